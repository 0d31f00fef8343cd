//! The coordinator's request handling, without IO (STYLE G4): [`Coordinator::step`] validates
//! a request, asks the [`Scheduler`] for decisions, and answers, or asks its driver to commit a
//! [`Command`] first (through Raft: `crate::node`). Committed commands come back through
//! [`Replica::apply`] on every replica. Synchronous and quick: the lock is held for the pure
//! decisions, never across IO.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use stoker_format::error::ShardError;
use stoker_format::{DatasetRoots, Manifest};
use stoker_net::random::random_u64;
use stoker_obs::prometheus::Histogram;
use stoker_plan::ids::{CertKey, JobId, Rank, SessionId, Step, WorkerId};
use stoker_plan::transform::Recipe;
use stoker_plan::{Checkpoint, EpochPlan, ShardTable};
use stoker_proto::api::CoordinatorApi;
use stoker_proto::{
    ChunkGrant, ClusterStatus, ControlRequest, ControlResponse, DatasetInfo, ErrorCode, JobSpec, JobStatus, RankStatus, RemoteError,
};

use crate::authz::Owners;
use crate::config::CoordinatorConfig;
use crate::error::CoordinatorError;
use crate::raft::Replica;
use crate::scheduler::Done;
use crate::scheduler::{Opening, Refusal, Reporting, RunKey, RunShape, Scheduler, SeatRefusal};
use crate::state::{Applied, ClusterState, Command};

struct Inner {
    state: ClusterState,
    scheduler: Scheduler,
    plans: BTreeMap<RunKey, Arc<EpochPlan>>,
    ranks: BTreeMap<(JobId, Rank), RankStatus>,
    /// What each rank's trainer reported it consumed in total (for metrics).
    totals: BTreeMap<(JobId, Rank), RankTotals>,
    next_session: u64,
    /// Which certificate owns each rank's newest session.
    owners: Owners,
    /// Checkpoints not yet committed (replicated mode): one `RecordCheckpoints` entry carries
    /// all of them at the next flush.
    pending: BTreeMap<JobId, Checkpoint>,
    /// The Raft term this node leads with the soft state it holds (replicated mode).
    led_term: Option<u64>,
    /// When this coordinator started leading: a job no trainer was heard from since is idle
    /// since then.
    started: Instant,
}

/// Where committed commands go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Durability {
    /// Applied at once, in memory (tests, simulations): [`Coordinator::handle`] commits itself.
    Local,
    /// Through Raft: the driver commits and the state machine applies.
    Replicated,
}

/// What handling a request needs next.
#[derive(Debug)]
pub enum Outcome {
    /// The answer.
    Reply(Result<ControlResponse, RemoteError>),
    /// Commit `command` (it is valid now), then go on with `then`.
    Commit {
        /// The change.
        command: Command,
        /// What to do once it is committed and applied.
        then: Then,
    },
}

/// What follows a commit.
#[derive(Debug)]
pub enum Then {
    /// Handle the request again (it now finds the job it created, say).
    Again(ControlRequest),
    /// Answer this.
    Reply(ControlResponse),
}

/// A coordinator's state and logic, without the network.
pub struct Coordinator {
    inner: Mutex<Inner>,
    config: CoordinatorConfig,
    advertised: String,
    durability: Durability,
    /// How long leases are held until done, once metrics are on.
    lease_seconds: std::sync::OnceLock<Histogram>,
}

/// A trainer's running totals, as its progress reports give them.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct RankTotals {
    /// The trainer's session: its totals start at 0.
    pub session: SessionId,
    /// Batches yielded.
    pub batches: u64,
    /// Samples in them.
    pub samples: u64,
    /// Seconds waited for data.
    pub wait_seconds: f64,
}

/// What the metrics show of the leader's soft state, read under one lock.
#[derive(Clone, Debug, Default)]
pub struct Figures {
    /// Workers whose heartbeats arrive.
    pub workers_alive: usize,
    /// Leases expired, chunks failed and trainer sessions superseded so far (this term).
    pub leases_expired: u64,
    /// See `leases_expired`.
    pub chunks_failed: u64,
    /// See `leases_expired`.
    pub sessions_superseded: u64,
    /// Every job.
    pub jobs: Vec<JobFigures>,
}

/// One job in [`Figures`].
#[derive(Clone, Debug)]
pub struct JobFigures {
    /// Its name.
    pub name: String,
    /// Ranks, and samples per batch.
    pub world_size: u32,
    /// See `world_size`.
    pub batch_size: u32,
    /// Steps queued for a worker and chunks leased.
    pub steps_queued: u32,
    /// See `steps_queued`.
    pub chunks_leased: u32,
    /// Delivered so far.
    pub done: Done,
    /// Steps in its flow windows and what they hold.
    pub window: (u64, u64),
    /// Ranks whose trainer is live.
    pub live_ranks: usize,
    /// Each rank: where it stands, and its trainer's totals.
    pub ranks: Vec<(RankStatus, Option<RankTotals>)>,
}

impl std::fmt::Debug for Coordinator {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("Coordinator").field("advertised", &self.advertised).finish_non_exhaustive()
    }
}

/// The largest transform spec (JSON) a job may have. Raft sends at most 64 entries at once
/// (`raft_config`), so even escaped six-fold they fit a control frame.
const MAX_TRANSFORM_SPEC_BYTES: usize = 16 << 10;

fn invalid(message: impl Into<String>) -> RemoteError {
    RemoteError::new(ErrorCode::InvalidArgument, message)
}

/// A dataset path refused: one outside the roots is forbidden, the rest is a mistake (a
/// missing file, a device) to fix.
fn refused_path(error: ShardError) -> RemoteError {
    let forbidden = matches!(&error, ShardError::Confined { reason, .. } if reason.contains("--dataset-root"));
    RemoteError::new(if forbidden { ErrorCode::Forbidden } else { ErrorCode::InvalidArgument }, error.to_string())
}

fn not_found(message: impl Into<String>) -> RemoteError {
    RemoteError::new(ErrorCode::NotFound, message)
}

