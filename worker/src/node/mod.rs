//! The worker service (DESIGN §5): registers with the coordinator, pulls chunks when it has
//! room, makes their batches with the pipeline, pushes each batch to its trainer on the
//! trainer's bulk connection (TLS over TCP, [`bulk_link`]) or as one QUIC stream
//! (`stoker_net::send_batch`), and reports each chunk done once every batch is
//! acknowledged.
//!
//! * [`trainers`]: trainer connections by (job, rank).
//! * [`bulk_link`]: sending on a trainer's bulk connection.
//! * [`jobs`]: one pipeline per job, made and released without holding locks across IO.
//! * [`ledger`]: the pure lease bookkeeping (what each lease owes, one report per lease).
//! * [`link`]: registration, heartbeats, pulls and reports; dispatch of finished batches.

mod bulk_link;
mod jobs;
pub mod ledger;
mod link;
mod trainers;

use std::collections::HashMap;
use std::net::{SocketAddr, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use stoker_format::DatasetRoots;
use stoker_net::bulk::{self, BatchTransport};
use stoker_net::{
    Admission, DEFAULT_MAX_CONNECTIONS, DEFAULT_MAX_CONNECTIONS_PER_ADDRESS, Role, TlsConfigs, Tuning, accept_with_tuning, server_endpoint,
};
use stoker_obs::Metrics;
use stoker_proto::TrainerHello;
use stoker_proto::api::CoordinatorApi;
use tokio::sync::{Notify, mpsc};
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};

use self::jobs::{DatasetSlot, JobKey, JobSlot, Made};
use self::ledger::LeaseLedger;
use self::trainers::Trainers;
use crate::error::PipelineError;
use crate::metrics::WorkerMetrics;

/// How a worker runs.
#[derive(Clone, Debug)]
pub struct WorkerConfig {
    /// Decode threads per job pipeline.
    pub threads: usize,
    /// Batches being made or delivered at once; the worker pulls work only below this.
    pub in_flight: usize,
    /// Address trainers use to reach this worker [default: the socket's address].
    pub advertise: Option<SocketAddr>,
    /// How long a batch waits for its trainer to connect before its chunk is failed.
    pub trainer_patience: Duration,
    /// How long one batch's delivery may take (until the trainer acknowledged every byte)
    /// before it is failed and made again: a trainer that stopped reading does not hold the
    /// worker's slots forever.
    pub delivery_timeout: Duration,
    /// A job's pipeline (threads, batch buffers, mapped dataset) is released after this long
    /// without work here, and at once when the coordinator no longer lists the job as live.
    pub job_idle: Duration,
    /// QUIC transport settings (the largest UDP payload).
    pub tuning: Tuning,
    /// Bytes of batch buffers one job's pipeline may hold (its batches in flight × one
    /// batch's bytes). A job whose batches are large gets fewer buffers; a job two batches of
    /// which do not fit is refused here (reported stuck, so other workers make it), with this
    /// named in the log.
    pub max_batch_memory: u64,
    /// Time every sample and batch into the metrics (`stoker_worker_decode_seconds`,
    /// `stoker_worker_batch_make_seconds`); off only to measure what that costs.
    pub time_samples: bool,
    /// Folders datasets must be in (`--dataset-root`): a job whose manifest or shards are
    /// elsewhere is refused here (logged, reported stuck) before anything of it is read.
    pub dataset_roots: DatasetRoots,
    /// The most trainer connections open at once, handshakes included (`--max-connections`).
    pub max_connections: usize,
    /// The most from one IP address (`--max-connections-per-address`).
    pub max_connections_per_address: usize,
    /// Called on the blocking thread just before a dataset is opened. Tests make it block, as
    /// a hung network file system would (a FIFO no longer can: dataset files are opened only
    /// if regular); `None` in every real worker.
    #[doc(hidden)]
    pub before_dataset_open: Option<fn(&std::path::Path)>,
    /// How batches go out (`--batch-transport`): with [`BatchTransport::Tcp`] the worker also
    /// listens on TCP at its address's port for trainers' bulk connections.
    pub batch_transport: BatchTransport,
}

