//! Raft between coordinators over the control endpoint (DESIGN §7): each message is a
//! [`ControlRequest::Raft`] call, framed and size-checked like every other control call, on
//! one cached connection per peer dialled from the coordinator's own endpoint.

use std::collections::{BTreeSet, HashMap};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use openraft::error::{InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError as RaftRemoteError, Unreachable};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse, VoteRequest, VoteResponse,
};
use openraft::{BasicNode, Vote};
use quinn::{Connection, Endpoint};
use serde::Serialize;
use serde::de::DeserializeOwned;
use stoker_net::{NetError, PeerIdentity, Role, TlsConfigs, call, connect_to, peer_identity};
use stoker_proto::wire::CONTROL_FRAME_LIMIT;
use stoker_proto::{ControlRequest, ControlResponse, ErrorCode, RaftKind, RemoteError};

use super::{Raft, TypeConfig};
use crate::authz::authorize_raft_sender;

/// The largest snapshot a peer may send: twice the most `--max-state-bytes` lets the state
/// hold (`config::MAX_STATE_BYTES_LIMIT`).
pub const MAX_SNAPSHOT_BYTES: u64 = 1 << 30;

/// A Raft message that could not be encoded or decoded.
#[derive(Debug, thiserror::Error)]
pub enum RaftCodecError {
    /// The peer's answer or request is not what openraft sent.
    #[error("unreadable Raft message: {0}")]
    Decode(String),
    /// The peer answered something else than a Raft answer.
    #[error("the peer answered {0} to a Raft message")]
    Unexpected(String),
}

/// Dials peers from the coordinator's endpoint. Connections are shared by every client
/// openraft makes for a peer: it makes a new one for each leadership check, and a handshake
/// there would not fit in a heartbeat interval.
#[derive(Clone, Debug)]
pub struct Network {
    endpoint: Endpoint,
    isolated: Arc<AtomicBool>,
    /// By (node id, address).
    connections: Arc<parking_lot::Mutex<HashMap<(u64, String), Connection>>>,
    /// This node's TLS: a cached connection to a peer revoked since is closed, not used.
    tls: TlsConfigs,
}

impl Network {
    /// Peers are dialled from `endpoint` (the one the coordinator serves on) with `tls`; while
    /// `isolated` is set (a test's partition switch) nothing is sent.
    pub fn new(endpoint: Endpoint, isolated: Arc<AtomicBool>, tls: TlsConfigs) -> Self {
        Self { endpoint, isolated, connections: Arc::default(), tls }
    }
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = Peer;

    async fn new_client(&mut self, target: u64, node: &BasicNode) -> Peer {
        Peer {
            target,
            addr: node.addr.clone(),
            endpoint: self.endpoint.clone(),
            connections: Arc::clone(&self.connections),
            isolated: Arc::clone(&self.isolated),
            tls: self.tls.clone(),
        }
    }
}

/// One peer coordinator.
#[derive(Debug)]
pub struct Peer {
    target: u64,
    addr: String,
    endpoint: Endpoint,
    connections: Arc<parking_lot::Mutex<HashMap<(u64, String), Connection>>>,
    isolated: Arc<AtomicBool>,
    tls: TlsConfigs,
}

/// A failure to reach the peer (openraft backs off) or to understand it.
enum SendError {
    Unreachable(String),
    Broken(String),
}