fn refused(refusal: Refusal) -> RemoteError {
    match refusal {
        Refusal::NotYours { worker, owner, caller } => crate::authz::not_yours(worker, owner, caller),
        Refusal::UnknownWorker(worker) => {
            not_found(format!("{worker} is not registered (the coordinator restarted or declared it dead): register again"))
        }
        Refusal::Seat(SeatRefusal::Superseded { job, rank, session }) => RemoteError::new(
            ErrorCode::Superseded,
            format!("another trainer attached as {rank} of {job} since this one ({session}); only the newest is served"),
        ),
        Refusal::Seat(SeatRefusal::Stale { pass, current }) => {
            RemoteError::new(ErrorCode::Stale, format!("{pass} is older than {current}, which this trainer opened since: ignored"))
        }
    }
}

/// Ids of leases and sessions start here: milliseconds since 1970 × 1000, so that a later
/// leader (or a restarted one) never hands out an id an earlier one gave.
fn clock_id_base() -> u64 {
    clock_millis() * 1000
}

fn clock_millis() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(1, |elapsed| elapsed.as_millis() as u64)
}

/// Random low bits of a replicated coordinator's session ids. The high bits count up from the
/// clock in milliseconds (41 bits until 2039, 42 after), so sessions still order by age (a
/// worker serves the newest; a coordinator adopts a newer one after a restart), while a peer
/// cannot name another trainer's session by counting.
const SESSION_RANDOM_BITS: u32 = 21;

impl Coordinator {
    /// A coordinator whose state Raft fills in (through [`Replica`]); `advertised` is the
    /// address status reports. It schedules only after [`Coordinator::lead`].
    pub fn replicated(config: CoordinatorConfig, advertised: String) -> Result<Self, CoordinatorError> {
        let config = config.validate()?;
        Ok(Self::build(config, advertised, ClusterState::new(), clock_millis(), Durability::Replicated))
    }

    /// A coordinator whose state lives in memory only, starting from `state`, with ids from
    /// `id_base` (for simulations and tests: the protocol model drives it with a simulated
    /// clock, and "restarts" it by building a new one from the old one's durable state).
    pub fn in_memory(config: CoordinatorConfig, state: ClusterState, id_base: u64) -> Result<Self, CoordinatorError> {
        let config = config.validate()?;
        Ok(Self::build(config, "in-memory".to_owned(), state, id_base, Durability::Local))
    }

    fn build(config: CoordinatorConfig, advertised: String, state: ClusterState, id_base: u64, durability: Durability) -> Self {
        let scheduler = Self::new_scheduler(&config, durability, id_base);
        let inner = Inner {
            state,
            scheduler,
            plans: BTreeMap::new(),
            ranks: BTreeMap::new(),
            totals: BTreeMap::new(),
            next_session: id_base,
            owners: Owners::default(),
            pending: BTreeMap::new(),
            led_term: None,
            started: Instant::now(),
        };
        Self { inner: Mutex::new(inner), config, advertised, durability, lease_seconds: std::sync::OnceLock::new() }
    }

    /// A scheduler with ids from `id_base`; a replicated coordinator's leases are random.
    fn new_scheduler(config: &CoordinatorConfig, durability: Durability, id_base: u64) -> Scheduler {
        let scheduler = Scheduler::new(config.scheduler(), id_base);
        if durability == Durability::Replicated { scheduler.with_random_leases() } else { scheduler }
    }

    /// A new session id: counted, with random low bits in a replicated coordinator.
    fn new_session(&self, inner: &mut Inner) -> SessionId {
        let count = inner.next_session;
        inner.next_session += 1;
        if self.durability == Durability::Replicated {
            SessionId(count << SESSION_RANDOM_BITS | random_u64() >> (64 - SESSION_RANDOM_BITS))
        } else {
            SessionId(count)
        }
    }

    /// This node leads in `term`: if it did not lead in that term until now, its soft state
    /// (runs, leases, windows, workers, sessions) starts empty, as after a restart; workers
    /// and trainers rebuild it by registering and opening again (DESIGN §6).
    pub fn lead(&self, term: u64, now: Instant) {
        let mut inner = self.lock();
        if inner.led_term == Some(term) {
            return;
        }
        let id_base = clock_id_base().max(inner.next_session + 1);
        inner.scheduler = Self::new_scheduler(&self.config, self.durability, id_base);
        inner.owners.clear();
        inner.plans.clear();
        inner.ranks.clear();
        inner.totals.clear();
        inner.pending.clear();
        // Above every session recorded by earlier leaders too: their clocks may run ahead of
        // this node's, and a new session must supersede every older one.
        let recorded =
            inner.state.sessions.values().flat_map(BTreeMap::values).map(|(session, _)| (session.0 >> SESSION_RANDOM_BITS) + 1).max();
        inner.next_session = if self.durability == Durability::Replicated {
            clock_millis().max(inner.next_session).max(recorded.unwrap_or(0))
        } else {
            id_base
        };
        inner.started = now;
        inner.led_term = Some(term);
        tracing::info!(term, "leading: scheduling starts afresh; workers and trainers reconnect");
    }

    /// This node no longer leads: drop the soft state so that nothing stale is served if it
    /// leads again.
    pub fn follow(&self) {
        let mut inner = self.lock();
        if inner.led_term.take().is_some() {
            inner.scheduler = Self::new_scheduler(&self.config, self.durability, clock_id_base());
            inner.owners.clear();
            inner.plans.clear();
            inner.ranks.clear();
            inner.totals.clear();
            inner.pending.clear();
            tracing::info!("no longer leading: soft state dropped");
        }
    }

    /// The checkpoints recorded since the last call, as one command (replicated mode).
    pub fn take_checkpoints(&self) -> Option<Command> {
        let mut inner = self.lock();
        if inner.pending.is_empty() {
            return None;
        }
        let checkpoints = std::mem::take(&mut inner.pending).into_iter().collect();
        Some(Command::RecordCheckpoints { checkpoints })
    }

