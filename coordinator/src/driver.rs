//! The driver of a replicated coordinator: it answers each request with the pure core
//! ([`Coordinator::step`]) when this node leads, commits what the core asks through Raft, and
//! redirects callers to the leader otherwise. Raft messages, this node's status and membership
//! changes are answered here.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use openraft::error::{ClientWriteError, RaftError};
use openraft::{BasicNode, ServerState};
use quinn::Endpoint;
use stoker_common::net::{call, connect};
use stoker_common::proto::{ControlRequest, ControlResponse, CoordinatorStatus, ErrorCode, RemoteError};
use stoker_common::wire::CONTROL_FRAME_LIMIT;
use tracing::{info, warn};

use crate::error::CoordinatorError;
use crate::raft::{Raft, answer_raft_rpc};
use crate::service::{Coordinator, Outcome, Then};
use crate::state::{Applied, ClusterState, Command};

/// How long the leader waits for each other coordinator's status in `stoker status`.
const PEER_STATUS_TIMEOUT: Duration = Duration::from_millis(500);

/// Serves requests on one coordinator.
pub(crate) struct Driver {
    id: u64,
    advertised: String,
    raft: Raft,
    core: Arc<Coordinator>,
    endpoint: Endpoint,
    /// A test's partition switch: while set, this node neither sends nor answers anything.
    isolated: Arc<AtomicBool>,
}

impl std::fmt::Debug for Driver {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("Driver").field("id", &self.id).field("advertised", &self.advertised).finish_non_exhaustive()
    }
}

fn unavailable(message: impl Into<String>) -> RemoteError {
    RemoteError::new(ErrorCode::Unavailable, message)
}

impl Driver {
    pub(crate) fn new(
        id: u64,
        advertised: String,
        raft: Raft,
        core: Arc<Coordinator>,
        endpoint: Endpoint,
        isolated: Arc<AtomicBool>,
    ) -> Self {
        Self { id, advertised, raft, core, endpoint, isolated }
    }

    pub(crate) fn set_isolated(&self, isolated: bool) {
        self.isolated.store(isolated, Ordering::Relaxed);
    }

    pub(crate) fn core(&self) -> Arc<Coordinator> {
        Arc::clone(&self.core)
    }

    pub(crate) fn raft(&self) -> Raft {
        self.raft.clone()
    }

    /// Answer one request.
    pub(crate) async fn serve(&self, request: ControlRequest) -> Result<ControlResponse, RemoteError> {
        if self.isolated.load(Ordering::Relaxed) {
            return Err(unavailable(format!("coordinator {} is cut off (partition switch)", self.advertised)));
        }
        match request {
            ControlRequest::Raft { kind, payload } => answer_raft_rpc(&self.raft, kind, &payload).await,
            ControlRequest::NodeStatus => Ok(ControlResponse::NodeStatus { node: self.own_status() }),
            ControlRequest::AddNode { id, addr } => {
                self.ensure_leader().await?;
                self.add_node(id, addr).await
            }
            ControlRequest::RemoveNode { id } => {
                self.ensure_leader().await?;
                self.remove_node(id).await
            }
            ControlRequest::Status => {
                self.ensure_leader().await?;
                let mut answer = self.core.handle_status(Instant::now());
                answer.coordinators = self.coordinators().await;
                Ok(ControlResponse::Status { status: answer })
            }
            request => {
                self.ensure_leader().await?;
                self.step_through(request).await
            }
        }
    }

    /// Step the core, committing what it asks, until it answers.
    async fn step_through(&self, request: ControlRequest) -> Result<ControlResponse, RemoteError> {
        let mut request = request;
        // A request commits at most twice (create a job, clear its failure), then answers.
        for _ in 0..4 {
            let core = Arc::clone(&self.core);
            let outcome = if matches!(request, ControlRequest::AddDataset { .. }) {
                // Reads the manifest: off the async threads.
                tokio::task::spawn_blocking(move || core.step(request, Instant::now()))
                    .await
                    .map_err(|error| RemoteError::new(ErrorCode::Internal, format!("request task failed: {error}")))?
            } else {
                core.step(request, Instant::now())
            };
            match outcome {
                Outcome::Reply(answer) => return answer,
                Outcome::Commit { command, then } => {
                    self.commit(command).await?;
                    match then {
                        Then::Again(again) => request = again,
                        Then::Reply(answer) => return Ok(answer),
                    }
                }
            }
        }
        Err(RemoteError::new(ErrorCode::Internal, "a request kept asking for commits"))
    }

