//! The trainer's loader: attach to a job, connect to every worker, and yield this rank's
//! batches of an epoch exactly once and in step order. The public API is blocking (what a
//! training loop wants); a small background runtime receives batches and reports progress.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use quinn::{Connection, Endpoint};
use stoker_net::bulk::BatchTransport;
use stoker_net::{NetError, PayloadPool, QuicCoordinator, Role, TlsConfigs, Tuning, client_endpoint};
use stoker_obs::error::ObsError;
use stoker_obs::{Metrics, MetricsServer};
use stoker_plan::ids::{Epoch, JobId, Rank, SessionId, Step, WorkerId};
use stoker_plan::transform::Recipe;
use stoker_plan::{Checkpoint, EpochPlan, Layout, ShardTable};
use stoker_proto::api::CoordinatorApi;
use stoker_proto::expect_response;
use stoker_proto::{ControlRequest, ControlResponse, ErrorCode, JobSpec, RemoteError, WorkerInfo};
use tokio::runtime::Runtime;
use tokio::sync::{mpsc, watch};
use tracing::{debug, info, warn};

use crate::batch::ReceivedBatch;
use crate::config::LoaderConfig;
use crate::error::ClientError;
use crate::metrics::LoaderCounters;
use crate::protocol::{Offered, Open, TrainerProtocol};
use crate::receive::{Expect, HeldCount, PlanBook, ReceiveStats, bulk_loop, connect_worker, receive_loop};
use crate::session::{Progress, Session, report_progress};

/// Where a trainer stands, for its checkpoint: the job's name and the position consumed.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LoaderState {
    /// The job the state was taken in.
    pub job_name: String,
    /// Epoch and position.
    pub checkpoint: Checkpoint,
}

/// How long a dropped loader waits for the coordinator to acknowledge its detach.
const DETACH_TIMEOUT: Duration = Duration::from_millis(500);
/// While a rank waits without moving, its progress goes to the reporter again each time its
/// wait grew by this much (the coordinator exports the wait: the data stall).
const WAIT_REPORT_STEP: Duration = Duration::from_millis(500);

/// Dials workers as they appear.
struct Connector {
    endpoint: Endpoint,
    /// For bulk connections; `None` receives over QUIC only.
    bulk_tls: Option<TlsConfigs>,
    expect: Expect,
    /// Workers dialled: `None` while the dial is under way.
    connected: Mutex<HashMap<WorkerId, Option<Connection>>>,
    batches_tx: mpsc::UnboundedSender<ReceivedBatch>,
    stats: Arc<ReceiveStats>,
    pool: PayloadPool,
}

impl Connector {
    /// Connect to the workers in `workers` that we have no live connection to.
    fn connect_new(self: &Arc<Self>, workers: &[WorkerInfo]) {
        let mut connected = self.connected.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        connected.retain(|_, connection_opt| connection_opt.as_ref().is_none_or(|connection| connection.close_reason().is_none()));
        for worker in workers {
            if connected.contains_key(&worker.id) {
                continue;
            }
            connected.insert(worker.id, None);
            let this = Arc::clone(self);
            let worker = *worker;
            tokio::spawn(async move {
                match connect_worker(&this.endpoint, worker, &this.expect, this.bulk_tls.is_some()).await {
                    Ok(connection) => {
                        debug!(worker = %worker.id, addr = %worker.addr, "connected to worker");
                        this.connected
                            .lock()
                            .unwrap_or_else(std::sync::PoisonError::into_inner)
                            .insert(worker.id, Some(connection.clone()));
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
                        receive_loop(connection, this.expect.clone(), this.batches_tx.clone(), Arc::clone(&this.stats), this.pool.clone())
                            .await;
                    }
                    Err(error @ (NetError::Refused { .. } | NetError::WrongPeer { .. } | NetError::Tls(_))) => {
                        warn!(worker = %worker.id, addr = %worker.addr, %error, "refused a worker's certificate, or it refused ours: no batches from it");
                        this.connected.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(&worker.id);
                    }
                    Err(error) => {
                        debug!(worker = %worker.id, %error, "cannot connect to worker");
                        this.connected.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(&worker.id);
                    }
                }
            });
        }
    }
}