impl WorkerConfig {
    /// Defaults for `threads` decode threads: twice as many batches in flight (at least 4), 3 s
    /// trainer patience, 30 s delivery timeout, pipelines released after 60 s idle.
    pub fn new(threads: usize) -> Self {
        let threads = threads.max(1);
        Self {
            threads,
            in_flight: (2 * threads).max(4),
            advertise: None,
            trainer_patience: Duration::from_secs(3),
            delivery_timeout: Duration::from_secs(30),
            job_idle: Duration::from_secs(60),
            tuning: Tuning::default(),
            max_batch_memory: default_batch_memory(),
            time_samples: true,
            dataset_roots: DatasetRoots::anywhere(),
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_connections_per_address: DEFAULT_MAX_CONNECTIONS_PER_ADDRESS,
            before_dataset_open: None,
            batch_transport: BatchTransport::Tcp,
        }
    }
}

/// Half the memory this process may use: the machine's (`/proc/meminfo`) or its container's
/// limit (cgroup v2 `memory.max`, v1 `memory.limit_in_bytes`), whichever is less; 8 GiB where
/// neither can be read. What a job's batch buffers may take by default.
pub fn default_batch_memory() -> u64 {
    let machine = std::fs::read_to_string("/proc/meminfo").ok().and_then(|text| {
        text.lines().find_map(|line| line.strip_prefix("MemTotal:")?.trim().strip_suffix("kB")?.trim().parse::<u64>().ok())
    });
    let container = ["/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"]
        .iter()
        .find_map(|path| std::fs::read_to_string(path).ok()?.trim().parse::<u64>().ok());
    let limit = match (machine.map(|kib| kib.saturating_mul(1024)), container) {
        (Some(machine), Some(container)) => machine.min(container),
        (Some(bytes), None) | (None, Some(bytes)) => bytes,
        (None, None) => 16 << 30,
    };
    limit / 2
}

/// How many batch buffers of `batch_bytes` a job's pipeline gets: `in_flight`, fewer if they
/// would not fit in `budget`, none if a single batch does not.
pub(crate) fn buffers_within(budget: u64, batch_bytes: u64, in_flight: usize) -> usize {
    usize::try_from(budget / batch_bytes.max(1)).unwrap_or(usize::MAX).min(in_flight)
}

/// State shared by the worker's tasks.
pub(crate) struct Shared<A> {
    api: A,
    config: WorkerConfig,
    advertised: SocketAddr,
    /// Our worker id from the coordinator; 0 while unregistered.
    worker: AtomicU64,
    /// Random for this worker: its registrations replace only its own earlier ones.
    instance: u64,
    /// Registrations asked for so far.
    register_attempts: AtomicU64,
    heartbeat_millis: AtomicU64,
    /// A job's pipeline counts as stuck after this long without making anything of the work
    /// it holds (half the coordinator's lease stall timeout; see `LeaseLedger::job_stuck`).
    stuck_after_millis: AtomicU64,
    trainers: Trainers,
    ledger: std::sync::Mutex<LeaseLedger>,
    room: Notify,
    jobs: std::sync::Mutex<HashMap<JobKey, JobSlot>>,
    /// Datasets by (manifest path, version).
    datasets: std::sync::Mutex<HashMap<(String, u64), DatasetSlot>>,
    made_tx: mpsc::Sender<Made>,
    metrics: WorkerMetrics,
    /// Jobs whose batches do not fit this worker's batch memory, or whose data is outside its
    /// `--dataset-root`: reported stuck with every heartbeat, so that the coordinator grants
    /// them to other workers.
    pub(crate) unmakeable: std::sync::Mutex<std::collections::BTreeSet<stoker_plan::ids::JobId>>,
    /// When the coordinator last answered a registration or heartbeat (for readiness).
    heard_at: std::sync::Mutex<Option<std::time::Instant>>,
    stopping: AtomicBool,
}

/// A running worker.
pub struct WorkerHandle<A>
where
    A: CoordinatorApi,
{
    addr: SocketAddr,
    endpoint: quinn::Endpoint,
    shared: Arc<Shared<A>>,
    tasks: Vec<JoinHandle<()>>,
}

