//! How a trainer rank reaches the cluster: attach to its job through the coordinator, dial
//! every worker as it appears (QUIC, plus a bulk connection where batches come over TCP) and
//! dial again when a connection is lost, and the calls to the coordinator made on the
//! loader's runtime.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use parking_lot::Mutex;
use quinn::{Connection, Endpoint};
use stoker_net::bulk::BatchTransport;
use stoker_net::random::random_u64;
use stoker_net::{NetError, PayloadPool, SUPERSEDED_CLOSE_CODE, TlsConfigs, Tuning, client_endpoint};
use stoker_plan::ShardTable;
use stoker_plan::ids::{CertKey, WorkerId};
use stoker_plan::transform::Recipe;
use stoker_proto::api::CoordinatorApi;
use stoker_proto::expect_response;
use stoker_proto::{ControlRequest, ControlResponse, ErrorCode, JobSpec, RemoteError, WorkerInfo};
use tokio::runtime::Runtime;
use tokio::sync::{mpsc, watch};
use tracing::{debug, info, warn};

use crate::batch::{HeldCount, ReceivedBatch};
use crate::config::LoaderConfig;
use crate::dial_backoff::DialBackoff;
use crate::error::ClientError;
use crate::receive::{Expect, PlanBook, ReceiveStats, bulk_loop, connect_worker, receive_loop};
use crate::session::{Progress, Session, report_progress};

/// Dials workers as they appear.
pub(crate) struct Connector {
    pub(crate) endpoint: Endpoint,
    /// For bulk connections; `None` receives over QUIC only.
    bulk_tls: Option<TlsConfigs>,
    expect: Expect,
    /// Workers dialled: `None` while the dial is under way.
    connected: Mutex<HashMap<WorkerId, Option<Connection>>>,
    /// Dials by address: one at a time, spaced out after failures.
    backoff: Mutex<DialBackoff>,
    /// The trainer's TLS: its deny list is asked about every connected worker.
    tls: TlsConfigs,
    /// Each connected worker's certificate, and since when the coordinator no longer lists it.
    listing: Mutex<HashMap<WorkerId, (CertKey, Option<std::time::Instant>)>>,
    batches_tx: mpsc::UnboundedSender<ReceivedBatch>,
    pub(crate) stats: Arc<ReceiveStats>,
    pub(crate) pool: PayloadPool,
    /// Set when a worker closes our connection because a newer trainer of this rank connected.
    superseded: Arc<std::sync::atomic::AtomicBool>,
}

impl Connector {
    /// Connect to the workers in `workers` (every worker the coordinator lists now) that we
    /// have no live connection to, and close the connections to workers whose certificate is
    /// revoked (this trainer's deny list) or that the coordinator has not listed for
    /// [`UNLISTED_GRACE`] (revoked there, or gone): nothing more is taken from them (issue 31,
    /// item 3).
    pub(crate) fn connect_new(self: &Arc<Self>, workers: &[WorkerInfo]) {
        self.cut_revoked_and_unlisted(workers);
        let mut connected = self.connected.lock();
        connected.retain(|_, connection_opt| connection_opt.as_ref().is_none_or(|connection| connection.close_reason().is_none()));
        let now = std::time::Instant::now();
        for worker in workers {
            if connected.contains_key(&worker.id) || !self.backoff.lock().start(worker.addr, now) {
                continue;
            }
            connected.insert(worker.id, None);
            let this = Arc::clone(self);
            let worker = *worker;
            tokio::spawn(async move {
                match connect_worker(&this.endpoint, worker, &this.expect, this.bulk_tls.is_some()).await {
                    Ok(connection) => {
                        debug!(worker = %worker.id, addr = %worker.addr, "connected to worker");
                        this.backoff.lock().connected(worker.addr);
                        this.listing.lock().insert(worker.id, (worker.key, None));
                        this.connected.lock().insert(worker.id, Some(connection.clone()));
                        if let Some(tls) = &this.bulk_tls {
                            tokio::spawn(bulk_loop(
                                connection.clone(),
                                worker,
                                tls.clone(),
                                this.expect.clone(),
                                this.batches_tx.clone(),
                                Arc::clone(&this.stats),
                                this.pool.clone(),
                            ));
                        }
                        receive_loop(
                            connection.clone(),
                            this.expect.clone(),
                            this.batches_tx.clone(),
                            Arc::clone(&this.stats),
                            this.pool.clone(),
                        )
                        .await;
                        if let Some(quinn::ConnectionError::ApplicationClosed(close)) = connection.close_reason()
                            && close.error_code == quinn::VarInt::from_u32(SUPERSEDED_CLOSE_CODE)
                        {
                            info!(worker = %worker.id, "a newer trainer attached as this rank; this loader stops");
                            this.superseded.store(true, Ordering::Release);
                        }
                    }
                    Err(error @ (NetError::Refused { .. } | NetError::WrongPeer { .. } | NetError::Tls(_))) => {
                        warn!(worker = %worker.id, addr = %worker.addr, %error, "refused a worker's certificate, or it refused ours: no batches from it");
                        this.connected.lock().remove(&worker.id);
                        this.backoff.lock().failed(worker.addr, std::time::Instant::now(), random_u64());
                    }
                    Err(error) => {
                        debug!(worker = %worker.id, %error, "cannot connect to worker");
                        this.connected.lock().remove(&worker.id);
                        this.backoff.lock().failed(worker.addr, std::time::Instant::now(), random_u64());
                    }
                }
            });
        }
    }
}