/// A trainer rank's loader, calling the coordinator through `A` (QUIC unless a test gives
/// another [`CoordinatorApi`]).
pub struct Loader<A = QuicCoordinator>
where
    A: CoordinatorApi,
{
    runtime: Runtime,
    coordinator: Arc<A>,
    job: JobId,
    rank: Rank,
    session: Session,
    connector: Arc<Connector>,
    spec: JobSpec,
    table: Arc<ShardTable>,
    batches_rx: mpsc::UnboundedReceiver<ReceivedBatch>,
    stats: Arc<ReceiveStats>,
    progress_tx: watch::Sender<Option<Progress>>,
    protocol: TrainerProtocol<ReceivedBatch>,
    epoch: Epoch,
    resume_opt: Option<Checkpoint>,
    /// The plan of the open pass's run; `None` until the epoch is opened.
    plan_opt: Option<Arc<EpochPlan>>,
    /// Steps of the epoch before the open run's start (non-zero after a resume).
    step_offset: u64,
    /// Where the rank stands after a pass ran to its end (the next epoch's start), until the
    /// next pass opens or `set_epoch` picks another epoch.
    completed_opt: Option<Checkpoint>,
    /// An `OpenEpoch` the coordinator could not be reached for (it restarts), with its plan:
    /// sent again, unchanged, by the next call.
    opening_opt: Option<(ControlRequest, Arc<EpochPlan>)>,
    finished: bool,
    waited: Duration,
    /// Batches dropped for the buffer limit when that was last logged.
    evicted_warned: u64,
    /// Of `waited`, the part since the last `set_epoch`.
    epoch_waited: Duration,
    batch_timeout: Duration,
    /// When waiting for the next step gives up; set by the first wait for it.
    deadline_opt: Option<Instant>,
    /// Totals for the progress reports and this rank's metrics.
    counters: Arc<LoaderCounters>,
    /// This rank's metrics endpoint, once [`Self::serve_metrics`] started it.
    metrics_server_opt: Option<MetricsServer>,
}

/// What [`Loader::next_within`] found.
// Returned once per batch: moving the header is cheaper than boxing it (an allocation each).
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum Next {
    /// The next batch of the epoch.
    Batch(ReceivedBatch),
    /// The epoch is over.
    EndOfEpoch,
    /// Nothing arrived within the time slice; call again.
    Waiting,
}

impl<A> std::fmt::Debug for Loader<A>
where
    A: CoordinatorApi,
{
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("Loader")
            .field("job", &self.job)
            .field("rank", &self.rank)
            .field("epoch", &self.epoch)
            .finish_non_exhaustive()
    }
}

/// A random id for this loader (its attach is idempotent under it); never 0.
fn loader_id() -> u64 {
    stoker_net::random::random_u64().max(1)
}

fn new_runtime() -> Result<Runtime, ClientError> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("stoker-client")
        .enable_all()
        .build()
        .map_err(|error| ClientError::Runtime { message: error.to_string() })
}

impl Loader<QuicCoordinator> {
    /// Attach to the job `config` describes (creating it if this is its first trainer) and
    /// connect to the workers.
    pub fn attach(config: &LoaderConfig) -> Result<Self, ClientError> {
        let runtime = new_runtime()?;
        let tls = config.tls.load(Role::Trainer)?;
        let coordinator = {
            let _guard = runtime.enter();
            QuicCoordinator::with_addrs(config.coordinator.clone(), &tls)?
        };
        Self::attach_on(config, runtime, Arc::new(coordinator), &tls)
    }
}

