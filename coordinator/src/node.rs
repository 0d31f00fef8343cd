//! Composition root of a coordinator (STYLE G6): the Raft store in `--data-dir`, the Raft
//! node, the QUIC endpoint on a socket the caller bound (control calls and Raft share it), the
//! request driver, and a timer that expires leases and flushes checkpoints. Forms the cluster
//! on a fresh store, checks the stored membership on a used one, and imports the data
//! directory of earlier versions. Returns a handle to stop it.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{SocketAddr, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use openraft::BasicNode;
use parking_lot::Mutex;
use stoker_net::{Admission, Role, ServeLimits, TlsConfigs, Tuning, peer_identity, serve_calls, server_endpoint};
use stoker_obs::Metrics;
use stoker_obs::prometheus::IntCounter;
use stoker_proto::wire::CONTROL_FRAME_LIMIT;
use stoker_proto::{ControlRequest, ErrorCode, RemoteError};
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};

use crate::config::CoordinatorConfig;
use crate::driver::Driver;
use crate::error::CoordinatorError;
use crate::legacy;
use crate::raft::{LogStore, Network, Raft, StateMachine, StoreFile, raft_config};
use crate::runtime::Coordinator;
use crate::sources::OsIds;
use crate::state::ClusterState;

/// How long a coordinator alone waits to lead at start (an election timeout or two).
const LEAD_ALONE_WITHIN: Duration = Duration::from_secs(10);
/// How often the timer expires leases and, when leading, commits idle-job removals.
const TICK: Duration = Duration::from_millis(200);
/// How often the checkpoints recorded since the last flush are committed (one entry each).
pub const CHECKPOINT_FLUSH: Duration = Duration::from_secs(1);

/// A running coordinator.
#[derive(Debug)]
pub struct CoordinatorHandle {
    addr: SocketAddr,
    endpoint: quinn::Endpoint,
    driver: Arc<Driver>,
    tasks: Vec<JoinHandle<()>>,
    /// Raft stopping (its store closes when it has).
    stopping: Mutex<Option<JoinHandle<()>>>,
}