impl Peer {
    fn cached(&self) -> parking_lot::MutexGuard<'_, HashMap<(u64, String), Connection>> {
        self.connections.lock()
    }

    fn forget(&self, connection: &Connection) {
        let mut cached = self.cached();
        let key = self.key();
        if cached.get(&key).is_some_and(|known| known.stable_id() == connection.stable_id()) {
            cached.remove(&key);
        }
    }

    /// A connection is cached by node id and address: one checked to be node A's is never
    /// used for node B that a membership change puts at the same address.
    fn key(&self) -> (u64, String) {
        (self.target, self.addr.clone())
    }

    async fn connection(&mut self, timeout: Duration) -> Result<Connection, SendError> {
        let cached = self.cached().get(&self.key()).filter(|connection| connection.close_reason().is_none()).cloned();
        if let Some(connection) = cached {
            // Revoked since it was made (issue 31, item 3): closed, and a new one is refused
            // at its handshake.
            let revoked = peer_identity(&connection, true).is_some_and(|peer| self.tls.is_denied(&peer.key()));
            if !revoked {
                return Ok(connection);
            }
            connection.close(7u32.into(), b"certificate revoked");
            self.forget(&connection);
            return Err(SendError::Unreachable(format!("{}'s certificate is revoked (on the deny list)", self.addr)));
        }
        let addr: SocketAddr = match tokio::net::lookup_host(self.addr.as_str()).await {
            Ok(mut addrs) => addrs.next().ok_or_else(|| SendError::Unreachable(format!("{} resolves to no address", self.addr)))?,
            Err(error) => return Err(SendError::Unreachable(format!("cannot resolve {}: {error}", self.addr))),
        };
        let connection = connect_to(&self.endpoint, addr, timeout, Role::Coordinator)
            .await
            .map_err(|error| SendError::Unreachable(error.to_string()))?;
        // The peer at that address must be the node meant (its certificate names it): another
        // coordinator's certificate there could answer for it, granting votes it never cast.
        if let Some(PeerIdentity::Certified(peer)) = peer_identity(&connection, self.tls.is_checked())
            && peer.node_id != Some(self.target)
        {
            connection.close(8u32.into(), b"not the node dialled");
            return Err(SendError::Unreachable(format!("{} presents the certificate of {peer}, not node {}'s", self.addr, self.target)));
        }
        self.cached().insert(self.key(), connection.clone());
        Ok(connection)
    }

    /// Send one message; the peer's answer is openraft's `Result<R, E>` as JSON.
    async fn send<Q: Serialize, R: DeserializeOwned, E: DeserializeOwned>(
        &mut self,
        kind: RaftKind,
        request: &Q,
        option: &RPCOption,
    ) -> Result<Result<R, E>, SendError> {
        let timeout = option.hard_ttl();
        if self.isolated.load(Ordering::Relaxed) {
            return Err(SendError::Unreachable(format!("{} is cut off (partition switch)", self.addr)));
        }
        let payload = serde_json::to_vec(request).map_err(|error| SendError::Broken(error.to_string()))?;
        let connection = self.connection(timeout).await?;
        let request = ControlRequest::Raft { kind, payload };
        let answer = match tokio::time::timeout(timeout, call::<_, ControlResponse>(&connection, &request, CONTROL_FRAME_LIMIT)).await {
            Err(_) => {
                // The peer may have restarted: its old connection never answers again.
                self.forget(&connection);
                return Err(SendError::Unreachable(format!("no answer from {} in {timeout:?}", self.addr)));
            }
            Ok(Err(NetError::Remote { source, .. })) => return Err(SendError::Broken(source.to_string())),
            Ok(Err(error)) => {
                self.forget(&connection);
                return Err(SendError::Unreachable(error.to_string()));
            }
            Ok(Ok(answer)) => answer,
        };
        match answer {
            ControlResponse::Raft { payload } => {
                serde_json::from_slice(&payload).map_err(|error| SendError::Broken(RaftCodecError::Decode(error.to_string()).to_string()))
            }
            other => Err(SendError::Broken(RaftCodecError::Unexpected(format!("{other:?}")).to_string())),
        }
    }
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct PeerError(String);

// openraft's error type is what the trait returns: its size is not ours to choose.
#[allow(clippy::result_large_err)]
fn into_rpc<R, E: std::error::Error>(target: u64, result: Result<Result<R, E>, SendError>) -> Result<R, RPCError<u64, BasicNode, E>> {
    match result {
        Ok(Ok(answer)) => Ok(answer),
        Ok(Err(remote)) => Err(RPCError::RemoteError(RaftRemoteError::new(target, remote))),
        Err(SendError::Unreachable(message)) => Err(RPCError::Unreachable(Unreachable::new(&PeerError(message)))),
        Err(SendError::Broken(message)) => Err(RPCError::Network(NetworkError::new(&PeerError(message)))),
    }
}