impl<A> std::fmt::Debug for WorkerHandle<A>
where
    A: CoordinatorApi,
{
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("WorkerHandle").field("addr", &self.addr).finish_non_exhaustive()
    }
}

/// Start a worker that serves trainers on `socket` and takes work from `api`, counting into
/// `metrics` (and answering its readiness: registered with the coordinator). Must run inside
/// a tokio runtime.
pub fn start<A>(
    config: WorkerConfig,
    socket: UdpSocket,
    tls: &TlsConfigs,
    api: A,
    metrics: &Metrics,
) -> Result<WorkerHandle<A>, PipelineError>
where
    A: CoordinatorApi,
{
    match tls.own() {
        Some(own) if own.role != Role::Worker => {
            return Err(PipelineError::Start(format!("the certificate in --tls-dir is {own}; a worker needs the worker role")));
        }
        Some(own) => info!(%own, "mutual TLS: trainers need a certificate of the cluster CA"),
        None => warn!("INSECURE: --insecure: any peer that reaches this worker may take batches; use it on a trusted network only"),
    }
    let worker_metrics = WorkerMetrics::register(metrics).map_err(|error| PipelineError::Start(error.to_string()))?;
    worker_metrics.threads.set(config.threads as i64);
    let addr = socket.local_addr().map_err(|error| PipelineError::Start(format!("socket has no address: {error}")))?;
    let bulk_listener = match config.batch_transport {
        BatchTransport::Tcp => Some(bulk_listener(addr)?),
        BatchTransport::Quic => None,
    };
    let endpoint = server_endpoint(socket, tls, batch_port(config.tuning)).map_err(|error| PipelineError::Start(error.to_string()))?;
    let (made_tx, made_rx) = mpsc::channel(config.in_flight.max(1));
    let shared = Arc::new(Shared {
        api,
        advertised: config.advertise.unwrap_or(addr),
        config,
        worker: AtomicU64::new(0),
        instance: std::hash::BuildHasher::hash_one(
            &std::hash::RandomState::new(),
            (std::process::id(), addr, std::time::SystemTime::now()),
        ),
        register_attempts: AtomicU64::new(0),
        heartbeat_millis: AtomicU64::new(500),
        stuck_after_millis: AtomicU64::new(30_000),
        trainers: Trainers::new(tls.clone(), bulk_listener.is_some()),
        ledger: std::sync::Mutex::new(LeaseLedger::default()),
        room: Notify::new(),
        jobs: std::sync::Mutex::new(HashMap::new()),
        datasets: std::sync::Mutex::new(HashMap::new()),
        made_tx,
        metrics: worker_metrics,
        heard_at: std::sync::Mutex::new(None),
        unmakeable: std::sync::Mutex::default(),
        stopping: AtomicBool::new(false),
    });
    observe(&shared, metrics);
    // QUIC and bulk connections count against the same limits.
    let admission = Admission::new(shared.config.max_connections, shared.config.max_connections_per_address);
    let mut tasks = vec![
        tokio::spawn(accept_trainers(endpoint.clone(), tls.clone(), Arc::clone(&shared), Arc::clone(&admission))),
        tokio::spawn(link::pull_loop(Arc::clone(&shared))),
        tokio::spawn(link::heartbeat_loop(Arc::clone(&shared))),
        tokio::spawn(link::dispatch_loop(Arc::clone(&shared), made_rx)),
    ];
    if let Some(listener) = bulk_listener {
        tasks.push(tokio::spawn(accept_bulk(listener, tls.clone(), Arc::clone(&shared), admission)));
    }
    info!(%addr, advertised = %shared.advertised, threads = shared.config.threads, "worker listening");
    Ok(WorkerHandle { addr, endpoint, shared, tasks })
}

