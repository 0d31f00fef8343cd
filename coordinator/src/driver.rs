//! The driver of a replicated coordinator: when this node leads, it answers each request with
//! the runtime's drive loop ([`Coordinator::serve`]), committing what the core asks through
//! Raft (the driver is the [`Committer`]); otherwise it redirects callers to the leader. Raft
//! messages, this node's status and membership changes are answered here. Requests are
//! dispatched in one place: [`Driver::serve_as`] takes the Raft and membership requests, the
//! core every other.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use openraft::error::{ClientWriteError, RaftError};
use openraft::{BasicNode, ChangeMembers, ServerState};
use quinn::Endpoint;
use stoker_net::PeerIdentity;
use stoker_proto::{ControlRequest, ControlResponse, CoordinatorStatus, ErrorCode, RemoteError};
use tracing::{info, warn};

use crate::authz::authorize;
use crate::error::CoordinatorError;
use crate::peers::{ask_status, resolve, resolve_now};
use crate::raft::{Raft, answer_raft_rpc};
use crate::runtime::{Committer, Coordinator};
use crate::state::{Applied, ClusterState, Command};

/// A leader serves for this long after a majority last confirmed it (and it had applied every
/// entry committed before): shorter than the election timeout's lower bound plus a heartbeat,
/// so a leader cut off from the others stops scheduling about when they elect another.
const LEADERSHIP_LEASE: Duration = Duration::from_millis(500);
/// The timer confirms again once the last confirmation is this old (it ticks every 200 ms).
const TICK_CONFIRMATION_AGE: Duration = Duration::from_millis(150);
/// How long one confirmation of leadership may take.
const CONFIRM_WITHIN: Duration = Duration::from_millis(500);
/// How long `cluster add-node` waits for the new node to catch up as a learner.
const ADD_NODE_WITHIN: Duration = Duration::from_secs(30);
/// How long the timer waits for one of its commits.
const TICK_COMMIT_WITHIN: Duration = Duration::from_secs(2);

/// Serves requests on one coordinator.
pub(crate) struct Driver {
    id: u64,
    advertised: String,
    raft: Raft,
    core: Arc<Coordinator>,
    endpoint: Endpoint,
    /// A test's partition switch: while set, this node neither sends nor answers Raft messages
    /// (clients still reach it).
    isolated: Arc<AtomicBool>,
    /// When a majority last confirmed this node's leadership, in which term.
    confirmed: Mutex<Option<(u64, Instant)>>,
    /// Held while a confirmation is under way.
    confirming: tokio::sync::Mutex<()>,
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
        Self { id, advertised, raft, core, endpoint, isolated, confirmed: Mutex::new(None), confirming: tokio::sync::Mutex::new(()) }
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
    /// Answer one request of `caller`, if its certificate allows it.
    pub(crate) async fn serve_as(&self, caller: &PeerIdentity, request: ControlRequest) -> Result<ControlResponse, RemoteError> {
        authorize(caller, &request)?;
        self.serve_checked(caller, request).await
    }