    /// Put back checkpoints whose commit failed, unless newer ones were recorded meanwhile.
    pub fn restore_checkpoints(&self, checkpoints: Vec<(JobId, Checkpoint)>) {
        let mut inner = self.lock();
        for (job, checkpoint) in checkpoints {
            if inner.state.jobs.contains_key(&job) {
                inner.pending.entry(job).or_insert(checkpoint);
            }
        }
    }

    /// The address status reports.
    pub fn advertised(&self) -> &str {
        &self.advertised
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves consistent data (apply is all-or-nothing).
        self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Expire leases and forget dead workers (also done on every request). Returns the
    /// removal of every job no trainer was heard from for the job TTL, to commit (in local
    /// mode they are applied here and nothing is returned).
    pub fn tick(&self, now: Instant) -> Vec<Command> {
        let mut inner = self.lock();
        inner.scheduler.expire(now);
        let Some(ttl) = self.config.job_ttl else { return Vec::new() };
        let idle: Vec<Command> = inner
            .state
            .jobs
            .keys()
            .copied()
            .filter(|job| now.saturating_duration_since(inner.scheduler.last_heard(*job).unwrap_or(inner.started)) >= ttl)
            .map(|job| Command::RemoveJob { job })
            .collect();
        for command in &idle {
            tracing::info!(?command, ttl_seconds = ttl.as_secs(), "job removed: no trainer for the job TTL (--job-ttl-hours)");
        }
        match self.durability {
            Durability::Local => {
                idle.into_iter().for_each(|command| {
                    inner.apply(command);
                });
                Vec::new()
            }
            Durability::Replicated => idle,
        }
    }

    /// Answer one request in local mode: commits are applied at once. (A replicated
    /// coordinator's driver calls [`Coordinator::step`] and commits through Raft; here it
    /// answers only requests that commit nothing, such as `Status`.)
    pub fn handle(&self, request: ControlRequest, now: Instant) -> Result<ControlResponse, RemoteError> {
        self.handle_as(request, CertKey::UNCHECKED, now)
    }

    /// [`Coordinator::handle`] for a peer proving `caller`.
    pub fn handle_as(&self, request: ControlRequest, caller: CertKey, now: Instant) -> Result<ControlResponse, RemoteError> {
        let mut request = request;
        // A request commits at most twice (create a job, clear its failure), then answers.
        for _ in 0..4 {
            match self.step_as(request, caller, now) {
                Outcome::Reply(answer) => {
                    let checkpoints = if self.durability == Durability::Local { self.take_checkpoints() } else { None };
                    if let Some(checkpoints) = checkpoints {
                        self.lock().apply(checkpoints);
                    }
                    return answer;
                }
                Outcome::Commit { .. } if self.durability == Durability::Replicated => {
                    return Err(RemoteError::new(
                        ErrorCode::Internal,
                        "a replicated coordinator commits through Raft: call it over the network",
                    ));
                }
                Outcome::Commit { command, then } => {
                    self.lock().apply(command);
                    match then {
                        Then::Again(again) => request = again,
                        Then::Reply(answer) => return Ok(answer),
                    }
                }
            }
        }
        Err(RemoteError::new(ErrorCode::Internal, "a request kept asking for commits"))
    }

    /// Handle one request as far as it goes without a commit.
    pub fn step(&self, request: ControlRequest, now: Instant) -> Outcome {
        self.step_as(request, CertKey::UNCHECKED, now)
    }

    /// [`Coordinator::step`] for a peer proving `caller` (its role already checked): it may
    /// speak only for the sessions and the worker ids its certificate owns.
    pub fn step_as(&self, request: ControlRequest, caller: CertKey, now: Instant) -> Outcome {
        match request {
            ControlRequest::AddDataset { name, manifest } => self.add_dataset(name, &manifest),
            ControlRequest::Attach { spec, rank, client } => self.attach(spec, rank, client, caller, now),
            ControlRequest::RemoveJob { name, force } => self.remove_job(name, force, now),
            ControlRequest::ChunkFatal { worker, lease, reason } => {
                if let Err(refusal) = self.lock().scheduler.check_worker_key(worker, caller) {
                    return Outcome::Reply(Err(refused(refusal)));
                }
                let Some(job) = self.lock().scheduler.chunk_fatal(worker, lease) else { return Outcome::Reply(Ok(ControlResponse::Ack)) };
                tracing::error!(%job, %worker, %lease, %reason, "job failed: a chunk cannot be made");
                Outcome::Commit { command: Command::FailJob { job, reason }, then: Then::Reply(ControlResponse::Ack) }
            }
            other => Outcome::Reply(self.answer(other, caller, now)),
        }
    }

    /// Requests that change no durable state.
    fn answer(&self, request: ControlRequest, caller: CertKey, now: Instant) -> Result<ControlResponse, RemoteError> {
        if let Some(worker) = worker_of(&request) {
            self.lock().scheduler.check_worker_key(worker, caller).map_err(refused)?;
        }
        match request {
            ControlRequest::AddDataset { .. }
            | ControlRequest::Attach { .. }
            | ControlRequest::RemoveJob { .. }
            | ControlRequest::ChunkFatal { .. }
            | ControlRequest::Raft { .. }
            | ControlRequest::NodeStatus
            | ControlRequest::AddNode { .. }
            | ControlRequest::RemoveNode { .. } => {
                Err(RemoteError::new(ErrorCode::InvalidArgument, "this coordinator does not answer that request here"))
            }
            ControlRequest::ListDatasets => {
                Ok(ControlResponse::Datasets { datasets: self.lock().state.datasets.values().cloned().collect() })
            }
            ControlRequest::OpenEpoch { job, rank, epoch, start, session, pass, consumed, holding } => {
                let mut inner = self.lock();
                inner.check_job(job, rank)?;
                inner.check_owner(job, rank, session, caller)?;
                inner.check_not_failed(job)?;
                check_list_len("holding", holding.len())?;
                let opening = Opening { session, pass, consumed, holding };
                let steps = inner.open_run(RunKey { job, epoch, start }, rank, &opening, now);
                inner.forget_plans_of_finished_runs();
                Ok(ControlResponse::EpochOpened { steps: steps? })
            }
            ControlRequest::ReportProgress {
                job,
                rank,
                epoch,
                start,
                consumed,
                wait_seconds,
                batches,
                samples,
                session,
                pass,
                missing,
            } => {
                let mut inner = self.lock();
                inner.check_job(job, rank)?;
                inner.check_owner(job, rank, session, caller)?;
                inner.check_not_failed(job)?;
                check_list_len("missing", missing.len())?;
                let reporting = Reporting { session, pass, consumed, missing };
                let run_known = inner.record_progress(RunKey { job, epoch, start }, rank, &reporting, wait_seconds, now)?;
                inner.record_totals(job, rank, RankTotals { session, batches, samples, wait_seconds });
                Ok(ControlResponse::ProgressRecorded { workers: inner.scheduler.alive_workers(now), run_known })
            }
            ControlRequest::RegisterWorker { addr, threads, instance, attempt } => {
                let process = crate::scheduler::WorkerProcess { instance, attempt };
                let worker = self.lock().scheduler.register_worker_as(addr, threads, process, caller, now);
                Ok(ControlResponse::WorkerRegistered {
                    worker,
                    heartbeat_millis: self.config.heartbeat.as_millis() as u64,
                    lease_ttl_millis: self.config.lease_ttl.as_millis() as u64,
                    lease_stall_millis: self.config.lease_stall.as_millis() as u64,
                })
            }
            ControlRequest::Heartbeat { worker, leases, images, stuck_jobs } => {
                check_list_len("leases", leases.len())?;
                check_list_len("stuck_jobs", stuck_jobs.len())?;
                let mut inner = self.lock();
                let revoked = inner.scheduler.heartbeat(worker, &leases, images, &stuck_jobs, now).map_err(refused)?;
                Ok(ControlResponse::HeartbeatAck { revoked, live_jobs: inner.scheduler.live_jobs(now) })
            }
            ControlRequest::PullChunks { worker, max } => self.pull(worker, max, now),
            ControlRequest::ChunkDone { worker, lease } => {
                let held_opt = self.lock().scheduler.chunk_done(worker, lease, now);
                if let (Some(held), Some(histogram)) = (held_opt, self.lease_seconds.get()) {
                    histogram.observe(held.as_secs_f64());
                }
                Ok(ControlResponse::Ack)
            }
            ControlRequest::ChunkFailed { worker, lease, reason } => {
                tracing::warn!(%worker, %lease, %reason, "chunk failed; granting it again");
                self.lock().scheduler.chunk_failed(worker, lease, now);
                Ok(ControlResponse::Ack)
            }
            ControlRequest::Deregister { worker } => {
                self.lock().scheduler.deregister(worker);
                Ok(ControlResponse::Ack)
            }
            ControlRequest::Status => Ok(ControlResponse::Status { status: self.status(now) }),
            ControlRequest::Detach { job, rank, session } => {
                let mut inner = self.lock();
                inner.check_job(job, rank)?;
                inner.check_record(job, rank, session, caller)?;
                inner.owners.check(job, rank, session, caller)?;
                inner.scheduler.detach(job, rank, session).map_err(refused)?;
                inner.forget_plans_of_finished_runs();
                tracing::info!(%job, %rank, %session, "trainer detached");
                Ok(ControlResponse::Ack)
            }
        }
    }

    fn remove_job(&self, name: String, force: bool, now: Instant) -> Outcome {
        let inner = self.lock();
        let Some((job, spec)) = inner.state.job_named(&name).map(|(job, spec)| (job, spec.clone())) else {
            return Outcome::Reply(Err(not_found(format!("no job named {name:?}: `stoker job ls` lists them"))));
        };
        let live = inner.scheduler.live_trainers(job, spec.plan.world_size.get(), now);
        if !live.is_empty() && !force {
            let ranks: Vec<String> = live.iter().map(ToString::to_string).collect();
            return Outcome::Reply(Err(invalid(format!(
                "job {name:?} has live trainers ({}): stop them first, or pass --force (they fail at their next request)",
                ranks.join(", ")
            ))));
        }
        tracing::info!(%job, %name, live = live.len(), "removing job");
        Outcome::Commit { command: Command::RemoveJob { job }, then: Then::Reply(ControlResponse::JobRemoved { job }) }
    }

    fn add_dataset(&self, name: String, manifest: &str) -> Outcome {
        match self.dataset_to_add(name, manifest) {
            Ok(dataset) => {
                tracing::info!(dataset = %dataset.name, manifest = %dataset.manifest, "adding dataset");
                let then = Then::Reply(ControlResponse::DatasetAdded { dataset: dataset.clone() });
                Outcome::Commit { command: Command::AddDataset { dataset }, then }
            }
            Err(error) => Outcome::Reply(Err(error)),
        }
    }

    /// Check and load a dataset's manifest (file IO: the driver calls this off the async
    /// threads).
    fn dataset_to_add(&self, name: String, manifest: &str) -> Result<DatasetInfo, RemoteError> {
        if name.is_empty() || name.len() > 256 {
            return Err(invalid("a dataset name must have 1 to 256 characters"));
        }
        let given = Path::new(manifest);
        let path = if given.is_dir() { given.join("manifest.json") } else { given.to_path_buf() };
        // After symlinks are resolved: a link inside a root to a file outside it is outside.
        let roots = DatasetRoots::new(self.config.dataset_roots.iter().cloned()).map_err(refused_path)?;
        let path = roots.check_file(&path).map_err(|error| match error {
            ShardError::Io { .. } => invalid(format!("{error} (give a manifest.json, or the folder `stoker pack` wrote)")),
            other => refused_path(other),
        })?;
        {
            let inner = self.lock();
            let count = inner.state.datasets.len();
            if !inner.state.datasets.contains_key(&name) && count >= self.config.max_datasets {
                return Err(invalid(format!(
                    "the coordinator keeps {count} datasets, its limit (--max-datasets {}): remove some, or raise it",
                    self.config.max_datasets
                )));
            }
        }
        let (loaded, version) = Manifest::load_versioned(&path).map_err(|error| invalid(error.to_string()))?;
        roots.check_shards(&loaded, path.parent().unwrap_or(&path)).map_err(refused_path)?;
        let dataset = DatasetInfo {
            name,
            manifest: path.to_string_lossy().into_owned(),
            shard_counts: loaded.shards.iter().map(|shard| shard.samples).collect(),
            version,
        };
        ShardTable::new(dataset.shard_counts.iter().copied()).map_err(|error| invalid(error.to_string()))?;
        Ok(dataset)
    }

    fn attach(&self, spec: JobSpec, rank: Rank, client: u64, caller: CertKey, now: Instant) -> Outcome {
        if let Err(error) = validate_spec(&spec, rank) {
            return Outcome::Reply(Err(error));
        }
        match self.attach_existing(&spec, rank, client, caller, now) {
            // Under mutual TLS the session and its certificate are committed before the trainer
            // learns the session, so that a later leader adopts that session from that
            // certificate only (nobody can take a rank over by naming a session after a
            // fail-over).
            Ok(Some(ControlResponse::Attached { job, dataset, workers, checkpoint, session })) if caller != CertKey::UNCHECKED => {
                let answer = ControlResponse::Attached { job, dataset, workers, checkpoint, session };
                Outcome::Commit { command: Command::RecordSession { job, rank, session, key: caller }, then: Then::Reply(answer) }
            }
            Ok(Some(answer)) => Outcome::Reply(Ok(answer)),
            Ok(None) => Outcome::Reply(Err(RemoteError::new(ErrorCode::Internal, "attach needs no commit"))),
            Err(AttachNeeds::Commit(command)) => {
                Outcome::Commit { command, then: Then::Again(ControlRequest::Attach { spec, rank, client }) }
            }
            Err(AttachNeeds::Refusal(error)) => Outcome::Reply(Err(error)),
        }
    }

    /// Attach to the job of `spec` if it exists and has not failed; otherwise the command that
    /// creates it (or clears its failure) first.
    // Once per attach, and the "error" is the usual way on: a command is no burden to move.
    #[allow(clippy::result_large_err)]
    fn attach_existing(
        &self,
        spec: &JobSpec,
        rank: Rank,
        client: u64,
        caller: CertKey,
        now: Instant,
    ) -> Result<Option<ControlResponse>, AttachNeeds> {
        let mut inner = self.lock();
        let Some(current) = inner.state.datasets.get(&spec.dataset).cloned() else {
            return Err(AttachNeeds::Refusal(not_found(format!(
                "dataset {:?} is not registered: add it with `stoker dataset add {} PATH`",
                spec.dataset, spec.dataset
            ))));
        };
        let job = match inner.state.job_named(&spec.name) {
            Some((id, existing)) if existing == spec => {
                if let Some(bound) = inner.state.job_dataset(id).filter(|bound| bound.version != current.version) {
                    return Err(AttachNeeds::Refusal(invalid(format!(
                        "job {:?} was made for dataset {:?} as it was when the job started (manifest {}, version {:016x}); \
                         the name now stands for other data (manifest {}, version {:016x}), and the job's checkpoints and \
                         plans refer to the old one: give this run another job name to train on the new data",
                        spec.name, spec.dataset, bound.manifest, bound.version, current.manifest, current.version
                    ))));
                }
                id
            }
            Some((_, existing)) => {
                return Err(AttachNeeds::Refusal(invalid(format!(
                    "job {:?} exists with another spec ({}); attach every rank with the same spec, or pick another job name",
                    spec.name,
                    describe_difference(existing, spec)
                ))));
            }
            None => {
                // Limits apply to new jobs only: a job that exists keeps being served to the
                // ranks that come back (its spec cannot change), whatever the limit says now.
                check_batch_size(spec, self.config.max_batch_bytes).map_err(AttachNeeds::Refusal)?;
                check_job_limits(spec, &self.config, inner.state.jobs.len()).map_err(AttachNeeds::Refusal)?;
                tracing::info!(name = %spec.name, dataset = %spec.dataset, "creating job");
                return Err(AttachNeeds::Commit(Command::CreateJob { spec: spec.clone() }));
            }
        };
        if let Some(reason) = inner.state.failed.get(&job) {
            tracing::info!(%job, %reason, "a trainer attached to a failed job: trying again");
            return Err(AttachNeeds::Commit(Command::ClearFailure { job }));
        }
        let checkpoint = inner.state.checkpoints.get(&job).copied();
        let dataset = inner.state.job_dataset(job).cloned().unwrap_or(current);
        // The same loader asking again (its answer was lost) keeps its session; anyone else,
        // even with the same client number, gets a new one.
        let repeated =
            inner.scheduler.attached(job, rank, client).filter(|session| inner.owners.owner(job, rank, *session).admits(&caller));
        let session = match repeated {
            Some(session) => session,
            None => {
                let session = self.new_session(&mut inner);
                inner.owners.record(job, rank, session, caller);
                if inner.scheduler.attach(job, rank, session, client, now) {
                    tracing::info!(%job, %rank, %session, "rank attached again; the earlier trainer is no longer served");
                }
                session
            }
        };
        Ok(Some(ControlResponse::Attached { job, dataset, workers: inner.scheduler.alive_workers(now), checkpoint, session }))
    }

    fn pull(&self, worker: WorkerId, max: u32, now: Instant) -> Result<ControlResponse, RemoteError> {
        let mut inner = self.lock();
        let granted = inner.scheduler.pull(worker, max, now).map_err(refused)?;
        let grants = granted
            .into_iter()
            .filter_map(|(lease, chunk)| {
                let spec = inner.state.jobs.get(&chunk.job)?.clone();
                let dataset = inner.state.job_dataset(chunk.job)?;
                let session = inner.scheduler.session_of(chunk.job, chunk.rank).unwrap_or(SessionId(0));
                let trainer = inner.owner_of(chunk.job, chunk.rank, session);
                Some(ChunkGrant {
                    lease,
                    chunk,
                    spec,
                    manifest: dataset.manifest.clone(),
                    dataset_version: dataset.version,
                    session,
                    trainer,
                })
            })
            .collect();
        Ok(ControlResponse::Chunks { grants })
    }

    /// What `stoker status` shows of this coordinator's state (the driver adds every
    /// coordinator's Raft view).
    pub fn status(&self, now: Instant) -> ClusterStatus {
        let inner = self.lock();
        let jobs = inner
            .state
            .jobs
            .iter()
            .map(|(id, spec)| {
                let counts = inner.scheduler.job_counts(*id);
                let heard = inner.scheduler.last_heard(*id).unwrap_or(inner.started);
                JobStatus {
                    id: *id,
                    spec: spec.clone(),
                    steps_queued: counts.queued,
                    chunks_leased: counts.leased,
                    ranks: inner.ranks.range((*id, Rank(0))..=(*id, Rank(u32::MAX))).map(|(_, status)| *status).collect(),
                    live_ranks: inner.scheduler.live_trainers(*id, spec.plan.world_size.get(), now),
                    idle_seconds: now.saturating_duration_since(heard).as_secs_f64(),
                    checkpoint: inner.state.checkpoints.get(id).copied(),
                }
            })
            .collect();
        ClusterStatus {
            coordinator: self.advertised.clone(),
            coordinators: Vec::new(),
            datasets: inner.state.datasets.len() as u32,
            workers: inner.scheduler.worker_status(now),
            jobs,
        }
    }

    /// Time every lease held until done into `histogram` from now on.
    pub fn observe_leases(&self, histogram: Histogram) {
        let _ = self.lease_seconds.set(histogram);
    }

    /// What the metrics show: the leader's soft state (empty on a follower).
    pub fn figures(&self, now: Instant) -> Figures {
        let inner = self.lock();
        let scheduler = &inner.scheduler;
        let jobs = inner
            .state
            .jobs
            .iter()
            .map(|(id, spec)| {
                let counts = scheduler.job_counts(*id);
                let ranks = inner.ranks.range((*id, Rank(0))..=(*id, Rank(u32::MAX)));
                JobFigures {
                    name: spec.name.clone(),
                    world_size: spec.plan.world_size.get(),
                    batch_size: spec.plan.batch_size.get(),
                    steps_queued: counts.queued,
                    chunks_leased: counts.leased,
                    done: scheduler.done(*id),
                    window: scheduler.window_fill(*id),
                    live_ranks: scheduler.live_trainers(*id, spec.plan.world_size.get(), now).len(),
                    ranks: ranks.map(|(key, status)| (*status, inner.totals.get(key).copied())).collect(),
                }
            })
            .collect();
        Figures {
            workers_alive: scheduler.alive_workers(now).len(),
            leases_expired: scheduler.leases_expired(),
            chunks_failed: scheduler.chunks_failed(),
            sessions_superseded: scheduler.sessions_superseded(),
            jobs,
        }
    }

    /// Leases expired so far (for metrics and tests).
    pub fn leases_expired(&self) -> u64 {
        self.lock().scheduler.leases_expired()
    }

    /// Chunks workers reported failed so far (for metrics and tests).
    pub fn chunks_failed(&self) -> u64 {
        self.lock().scheduler.chunks_failed()
    }

    /// Coordinator node ids that took part in the cluster.
    pub fn nodes_joined(&self) -> std::collections::BTreeSet<u64> {
        self.lock().state.nodes_joined.clone()
    }

    /// A copy of the durable state (for tests and status).
    pub fn state(&self) -> ClusterState {
        self.lock().state.clone()
    }
}

/// Most entries a list in a request may hold (`holding`, `missing`, a heartbeat's leases):
/// far more than any flow window or worker holds, far less than a frame could carry.
const MAX_LIST_LEN: usize = 65_536;

fn check_list_len(what: &str, len: usize) -> Result<(), RemoteError> {
    if len > MAX_LIST_LEN {
        return Err(invalid(format!("{len} entries in `{what}`, over the limit of {MAX_LIST_LEN}")));
    }
    Ok(())
}

/// What attaching needs first.
enum AttachNeeds {
    /// This committed.
    Commit(Command),
    /// Nothing: it is refused.
    Refusal(RemoteError),
}

impl Replica for Coordinator {
    fn apply(&self, command: Command) -> Applied {
        self.lock().apply(command)
    }