/// How long a connected worker may go unlisted by the coordinator before its connection is
/// closed: a worker whose heartbeat is late for a moment keeps its connection.
const UNLISTED_GRACE: Duration = Duration::from_secs(3);

impl Connector {
    fn cut_revoked_and_unlisted(&self, workers: &[WorkerInfo]) {
        let now = std::time::Instant::now();
        let mut cut = Vec::new();
        {
            let mut listing = self.listing.lock();
            listing.retain(|id, (key, unlisted_since)| {
                let revoked = self.tls.is_denied(key);
                let listed = workers.iter().any(|worker| worker.id == *id);
                *unlisted_since = if listed { None } else { Some(unlisted_since.unwrap_or(now)) };
                let gone = unlisted_since.is_some_and(|since| now.saturating_duration_since(since) >= UNLISTED_GRACE);
                if revoked || gone {
                    cut.push((*id, if revoked { "its certificate is revoked" } else { "the coordinator no longer lists it" }));
                }
                !(revoked || gone)
            });
        }
        let mut connected = self.connected.lock();
        for (worker, why) in cut {
            if let Some(Some(connection)) = connected.remove(&worker) {
                warn!(%worker, reason = why, "closing the connection to a worker: nothing more is taken from it");
                connection.close(6u32.into(), why.as_bytes());
            }
        }
    }
}

/// What attaching to a job gave a rank: its session, the job, and the receiving side.
pub(crate) struct Attachment<A> {
    pub(crate) coordinator: Arc<A>,
    pub(crate) session: Session,
    pub(crate) spec: JobSpec,
    pub(crate) table: Arc<ShardTable>,
    pub(crate) connector: Arc<Connector>,
    pub(crate) batches_rx: mpsc::UnboundedReceiver<ReceivedBatch>,
    /// The rank's standing, for the reporter on the runtime.
    pub(crate) progress_tx: watch::Sender<Option<Progress>>,
}

/// How long a dropped loader waits for the coordinator to acknowledge its detach.
const DETACH_TIMEOUT: Duration = Duration::from_millis(500);

impl<A> Attachment<A>
where
    A: CoordinatorApi,
{
    /// Tell the coordinator this rank's trainer stopped (its last totals first: wait seconds,
    /// batches, samples) and close the worker connections, best effort and briefly.
    pub(crate) fn detach(&self, runtime: &Runtime, (wait_seconds, batches, samples): (f64, u64, u64)) {
        let session = self.session.clone();
        let detach = (!session.superseded.load(Ordering::Acquire)).then_some(ControlRequest::Detach {
            job: session.job,
            rank: session.rank,
            session: session.session,
        });
        let last_report = self.progress_tx.borrow().as_ref().map(|progress| ControlRequest::ReportProgress {
            job: session.job,
            rank: session.rank,
            epoch: progress.report.run.0,
            start: progress.report.run.1,
            consumed: progress.report.consumed,
            wait_seconds,
            batches,
            samples,
            session: session.session,
            pass: progress.report.pass,
            missing: Vec::new(),
            workers_version: 0,
        });
        let coordinator = Arc::clone(&self.coordinator);
        let endpoint = self.connector.endpoint.clone();
        let goodbye = runtime.spawn(async move {
            // After any report in flight; none goes out after it (the coordinator would take the
            // trainer for alive again).
            // The wait for the turn, the last report and the detach: each at most DETACH_TIMEOUT.
            let detached = tokio::time::timeout(3 * DETACH_TIMEOUT, async {
                let mut turn = session.turn().await;
                *turn = true;
                if let Some(request) = detach {
                    // The rank's final totals first, within a time of their own so that the
                    // detach always goes out: the coordinator's figures of this rank (its
                    // metrics) then end where the trainer ended.
                    if let Some(last) = last_report {
                        let _ = tokio::time::timeout(DETACH_TIMEOUT, coordinator.call(last)).await;
                    }
                    let _ = tokio::time::timeout(DETACH_TIMEOUT, coordinator.call(request)).await;
                }
            });
            let _ = detached.await;
            endpoint.close(0u32.into(), b"loader dropped");
            coordinator.close();
            let _ = tokio::time::timeout(DETACH_TIMEOUT, endpoint.wait_idle()).await;
        });
        let _ = runtime.block_on(goodbye);
    }
}