    async fn serve_checked(&self, caller: &PeerIdentity, request: ControlRequest) -> Result<ControlResponse, RemoteError> {
        let cut_off = self.isolated.load(Ordering::Relaxed);
        match request {
            ControlRequest::Raft { .. } if cut_off => {
                Err(unavailable(format!("coordinator {} is cut off (partition switch)", self.advertised)))
            }
            ControlRequest::Raft { kind, payload } => answer_raft_rpc(&self.raft, caller, kind, &payload).await,
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
                let mut answer = self.core.status(Instant::now());
                answer.coordinators = self.coordinators().await;
                Ok(ControlResponse::Status { status: answer })
            }
            request => {
                self.ensure_leader().await?;
                self.core.serve(self, request, caller.key(), Instant::now()).await
            }
        }
    }

    /// Commit `command` through Raft; it is applied when this returns.
    pub(crate) async fn propose(&self, command: Command) -> Result<Applied, RemoteError> {
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
            if self.confirm(term, false).await {
                self.core.lead(term, Instant::now());
                return Ok(());
            }
            return Err(RemoteError::new(
                ErrorCode::NotLeader { leader_hint: None },
                format!(
                    "coordinator {} was elected but a majority has not confirmed it yet (or it is cut off): try again shortly",
                    self.advertised
                ),
            ));
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

    /// Whether a majority confirmed this node's leadership in `term` within the lease, and it
    /// has applied everything committed before (openraft's read index): asked now if not.
    /// `refresh`: confirm again even if the last confirmation is still valid (the timer, so
    /// that requests seldom find it stale). One confirmation runs at a time.
    async fn confirm(&self, term: u64, refresh: bool) -> bool {
        let fresh = |within: Duration| {
            let confirmed = self.confirmed.lock();
            confirmed.is_some_and(|(at_term, at)| at_term == term && at.elapsed() < within)
        };
        let wanted = if refresh { TICK_CONFIRMATION_AGE } else { LEADERSHIP_LEASE };
        if fresh(wanted) {
            return true;
        }
        let _one_at_a_time = self.confirming.lock().await;
        // Another caller may have confirmed while this one waited.
        if fresh(wanted) {
            return true;
        }
        let asked = Instant::now();
        match tokio::time::timeout(CONFIRM_WITHIN, self.raft.ensure_linearizable()).await {
            Ok(Ok(_)) => {
                *self.confirmed.lock() = Some((term, asked));
                true
            }
            _ => false,
        }
    }

    /// Whether this node leads now with a majority's confirmation within the lease (the timer
    /// confirms again every tick): what metrics and readiness report. A leader cut off from the
    /// other coordinators keeps openraft's `Leader` state but not this.
    pub(crate) fn leads_confirmed(&self) -> bool {
        let (state, term) = {
            let metrics = self.raft.metrics();
            let metrics = metrics.borrow();
            (metrics.state, metrics.current_term)
        };
        let confirmed = self.confirmed.lock();
        state == ServerState::Leader && confirmed.is_some_and(|(at_term, at)| at_term == term && at.elapsed() < LEADERSHIP_LEASE)
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
        match self.propose(Command::Import { state: Box::new(state) }).await {
            Ok(Applied::Refused(reason)) => Err(CoordinatorError::Cluster { message: format!("cannot import the old store: {reason}") }),
            Ok(_) => Ok(()),
            Err(error) => Err(CoordinatorError::Internal { message: format!("cannot import the old store: {}", error.message) }),
        }
    }

    /// A coordinator alone may come back on another address (a new port): record it, so that
    /// `stoker status`, redirects and a later `cluster add-node` use the address it has now.
    pub(crate) async fn update_own_address(&self) -> Result<(), CoordinatorError> {
        let stored = self.raft.metrics().borrow().membership_config.membership().get_node(&self.id).map(|node| node.addr.clone());
        if stored.as_deref() == Some(self.advertised.as_str()) {
            return Ok(());
        }
        let nodes = BTreeMap::from([(self.id, BasicNode::new(&self.advertised))]);
        let changed =
            tokio::time::timeout(Duration::from_secs(10), self.raft.change_membership(ChangeMembers::SetNodes(nodes), true)).await;
        match changed {
            Ok(Ok(_)) => {
                info!(old = ?stored, new = %self.advertised, "this coordinator's address changed");
                Ok(())
            }
            Ok(Err(error)) => Err(CoordinatorError::Cluster { message: format!("cannot record this coordinator's new address: {error}") }),
            Err(_) => Err(CoordinatorError::Cluster { message: "cannot record this coordinator's new address within 10 s".to_owned() }),
        }
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
            self.core.follow(now);
            return;
        }
        // Confirmed at every tick, so requests seldom wait for a confirmation. Unconfirmed
        // (slow, or cut off), the soft state is kept for this term but nothing is committed.
        if !self.confirm(term, true).await {
            return;
        }
        self.core.lead(term, now);
        let joined = self.newly_joined();
        self.core.tick(&Within { driver: self, within: TICK_COMMIT_WITHIN }, now, flush, joined).await;
    }

    /// `NodeJoined` for each voter whose log the leader has seen match and the state does not
    /// name yet (this node included).
    fn newly_joined(&self) -> Vec<Command> {
        let joined = self.core.nodes_joined();
        let metrics = self.raft.metrics();
        let metrics = metrics.borrow();
        let matched: Vec<u64> = match &metrics.replication {
            Some(replication) => replication.iter().filter(|(_, matched)| matched.is_some()).map(|(id, _)| *id).collect(),
            None => Vec::new(),
        };
        let voters: BTreeSet<u64> = metrics.membership_config.membership().voter_ids().collect();
        let members: BTreeSet<u64> = metrics.membership_config.nodes().map(|(id, _)| *id).collect();
        let joining = matched
            .into_iter()
            .chain([self.id])
            .filter(|id| voters.contains(id) && !joined.contains(id))
            .collect::<BTreeSet<u64>>()
            .into_iter()
            .map(|id| Command::NodeJoined { id });
        // A node no longer a member (removed, also a leader that removed itself) frees its id.
        let left = joined.iter().filter(|id| !members.contains(id)).map(|id| Command::NodeLeft { id: *id });
        joining.chain(left).collect()
    }

    fn own_status(&self) -> CoordinatorStatus {
        // Read before the metrics are borrowed: openraft cannot publish metrics meanwhile.
        let joined = self.core.nodes_joined().into_iter().collect();
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
            joined,
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
            let asked = ask_status(&self.endpoint, &addr).await;
            statuses.push(asked.unwrap_or(CoordinatorStatus { id, addr, role: "unreachable".to_owned(), ..CoordinatorStatus::default() }));
        }
        statuses
    }

    async fn add_node(&self, id: u64, addr: String) -> Result<ControlResponse, RemoteError> {
        let invalid = |message: String| RemoteError::new(ErrorCode::InvalidArgument, message);
        let well_formed =
            addr.len() <= 256 && addr.rsplit_once(':').is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
        if !well_formed {
            return Err(invalid(format!("{addr:?} is not HOST:PORT")));
        }
        if id == 0 {
            return Err(invalid("node ids are positive numbers".to_owned()));
        }
        let known: Vec<(u64, String)> = {
            let metrics = self.raft.metrics();
            let metrics = metrics.borrow();
            metrics.membership_config.nodes().map(|(id, node)| (*id, node.addr.clone())).collect()
        };
        if let Some((_, existing)) = known.iter().find(|(known_id, existing)| *known_id == id && *existing != addr) {
            return Err(invalid(format!("node {id} is in the cluster at {existing}: remove it first to add it elsewhere")));
        }
        if let Some((unroutable, at)) = known.iter().find(|(_, at)| resolve_now(at).is_some_and(|socket| socket.ip().is_unspecified())) {
            return Err(invalid(format!(
                "node {unroutable} is recorded at {at}, which other coordinators cannot dial: restart it with --advertise HOST:PORT first"
            )));
        }
        info!(node = id, %addr, "adding a coordinator: as a learner until it has caught up, then as a voter");
        let added = tokio::time::timeout(ADD_NODE_WITHIN, self.raft.add_learner(id, BasicNode::new(&addr), true)).await;
        match added {
            Ok(Ok(_)) => {}
            Ok(Err(error)) => return Err(unavailable(format!("cannot add node {id} as a learner: {error}"))),
            Err(_) => {
                return Err(unavailable(format!(
                    "node {id} at {addr} did not catch up within {}s: is it running with --join at that address? It stays a \
                     learner (no vote) until it does; `stoker cluster remove-node {id}` takes it out",
                    ADD_NODE_WITHIN.as_secs()
                )));
            }
        }
        let mut voters = self.voters();
        voters.insert(id);
        self.change_voters(voters).await
    }

    async fn remove_node(&self, id: u64) -> Result<ControlResponse, RemoteError> {
        let learner = self.raft.metrics().borrow().membership_config.membership().learner_ids().any(|learner| learner == id);
        if learner {
            info!(node = id, "removing a learner");
            let removed = self.raft.change_membership(ChangeMembers::RemoveNodes(BTreeSet::from([id])), false).await;
            removed.map_err(|error| unavailable(format!("cannot remove node {id}: {error}")))?;
            return Ok(ControlResponse::MembershipChanged { voters: self.voter_addrs() });
        }
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
        let changed = self.change_voters(voters).await?;
        // Its id may start afresh on an empty data directory from now on. (Best effort: a
        // leader that removed itself no longer leads, and the id stays refused.)
        if let Err(error) = self.propose(Command::NodeLeft { id }).await {
            warn!(node = id, %error, "cannot record that the node left; its id stays refused on an empty data directory");
        }
        Ok(changed)
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
        Ok(ControlResponse::MembershipChanged { voters: self.voter_addrs() })
    }

    fn voter_addrs(&self) -> Vec<(u64, String)> {
        let metrics = self.raft.metrics();
        let metrics = metrics.borrow();
        let config = metrics.membership_config.membership();
        config.voter_ids().filter_map(|id| config.get_node(&id).map(|node| (id, node.addr.clone()))).collect()
    }
}

impl Committer for Driver {
    /// Through Raft: applied on this node when it returns.
    async fn commit(&self, command: Command) -> Result<Applied, RemoteError> {
        self.propose(command).await
    }

    /// The timer flushes checkpoints (at its next tick when an answer waits for one).
    fn flushes_on_timer(&self) -> bool {
        true
    }

    /// On tokio's blocking threads, off the async ones.
    async fn blocking<T, F>(&self, work: F) -> Result<T, RemoteError>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        tokio::task::spawn_blocking(work)
            .await
            .map_err(|error| RemoteError::new(ErrorCode::Internal, format!("request task failed: {error}")))
    }
}

/// The driver's commits, each given up after `within` (the timer's: it tries again at its
/// next tick).
struct Within<'a> {
    driver: &'a Driver,
    within: Duration,
}

impl Committer for Within<'_> {
    async fn commit(&self, command: Command) -> Result<Applied, RemoteError> {
        match tokio::time::timeout(self.within, self.driver.propose(command)).await {
            Ok(committed) => committed,
            Err(_) => Err(unavailable(format!("no commit within {:?}", self.within))),
        }
    }

    async fn blocking<T, F>(&self, work: F) -> Result<T, RemoteError>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        Committer::blocking(self.driver, work).await
    }
}