    /// Commit `command` through Raft; it is applied when this returns.
    pub(crate) async fn commit(&self, command: Command) -> Result<Applied, RemoteError> {
        match self.raft.client_write(command).await {
            Ok(written) => Ok(written.data),
            Err(RaftError::APIError(ClientWriteError::ForwardToLeader(forward))) => {
                let hint = match forward.leader_node {
                    Some(node) => resolve(&node.addr).await,
                    None => None,
                };
                Err(RemoteError::new(ErrorCode::NotLeader { leader_hint: hint }, "leadership moved while committing: ask the leader"))
            }
            Err(error) => Err(unavailable(format!("cannot commit: {error}"))),
        }
    }

    /// Succeed if this node leads (and make sure its soft state is that of this term), or
    /// say who leads.
    async fn ensure_leader(&self) -> Result<(), RemoteError> {
        let (leading, term, leader) = {
            let metrics = self.raft.metrics();
            let metrics = metrics.borrow();
            let leader_addr = metrics
                .current_leader
                .and_then(|leader| metrics.membership_config.membership().get_node(&leader).map(|node| node.addr.clone()));
            (metrics.state == ServerState::Leader && metrics.current_leader == Some(self.id), metrics.current_term, leader_addr)
        };
        if leading {
            self.core.lead(term, Instant::now());
            return Ok(());
        }
        let hint = match &leader {
            Some(addr) => resolve(addr).await,
            None => None,
        };
        let message = match &leader {
            Some(addr) => format!("coordinator {} is not the leader: {addr} is", self.advertised),
            None => format!("coordinator {} knows no leader yet (an election is under way): try again shortly", self.advertised),
        };
        Err(RemoteError::new(ErrorCode::NotLeader { leader_hint: hint }, message))
    }

    /// Wait until this node leads (a cluster of one after a restart: one election timeout).
    pub(crate) async fn wait_to_lead(&self, within: Duration) -> Result<(), CoordinatorError> {
        let id = self.id;
        self.raft
            .wait(Some(within))
            .metrics(|metrics| metrics.state == ServerState::Leader && metrics.current_leader == Some(id), "this node leads")
            .await
            .map(|_| ())
            .map_err(|error| CoordinatorError::Cluster {
                message: format!("node {id} did not become the leader of its one-node cluster: {error}"),
            })
    }

    /// Import the state of an earlier version's store (this node alone leads).
    pub(crate) async fn import(&self, state: ClusterState) -> Result<(), CoordinatorError> {
        self.commit(Command::Import { state: Box::new(state) })
            .await
            .map(|_| ())
            .map_err(|error| CoordinatorError::Internal { message: format!("cannot import the old store: {}", error.message) })
    }

    /// Expire leases; when leading, commit idle-job removals and (if `flush`) the checkpoints
    /// recorded since the last flush, as one entry.
    pub(crate) async fn tick(&self, now: Instant, flush: bool) {
        let (leading, term) = {
            let metrics = self.raft.metrics();
            let metrics = metrics.borrow();
            (metrics.state == ServerState::Leader && metrics.current_leader == Some(self.id), metrics.current_term)
        };
        if !leading {
            self.core.follow();
            return;
        }
        self.core.lead(term, now);
        let mut commands = self.core.tick(now);
        if flush {
            commands.extend(self.core.take_checkpoints());
        }
        for command in commands {
            if let Err(error) = self.commit(command).await {
                warn!(%error, "cannot commit; trying again at the next tick");
            }
        }
    }