/// Start a coordinator serving on `socket` (already bound), with its figures in `metrics`
/// (and its readiness: a Raft leader known).
pub async fn start(
    config: CoordinatorConfig,
    socket: UdpSocket,
    tls: &TlsConfigs,
    metrics: &Metrics,
) -> Result<CoordinatorHandle, CoordinatorError> {
    let config = config.validate()?;
    match tls.own() {
        Some(own) if own.role != Role::Coordinator => {
            return Err(CoordinatorError::Config {
                message: format!("the certificate in --tls-dir is {own}; a coordinator needs the coordinator role"),
            });
        }
        Some(own) if own.node_id != Some(config.node_id) => {
            let named = own
                .node_id
                .map_or_else(|| "names no node id (issued before certificates carried one)".to_owned(), |id| format!("is node {id}'s"));
            return Err(CoordinatorError::Config {
                message: format!(
                    "the certificate in --tls-dir ({own}) {named}, but this coordinator is --node-id {id}: peers accept its Raft \
                     messages only as the node its certificate names. Reissue it with `stoker certs issue --role coordinator \
                     --node-id {id} ...`",
                    id = config.node_id
                ),
            });
        }
        Some(own) => info!(%own, "mutual TLS: peers need a certificate of the cluster CA"),
        None => warn!("INSECURE: --insecure: any peer that reaches this coordinator may do anything; use it on a trusted network only"),
    }
    let addr = socket.local_addr().map_err(|error| CoordinatorError::Internal { message: format!("socket has no address: {error}") })?;
    let advertised = config.advertise.clone().or_else(|| config.peers.get(&config.node_id).cloned()).unwrap_or_else(|| addr.to_string());
    let members: BTreeMap<u64, String> =
        if config.peers.is_empty() { BTreeMap::from([(config.node_id, advertised.clone())]) } else { config.peers.clone() };

    let file = StoreFile::open(&config.data_dir)?;
    let fresh = file.is_fresh()?;
    let imported = legacy::load(&config.data_dir)?;
    if imported.is_some() && (!config.peers.is_empty() || config.join) {
        return Err(CoordinatorError::Cluster {
            message: format!(
                "{} holds the single-node store of an earlier version: start this coordinator once without --peers \
                 or --join to import it, then add the others with `stoker cluster add-node`",
                config.data_dir.display()
            ),
        });
    }

    // Ids from the OS's randomness; counted ones (workers, sessions) from the Raft term each
    // time this node leads, never from its clock.
    let core = Arc::new(Coordinator::new(&config, advertised.clone(), ClusterState::new(), Box::new(OsIds), 0, Instant::now()));
    let machine = StateMachine::open(file.clone(), core.clone())?;
    let snapshot_requests = machine.snapshot_requests();
    // Requests only: small windows, no unidirectional streams; large sends (Raft) still go out.
    let tuning = Tuning { max_bidi_streams: config.max_streams_per_connection, receives_batches: false, ..Tuning::default() };
    let endpoint = server_endpoint(socket, tls, tuning)?;
    let raft_settings = raft_config("stoker").validate().map_err(|error| CoordinatorError::Config { message: error.to_string() })?;
    let isolated = Arc::new(AtomicBool::new(false));
    let network = Network::new(endpoint.clone(), Arc::clone(&isolated), tls.clone());
    let raft = Raft::new(config.node_id, Arc::new(raft_settings), network, LogStore::new(file.clone()), machine)
        .await
        .map_err(|error| CoordinatorError::Internal { message: format!("cannot start Raft: {error}") })?;
    let driver = Arc::new(Driver::new(config.node_id, advertised, raft.clone(), core, endpoint.clone(), isolated));

    if fresh
        && !config.join
        && !config.peers.is_empty()
        && let Err(error) = refuse_a_reused_node_id(&endpoint, &config).await
    {
        return stopped(&raft, error).await;
    }
    if fresh && !config.join {
        let nodes: BTreeMap<u64, BasicNode> = members.iter().map(|(id, addr)| (*id, BasicNode::new(addr))).collect();
        match raft.initialize(nodes).await {
            Ok(()) => info!(node = config.node_id, members = ?members, "cluster formed"),
            // Another member's initialisation reached this node first: the same cluster.
            Err(error) => debug!(%error, "not initialised here"),
        }
    } else if !fresh {
        if let Err(error) = check_membership(&raft, &config, &members, &file).await {
            return stopped(&raft, error).await;
        }
    } else {
        info!(node = config.node_id, "waiting to be added to a cluster (`stoker cluster add-node`)");
    }
    let alone = config.peers.is_empty() && !config.join;
    if alone && let Err(error) = driver.wait_to_lead(LEAD_ALONE_WITHIN).await {
        return stopped(&raft, error).await;
    }
    if let Some(state) = imported {
        // Imported before (a start that stopped before renaming the old files) or not: the
        // replicated state says, not whether the Raft store is new.
        if driver.core().state().imported_legacy {
            warn!(dir = %config.data_dir.display(), "the old single-node store was imported before; renaming its files now");
        } else if let Err(error) = driver.import(state).await {
            return stopped(&raft, error).await;
        } else {
            info!(dir = %config.data_dir.display(), "imported the single-node store of an earlier version into the Raft store");
        }
        if let Err(error) = legacy::retire(&config.data_dir) {
            return stopped(&raft, error).await;
        }
    }
    if alone && let Err(error) = driver.update_own_address().await {
        return stopped(&raft, error).await;
    }

    let handshakes = match crate::metrics::observe(metrics, &driver) {
        Ok(handshakes) => handshakes,
        Err(error) => return stopped(&raft, CoordinatorError::Config { message: error.to_string() }).await,
    };
    let admission = Admission::new(config.max_connections, config.max_connections_per_address);
    let serve = ServeLimits { request_timeout: config.request_timeout, ..ServeLimits::new(CONTROL_FRAME_LIMIT) };
    let limits = AcceptLimits { admission, serve };
    let accept = tokio::spawn(accept_loop(endpoint.clone(), Arc::clone(&driver), tls.clone(), handshakes, limits));
    let timer = tokio::spawn(timer_loop(Arc::clone(&driver)));
    let snapshots = tokio::spawn(snapshot_loop(raft.clone(), snapshot_requests));
    info!(%addr, node = config.node_id, "coordinator listening");
    Ok(CoordinatorHandle { addr, endpoint, driver, tasks: vec![accept, timer, snapshots], stopping: Mutex::new(None) })
}

/// Build a snapshot whenever the state machine says one is due (`raft::snapshot_due`): the
/// state machine cannot call into Raft itself, as it runs inside it.
async fn snapshot_loop(raft: Raft, requests: Arc<tokio::sync::Notify>) {
    loop {
        requests.notified().await;
        // A snapshot already being built makes openraft ignore this; the next entry asks again.
        if let Err(error) = raft.trigger().snapshot().await {
            debug!(%error, "Raft stopped: no more snapshots");
            return;
        }
    }
}