    fn snapshot(&self) -> ClusterState {
        self.lock().state.clone()
    }

    fn restore(&self, state: ClusterState) {
        self.lock().state = state;
    }
}

impl Inner {
    /// Apply a committed command, and forget the soft state of a job it removes or fails.
    fn apply(&mut self, command: Command) -> Applied {
        let removed = match &command {
            Command::RemoveJob { job } => Some(*job),
            _ => None,
        };
        let failed = matches!(command, Command::FailJob { .. });
        let applied = self.state.apply(command);
        if let Some(job) = removed {
            self.scheduler.forget_job(job);
            self.ranks.retain(|(ranked_job, _), _| *ranked_job != job);
            self.totals.retain(|(ranked_job, _), _| *ranked_job != job);
            self.pending.remove(&job);
        }
        if removed.is_some() || failed {
            self.forget_plans_of_finished_runs();
        }
        applied
    }

    /// Drop the plans of runs that are gone (finished, left by every rank, or failed).
    fn forget_plans_of_finished_runs(&mut self) {
        let scheduler = &self.scheduler;
        self.plans.retain(|key, _| scheduler.has_run(*key));
    }

    /// Refuse a trainer's request for a job that does not exist or a rank outside it.
    fn check_job(&self, job: JobId, rank: Rank) -> Result<(), RemoteError> {
        let Some(spec) = self.state.jobs.get(&job) else {
            return Err(not_found(format!("{job} does not exist: attach first")));
        };
        if rank.0 >= spec.plan.world_size.get() {
            return Err(invalid(format!("{rank} is outside world size {}", spec.plan.world_size)));
        }
        Ok(())
    }

