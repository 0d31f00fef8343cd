//! [`CoordinatorApi`] over QUIC: one or several coordinator addresses, one cached connection per
//! address (re-dialled when it breaks), and the Raft leader followed from call to call. Which
//! address to call next is decided by the pure [`super::leader_follow`]; this file performs the
//! calls and the waits.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex as SyncMutex, PoisonError};
use std::time::{Duration, Instant};

use quinn::{Connection, Endpoint};
use tokio::sync::Mutex;
use tracing::{debug, info};

use super::leader_follow::{DEFAULT_FAILOVER_TIMEOUT, FollowAttempt, KnownCoordinators, Next};
use super::{CoordinatorAddrs, NetError, Role, TlsConfigs, call, client_endpoint_for_all, connect_to};
use stoker_proto::api::CoordinatorApi;
use stoker_proto::wire::CONTROL_FRAME_LIMIT;
use stoker_proto::{ControlRequest, ControlResponse, ErrorCode, RemoteError};

/// How long to wait for the coordinator to accept a connection or answer a call.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// How long to wait for a connection or an answer when other coordinators could answer
/// instead: a node that is down (no ICMP reaches a QUIC client, and a killed process closes no
/// connection) must not hold a call long. A coordinator answers in milliseconds; the slowest
/// request (a commit waiting for a majority's fsync) takes tens.
const FAILOVER_CALL_TIMEOUT: Duration = Duration::from_millis(1500);

/// How long one try of `request` may take. Most requests are answered in milliseconds, and
/// with other coordinators to ask a silent one is given up after [`FAILOVER_CALL_TIMEOUT`];
/// those that legitimately take long (reading a manifest, asking every coordinator, a new node
/// catching up) get the long timeout, or longer.
fn call_timeout(request: &ControlRequest, several: bool) -> Duration {
    match request {
        ControlRequest::AddNode { .. } => Duration::from_secs(45),
        ControlRequest::AddDataset { .. } | ControlRequest::Status | ControlRequest::RemoveNode { .. } => CALL_TIMEOUT,
        _ if several => FAILOVER_CALL_TIMEOUT,
        _ => CALL_TIMEOUT,
    }
}

/// One connection slot per address; its lock is held while dialling, so concurrent calls share
/// one connection.
type Slot = Arc<Mutex<Option<Connection>>>;

/// The coordinator, at one address or at several (the nodes of a Raft-replicated coordinator),
/// called over QUIC.
///
/// A call goes to the address that answered last (the leader). A node that is not the leader
/// answers `NotLeader`: with a hint the call goes there at once; without one (an election is
/// under way), or when a node cannot be reached and there are others, the call tries the next
/// address after a pause (50 ms, doubling up to 1 s) until it succeeds or its failover time
/// ([`QuicCoordinator::set_failover_timeout`], 15 s) is spent, then returns the last error.
/// With a single address, an unreachable coordinator is reported at once, as callers have their
/// own retry loops.
#[derive(Debug)]
pub struct QuicCoordinator {
    endpoint: Endpoint,
    known: SyncMutex<KnownCoordinators>,
    connections: SyncMutex<HashMap<SocketAddr, Slot>>,
    failover_timeout: Duration,
}

impl QuicCoordinator {
    /// A client for the coordinator at `addr`; nothing is dialled until the first call.
    pub fn new(addr: SocketAddr, tls: &TlsConfigs) -> Result<Self, NetError> {
        Self::with_addrs(CoordinatorAddrs::one(addr), tls)
    }

    /// A client for the coordinator nodes at `addrs`, starting at the first; nothing is dialled
    /// until the first call. One QUIC endpoint serves every address.
    pub fn with_addrs(addrs: CoordinatorAddrs, tls: &TlsConfigs) -> Result<Self, NetError> {
        Ok(Self {
            endpoint: client_endpoint_for_all(tls, addrs.as_slice(), super::Tuning::default())?,
            known: SyncMutex::new(KnownCoordinators::new(&addrs)),
            connections: SyncMutex::new(HashMap::new()),
            failover_timeout: DEFAULT_FAILOVER_TIMEOUT,
        })
    }

    /// How long one call may look for the leader (redirects, elections, unreachable nodes)
    /// before it returns the last error; zero turns following off. 15 s by default.
    pub fn set_failover_timeout(&mut self, timeout: Duration) {
        self.failover_timeout = timeout;
    }

    /// The address the next call goes to: the last leader, or the first address.
    pub fn addr(&self) -> SocketAddr {
        self.known().start()
    }

    /// Every address known: the configured ones, then those learned from leader hints.
    pub fn addrs(&self) -> Vec<SocketAddr> {
        self.known().all().to_vec()
    }