/// Read the stage depths at each scrape, and answer readiness: registered.
fn observe<A>(shared: &Arc<Shared<A>>, metrics: &Metrics)
where
    A: CoordinatorApi,
{
    let weak = Arc::downgrade(shared);
    metrics.on_scrape(move || {
        let Some(shared) = weak.upgrade() else { return };
        let observed = &shared.metrics;
        let (leases, making, outstanding) = {
            let ledger = link::ledger(&shared);
            (ledger.leases(), ledger.in_pipelines(), ledger.outstanding())
        };
        // Deliveries in progress, also of leases revoked meanwhile (their batches still travel).
        let awaiting = observed.awaiting_trainer.get().max(0);
        let delivering = observed.delivering.get().max(0);
        let depth = |stage: &str, value: i64| observed.queue_depth.with_label_values(&[stage]).set(value);
        depth("chunks", leases as i64);
        depth("making", making as i64);
        depth("awaiting_trainer", awaiting);
        depth("delivering", delivering);
        depth("free_slots", shared.config.in_flight.saturating_sub(outstanding) as i64);
        observed.trainer_connections.set(shared.trainers.open() as i64);
        observed.bulk_connections.set(shared.trainers.bulk_open() as i64);
        observed.registered.set(i64::from(linked(&shared).is_ok()));
    });
    let weak = Arc::downgrade(shared);
    metrics.set_readiness(move || weak.upgrade().map_or_else(|| Err("stopped".to_owned()), |shared| linked(&shared)));
}

/// Whether the worker is registered and the coordinator answered it lately (within three
/// heartbeats, at least 3 s): what readiness and `stoker_worker_registered` say.
fn linked<A>(shared: &Shared<A>) -> Result<(), String>
where
    A: CoordinatorApi,
{
    if shared.worker.load(Ordering::Acquire) == 0 {
        return Err("not registered with the coordinator yet".to_owned());
    }
    let within = Duration::from_millis(3 * shared.heartbeat_millis.load(Ordering::Acquire)).max(Duration::from_secs(3));
    match *shared.heard_at.lock().unwrap_or_else(std::sync::PoisonError::into_inner) {
        Some(at) if at.elapsed() <= within => Ok(()),
        _ => Err(format!("the coordinator has not answered for over {within:?}")),
    }
}

/// A batch port's transport: batches go out with `tuning`'s windows; what comes in is one
/// hello per connection, so peers get small windows, a few request streams and no
/// unidirectional ones.
fn batch_port(tuning: Tuning) -> Tuning {
    Tuning { receives_batches: false, max_bidi_streams: 4, ..tuning }
}

/// Accept trainer connections, each with the transport its path allows: batches to a trainer
/// on this host go in the largest datagrams loopback carries.
async fn accept_trainers<A>(endpoint: quinn::Endpoint, tls: TlsConfigs, shared: Arc<Shared<A>>, admission: Arc<Admission>)
where
    A: CoordinatorApi,
{
    while let Some(incoming) = endpoint.accept().await {
        // Addresses proven first (a Retry round trip), then the limits, before the handshake.
        if !incoming.remote_address_validated() {
            let _ = incoming.retry();
            continue;
        }
        let Ok(admitted) = admission.admit(incoming.remote_address().ip()) else {
            shared.metrics.handshakes_refused.inc();
            incoming.refuse();
            continue;
        };
        let connecting = match accept_with_tuning(incoming, &tls, batch_port(shared.config.tuning)) {
            Ok(connecting) => connecting,
            Err(error) => {
                debug!(%error, "cannot accept a connection");
                shared.metrics.handshakes_refused.inc();
                continue;
            }
        };
        let (shared, tls) = (Arc::clone(&shared), tls.clone());
        tokio::spawn(async move {
            match connecting.await {
                Ok(connection) => match tls.peer(&connection) {
                    Some(peer) => {
                        shared.trainers.accept(connection.clone(), peer).await;
                        // The connection counts against the limits until it closes.
                        connection.closed().await;
                        shared.trainers.closed(&connection);
                        drop(admitted);
                    }
                    None => {
                        warn!(remote = %connection.remote_address(), "a peer passed the handshake without a readable certificate: closing");
                        connection.close(1u32.into(), b"no certificate");
                    }
                },
                Err(error) => {
                    debug!(%error, "trainer handshake failed");
                    shared.metrics.handshakes_refused.inc();
                }
            }
        });
    }
}