    /// Refuse the requests of a failed job's trainers, with the reason it failed.
    /// Keep a trainer's totals: a newer session's replace an older one's (a new trainer counts
    /// from 0), and within a session they only grow (a report that arrives late, after a newer
    /// one, changes nothing).
    fn record_totals(&mut self, job: JobId, rank: Rank, reported: RankTotals) {
        let totals = self.totals.entry((job, rank)).or_insert(reported);
        if reported.session > totals.session {
            *totals = reported;
        } else if reported.session == totals.session {
            totals.batches = totals.batches.max(reported.batches);
            totals.samples = totals.samples.max(reported.samples);
            totals.wait_seconds = totals.wait_seconds.max(reported.wait_seconds);
        }
    }

    /// Refuse `caller` speaking for a session another certificate owns, or one that is not the
    /// rank's newest; a session adopted here (the coordinator restarted since it attached) is
    /// owned by the first certificate that speaks for it.
    fn check_owner(&mut self, job: JobId, rank: Rank, session: SessionId, caller: CertKey) -> Result<(), RemoteError> {
        self.check_record(job, rank, session, caller)?;
        self.owners.check(job, rank, session, caller)?;
        self.scheduler.check_session(job, rank, session).map_err(refused)?;
        if self.owners.owner(job, rank, session) == CertKey::UNCHECKED {
            self.owners.record(job, rank, session, caller);
        }
        Ok(())
    }