impl<A> Loader<A>
where
    A: CoordinatorApi,
{
    /// [`Loader::attach`] with another way to call the coordinator (workers are still reached
    /// over QUIC).
    pub fn attach_with(config: &LoaderConfig, coordinator: A) -> Result<Self, ClientError> {
        let runtime = new_runtime()?;
        let tls = config.tls.load(Role::Trainer)?;
        Self::attach_on(config, runtime, Arc::new(coordinator), &tls)
    }

    fn attach_on(config: &LoaderConfig, runtime: Runtime, coordinator: Arc<A>, tls: &TlsConfigs) -> Result<Self, ClientError> {
        let (rank, _) = config.rank_and_world_size()?;
        let spec = config.job_spec()?;
        let sample_bytes =
            Recipe::new(&config.transforms).map_err(|error| ClientError::Config { message: error.to_string() })?.sample_bytes();
        let _guard = runtime.enter();
        let attach = ControlRequest::Attach { spec: spec.clone(), rank, client: loader_id() };
        // Not tried again: at the start an unreachable coordinator is most likely a wrong
        // address, and the user hears of it in seconds (a restart mid-training is what
        // `open_epoch` waits out).
        let answer = call_on_runtime(&runtime, &coordinator, attach)?;
        let (job, dataset, workers, _checkpoint, session) =
            expect_response!(answer, Attached { job, dataset, workers, checkpoint, session })?;
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
        let stats = Arc::new(ReceiveStats::default());
        let connector = Arc::new(Connector {
            endpoint: client_endpoint(tls, config.coordinator.first(), Tuning::default())?,
            bulk_tls: (config.batch_transport == BatchTransport::Tcp).then(|| tls.clone()),
            expect,
            connected: Mutex::new(HashMap::new()),
            batches_tx,
            stats: Arc::clone(&stats),
            // Up to two windows of freed batches are kept: near an epoch's end the rest of it
            // and the next epoch's first window (made early) are in flight at once, and never
            // more; keeping fewer left malloc to churn (and the RSS to creep) at every epoch.
            pool: PayloadPool::new(2 * config.prefetch.max(2) as usize),
        });
        connector.connect_new(&workers);
        let (progress_tx, progress_rx) = watch::channel(None);
        let session = Session::new(job, rank, session);
        let workers_seen = {
            let connector = Arc::clone(&connector);
            move |workers: &[WorkerInfo]| connector.connect_new(workers)
        };
        runtime.spawn(report_progress(Arc::clone(&coordinator), session.clone(), progress_rx, workers_seen, config.nack_after));
        info!(%job, %rank, name = %spec.name, workers = workers.len(), "attached");
        drop(_guard);
        Ok(Self {
            runtime,
            coordinator,
            job,
            rank,
            session,
            connector,
            spec,
            table,
            batches_rx,
            stats,
            progress_tx,
            protocol: TrainerProtocol::new(config.nack_after).with_max_buffered(config.buffered_limit()),
            epoch: Epoch(0),
            resume_opt: None,
            plan_opt: None,
            step_offset: 0,
            completed_opt: None,
            opening_opt: None,
            finished: false,
            waited: Duration::ZERO,
            evicted_warned: 0,
            epoch_waited: Duration::ZERO,
            batch_timeout: config.batch_timeout,
            deadline_opt: None,
            counters: Arc::new(LoaderCounters::new()),
            metrics_server_opt: None,
        })
    }

    /// The job's id.
    pub fn job(&self) -> JobId {
        self.job
    }

    /// The job's spec (its name, plan and transforms).
    pub fn spec(&self) -> &JobSpec {
        &self.spec
    }

    /// This trainer's rank.
    pub fn rank(&self) -> Rank {
        self.rank
    }

    /// The session the coordinator gave this trainer (for logs: a worker serves the rank's
    /// batches to the newest session).
    pub fn session(&self) -> SessionId {
        self.session.session
    }

    /// Iterate `epoch` next (from its start, or from the resumed position if `resume` named it).
    /// Batches already received are kept for when their run is opened.
    pub fn set_epoch(&mut self, epoch: Epoch) {
        self.epoch = epoch;
        self.epoch_waited = Duration::ZERO;
        self.protocol.close();
        self.plan_opt = None;
        self.completed_opt = None;
        self.opening_opt = None;
        self.finished = false;
        self.deadline_opt = None;
    }

    /// Continue from `state` (taken by [`Loader::state`], possibly with another world size or
    /// batch size): the next iteration of its epoch starts after its position.
    pub fn resume(&mut self, state: &LoaderState) -> Result<(), ClientError> {
        let plan = EpochPlan::resume(Arc::clone(&self.table), self.spec.plan, &state.checkpoint).map_err(|error| ClientError::Resume {
            message: format!("{error} (was the checkpoint taken with another dataset, seed or shuffle?)"),
        })?;
        drop(plan);
        self.resume_opt = Some(state.checkpoint);
        self.set_epoch(state.checkpoint.epoch);
        Ok(())
    }

    /// Go to global step `global_step`, counted over all epochs from epoch 0 step 0, for a
    /// training loop that counts steps rather than epochs: epoch `global_step / len()`, from its
    /// step `global_step % len()`. Batches already received are kept for when their run opens.
    pub fn seek_step(&mut self, global_step: u64) -> Result<(), ClientError> {
        let steps = self.epoch_steps();
        if steps == 0 {
            return Err(ClientError::Config {
                message: "an epoch has no steps at this world size and batch size: nothing to seek".to_owned(),
            });
        }
        let epoch = Epoch(global_step / steps);
        let step = global_step % steps;
        self.resume_opt = match step {
            0 => None,
            _ => Some(EpochPlan::new(Arc::clone(&self.table), self.spec.plan, epoch).checkpoint_after(Step(step - 1))),
        };
        self.set_epoch(epoch);
        Ok(())
    }

    /// Where this rank stands: every step before it has been yielded. After an epoch's last
    /// batch that is the next epoch's start, so a run restarted from a checkpoint saved after
    /// the `for batch in loader` loop goes on with the next epoch.
    pub fn state(&self) -> Result<LoaderState, ClientError> {
        let checkpoint = match (&self.plan_opt, self.completed_opt) {
            (Some(plan), _) => match self.protocol.yielded() {
                Some(step) => plan.checkpoint_after(step),
                None => plan.checkpoint_at_start(),
            },
            (None, Some(completed)) => completed,
            (None, None) => self.plan_for(self.epoch)?.checkpoint_at_start(),
        };
        Ok(LoaderState { job_name: self.spec.name.clone(), checkpoint })
    }

    /// Steps of an epoch for this rank, from the epoch's start (as `len(DataLoader)`), also
    /// after a resume: `epochs * len()` is the run's length in steps.
    pub fn len(&self) -> Result<u64, ClientError> {
        Ok(self.epoch_steps())
    }

    /// Steps of the current epoch not yielded yet: all of them before it starts, those after
    /// the resumed position after a resume, 0 once it ended (iterating again without
    /// `set_epoch` starts it over).
    pub fn remaining(&self) -> Result<u64, ClientError> {
        match (&self.plan_opt, self.completed_opt) {
            (Some(plan), _) => Ok(plan.steps() - self.protocol.yielded().map_or(0, |step| step.0 + 1)),
            (None, Some(_)) => Ok(0),
            (None, None) => Ok(self.plan_for(self.epoch)?.steps()),
        }
    }

    fn epoch_steps(&self) -> u64 {
        let plan = &self.spec.plan;
        Layout::new(self.table.samples(), 0, plan.world_size, plan.batch_size, plan.tail).steps()
    }

    /// Whether the current epoch has no steps.
    pub fn is_empty(&self) -> Result<bool, ClientError> {
        Ok(self.len()? == 0)
    }

    /// Seconds this rank waited for data so far (the data stall).
    pub fn wait_seconds(&self) -> f64 {
        self.waited.as_secs_f64()
    }

    /// Seconds this rank waited for data since the last [`Self::set_epoch`].
    pub fn epoch_wait_seconds(&self) -> f64 {
        self.epoch_waited.as_secs_f64()
    }

    /// The epoch iterated (the last [`Self::set_epoch`], or a resumed state's).
    pub fn epoch(&self) -> Epoch {
        self.epoch
    }

    /// Batches received (including duplicates later dropped) and rejected (failed checks).
    pub fn received_and_rejected(&self) -> (u64, u64) {
        (self.stats.received.load(Ordering::Acquire), self.stats.rejected.load(Ordering::Acquire))
    }

    /// Batches received and not yet yielded: waiting for earlier steps, queued from the
    /// network, or early ones of the next epoch. The flow window bounds it.
    pub fn buffered_batches(&self) -> usize {
        self.protocol.buffered() + self.batches_rx.len()
    }

    /// Receive buffers freed by the trainer and kept for the next batches (a batch's buffer
    /// comes back when the last view of it is dropped).
    pub fn free_receive_buffers(&self) -> usize {
        self.connector.pool.free_buffers()
    }

    /// Duplicates dropped in the current epoch.
    pub fn duplicates(&self) -> u64 {
        self.protocol.duplicates()
    }

    fn plan_for(&self, epoch: Epoch) -> Result<EpochPlan, ClientError> {
        match self.resume_opt {
            Some(checkpoint) if checkpoint.epoch == epoch => EpochPlan::resume(Arc::clone(&self.table), self.spec.plan, &checkpoint)
                .map_err(|error| ClientError::Resume { message: error.to_string() }),
            _ => Ok(EpochPlan::new(Arc::clone(&self.table), self.spec.plan, epoch)),
        }
    }

    /// Open a new pass over the epoch's run: the coordinator makes every step this rank does
    /// not hold, whatever it delivered before. Returns whether it is open; `false` when the
    /// coordinator could not be reached (it is restarting): the same open is tried again at the
    /// next call, until the batch timeout.
    fn open_epoch(&mut self) -> Result<bool, ClientError> {
        let (request, plan) = match self.opening_opt.take() {
            Some(opening) => opening,
            None => {
                let plan = Arc::new(self.plan_for(self.epoch)?);
                // Batches already here count as held, so they are not made again.
                while let Ok(batch) = self.batches_rx.try_recv() {
                    self.protocol.offer(batch);
                }
                let Open { run: (epoch, start), pass, consumed, holding } = self.protocol.open((self.epoch, plan.start()), plan.steps());
                let session = self.session.session;
                let request = ControlRequest::OpenEpoch { job: self.job, rank: self.rank, epoch, start, session, pass, consumed, holding };
                (request, plan)
            }
        };
        // Reports of the previous pass go out before the open, and the progress is the new
        // pass's before the reporter can read it again (see `session`).
        let turn = self.runtime.block_on(self.session.turn());
        let answer = call_on_runtime(&self.runtime, &self.coordinator, request.clone());
        drop(turn);
        let steps = match answer.and_then(|answer| expect_response!(answer, EpochOpened { steps })) {
            Ok(steps) => steps,
            Err(error) if error.code == ErrorCode::Superseded => {
                self.session.superseded.store(true, Ordering::Release);
                self.protocol.close();
                return Err(self.session.superseded_error());
            }
            Err(error) if error.is_retryable() => {
                // The same pass, asked again: the coordinator takes a repeated open as one.
                let deadline = *self.deadline_opt.get_or_insert(Instant::now() + self.batch_timeout);
                if Instant::now() >= deadline {
                    self.protocol.close();
                    self.deadline_opt = None;
                    return Err(ClientError::Coordinator { source: error });
                }
                debug!(%error, "cannot open the epoch yet; trying again");
                self.opening_opt = Some((request, plan));
                return Ok(false);
            }
            Err(error) => {
                // Not opened: the next call opens a new pass, with a wait of its own.
                self.protocol.close();
                self.deadline_opt = None;
                return Err(ClientError::Coordinator { source: error });
            }
        };
        if steps != plan.steps() {
            self.protocol.close();
            self.deadline_opt = None;
            return Err(ClientError::Config {
                message: format!("the coordinator plans {steps} steps, this trainer {}: the dataset changed under the job", plan.steps()),
            });
        }
        // The deadline of an open asked again stands: the first batch is waited for within the
        // same batch timeout.
        self.step_offset = self.epoch_steps().saturating_sub(plan.steps());
        self.plan_opt = Some(plan);
        self.completed_opt = None;
        self.report();
        Ok(true)
    }

    /// The pass ran to its end: remember where that leaves the rank, and leave the run.
    fn end_pass(&mut self) {
        if let Some(plan) = self.plan_opt.take() {
            self.completed_opt = Some(plan.checkpoint_after(Step(plan.steps().saturating_sub(1))));
        }
        self.protocol.close();
    }

    /// Say (once per 100 drops) that batches were dropped for the buffer limit.
    fn warn_evicted(&mut self) {
        let evicted = self.protocol.evicted();
        if evicted > self.evicted_warned && (self.evicted_warned == 0 || evicted >= self.evicted_warned + 100) {
            warn!(
                rank = %self.rank,
                evicted,
                "more batches arrived ahead of the training loop than max_buffered_batches: the farthest ahead were \
                 dropped and will be made again (a worker sending far ahead; raise max_buffered_batches if this is expected)"
            );
            self.evicted_warned = evicted;
        }
    }

    fn count_buffered(&self) {
        self.counters.buffered.store(self.buffered_batches() as u64, Ordering::Release);
        self.counters.early.store(self.protocol.early() as u64, Ordering::Release);
    }

    /// Serve this rank's metrics (`/metrics`, `/healthz`, `/readyz`: ready while attached) on
    /// `listen` over HTTP, for as long as the loader lives; returns the address (with the port
    /// the system chose for port 0). The coordinator exports the rank's steps, batches and
    /// wait already; this adds bytes, first-batch latency and buffer depths.
    pub fn serve_metrics(&mut self, listen: std::net::SocketAddr) -> Result<std::net::SocketAddr, ClientError> {
        if let Some(server) = &self.metrics_server_opt {
            return Ok(server.local_addr());
        }
        let failed = |error: ObsError| ClientError::Config { message: format!("cannot serve metrics on {listen}: {error}") };
        let metrics = Metrics::for_role("trainer").map_err(failed)?;
        crate::metrics::register(&metrics, Arc::clone(&self.counters), &self.spec.name, self.rank.0).map_err(failed)?;
        let superseded = Arc::clone(&self.session.superseded);
        metrics.set_readiness(move || {
            if superseded.load(Ordering::Acquire) { Err("a newer trainer of this rank took over".to_owned()) } else { Ok(()) }
        });
        let server = self.runtime.block_on(stoker_obs::serve(listen, metrics)).map_err(failed)?;
        let addr = server.local_addr();
        info!(%addr, rank = %self.rank, "trainer metrics on http://{addr}/metrics");
        self.metrics_server_opt = Some(server);
        Ok(addr)
    }

    /// Hand the reporter the rank's standing, if it changed.
    fn report(&self) {
        let Some(report) = self.protocol.report(Instant::now()) else { return };
        let progress = Progress {
            report,
            wait_seconds: self.waited.as_secs_f64(),
            batches: self.counters.batches.load(Ordering::Acquire),
            samples: self.counters.samples.load(Ordering::Acquire),
        };
        self.progress_tx.send_if_modified(|latest| {
            // A rank that waits without moving (every worker gone) must still report its
            // growing wait: that is the stall the coordinator exports.
            let changed = latest.as_ref().is_none_or(|latest| {
                latest.report != progress.report || progress.wait_seconds - latest.wait_seconds >= WAIT_REPORT_STEP.as_secs_f64()
            });
            if changed {
                *latest = Some(progress);
            }
            changed
        });
    }

    /// The next batch of the epoch, `None` at its end (the next call starts the epoch again,
    /// as a PyTorch DataLoader does, unless `set_epoch` picks another). Waits up to the
    /// configured batch timeout.
    pub fn next_batch(&mut self) -> Option<Result<ReceivedBatch, ClientError>> {
        loop {
            match self.next_within(Duration::from_secs(1)) {
                Ok(Next::Batch(batch)) => return Some(Ok(batch)),
                Ok(Next::EndOfEpoch) => return None,
                Ok(Next::Waiting) => {}
                Err(error) => return Some(Err(error)),
            }
        }
    }

    /// Like [`Loader::next_batch`], but return [`Next::Waiting`] when no batch came within
    /// `slice`, so that a caller can check for interrupts (Python's Ctrl-C) between slices. The
    /// batch timeout counts from the first call that waited for this step.
    pub fn next_within(&mut self, slice: Duration) -> Result<Next, ClientError> {
        if self.finished {
            self.finished = false;
            self.end_pass();
            return Ok(Next::EndOfEpoch);
        }
        self.session.check()?;
        if self.plan_opt.is_none() && !self.open_epoch()? {
            let pause = slice.min(Duration::from_millis(200));
            self.runtime.block_on(async { tokio::time::sleep(pause).await });
            return Ok(Next::Waiting);
        }
        let slice_end = Instant::now() + slice;
        loop {
            if self.protocol.is_done() {
                self.finished = false;
                self.end_pass();
                return Ok(Next::EndOfEpoch);
            }
            if let Some((_, mut batch)) = self.protocol.pop() {
                batch.step_offset = self.step_offset;
                self.deadline_opt = None;
                self.counters.yielded(batch.len(), batch.images().len());
                self.count_buffered();
                self.report();
                self.finished = self.protocol.is_done();
                return Ok(Next::Batch(batch));
            }
            let waiting_since = Instant::now();
            self.protocol.waiting(waiting_since);
            self.session.mark_waiting();
            let deadline = *self.deadline_opt.get_or_insert(waiting_since + self.batch_timeout);
            if waiting_since >= deadline {
                self.deadline_opt = None;
                return Err(ClientError::Timeout {
                    epoch: self.epoch.0,
                    step: self.step_offset + self.protocol.next_step().map_or(0, |step| step.0),
                    seconds: self.batch_timeout.as_secs_f64(),
                });
            }
            if waiting_since >= slice_end {
                self.session.check()?;
                return Ok(Next::Waiting);
            }
            // Wake when the steps waited for are due to be reported missing, and often enough
            // that the reporter sees the loop still waiting (`MissingDamper`).
            let nack_due = self.protocol.nack_due().filter(|due| *due > waiting_since);
            let refresh = waiting_since + self.protocol.waiting_refresh();
            let wake = nack_due.map_or(refresh, |due| due.min(refresh)).min(deadline).min(slice_end);
            let remaining = wake.saturating_duration_since(waiting_since);
            let received = self.runtime.block_on(async { tokio::time::timeout(remaining, self.batches_rx.recv()).await });
            let waited = waiting_since.elapsed();
            self.waited += waited;
            self.epoch_waited += waited;
            self.counters.wait_nanos.fetch_add(u64::try_from(waited.as_nanos()).unwrap_or(u64::MAX), Ordering::AcqRel);
            self.count_buffered();
            match received {
                Ok(Some(batch)) => {
                    match self.protocol.offer(batch) {
                        Offered::Kept | Offered::Early => {}
                        Offered::Duplicate => debug!(rank = %self.rank, "duplicate batch dropped"),
                        Offered::Dropped => debug!(rank = %self.rank, "batch of a past run dropped"),
                    }
                    self.warn_evicted();
                    // Batches that cannot be yielded yet must not hold back the missing report.
                    self.report();
                }
                Ok(None) => return Err(ClientError::Runtime { message: "the receive side stopped".to_owned() }),
                Err(_) => {
                    // Still waiting: the reporter must see this wait, not one `wake` ago, when
                    // the missing steps fall due now.
                    self.session.mark_waiting();
                    self.report();
                }
            }
        }
    }
}

