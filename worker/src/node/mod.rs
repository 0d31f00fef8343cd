//! The worker service (DESIGN §5): registers with the coordinator, pulls chunks when it has
//! room, makes their batches with the pipeline, pushes each batch to its trainer on the
//! trainer's bulk connection (TLS over TCP, [`bulk_link`]) or as one QUIC stream
//! (`stoker_net::send_batch`), and reports each chunk done once every batch is
//! acknowledged.
//!
//! [`Node`] holds a worker's parts, each the owner of its state:
//! * [`registration`]: the id the coordinator gave it, heartbeat timings, when it last answered.
//! * [`trainers`]: trainer connections by (job, rank).
//! * [`ledger`]: the pure lease bookkeeping (what each lease owes, one report per lease).
//! * [`job_table`]: one pipeline ([`job_pipeline`]) per job, made and released without holding
//!   locks across IO, the datasets they read and the jobs refused here.
//!
//! The node's tasks: [`link`] (registration, heartbeats, pulls and reports; dispatch of finished
//! batches, over [`bulk_link`] or QUIC) and [`accept`] (trainer connections).

mod accept;
mod bulk_link;
mod config;
mod job_pipeline;
mod job_table;
pub mod ledger;
mod link;
mod registration;
mod trainers;

use std::collections::HashMap;
use std::net::{SocketAddr, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;
use stoker_net::bulk::BatchTransport;
use stoker_net::{Admission, Role, TlsConfigs, server_endpoint};
use stoker_obs::Metrics;
use stoker_plan::ids::LeaseId;
use stoker_proto::ControlRequest;
use stoker_proto::api::CoordinatorApi;
use stoker_store::ObjectStores;
use tokio::sync::{Notify, mpsc};
use tokio::task::JoinHandle;
use tracing::{info, warn};

pub use self::accept::bind_socket;
use self::accept::{accept_bulk, accept_trainers, batch_port, bulk_listener};
pub use self::config::{CacheConfig, WorkerConfig, default_batch_memory};
use self::job_table::JobTable;
use self::ledger::LeaseLedger;
use self::registration::Registration;
use self::trainers::Trainers;
use crate::cache::{Pins, ShardCache};
use crate::error::PipelineError;
use crate::metrics::WorkerMetrics;

/// A running worker's parts, shared by its tasks.
pub(crate) struct Node<A> {
    api: A,
    config: WorkerConfig,
    advertised: SocketAddr,
    registration: Registration,
    trainers: Trainers,
    /// Locked briefly: no call inside waits.
    ledger: Mutex<LeaseLedger>,
    /// Wakes the pull loop when a batch finished (room to pull).
    room: Notify,
    jobs: JobTable,
    /// The shard-cache pins of leases whose batches are still being made, with how many are.
    pins: Mutex<HashMap<LeaseId, (u32, Pins)>>,
    metrics: WorkerMetrics,
    stopping: AtomicBool,
}

/// A running worker.
pub struct WorkerHandle<A>
where
    A: CoordinatorApi,
{
    addr: SocketAddr,
    endpoint: quinn::Endpoint,
    node: Arc<Node<A>>,
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
    let stores = Arc::new(ObjectStores::new(config.store.clone(), config.object_roots.clone()));
    let cache_opt = match &config.cache_opt {
        Some(cache) => Some(
            ShardCache::open(&cache.dir, cache.capacity, Arc::clone(&stores), worker_metrics.cache.clone())
                .map_err(|error| PipelineError::Start(error.to_string()))?,
        ),
        None => None,
    };
    // Random for this worker (the one recipe for ids): its registrations replace only its own.
    let instance = stoker_net::random::random_u64();
    let node = Arc::new(Node {
        api,
        advertised: config.advertise.unwrap_or(addr),
        jobs: JobTable::new(config.clone(), made_tx, worker_metrics.pipeline.clone(), Arc::clone(&stores), cache_opt),
        pins: Mutex::new(HashMap::new()),
        config,
        registration: Registration::new(instance),
        trainers: Trainers::new(tls.clone(), bulk_listener.is_some()),
        ledger: Mutex::new(LeaseLedger::default()),
        room: Notify::new(),
        metrics: worker_metrics,
        stopping: AtomicBool::new(false),
    });
    observe(&node, metrics);
    // QUIC and bulk connections count against the same limits.
    let admission = Admission::new(node.config.max_connections, node.config.max_connections_per_address);
    let mut tasks = vec![
        tokio::spawn(accept_trainers(endpoint.clone(), tls.clone(), Arc::clone(&node), Arc::clone(&admission))),
        tokio::spawn(Arc::clone(&node).pull_loop()),
        tokio::spawn(Arc::clone(&node).heartbeat_loop()),
        tokio::spawn(Arc::clone(&node).dispatch_loop(made_rx)),
    ];
    if let Some(listener) = bulk_listener {
        tasks.push(tokio::spawn(accept_bulk(listener, tls.clone(), Arc::clone(&node), admission)));
    }
    info!(%addr, advertised = %node.advertised, threads = node.config.threads, "worker listening");
    Ok(WorkerHandle { addr, endpoint, node, tasks })
}

/// Read the stage depths at each scrape, and answer readiness: registered.
fn observe<A>(node: &Arc<Node<A>>, metrics: &Metrics)
where
    A: CoordinatorApi,
{
    let weak = Arc::downgrade(node);
    metrics.on_scrape(move || {
        let Some(node) = weak.upgrade() else { return };
        let observed = &node.metrics;
        let (leases, making, outstanding) = {
            let ledger = node.ledger.lock();
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
        depth("free_slots", node.config.in_flight.saturating_sub(outstanding) as i64);
        observed.trainer_connections.set(node.trainers.open() as i64);
        observed.bulk_connections.set(node.trainers.bulk_open() as i64);
        observed.registered.set(i64::from(node.registration.linked().is_ok()));
        if let Some(cache) = node.jobs.cache() {
            observed.cache.bytes.set(cache.held() as i64);
            let counters = cache.stores().counters();
            let catch_up = |outcome: &str, total: u64| {
                let counter = observed.cache.requests.with_label_values(&[outcome]);
                counter.inc_by(total.saturating_sub(counter.get()));
            };
            catch_up("ok", counters.requests_ok.load(Ordering::Relaxed));
            catch_up("retried", counters.retries.load(Ordering::Relaxed));
            catch_up("failed", counters.requests_failed.load(Ordering::Relaxed));
        }
    });
    let weak = Arc::downgrade(node);
    metrics.set_readiness(move || weak.upgrade().map_or_else(|| Err("stopped".to_owned()), |node| node.registration.linked()));
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
        self.node.ledger.lock().outstanding()
    }

    /// Job pipelines this worker holds now (released when idle or ended).
    pub fn job_pipelines(&self) -> usize {
        self.node.jobs.len()
    }

    /// Batches pushed and acknowledged so far.
    pub fn batches_pushed(&self) -> u64 {
        self.node.metrics.batches.get()
    }

    /// Of [`Self::batches_pushed`], those delivered on bulk connections.
    pub fn bulk_batches_pushed(&self) -> u64 {
        self.node.metrics.bulk_batches.get()
    }

    /// Bulk connections open now.
    pub fn bulk_connections(&self) -> usize {
        self.node.trainers.bulk_open()
    }

    /// Close every bulk connection at once, as a network fault would (for fault tests).
    #[doc(hidden)]
    pub fn break_bulk_connections(&self) {
        self.node.trainers.close_all_bulk("broken on purpose (a fault test)");
    }

    /// Trainer connections open now.
    pub fn trainers(&self) -> usize {
        self.node.trainers.count()
    }

    /// Trainer connections not closed by either end.
    pub fn open_trainers(&self) -> usize {
        self.node.trainers.open()
    }

    /// Leave gracefully: stop pulling, hand the leases back to the coordinator, close.
    pub async fn shutdown(mut self) {
        self.node.stopping.store(true, Ordering::Release);
        if let Some(worker) = self.node.registration.current() {
            let request = ControlRequest::Deregister { worker };
            if let Err(error) = self.node.api.call(request).await {
                warn!(%error, "could not hand leases back; they will expire");
            }
        }
        self.stop();
    }

    /// Stop at once without telling anyone, as a crash would (for fault tests).
    pub fn kill(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        self.node.stopping.store(true, Ordering::Release);
        for task in self.tasks.drain(..) {
            task.abort();
        }
        self.endpoint.close(0u32.into(), b"worker stopping");
        self.node.jobs.clear();
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