    /// Refuse a session other than the rank's recorded newest, or the recorded one from another
    /// certificate. Nothing is recorded under `--insecure` (nor for ranks that attached before
    /// records existed): then the seats alone decide, adopting unknown newer sessions.
    fn check_record(&self, job: JobId, rank: Rank, session: SessionId, caller: CertKey) -> Result<(), RemoteError> {
        let Some((recorded, owner)) = self.state.sessions.get(&job).and_then(|ranks| ranks.get(&rank)) else { return Ok(()) };
        match session.cmp(recorded) {
            std::cmp::Ordering::Equal if owner.admits(&caller) => Ok(()),
            std::cmp::Ordering::Equal => Err(crate::authz::not_yours(session, *owner, caller)),
            std::cmp::Ordering::Less => Err(refused(Refusal::Seat(SeatRefusal::Superseded { job, rank, session }))),
            std::cmp::Ordering::Greater => Err(RemoteError::new(
                ErrorCode::Forbidden,
                format!("{session} was never given to {rank} of {job} (its newest is {recorded}): attach to get a session"),
            )),
        }
    }

    /// The certificate that owns `session` of (job, rank): as this leader saw it attach or
    /// re-open, else as recorded; [`CertKey::UNCHECKED`] if neither knows.
    fn owner_of(&self, job: JobId, rank: Rank, session: SessionId) -> CertKey {
        let soft = self.owners.owner(job, rank, session);
        if soft != CertKey::UNCHECKED {
            return soft;
        }
        match self.state.sessions.get(&job).and_then(|ranks| ranks.get(&rank)) {
            Some((recorded, owner)) if *recorded == session => *owner,
            _ => CertKey::UNCHECKED,
        }
    }