/// Refuse to start when `--peers` (or this node alone) disagrees with the membership the
/// store holds: the store wins, and the operator is told what it says.
async fn check_membership(
    raft: &Raft,
    config: &CoordinatorConfig,
    members: &BTreeMap<u64, String>,
    file: &StoreFile,
) -> Result<(), CoordinatorError> {
    // The metrics show the stored membership once Raft's core has loaded the store.
    let wait = raft.wait(Some(Duration::from_secs(2)));
    let loaded = wait.metrics(|metrics| metrics.membership_config.nodes().next().is_some(), "membership loaded").await;
    let stored = match loaded {
        Ok(metrics) => metrics.membership_config.clone(),
        Err(_) => raft.metrics().borrow().membership_config.clone(),
    };
    let stored_nodes: BTreeMap<u64, String> = stored.nodes().map(|(id, node)| (*id, node.addr.clone())).collect();
    if stored_nodes.is_empty() {
        return Ok(());
    }
    let stored_ids: BTreeSet<u64> = stored_nodes.keys().copied().collect();
    let given_ids: BTreeSet<u64> = members.keys().copied().collect();
    let alone = config.peers.is_empty();
    // Alone, the address may change between runs (a new port); in a cluster it must not.
    let agrees = if alone { stored_ids == given_ids || config.join } else { stored_nodes == *members || config.join };
    if !agrees {
        let describe = |nodes: &BTreeMap<u64, String>| nodes.iter().map(|(id, addr)| format!("{id}={addr}")).collect::<Vec<_>>().join(",");
        return Err(CoordinatorError::Cluster {
            message: format!(
                "the store {} says the cluster is {}, but {} was given: start with --peers {} (membership changes with \
                 `stoker cluster add-node`/`remove-node`, not with flags), or move the data directory away to start a new cluster",
                file.path().display(),
                describe(&stored_nodes),
                if alone { format!("no --peers (node {} alone)", config.node_id) } else { format!("--peers {}", describe(members)) },
                describe(&stored_nodes),
            ),
        });
    }
    if !stored_ids.contains(&config.node_id) && !config.join {
        warn!(node = config.node_id, "this node is not a member of the cluster its store knows: it was removed; it only listens");
    }
    Ok(())
}

/// A node id the cluster knows, started on an empty data directory, could vote twice in one
/// term (it forgot its vote): refuse it. Asked before this node serves anything, so a "joined"
/// record cannot be about this very start.
async fn refuse_a_reused_node_id(endpoint: &quinn::Endpoint, config: &CoordinatorConfig) -> Result<(), CoordinatorError> {
    for (id, addr) in config.peers.iter().filter(|(id, _)| **id != config.node_id) {
        let Some(status) = crate::peers::ask_status(endpoint, addr).await else { continue };
        if status.joined.contains(&config.node_id) {
            return Err(CoordinatorError::Cluster {
                message: format!(
                    "node {} took part in this cluster before (node {id} at {addr} says so), but {} is empty: a node \
                     that lost its data must not come back under its old id. Remove it (`stoker cluster remove-node {}`) \
                     and start this one with a new --node-id and --join, then `stoker cluster add-node`; or give it its \
                     old data directory",
                    config.node_id,
                    config.data_dir.display(),
                    config.node_id
                ),
            });
        }
    }
    Ok(())
}

/// Stop `raft` (closing the store) and fail with `error`.
async fn stopped<T>(raft: &Raft, error: CoordinatorError) -> Result<T, CoordinatorError> {
    let _ = raft.shutdown().await;
    Err(error)
}

fn shut_down(raft: &Raft) -> JoinHandle<()> {
    let raft = raft.clone();
    tokio::spawn(async move {
        let _ = raft.shutdown().await;
    })
}

/// What the accept loop holds connections to.
struct AcceptLimits {
    admission: Arc<Admission>,
    /// Shared by every connection (its memory budget is the node's).
    serve: ServeLimits,
}

