//! The trainer's loader: yield this rank's batches of an epoch exactly once and in step order,
//! blocking (what a training loop wants). A thin facade: `connector` attaches and dials workers
//! (a small runtime receives and reports), the pure `cursor` knows where the rank stands, and
//! the pure [`TrainerProtocol`] puts received batches in order.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use stoker_net::{QuicCoordinator, Role, TlsConfigs};
use stoker_obs::error::ObsError;
use stoker_obs::{Metrics, MetricsServer};
use stoker_plan::Checkpoint;
use stoker_plan::ids::{Epoch, JobId, Rank, SessionId};
use stoker_proto::api::CoordinatorApi;
use stoker_proto::expect_response;
use stoker_proto::{ControlRequest, ErrorCode, JobSpec};
use tokio::runtime::Runtime;
use tracing::{debug, info, warn};

use crate::batch::ReceivedBatch;
use crate::config::LoaderConfig;
use crate::connector::{Attachment, attach, call_on_runtime, new_runtime};
use crate::cursor::{EpochCursor, Waits};
use crate::error::ClientError;
use crate::metrics::LoaderCounters;
use crate::protocol::{Offered, Open, TrainerProtocol};
use crate::session::Progress;

/// Where a trainer stands, for its checkpoint: the job's name and the position consumed.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LoaderState {
    /// The job the state was taken in.
    pub job_name: String,
    /// Epoch and position.
    pub checkpoint: Checkpoint,
}

/// A batch timeout blames the coordinator when it has not answered a report for this long
/// (reports go out every second).
const COORDINATOR_SILENCE: Duration = Duration::from_secs(5);
/// While a rank waits without moving, its progress goes to the reporter again each time its
/// wait grew by this much (the coordinator exports the wait: the data stall).
const WAIT_REPORT_STEP: Duration = Duration::from_millis(500);