    fn check_not_failed(&self, job: JobId) -> Result<(), RemoteError> {
        match self.state.failed.get(&job) {
            Some(reason) => Err(RemoteError::new(ErrorCode::JobFailed, format!("{job} failed: {reason}"))),
            None => Ok(()),
        }
    }

    fn open_run(&mut self, key: RunKey, rank: Rank, opening: &Opening, now: Instant) -> Result<u64, RemoteError> {
        let Some(spec) = self.state.jobs.get(&key.job) else {
            return Err(not_found(format!("{} does not exist: attach first", key.job)));
        };
        let plan = match self.plans.get(&key) {
            Some(plan) => Arc::clone(plan),
            None => {
                let dataset =
                    self.state.job_dataset(key.job).ok_or_else(|| not_found(format!("dataset {:?} was removed", spec.dataset)))?;
                let table = ShardTable::new(dataset.shard_counts.iter().copied()).map_err(|error| invalid(error.to_string()))?;
                if key.start.0 > table.samples() {
                    return Err(invalid(format!("start {} is past the epoch's {} samples", key.start, table.samples())));
                }
                Arc::new(EpochPlan::starting_at(Arc::new(table), spec.plan, key.epoch, key.start))
            }
        };
        let shape = RunShape { steps: plan.steps(), world_size: spec.plan.world_size.get(), prefetch: spec.prefetch };
        self.scheduler.open_run(key, rank, opening, shape, now).map_err(refused)?;
        self.plans.insert(key, Arc::clone(&plan));
        let status = self.ranks.entry((key.job, rank)).or_insert(RankStatus {
            rank,
            epoch: key.epoch,
            consumed: Step(0),
            steps: plan.steps(),
            wait_seconds: 0.0,
        });
        status.epoch = key.epoch;
        status.consumed = Step(opening.consumed);
        status.steps = plan.steps();
        Ok(plan.steps())
    }