/// The UDP socket a worker serves trainers on, at `listen`. With `port 0` and bulk connections
/// (`BatchTransport::Tcp`), a port whose number is free on TCP too, where the worker will
/// listen for them.
pub fn bind_socket(listen: SocketAddr, transport: BatchTransport) -> std::io::Result<UdpSocket> {
    if listen.port() != 0 || transport == BatchTransport::Quic {
        return UdpSocket::bind(listen);
    }
    for _ in 0..100 {
        let socket = UdpSocket::bind(listen)?;
        let port = socket.local_addr()?.port();
        if std::net::TcpListener::bind(SocketAddr::new(listen.ip(), port)).is_ok() {
            return Ok(socket);
        }
    }
    Err(std::io::Error::new(std::io::ErrorKind::AddrInUse, format!("no port on {} is free on both UDP and TCP", listen.ip())))
}

/// The TCP listener of bulk connections, at the port of the QUIC socket.
fn bulk_listener(addr: SocketAddr) -> Result<tokio::net::TcpListener, PipelineError> {
    let refused = |error: std::io::Error| {
        PipelineError::Start(format!(
            "cannot listen on TCP {addr} for trainers' bulk connections: {error} (free that TCP port, or send batches over QUIC \
             only with --batch-transport quic)"
        ))
    };
    let listener = std::net::TcpListener::bind(addr).map_err(refused)?;
    listener.set_nonblocking(true).map_err(refused)?;
    tokio::net::TcpListener::from_std(listener).map_err(refused)
}