/// Call the coordinator from a runtime thread, never from the caller's. QUIC draws connection
/// ids from a thread-local RNG, and a process forked from a trainer (a PyTorch DataLoader
/// worker) shares its parent's main-thread RNG state: connecting from the main thread in both
/// would give both connections the same ids. Runtime threads are new in every process.
fn call_on_runtime<A>(runtime: &Runtime, coordinator: &Arc<A>, request: ControlRequest) -> Result<ControlResponse, RemoteError>
where
    A: CoordinatorApi,
{
    let coordinator = Arc::clone(coordinator);
    let call = runtime.spawn(async move { coordinator.call(request).await });
    runtime.block_on(call).unwrap_or_else(|error| Err(RemoteError::new(ErrorCode::Internal, format!("coordinator call failed: {error}"))))
}

impl<A> Drop for Loader<A>
where
    A: CoordinatorApi,
{
    /// Tell the coordinator this rank's trainer stopped and close the worker connections
    /// (best effort, briefly), so workers stop making batches nobody will take and see the
    /// pushes in flight fail at once rather than at the idle timeout.
    fn drop(&mut self) {
        let detach = (!self.session.superseded.load(Ordering::Acquire)).then_some(ControlRequest::Detach {
            job: self.job,
            rank: self.rank,
            session: self.session.session,
        });
        let last_report = self.progress_tx.borrow().as_ref().map(|progress| ControlRequest::ReportProgress {
            job: self.job,
            rank: self.rank,
            epoch: progress.report.run.0,
            start: progress.report.run.1,
            consumed: progress.report.consumed,
            wait_seconds: self.waited.as_secs_f64(),
            batches: self.counters.batches.load(Ordering::Acquire),
            samples: self.counters.samples.load(Ordering::Acquire),
            session: self.session.session,
            pass: progress.report.pass,
            missing: Vec::new(),
        });
        let coordinator = Arc::clone(&self.coordinator);
        let endpoint = self.connector.endpoint.clone();
        let session = self.session.clone();
        let goodbye = self.runtime.spawn(async move {
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
        let _ = self.runtime.block_on(goodbye);
    }
}

impl<A> Iterator for Loader<A>
where
    A: CoordinatorApi,
{
    type Item = Result<ReceivedBatch, ClientError>;

    fn next(&mut self) -> Option<Self::Item> {
        self.next_batch()
    }
}