/// A trainer rank's loader, calling the coordinator through `A` (QUIC unless a test gives
/// another [`CoordinatorApi`]).
pub struct Loader<A = QuicCoordinator>
where
    A: CoordinatorApi,
{
    runtime: Runtime,
    /// The job, the session, the coordinator and the workers.
    link: Attachment<A>,
    /// Received batches, in order.
    protocol: TrainerProtocol<ReceivedBatch>,
    /// Where the rank stands in its epochs.
    cursor: EpochCursor,
    waits: Waits,
    /// Batches dropped for the buffer limit when that was last logged.
    evicted_warned: u64,
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
            .field("job", &self.link.session.job)
            .field("rank", &self.link.session.rank)
            .field("epoch", &self.cursor.epoch())
            .finish_non_exhaustive()
    }
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
        let link = attach(config, &runtime, coordinator, tls)?;
        let cursor = EpochCursor::new(Arc::clone(&link.table), link.spec.plan);
        Ok(Self {
            runtime,
            link,
            protocol: TrainerProtocol::new(config.nack_after).with_max_buffered(config.buffered_limit()),
            cursor,
            waits: Waits::new(config.batch_timeout),
            evicted_warned: 0,
            counters: Arc::new(LoaderCounters::new()),
            metrics_server_opt: None,
        })
    }

    /// The job's id.
    pub fn job(&self) -> JobId {
        self.link.session.job
    }

    /// The job's spec (its name, plan and transforms).
    pub fn spec(&self) -> &JobSpec {
        &self.link.spec
    }

    /// This trainer's rank.
    pub fn rank(&self) -> Rank {
        self.link.session.rank
    }

    /// The session the coordinator gave this trainer (for logs: a worker serves the rank's
    /// batches to the newest session).
    pub fn session(&self) -> SessionId {
        self.link.session.session
    }

    /// Iterate `epoch` next (from its start, or from the resumed position if `resume` named it).
    /// Batches already received are kept for when their run is opened.
    pub fn set_epoch(&mut self, epoch: Epoch) {
        self.cursor.set_epoch(epoch);
        self.waits.new_epoch();
        self.protocol.close();
    }

    /// Continue from `state` (taken by [`Loader::state`], possibly with another world size or
    /// batch size): the next iteration of its epoch starts after its position.
    pub fn resume(&mut self, state: &LoaderState) -> Result<(), ClientError> {
        self.cursor.resume(&state.checkpoint)?;
        self.set_epoch(state.checkpoint.epoch);
        Ok(())
    }

    /// Go to global step `global_step`, counted over all epochs from epoch 0 step 0, for a
    /// training loop that counts steps rather than epochs: epoch `global_step / len()`, from its
    /// step `global_step % len()`. Batches already received are kept for when their run opens.
    pub fn seek_step(&mut self, global_step: u64) -> Result<(), ClientError> {
        self.cursor.seek_step(global_step)?;
        self.set_epoch(self.cursor.epoch());
        Ok(())
    }

    /// Where this rank stands: every step before it has been yielded. After an epoch's last
    /// batch that is the next epoch's start, so a run restarted from a checkpoint saved after
    /// the `for batch in loader` loop goes on with the next epoch.
    pub fn state(&self) -> Result<LoaderState, ClientError> {
        let checkpoint = self.cursor.checkpoint(self.protocol.yielded())?;
        Ok(LoaderState { job_name: self.link.spec.name.clone(), checkpoint })
    }

    /// Where this rank stood before the yielded batch of `step` (numbered from the epoch's start,
    /// as [`ReceivedBatch::step`]) of the open pass: the state of a batch handed back unused (a
    /// peeked `next(iter(loader))`), which the next iteration yields again. Without an open
    /// pass, or for a step not yet yielded, the same as [`Self::state`].
    pub fn state_before(&self, step: u64) -> Result<LoaderState, ClientError> {
        match self.cursor.checkpoint_before(step, self.protocol.yielded()) {
            Some(checkpoint) => Ok(LoaderState { job_name: self.link.spec.name.clone(), checkpoint }),
            None => self.state(),
        }
    }

    /// Steps of an epoch for this rank, from the epoch's start (as `len(DataLoader)`), also
    /// after a resume: `epochs * len()` is the run's length in steps.
    pub fn len(&self) -> Result<u64, ClientError> {
        Ok(self.cursor.epoch_steps())
    }

    /// Steps of the current epoch not yielded yet: all of them before it starts, those after
    /// the resumed position after a resume, 0 once it ended (iterating again without
    /// `set_epoch` starts it over).
    pub fn remaining(&self) -> Result<u64, ClientError> {
        self.cursor.remaining(self.protocol.yielded())
    }

    /// Whether the current epoch has no steps.
    pub fn is_empty(&self) -> Result<bool, ClientError> {
        Ok(self.len()? == 0)
    }

    /// Seconds this rank waited for data so far (the data stall).
    pub fn wait_seconds(&self) -> f64 {
        self.waits.total().as_secs_f64()
    }

    /// Seconds this rank waited for data since the last [`Self::set_epoch`].
    pub fn epoch_wait_seconds(&self) -> f64 {
        self.waits.this_epoch().as_secs_f64()
    }

    /// The epoch iterated (the last [`Self::set_epoch`], or a resumed state's).
    pub fn epoch(&self) -> Epoch {
        self.cursor.epoch()
    }

    /// Batches received (including duplicates later dropped) and rejected (failed checks).
    pub fn received_and_rejected(&self) -> (u64, u64) {
        let stats = &self.link.connector.stats;
        (stats.received.load(Ordering::Acquire), stats.rejected.load(Ordering::Acquire))
    }

    /// Batches received and not yet yielded: waiting for earlier steps, queued from the
    /// network, or early ones of the next epoch. The flow window bounds it.
    pub fn buffered_batches(&self) -> usize {
        self.protocol.buffered() + self.link.batches_rx.len()
    }

    /// Receive buffers freed by the trainer and kept for the next batches (a batch's buffer
    /// comes back when the last view of it is dropped).
    pub fn free_receive_buffers(&self) -> usize {
        self.link.connector.pool.free_buffers()
    }

    /// Duplicates dropped in the current epoch.
    pub fn duplicates(&self) -> u64 {
        self.protocol.duplicates()
    }

    /// Open a new pass over the epoch's run: the coordinator makes every step this rank does
    /// not hold, whatever it delivered before. Returns whether it is open; `false` when the
    /// coordinator could not be reached (it is restarting): the same open is tried again at the
    /// next call, until the batch timeout.
    fn open_epoch(&mut self) -> Result<bool, ClientError> {
        let (request, plan) = match self.cursor.take_opening() {
            Some(opening) => opening,
            None => {
                let plan = Arc::new(self.cursor.next_plan()?);
                // Batches already here count as held, so they are not made again.
                while let Ok(batch) = self.link.batches_rx.try_recv() {
                    self.protocol.offer(batch);
                }
                let Open { run: (epoch, start), pass, consumed, holding } =
                    self.protocol.open((self.cursor.epoch(), plan.start()), plan.steps());
                let session = self.link.session.session;
                let request = ControlRequest::OpenEpoch {
                    job: self.link.session.job,
                    rank: self.link.session.rank,
                    epoch,
                    start,
                    session,
                    pass,
                    consumed,
                    holding,
                };
                (request, plan)
            }
        };
        // Reports of the previous pass go out before the open, and the progress is the new
        // pass's before the reporter can read it again (see `session`).
        let turn = self.runtime.block_on(self.link.session.turn());
        let answer = call_on_runtime(&self.runtime, &self.link.coordinator, request.clone());
        drop(turn);
        let steps = match answer.and_then(|answer| expect_response!(answer, EpochOpened { steps })) {
            Ok(steps) => steps,
            Err(error) if error.code == ErrorCode::Superseded => {
                self.link.session.superseded.store(true, Ordering::Release);
                self.protocol.close();
                return Err(self.link.session.superseded_error());
            }
            Err(error) if error.is_retryable() => {
                // The same pass, asked again: the coordinator takes a repeated open as one.
                let deadline = self.waits.deadline(Instant::now());
                if Instant::now() >= deadline {
                    self.protocol.close();
                    self.waits.clear_deadline();
                    return Err(ClientError::Coordinator { source: error });
                }
                debug!(%error, "cannot open the epoch yet; trying again");
                self.cursor.keep_opening(request, plan);
                return Ok(false);
            }
            Err(error) => {
                // Not opened: the next call opens a new pass, with a wait of its own.
                self.protocol.close();
                self.waits.clear_deadline();
                return Err(ClientError::Coordinator { source: error });
            }
        };
        if steps != plan.steps() {
            self.protocol.close();
            self.waits.clear_deadline();
            return Err(ClientError::Config {
                message: format!("the coordinator plans {steps} steps, this trainer {}: the dataset changed under the job", plan.steps()),
            });
        }
        // The deadline of an open asked again stands: the first batch is waited for within the
        // same batch timeout.
        self.cursor.opened(plan);
        self.report();
        Ok(true)
    }

    /// The pass ran to its end: remember where that leaves the rank, and leave the run.
    fn end_pass(&mut self) {
        self.cursor.end_pass();
        self.protocol.close();
    }

    /// Say (once per 100 drops) that batches were dropped for the buffer limit.
    fn warn_evicted(&mut self) {
        let evicted = self.protocol.evicted();
        if evicted > self.evicted_warned && (self.evicted_warned == 0 || evicted >= self.evicted_warned + 100) {
            warn!(
                rank = %self.link.session.rank,
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
        crate::metrics::register(&metrics, Arc::clone(&self.counters), &self.link.spec.name, self.link.session.rank.0).map_err(failed)?;
        let superseded = Arc::clone(&self.link.session.superseded);
        metrics.set_readiness(move || {
            if superseded.load(Ordering::Acquire) { Err("a newer trainer of this rank took over".to_owned()) } else { Ok(()) }
        });
        let server = self.runtime.block_on(stoker_obs::serve(listen, metrics)).map_err(failed)?;
        let addr = server.local_addr();
        info!(%addr, rank = %self.link.session.rank, "trainer metrics on http://{addr}/metrics");
        self.metrics_server_opt = Some(server);
        Ok(addr)
    }

    /// Hand the reporter the rank's standing, if it changed.
    fn report(&self) {
        let Some(report) = self.protocol.report(Instant::now()) else { return };
        let progress = Progress {
            report,
            wait_seconds: self.waits.total().as_secs_f64(),
            batches: self.counters.batches.load(Ordering::Acquire),
            samples: self.counters.samples.load(Ordering::Acquire),
        };
        self.link.progress_tx.send_if_modified(|latest| {
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
        if self.cursor.is_finished() {
            self.end_pass();
            return Ok(Next::EndOfEpoch);
        }
        self.link.session.check()?;
        if !self.cursor.is_open() && !self.open_epoch()? {
            let pause = slice.min(Duration::from_millis(200));
            self.runtime.block_on(async { tokio::time::sleep(pause).await });
            return Ok(Next::Waiting);
        }
        let slice_end = Instant::now() + slice;
        loop {
            if self.protocol.is_done() {
                self.end_pass();
                return Ok(Next::EndOfEpoch);
            }
            if let Some((_, mut batch)) = self.protocol.pop() {
                // Not a batch more once a newer trainer of this rank connected (its workers say
                // so at once): the two would hand out the same step.
                self.link.session.check()?;
                batch.step_offset = self.cursor.step_offset();
                self.waits.clear_deadline();
                self.counters.yielded(batch.len(), batch.images().len());
                self.count_buffered();
                self.report();
                self.cursor.set_finished(self.protocol.is_done());
                return Ok(Next::Batch(batch));
            }
            let waiting_since = Instant::now();
            self.protocol.waiting(waiting_since);
            self.link.session.mark_waiting();
            let deadline = self.waits.deadline(waiting_since);
            if waiting_since >= deadline {
                self.waits.clear_deadline();
                let (epoch, seconds) = (self.cursor.epoch().0, self.waits.batch_timeout().as_secs_f64());
                let step = self.cursor.step_offset() + self.protocol.next_step().map_or(0, |step| step.0);
                return Err(match self.link.session.coordinator_silence(COORDINATOR_SILENCE) {
                    Some((silent, error)) => {
                        ClientError::CoordinatorSilent { epoch, step, seconds, silent_seconds: silent.as_secs_f64(), error }
                    }
                    None => ClientError::Timeout { epoch, step, seconds },
                });
            }
            if waiting_since >= slice_end {
                self.link.session.check()?;
                return Ok(Next::Waiting);
            }
            // Wake when the steps waited for are due to be reported missing, and often enough
            // that the reporter sees the loop still waiting (`MissingDamper`).
            let nack_due = self.protocol.nack_due().filter(|due| *due > waiting_since);
            let refresh = waiting_since + self.protocol.waiting_refresh();
            let wake = nack_due.map_or(refresh, |due| due.min(refresh)).min(deadline).min(slice_end);
            let remaining = wake.saturating_duration_since(waiting_since);
            let received = self.runtime.block_on(async { tokio::time::timeout(remaining, self.link.batches_rx.recv()).await });
            let waited = waiting_since.elapsed();
            self.waits.add(waited);
            self.counters.wait_nanos.fetch_add(u64::try_from(waited.as_nanos()).unwrap_or(u64::MAX), Ordering::AcqRel);
            self.count_buffered();
            match received {
                Ok(Some(batch)) => {
                    match self.protocol.offer(batch) {
                        Offered::Kept | Offered::Early => {}
                        Offered::Duplicate => debug!(rank = %self.link.session.rank, "duplicate batch dropped"),
                        Offered::Dropped => debug!(rank = %self.link.session.rank, "batch of a past run dropped"),
                    }
                    self.warn_evicted();
                    // Batches that cannot be yielded yet must not hold back the missing report.
                    self.report();
                }
                Ok(None) => return Err(ClientError::Runtime { message: "the receive side stopped".to_owned() }),
                Err(_) => {
                    // Still waiting: the reporter must see this wait, not one `wake` ago, when
                    // the missing steps fall due now.
                    self.link.session.mark_waiting();
                    self.report();
                }
            }
        }
    }
}

impl<A> Drop for Loader<A>
where
    A: CoordinatorApi,
{
    /// Tell the coordinator this rank's trainer stopped and close the worker connections
    /// (best effort, briefly), so workers stop making batches nobody will take and see the
    /// pushes in flight fail at once rather than at the idle timeout.
    fn drop(&mut self) {
        let totals = (
            self.waits.total().as_secs_f64(),
            self.counters.batches.load(Ordering::Acquire),
            self.counters.samples.load(Ordering::Acquire),
        );
        self.link.detach(&self.runtime, totals);
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