impl RaftNetwork<TypeConfig> for Peer {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<u64>, RPCError<u64, BasicNode, RaftError<u64>>> {
        let result = self.send(RaftKind::AppendEntries, &rpc, &option).await;
        into_rpc(self.target, result)
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<InstallSnapshotResponse<u64>, RPCError<u64, BasicNode, RaftError<u64, InstallSnapshotError>>> {
        let result = self.send(RaftKind::InstallSnapshot, &rpc, &option).await;
        into_rpc(self.target, result)
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<u64>,
        option: RPCOption,
    ) -> Result<VoteResponse<u64>, RPCError<u64, BasicNode, RaftError<u64>>> {
        let result = self.send(RaftKind::Vote, &rpc, &option).await;
        into_rpc(self.target, result)
    }

    fn backoff(&self) -> openraft::network::Backoff {
        openraft::network::Backoff::new(std::iter::repeat(Duration::from_millis(200)))
    }
}

/// Answer a peer's Raft message with `raft`: the answer is openraft's `Result` as JSON. The
/// message is taken only from the node `caller`'s certificate is bound to, and only from a
/// member or learner of the membership this node knows ([`authorize_raft_sender`]).
pub async fn answer_raft_rpc(raft: &Raft, caller: &PeerIdentity, kind: RaftKind, payload: &[u8]) -> Result<ControlResponse, RemoteError> {
    fn decode<T: DeserializeOwned>(payload: &[u8]) -> Result<T, RemoteError> {
        serde_json::from_slice(payload)
            .map_err(|error| RemoteError::new(ErrorCode::InvalidArgument, format!("unreadable Raft message: {error}")))
    }
    fn encode<T: Serialize>(answer: &T) -> Result<ControlResponse, RemoteError> {
        serde_json::to_vec(answer)
            .map(|payload| ControlResponse::Raft { payload })
            .map_err(|error| RemoteError::new(ErrorCode::Internal, format!("cannot encode a Raft answer: {error}")))
    }
    // The sender of each message is its vote's node: the leader of an append or a snapshot
    // chunk, the candidate of a vote. Only a vote is checked against the membership this node
    // knows: a follower that missed the entry adding the current leader learns it only from
    // that leader's appends, so refusing a non-member's appends would shut it out for good
    // (found by review). A refused vote costs nothing, and a node no member votes for never
    // wins an election.
    let authorize = |vote: &Vote<u64>, against_members: bool| {
        let members: BTreeSet<u64> = if against_members {
            raft.metrics().borrow().membership_config.membership().nodes().map(|(id, _)| *id).collect()
        } else {
            BTreeSet::new()
        };
        let sender = vote
            .leader_id()
            .voted_for()
            .ok_or_else(|| RemoteError::new(ErrorCode::InvalidArgument, "a Raft message whose vote names no node".to_owned()))?;
        authorize_raft_sender(caller, sender, &members)
    };
    match kind {
        RaftKind::AppendEntries => {
            let request: AppendEntriesRequest<TypeConfig> = decode(payload)?;
            authorize(&request.vote, false)?;
            encode(&raft.append_entries(request).await)
        }
        RaftKind::Vote => {
            let request: VoteRequest<u64> = decode(payload)?;
            authorize(&request.vote, true)?;
            encode(&raft.vote(request).await)
        }
        RaftKind::InstallSnapshot => {
            let request: InstallSnapshotRequest<TypeConfig> = decode(payload)?;
            authorize(&request.vote, false)?;
            // openraft writes a chunk at its offset in a Vec: an offset far out would allocate it.
            let end = request.offset.checked_add(request.data.len() as u64);
            if end.is_none_or(|end| end > MAX_SNAPSHOT_BYTES) {
                return Err(RemoteError::new(
                    ErrorCode::InvalidArgument,
                    format!("a snapshot chunk at offset {} is past the {MAX_SNAPSHOT_BYTES}-byte snapshot limit", request.offset),
                ));
            }
            encode(&raft.install_snapshot(request).await)
        }
    }
}