    fn own_status(&self) -> CoordinatorStatus {
        let metrics = self.raft.metrics();
        let metrics = metrics.borrow();
        let role = match metrics.state {
            ServerState::Leader => "leader",
            ServerState::Follower => "follower",
            ServerState::Candidate => "candidate",
            ServerState::Learner => "learner",
            ServerState::Shutdown => "shutdown",
        };
        CoordinatorStatus {
            id: self.id,
            addr: self.advertised.clone(),
            role: role.to_owned(),
            term: metrics.current_term,
            last_log: metrics.last_log_index.unwrap_or(0),
            applied: metrics.last_applied.map_or(0, |log_id| log_id.index),
            leader: metrics.current_leader,
        }
    }

    /// Every member's status: this node's own, and each other's asked over the network.
    async fn coordinators(&self) -> Vec<CoordinatorStatus> {
        let nodes: Vec<(u64, String)> = {
            let metrics = self.raft.metrics();
            let metrics = metrics.borrow();
            metrics.membership_config.nodes().map(|(id, node)| (*id, node.addr.clone())).collect()
        };
        let mut statuses = Vec::new();
        for (id, addr) in nodes {
            if id == self.id {
                statuses.push(self.own_status());
                continue;
            }
            let asked = self.ask_status(&addr).await;
            statuses.push(asked.unwrap_or(CoordinatorStatus { id, addr, role: "unreachable".to_owned(), ..CoordinatorStatus::default() }));
        }
        statuses
    }

    async fn ask_status(&self, addr: &str) -> Option<CoordinatorStatus> {
        let target = resolve(addr).await?;
        let asked = tokio::time::timeout(PEER_STATUS_TIMEOUT, async {
            let connection = connect(&self.endpoint, target, PEER_STATUS_TIMEOUT).await.ok()?;
            let answer = call::<_, ControlResponse>(&connection, &ControlRequest::NodeStatus, CONTROL_FRAME_LIMIT).await.ok();
            connection.close(0u32.into(), b"status");
            match answer? {
                ControlResponse::NodeStatus { node } => Some(node),
                _ => None,
            }
        });
        asked.await.ok().flatten()
    }

    async fn add_node(&self, id: u64, addr: String) -> Result<ControlResponse, RemoteError> {
        if addr.is_empty() || addr.len() > 256 {
            return Err(RemoteError::new(ErrorCode::InvalidArgument, "a node address must have 1 to 256 characters"));
        }
        info!(node = id, %addr, "adding a coordinator: as a learner until it has caught up, then as a voter");
        self.raft
            .add_learner(id, BasicNode::new(&addr), true)
            .await
            .map_err(|error| unavailable(format!("cannot add node {id} as a learner: {error}")))?;
        let mut voters = self.voters();
        voters.insert(id);
        self.change_voters(voters).await
    }

    async fn remove_node(&self, id: u64) -> Result<ControlResponse, RemoteError> {
        let mut voters = self.voters();
        if !voters.remove(&id) {
            return Err(RemoteError::new(
                ErrorCode::NotFound,
                format!("node {id} is not a voter of this cluster: `stoker status` lists them"),
            ));
        }
        if voters.is_empty() {
            return Err(RemoteError::new(ErrorCode::InvalidArgument, "cannot remove the last coordinator"));
        }
        info!(node = id, "removing a coordinator");
        self.change_voters(voters).await
    }

    fn voters(&self) -> BTreeSet<u64> {
        self.raft.metrics().borrow().membership_config.membership().voter_ids().collect()
    }

    async fn change_voters(&self, voters: BTreeSet<u64>) -> Result<ControlResponse, RemoteError> {
        let changed = self
            .raft
            .change_membership(voters, false)
            .await
            .map_err(|error| unavailable(format!("cannot change the membership: {error}")))?;
        let membership = changed.log_id;
        info!(?membership, "membership changed");
        let metrics = self.raft.metrics();
        let metrics = metrics.borrow();
        let config = metrics.membership_config.membership();
        let voters = config.voter_ids().filter_map(|id| config.get_node(&id).map(|node| (id, node.addr.clone()))).collect();
        Ok(ControlResponse::MembershipChanged { voters })
    }
}

/// The socket address of `host:port` (a name is looked up), or `None`.
async fn resolve(addr: &str) -> Option<SocketAddr> {
    if let Ok(parsed) = addr.parse() {
        return Some(parsed);
    }
    tokio::net::lookup_host(addr).await.ok()?.next()
}