    fn known(&self) -> std::sync::MutexGuard<'_, KnownCoordinators> {
        self.known.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn slot(&self, addr: SocketAddr) -> Slot {
        let mut connections = self.connections.lock().unwrap_or_else(PoisonError::into_inner);
        Arc::clone(connections.entry(addr).or_default())
    }

    async fn connection(&self, addr: SocketAddr, connect_timeout: Duration) -> Result<Connection, NetError> {
        let slot = self.slot(addr);
        let mut cached = slot.lock().await;
        if let Some(connection) = cached.as_ref().filter(|connection| connection.close_reason().is_none()) {
            return Ok(connection.clone());
        }
        let connection = connect_to(&self.endpoint, addr, connect_timeout, Role::Coordinator).await?;
        *cached = Some(connection.clone());
        Ok(connection)
    }

    async fn call_once(&self, addr: SocketAddr, request: &ControlRequest, timeout: Duration) -> Result<ControlResponse, NetError> {
        let connection = self.connection(addr, timeout).await?;
        match tokio::time::timeout(timeout, call(&connection, request, CONTROL_FRAME_LIMIT)).await {
            Ok(answer) => answer,
            Err(_) => {
                // A coordinator killed without closing its connections never answers on them.
                self.forget_connection(addr, &connection).await;
                Err(NetError::Timeout { addr, seconds: timeout.as_secs_f64() })
            }
        }
    }

    async fn forget_connection(&self, addr: SocketAddr, connection: &Connection) {
        let slot = self.slot(addr);
        let mut cached = slot.lock().await;
        if cached.as_ref().is_some_and(|known| known.stable_id() == connection.stable_id()) {
            *cached = None;
        }
    }

    /// One try at `addr`, with transport failures as [`ErrorCode::Unavailable`]; the flag says
    /// whether the coordinator answered at all (an answered error is not a dead node).
    async fn try_at(&self, addr: SocketAddr, request: &ControlRequest) -> Result<ControlResponse, (RemoteError, bool)> {
        let timeout = call_timeout(request, self.known().all().len() > 1);
        self.call_once(addr, request, timeout).await.map_err(|error| match error {
            NetError::Remote { source, .. } => (source, true),
            NetError::VersionMismatch { .. } => (RemoteError::new(ErrorCode::VersionMismatch, error.to_string()), true),
            // A refused certificate stays refused: not a dead node, and not worth a retry.
            NetError::Refused { .. } | NetError::WrongPeer { .. } | NetError::Tls(_) => {
                (RemoteError::new(ErrorCode::Forbidden, format!("coordinator {addr}: {error}")), true)
            }
            other => (RemoteError::new(ErrorCode::Unavailable, format!("coordinator {addr}: {other}")), false),
        })
    }

    fn answered(&self, addr: SocketAddr) {
        let mut known = self.known();
        if let Some(previous) = known.answered(addr) {
            match previous {
                Some(previous) => info!(%previous, leader = %addr, "the coordinator leader changed"),
                None if known.all().len() > 1 => info!(leader = %addr, "following the coordinator leader"),
                None => {}
            }
        }
    }
}

impl CoordinatorApi for QuicCoordinator {
    async fn call(&self, request: ControlRequest) -> Result<ControlResponse, RemoteError> {
        let started = Instant::now();
        let mut attempt = FollowAttempt::new(started, self.failover_timeout);
        let mut addr = self.addr();
        // Bounded: `after_failure` gives up after MAX_ATTEMPTS tries or the failover timeout.
        loop {
            let error = match self.try_at(addr, &request).await {
                Ok(response) => {
                    self.answered(addr);
                    return Ok(response);
                }
                Err(error) => error,
            };
            let (error, answered) = error;
            let next = attempt.after_failure(&mut self.known(), addr, &error.code, answered, Instant::now());
            match next {
                Next::Call { addr: to, after } => {
                    debug!(failed = %addr, %to, pause_ms = after.as_millis() as u64, %error, "calling another coordinator");
                    if !after.is_zero() {
                        tokio::time::sleep(after).await;
                    }
                    addr = to;
                }
                Next::GiveUp if attempt.attempts() > 1 => {
                    let known = self.addrs().iter().map(ToString::to_string).collect::<Vec<_>>().join(",");
                    let message = format!(
                        "{} (no coordinator leader answered within {:.1} s, {} tries at {known})",
                        error.message,
                        started.elapsed().as_secs_f64(),
                        attempt.attempts()
                    );
                    return Err(RemoteError::new(error.code, message));
                }
                Next::GiveUp => return Err(error),
            }
        }
    }

    /// Close the connections and the endpoint.
    fn close(&self) {
        self.endpoint.close(0u32.into(), b"bye");
    }
}

#[cfg(test)]
#[path = "coordinator_client_tests.rs"]
mod tests;