    /// Record a rank's progress; `false` if the run is unknown (finished, or lost in a
    /// coordinator restart: a rank still inside it opens it again). A late report of a
    /// finished run must not re-create it, so unknown runs are never opened here.
    fn record_progress(
        &mut self,
        key: RunKey,
        rank: Rank,
        reporting: &Reporting,
        wait_seconds: f64,
        now: Instant,
    ) -> Result<bool, RemoteError> {
        let recorded = self.scheduler.record_progress(key, rank, reporting, now).map_err(refused)?;
        let Some(slowest) = recorded.slowest_opt else { return Ok(recorded.run_known) };
        if let Some(status) = self.ranks.get_mut(&(key.job, rank)).filter(|status| status.epoch == key.epoch) {
            status.consumed = Step(reporting.consumed);
            status.wait_seconds = wait_seconds;
        }
        let Some(plan) = self.plans.get(&key) else { return Ok(true) };
        if slowest == 0 {
            return Ok(true);
        }
        let checkpoint = plan.checkpoint_after(Step(slowest - 1));
        let latest = self.pending.get(&key.job).or_else(|| self.state.checkpoints.get(&key.job));
        let unchanged = latest == Some(&checkpoint);
        if !self.scheduler.has_run(key) {
            self.plans.remove(&key);
        }
        if !unchanged {
            // Committed at the next flush, with every other job's (`take_checkpoints`).
            self.pending.insert(key.job, checkpoint);
        }
        Ok(true)
    }
}

/// The worker a worker's request speaks for.
fn worker_of(request: &ControlRequest) -> Option<WorkerId> {
    match request {
        ControlRequest::Heartbeat { worker, .. }
        | ControlRequest::PullChunks { worker, .. }
        | ControlRequest::ChunkDone { worker, .. }
        | ControlRequest::ChunkFailed { worker, .. }
        | ControlRequest::ChunkFatal { worker, .. }
        | ControlRequest::Deregister { worker } => Some(*worker),
        _ => None,
    }
}

fn validate_spec(spec: &JobSpec, rank: Rank) -> Result<(), RemoteError> {
    if spec.name.is_empty() || spec.name.len() > 256 {
        return Err(invalid("a job name must have 1 to 256 characters"));
    }
    if spec.dataset.len() > 256 {
        return Err(invalid("a dataset name has at most 256 characters"));
    }
    // A spec travels in every Raft entry that creates its job, every grant and every status:
    // bounded so that they stay far below the frame limit (a real one is under 2 KB).
    let spec_bytes = serde_json::to_string(&spec.transforms).map_or(usize::MAX, |text| text.len());
    if spec_bytes > MAX_TRANSFORM_SPEC_BYTES {
        return Err(invalid(format!("the transform spec has {spec_bytes} bytes, over the {MAX_TRANSFORM_SPEC_BYTES} a job may have")));
    }
    if rank.0 >= spec.plan.world_size.get() {
        return Err(invalid(format!("{rank} is outside world size {} (ranks count from 0)", spec.plan.world_size)));
    }
    if spec.prefetch == 0 {
        return Err(invalid("prefetch must be at least 1 step"));
    }
    Recipe::new(&spec.transforms).map_err(|error| invalid(format!("the transform spec is not valid: {error}")))?;
    Ok(())
}

/// Refuse a new job over the coordinator's limits on ranks, flow window and job count.
fn check_job_limits(spec: &JobSpec, config: &CoordinatorConfig, jobs: usize) -> Result<(), RemoteError> {
    let world_size = spec.plan.world_size.get();
    if world_size > config.max_world_size {
        return Err(invalid(format!(
            "world size {world_size} is over the coordinator's limit of {} ranks (raise it with --max-world-size)",
            config.max_world_size
        )));
    }
    if spec.prefetch > config.max_prefetch {
        return Err(invalid(format!(
            "prefetch {} is over the coordinator's limit of {} steps (raise it with --max-prefetch)",
            spec.prefetch, config.max_prefetch
        )));
    }
    if jobs >= config.max_jobs {
        return Err(invalid(format!(
            "the coordinator keeps {jobs} jobs, its limit (--max-jobs {}): remove finished ones with `stoker job rm`, or raise it",
            config.max_jobs
        )));
    }
    Ok(())
}

/// Most samples a batch may have: its header (a label and a key per sample) must fit a frame.
pub const MAX_BATCH_SIZE: u32 = 16_384;

/// Refuse a new job whose batches are larger than `max_batch_bytes` (batch size × one output
/// sample's bytes) or hold more than [`MAX_BATCH_SIZE`] samples, before any worker allocates.
fn check_batch_size(spec: &JobSpec, max_batch_bytes: u64) -> Result<(), RemoteError> {
    let batch_size = spec.plan.batch_size.get();
    if batch_size > MAX_BATCH_SIZE {
        return Err(invalid(format!("batch size {batch_size} is over the most a batch may hold ({MAX_BATCH_SIZE} samples)")));
    }
    let recipe = Recipe::new(&spec.transforms).map_err(|error| invalid(format!("the transform spec is not valid: {error}")))?;
    let batch_bytes = u64::from(batch_size).saturating_mul(recipe.sample_bytes() as u64);
    if batch_bytes > max_batch_bytes {
        return Err(invalid(format!(
            "a batch of this job is {batch_bytes} bytes ({:.1} MiB: {batch_size} samples of {} bytes, {:?}), over the \
             coordinator's limit of {max_batch_bytes} bytes ({:.1} MiB): lower the batch size or the output size, or raise \
             the limit (stoker coordinator --max-batch-bytes)",
            batch_bytes as f64 / f64::from(1 << 20),
            recipe.sample_bytes(),
            recipe.batch_shape(1),
            max_batch_bytes as f64 / f64::from(1 << 20)
        )));
    }
    Ok(())
}

fn describe_difference(existing: &JobSpec, wanted: &JobSpec) -> String {
    let mut differences = Vec::new();
    if existing.dataset != wanted.dataset {
        differences.push(format!("dataset {:?} vs {:?}", existing.dataset, wanted.dataset));
    }
    if existing.plan != wanted.plan {
        differences.push(format!("plan {:?} vs {:?}", existing.plan, wanted.plan));
    }
    if existing.transforms != wanted.transforms {
        differences.push("transforms differ".to_owned());
    }
    if existing.prefetch != wanted.prefetch {
        differences.push(format!("prefetch {} vs {}", existing.prefetch, wanted.prefetch));
    }
    differences.join(", ")
}

/// [`CoordinatorApi`] by direct calls, for tests of worker and client logic.
#[derive(Clone, Debug)]
pub struct LocalCoordinator(pub Arc<Coordinator>);

impl CoordinatorApi for LocalCoordinator {
    async fn call(&self, request: ControlRequest) -> Result<ControlResponse, RemoteError> {
        self.0.handle(request, Instant::now())
    }
}

#[cfg(test)]
#[path = "service_tests.rs"]
mod tests;