async fn accept_loop(
    endpoint: quinn::Endpoint,
    driver: Arc<Driver>,
    tls: TlsConfigs,
    handshakes_refused: IntCounter,
    limits: AcceptLimits,
) {
    let checked = tls.is_checked();
    while let Some(incoming) = endpoint.accept().await {
        let remote = incoming.remote_address();
        // A peer first proves it receives at its address (a Retry round trip), so spoofed
        // addresses cannot take places; then, before the handshake, the limits: a refused
        // connection costs one packet and no cryptography.
        if !incoming.remote_address_validated() {
            let _ = incoming.retry();
            continue;
        }
        let Ok(admitted) = limits.admission.admit(remote.ip()) else {
            handshakes_refused.inc();
            incoming.refuse();
            continue;
        };
        let (driver, tls) = (Arc::clone(&driver), tls.clone());
        let (handshakes_refused, serve) = (handshakes_refused.clone(), limits.serve.clone());
        tokio::spawn(async move {
            let _admitted = admitted;
            let connection = match incoming.await {
                Ok(connection) => connection,
                Err(error) => {
                    debug!(%remote, %error, "handshake failed");
                    handshakes_refused.inc();
                    return;
                }
            };
            let Some(caller) = peer_identity(&connection, checked).map(Arc::new) else {
                warn!(%remote, "a peer passed the handshake without a readable certificate: closing");
                connection.close(1u32.into(), b"no certificate");
                return;
            };
            debug!(%remote, %caller, "connected");
            let open = connection.clone();
            serve_calls(connection, serve, move |request: ControlRequest| {
                let (driver, caller, tls, open) = (Arc::clone(&driver), Arc::clone(&caller), tls.clone(), open.clone());
                async move {
                    // A certificate revoked while its connection stays open is cut off here.
                    if tls.is_denied(&caller.key()) {
                        warn!(%caller, "refused a request: its certificate was revoked since it connected; closing the connection");
                        // Closed once this answer has had time to reach the peer.
                        tokio::spawn(async move {
                            tokio::time::sleep(Duration::from_secs(1)).await;
                            open.close(3u32.into(), b"certificate revoked");
                        });
                        return Err(RemoteError::new(ErrorCode::Forbidden, "this certificate is revoked (on the deny list)"));
                    }
                    driver.serve_as(&caller, request).await
                }
            })
            .await;
        });
    }
}

async fn timer_loop(driver: Arc<Driver>) {
    let mut interval = tokio::time::interval(TICK);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_flush = Instant::now();
    loop {
        interval.tick().await;
        // Once a second, or at once when an answer waits until its checkpoint is durable.
        let flush = last_flush.elapsed() >= CHECKPOINT_FLUSH || driver.core().flush_wanted();
        if flush {
            last_flush = Instant::now();
        }
        driver.tick(Instant::now(), flush).await;
    }
}

impl CoordinatorHandle {
    /// Where it listens.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The service behind the endpoint (for in-process callers and tests).
    pub fn core(&self) -> Arc<Coordinator> {
        self.driver.core()
    }

    /// The Raft node (for tests and metrics).
    pub fn raft(&self) -> Raft {
        self.driver.raft()
    }

    /// Whether this coordinator leads now.
    pub fn is_leader(&self) -> bool {
        self.driver.raft().metrics().borrow().state == openraft::ServerState::Leader
    }

    /// Index of the last entry in its Raft log (0 if none).
    pub fn last_log_index(&self) -> u64 {
        self.driver.raft().metrics().borrow().last_log_index.unwrap_or(0)
    }

    /// A test's partition switch (STYLE G12 `set_unreachable`): while set, this coordinator and
    /// its peers exchange no Raft messages, as if the network between coordinators were cut;
    /// clients still reach it (the case where a deposed leader must stop scheduling).
    pub fn set_isolated(&self, isolated: bool) {
        self.driver.set_isolated(isolated);
    }

    /// Index of the last entry purged from its log behind a snapshot (0 if none).
    pub fn last_purged_index(&self) -> u64 {
        self.driver.raft().metrics().borrow().purged.map_or(0, |log_id| log_id.index)
    }

    /// Commit `command` through Raft (this node must lead): for tools and tests that write
    /// the state directly.
    pub async fn commit(&self, command: crate::state::Command) -> Result<crate::state::Applied, RemoteError> {
        self.driver.propose(command).await
    }

    /// Stop serving: close every connection and the endpoint, and stop Raft.
    pub fn shutdown(&mut self) {
        self.endpoint.close(0u32.into(), b"coordinator shutting down");
        for task in self.tasks.drain(..) {
            task.abort();
        }
        let mut stopping = self.stopping.lock();
        if stopping.is_none() && tokio::runtime::Handle::try_current().is_ok() {
            *stopping = Some(shut_down(&self.driver.raft()));
        }
    }

    /// Wait until the endpoint is closed and Raft has stopped (its store is closed).
    pub async fn join(&self) {
        self.endpoint.wait_idle().await;
        let stopping = self.stopping.lock().take();
        if let Some(stopping) = stopping {
            let _ = stopping.await;
        }
    }
}

impl Drop for CoordinatorHandle {
    fn drop(&mut self) {
        self.shutdown();
    }
}