/// Attach to the job `config` describes (creating it if this is its first trainer), connect to
/// its workers and start the progress reporter, on `runtime`.
pub(crate) fn attach<A>(
    config: &LoaderConfig,
    runtime: &Runtime,
    coordinator: Arc<A>,
    tls: &TlsConfigs,
) -> Result<Attachment<A>, ClientError>
where
    A: CoordinatorApi,
{
    let (rank, _) = config.rank_and_world_size()?;
    let spec = config.job_spec()?;
    let sample_bytes = Recipe::new(&config.transforms).map_err(|error| ClientError::Config { message: error.to_string() })?.sample_bytes();
    let _guard = runtime.enter();
    let attach = ControlRequest::Attach { spec: spec.clone(), rank, client: loader_id() };
    // Not tried again: at the start an unreachable coordinator is most likely a wrong
    // address, and the user hears of it in seconds (a restart mid-training is what
    // `open_epoch` waits out).
    let answer = call_on_runtime(runtime, &coordinator, attach)?;
    let (job, dataset, workers, _checkpoint, session) = expect_response!(answer, Attached { job, dataset, workers, checkpoint, session })?;
    let table = Arc::new(
        ShardTable::new(dataset.shard_counts.iter().copied()).map_err(|error| ClientError::Config { message: error.to_string() })?,
    );
    let expect = Expect {
        job,
        rank,
        session,
        max_payload: u64::from(spec.plan.batch_size.get()) * sample_bytes as u64,
        plans: Arc::new(PlanBook::new(Arc::clone(&table), spec.plan, dataset.version)),
        held: HeldCount::new(2 * config.buffered_limit()),
    };
    let (batches_tx, batches_rx) = mpsc::unbounded_channel();
    let session = Session::new(job, rank, session);
    let connector = Arc::new(Connector {
        endpoint: client_endpoint(tls, config.coordinator.first(), Tuning::default())?,
        bulk_tls: (config.batch_transport == BatchTransport::Tcp).then(|| tls.clone()),
        expect,
        connected: Mutex::new(HashMap::new()),
        backoff: Mutex::new(DialBackoff::default()),
        tls: tls.clone(),
        listing: Mutex::new(HashMap::new()),
        batches_tx,
        stats: Arc::new(ReceiveStats::default()),
        // Up to two windows of freed batches are kept: near an epoch's end the rest of it
        // and the next epoch's first window (made early) are in flight at once, and never
        // more; keeping fewer left malloc to churn (and the RSS to creep) at every epoch.
        pool: PayloadPool::new(2 * config.prefetch.max(2) as usize),
        superseded: Arc::clone(&session.superseded),
    });
    connector.connect_new(&workers.workers);
    let (progress_tx, progress_rx) = watch::channel(None);
    let workers_seen = {
        let connector = Arc::clone(&connector);
        move |workers: &[WorkerInfo]| connector.connect_new(workers)
    };
    let listed = workers.workers.len();
    runtime.spawn(report_progress(Arc::clone(&coordinator), session.clone(), progress_rx, workers, workers_seen, config.nack_after));
    info!(%job, %rank, name = %spec.name, workers = listed, "attached");
    Ok(Attachment { coordinator, session, spec, table, connector, batches_rx, progress_tx })
}

/// A random id for this loader (its attach is idempotent under it); never 0.
pub(crate) fn loader_id() -> u64 {
    random_u64().max(1)
}

pub(crate) fn new_runtime() -> Result<Runtime, ClientError> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("stoker-client")
        .enable_all()
        .build()
        .map_err(|error| ClientError::Runtime { message: error.to_string() })
}

/// Call the coordinator from a runtime thread, never from the caller's. QUIC draws connection
/// ids from a thread-local RNG, and a process forked from a trainer (a PyTorch DataLoader
/// worker) shares its parent's main-thread RNG state: connecting from the main thread in both
/// would give both connections the same ids. Runtime threads are new in every process.
pub(crate) fn call_on_runtime<A>(runtime: &Runtime, coordinator: &Arc<A>, request: ControlRequest) -> Result<ControlResponse, RemoteError>
where
    A: CoordinatorApi,
{
    let coordinator = Arc::clone(coordinator);
    let call = runtime.spawn(async move { coordinator.call(request).await });
    runtime.block_on(call).unwrap_or_else(|error| Err(RemoteError::new(ErrorCode::Internal, format!("coordinator call failed: {error}"))))
}