/// Bulk connections in their TLS handshake and hello at once: before its certificate is
/// checked, a TCP connection costs only this many places, not the node's connection slots.
const BULK_HANDSHAKES: usize = 256;
/// How long a bulk connection may take to finish its handshake and hello.
const BULK_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// Accept trainers' bulk connections: within the connection limits and [`BULK_HANDSHAKES`], a
/// TLS handshake and a hello within [`BULK_HANDSHAKE_TIMEOUT`], from a trainer certificate that
/// holds a QUIC connection of the same (job, rank) and session here.
async fn accept_bulk<A>(listener: tokio::net::TcpListener, tls: TlsConfigs, shared: Arc<Shared<A>>, admission: Arc<Admission>)
where
    A: CoordinatorApi,
{
    let handshakes = Arc::new(tokio::sync::Semaphore::new(BULK_HANDSHAKES));
    loop {
        let (stream, remote) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(error) => {
                // Out of file descriptors, say: wait instead of spinning.
                warn!(%error, "cannot accept a bulk connection");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(handshake) = Arc::clone(&handshakes).try_acquire_owned() else {
            shared.metrics.handshakes_refused.inc();
            continue;
        };
        let Ok(admitted) = admission.admit(remote.ip()) else {
            shared.metrics.handshakes_refused.inc();
            continue;
        };
        let (shared, tls) = (Arc::clone(&shared), tls.clone());
        tokio::spawn(async move {
            let attached = tokio::time::timeout(BULK_HANDSHAKE_TIMEOUT, attach_bulk(stream, &tls, &shared)).await;
            drop(handshake);
            let link = match attached {
                Ok(Ok(link)) => link,
                Ok(Err(error)) => {
                    debug!(%remote, %error, "bulk connection refused");
                    shared.metrics.handshakes_refused.inc();
                    return;
                }
                Err(_) => {
                    warn!(%remote, "no bulk handshake and hello within {BULK_HANDSHAKE_TIMEOUT:?}: closing (a slow or stalled peer)");
                    shared.metrics.handshakes_refused.inc();
                    return;
                }
            };
            // Counts against the limits until it closes.
            link.closed().await;
            drop(admitted);
        });
    }
}

/// Handshake, hello, answer: the link, joined to its trainer's QUIC connection.
async fn attach_bulk<A>(stream: tokio::net::TcpStream, tls: &TlsConfigs, shared: &Shared<A>) -> Result<Arc<bulk_link::BulkLink>, String>
where
    A: CoordinatorApi,
{
    let mut connection = bulk::accept(stream, tls).await.map_err(|error| error.to_string())?;
    if !connection.peer.is(Role::Trainer) {
        return Err(format!("{} is not a trainer: only trainer certificates may receive batches", connection.peer));
    }
    let hello: TrainerHello = connection.reader.read_frame(bulk::HELLO_FRAME_LIMIT).await.map_err(|error| error.to_string())?;
    let (key, peer) = (connection.peer.key(), connection.peer.to_string());
    // The link starts only once the hello is answered: nothing else may precede the answer.
    let (answer, link_result) = match shared.trainers.can_attach_bulk(&hello, key) {
        Ok(()) => (Ok(()), Ok(())),
        Err(error) => (Err(error.clone()), Err(error.to_string())),
    };
    connection.writer.write_frame(&answer, bulk::HELLO_FRAME_LIMIT).await.map_err(|error| error.to_string())?;
    link_result?;
    let link = bulk_link::BulkLink::start(connection);
    shared.trainers.attach_bulk(&hello, key, &link).map_err(|error| error.to_string())?;
    info!(job = %hello.job, rank = %hello.rank, session = %hello.session, %peer, "trainer bulk connection");
    Ok(link)
}

impl<A> WorkerHandle<A>
where
    A: CoordinatorApi,
{
    /// Where trainers connect.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Batches being made or delivered now.
    pub fn outstanding_batches(&self) -> usize {
        link::ledger(&self.shared).outstanding()
    }

    /// Job pipelines this worker holds now (released when idle or ended).
    pub fn job_pipelines(&self) -> usize {
        self.shared.jobs.lock().unwrap_or_else(std::sync::PoisonError::into_inner).len()
    }

    /// Batches pushed and acknowledged so far.
    pub fn batches_pushed(&self) -> u64 {
        self.shared.metrics.batches.get()
    }

    /// Of [`Self::batches_pushed`], those delivered on bulk connections.
    pub fn bulk_batches_pushed(&self) -> u64 {
        self.shared.metrics.bulk_batches.get()
    }

    /// Bulk connections open now.
    pub fn bulk_connections(&self) -> usize {
        self.shared.trainers.bulk_open()
    }

    /// Close every bulk connection at once, as a network fault would (for fault tests).
    #[doc(hidden)]
    pub fn break_bulk_connections(&self) {
        self.shared.trainers.close_all_bulk("broken on purpose (a fault test)");
    }

    /// Trainer connections open now.
    pub fn trainers(&self) -> usize {
        self.shared.trainers.count()
    }

    /// Leave gracefully: stop pulling, hand the leases back to the coordinator, close.
    pub async fn shutdown(mut self) {
        self.shared.stopping.store(true, Ordering::Release);
        let worker = self.shared.worker.load(Ordering::Acquire);
        if worker != 0 {
            let request = stoker_proto::ControlRequest::Deregister { worker: stoker_plan::ids::WorkerId(worker) };
            if let Err(error) = self.shared.api.call(request).await {
                tracing::warn!(%error, "could not hand leases back; they will expire");
            }
        }
        self.stop();
    }

    /// Stop at once without telling anyone, as a crash would (for fault tests).
    pub fn kill(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        self.shared.stopping.store(true, Ordering::Release);
        for task in self.tasks.drain(..) {
            task.abort();
        }
        self.endpoint.close(0u32.into(), b"worker stopping");
        self.shared.jobs.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clear();
    }
}

impl<A> Drop for WorkerHandle<A>
where
    A: CoordinatorApi,
{
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::buffers_within;

    #[test]
    fn large_batches_get_fewer_buffers_and_one_over_the_budget_none() {
        assert_eq!(buffers_within(1000, 100, 4), 4, "room for 10: in-flight's 4");
        assert_eq!(buffers_within(250, 100, 4), 2);
        assert_eq!(buffers_within(150, 100, 4), 1);
        assert_eq!(buffers_within(99, 100, 4), 0, "one batch does not fit");
        assert_eq!(buffers_within(u64::MAX, 0, 4), 4);
    }
}
