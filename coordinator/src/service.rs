//! The coordinator's request handling: validates requests, commits durable changes through
//! the [`Store`], and asks the [`Scheduler`] for decisions. Synchronous and quick: the lock is
//! held for the pure decisions and the append of one log line, never across network IO.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use stoker_common::api::CoordinatorApi;
use stoker_common::ids::{JobId, Rank, SessionId, Step, WorkerId};
use stoker_common::plan::{EpochPlan, ShardTable};
use stoker_common::proto::{
    ChunkGrant, ClusterStatus, ControlRequest, ControlResponse, DatasetInfo, ErrorCode, JobSpec, JobStatus, RankStatus, RemoteError,
};
use stoker_common::shard::Manifest;
use stoker_common::transform::{Recipe, TransformSpec};

use crate::config::CoordinatorConfig;
use crate::error::CoordinatorError;
use crate::scheduler::{Opening, Refusal, Reporting, RunKey, RunShape, Scheduler, SeatRefusal};
use crate::state::{Applied, ClusterState, Command};
use crate::store::Store;

struct Inner {
    state: ClusterState,
    store: Store,
    scheduler: Scheduler,
    plans: BTreeMap<RunKey, Arc<EpochPlan>>,
    ranks: BTreeMap<(JobId, Rank), RankStatus>,
    next_session: u64,
    /// Jobs that cannot go on (an `on_error=fail` sample), with the worker's reason. Not durable,
    /// and a new `Attach` clears it: a restarted trainer (the data fixed) tries again.
    failed: BTreeMap<JobId, String>,
    /// When this coordinator started: a job no trainer was heard from since is idle since then.
    started: Instant,
}

/// A coordinator's state and logic, without the network.
pub struct Coordinator {
    inner: Mutex<Inner>,
    config: CoordinatorConfig,
    advertised: String,
}

impl std::fmt::Debug for Coordinator {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("Coordinator").field("advertised", &self.advertised).finish_non_exhaustive()
    }
}

fn invalid(message: impl Into<String>) -> RemoteError {
    RemoteError::new(ErrorCode::InvalidArgument, message)
}

fn not_found(message: impl Into<String>) -> RemoteError {
    RemoteError::new(ErrorCode::NotFound, message)
}

fn refused(refusal: Refusal) -> RemoteError {
    match refusal {
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

impl Coordinator {
    /// Load the state in `config.data_dir`. `advertised` is the address status reports.
    pub fn open(config: CoordinatorConfig, advertised: String) -> Result<Self, CoordinatorError> {
        let config = config.validate()?;
        let (store, state) = Store::open(&config.data_dir)?;
        let id_base = SystemTime::now().duration_since(UNIX_EPOCH).map_or(1, |elapsed| elapsed.as_millis() as u64 * 1000);
        Ok(Self::with_store(config, advertised, store, state, id_base))
    }

    /// A coordinator whose state lives in memory only, starting from `state`, with ids from
    /// `id_base` (for simulations and tests: the protocol model drives it with a simulated
    /// clock, and "restarts" it by building a new one from the old one's durable state).
    pub fn in_memory(config: CoordinatorConfig, state: ClusterState, id_base: u64) -> Result<Self, CoordinatorError> {
        let config = config.validate()?;
        let (store, _) = Store::in_memory();
        Ok(Self::with_store(config, "in-memory".to_owned(), store, state, id_base))
    }

    fn with_store(config: CoordinatorConfig, advertised: String, store: Store, state: ClusterState, id_base: u64) -> Self {
        let scheduler = Scheduler::new(config.scheduler(), id_base);
        let inner = Inner {
            state,
            store,
            scheduler,
            plans: BTreeMap::new(),
            ranks: BTreeMap::new(),
            next_session: id_base,
            failed: BTreeMap::new(),
            started: Instant::now(),
        };
        Self { inner: Mutex::new(inner), config, advertised }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves consistent data (apply is all-or-nothing).
        self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Expire leases and forget dead workers (also done on every request); remove jobs no
    /// trainer was heard from for the job TTL.
    pub fn tick(&self, now: Instant) {
        let mut inner = self.lock();
        inner.scheduler.expire(now);
        if let Some(ttl) = self.config.job_ttl {
            let idle: Vec<JobId> = inner
                .state
                .jobs
                .keys()
                .copied()
                .filter(|job| now.saturating_duration_since(inner.scheduler.last_heard(*job).unwrap_or(inner.started)) >= ttl)
                .collect();
            for job in idle {
                if let Err(error) = inner.remove_job(job) {
                    tracing::warn!(%job, %error, "cannot remove an idle job; trying again later");
                } else {
                    tracing::info!(%job, ttl_seconds = ttl.as_secs(), "job removed: no trainer for the job TTL (--job-ttl-hours)");
                }
            }
        }
    }

    /// Answer one request.
    pub fn handle(&self, request: ControlRequest, now: Instant) -> Result<ControlResponse, RemoteError> {
        match request {
            ControlRequest::AddDataset { name, manifest } => self.add_dataset(name, &manifest),
            ControlRequest::ListDatasets => {
                Ok(ControlResponse::Datasets { datasets: self.lock().state.datasets.values().cloned().collect() })
            }
            ControlRequest::Attach { spec, rank, client } => self.attach(spec, rank, client, now),
            ControlRequest::OpenEpoch { job, rank, epoch, start, session, pass, consumed, holding } => {
                let mut inner = self.lock();
                inner.check_job(job, rank)?;
                inner.scheduler.check_session(job, rank, session).map_err(refused)?;
                inner.check_not_failed(job)?;
                check_list_len("holding", holding.len())?;
                let opening = Opening { session, pass, consumed, holding };
                let steps = inner.open_run(RunKey { job, epoch, start }, rank, &opening, now);
                inner.forget_plans_of_finished_runs();
                Ok(ControlResponse::EpochOpened { steps: steps? })
            }
            ControlRequest::ReportProgress { job, rank, epoch, start, consumed, wait_seconds, session, pass, missing } => {
                let mut inner = self.lock();
                inner.check_job(job, rank)?;
                inner.scheduler.check_session(job, rank, session).map_err(refused)?;
                inner.check_not_failed(job)?;
                check_list_len("missing", missing.len())?;
                let reporting = Reporting { session, pass, consumed, missing };
                let run_known = inner.record_progress(RunKey { job, epoch, start }, rank, &reporting, wait_seconds, now)?;
                Ok(ControlResponse::ProgressRecorded { workers: inner.scheduler.alive_workers(now), run_known })
            }
            ControlRequest::RegisterWorker { addr, threads, instance, attempt } => {
                let process = crate::scheduler::WorkerProcess { instance, attempt };
                let worker = self.lock().scheduler.register_worker(addr, threads, process, now);
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
                self.lock().scheduler.chunk_done(worker, lease, now);
                Ok(ControlResponse::Ack)
            }
            ControlRequest::ChunkFailed { worker, lease, reason } => {
                tracing::warn!(%worker, %lease, %reason, "chunk failed; granting it again");
                self.lock().scheduler.chunk_failed(worker, lease, now);
                Ok(ControlResponse::Ack)
            }
            ControlRequest::ChunkFatal { worker, lease, reason } => {
                let mut inner = self.lock();
                if let Some(job) = inner.scheduler.chunk_fatal(worker, lease) {
                    tracing::error!(%job, %worker, %lease, %reason, "job failed: a chunk cannot be made");
                    inner.failed.entry(job).or_insert(reason);
                    inner.forget_plans_of_finished_runs();
                }
                Ok(ControlResponse::Ack)
            }
            ControlRequest::Deregister { worker } => {
                self.lock().scheduler.deregister(worker);
                Ok(ControlResponse::Ack)
            }
            ControlRequest::Status => Ok(ControlResponse::Status { status: self.status(now) }),
            ControlRequest::RemoveJob { name, force } => {
                let mut inner = self.lock();
                let Some((job, spec)) = inner.state.job_named(&name).map(|(job, spec)| (job, spec.clone())) else {
                    return Err(not_found(format!("no job named {name:?}: `stoker job ls` lists them")));
                };
                let live = inner.scheduler.live_trainers(job, spec.plan.world_size.get(), now);
                if !live.is_empty() && !force {
                    let ranks: Vec<String> = live.iter().map(ToString::to_string).collect();
                    return Err(invalid(format!(
                        "job {name:?} has live trainers ({}): stop them first, or pass --force (they fail at their next request)",
                        ranks.join(", ")
                    )));
                }
                inner.remove_job(job).map_err(|error| RemoteError::from(&error))?;
                tracing::info!(%job, %name, live = live.len(), "job removed");
                Ok(ControlResponse::JobRemoved { job })
            }
            ControlRequest::Detach { job, rank, session } => {
                let mut inner = self.lock();
                inner.check_job(job, rank)?;
                inner.scheduler.detach(job, rank, session).map_err(refused)?;
                inner.forget_plans_of_finished_runs();
                tracing::info!(%job, %rank, %session, "trainer detached");
                Ok(ControlResponse::Ack)
            }
        }
    }

    fn add_dataset(&self, name: String, manifest: &str) -> Result<ControlResponse, RemoteError> {
        if name.is_empty() || name.len() > 256 {
            return Err(invalid("a dataset name must have 1 to 256 characters"));
        }
        let given = Path::new(manifest);
        let path = if given.is_dir() { given.join("manifest.json") } else { given.to_path_buf() };
        let path = path.canonicalize().map_err(|error| {
            invalid(format!("cannot open {}: {error} (give a manifest.json, or the folder `stoker pack` wrote)", path.display()))
        })?;
        let (loaded, version) = Manifest::load_versioned(&path).map_err(|error| invalid(error.to_string()))?;
        let dataset = DatasetInfo {
            name,
            manifest: path.to_string_lossy().into_owned(),
            shard_counts: loaded.shards.iter().map(|shard| shard.samples).collect(),
            version,
        };
        ShardTable::new(dataset.shard_counts.iter().copied()).map_err(|error| invalid(error.to_string()))?;
        let mut inner = self.lock();
        let Inner { state, store, .. } = &mut *inner;
        store.commit(state, Command::AddDataset { dataset: dataset.clone() }).map_err(|error| RemoteError::from(&error))?;
        tracing::info!(dataset = %dataset.name, manifest = %dataset.manifest, "dataset added");
        Ok(ControlResponse::DatasetAdded { dataset })
    }

    fn attach(&self, spec: JobSpec, rank: Rank, client: u64, now: Instant) -> Result<ControlResponse, RemoteError> {
        validate_spec(&spec, rank)?;
        let mut inner = self.lock();
        let Some(current) = inner.state.datasets.get(&spec.dataset).cloned() else {
            return Err(not_found(format!(
                "dataset {:?} is not registered: add it with `stoker dataset add {} PATH`",
                spec.dataset, spec.dataset
            )));
        };
        let job = match inner.state.job_named(&spec.name) {
            Some((id, existing)) if *existing == spec => {
                if let Some(bound) = inner.state.job_dataset(id).filter(|bound| bound.version != current.version) {
                    return Err(invalid(format!(
                        "job {:?} was made for dataset {:?} as it was when the job started (manifest {}, version {:016x}); \
                         the name now stands for other data (manifest {}, version {:016x}), and the job's checkpoints and \
                         plans refer to the old one: give this run another job name to train on the new data",
                        spec.name, spec.dataset, bound.manifest, bound.version, current.manifest, current.version
                    )));
                }
                id
            }
            Some((_, existing)) => {
                return Err(invalid(format!(
                    "job {:?} exists with another spec ({}); attach every rank with the same spec, or pick another job name",
                    spec.name,
                    describe_difference(existing, &spec)
                )));
            }
            None => {
                let Inner { state, store, .. } = &mut *inner;
                match store.commit(state, Command::CreateJob { spec: spec.clone() }).map_err(|error| RemoteError::from(&error))? {
                    Applied::JobCreated(id) => {
                        tracing::info!(job = %id, name = %spec.name, dataset = %spec.dataset, "job created");
                        id
                    }
                    Applied::Done => return Err(RemoteError::new(ErrorCode::Internal, "creating a job did not create one")),
                }
            }
        };
        if let Some(reason) = inner.failed.remove(&job) {
            tracing::info!(%job, %reason, "a trainer attached to a failed job: trying again");
        }
        let checkpoint = inner.state.checkpoints.get(&job).copied();
        let dataset = inner.state.job_dataset(job).cloned().unwrap_or(current);
        let session = match inner.scheduler.attached(job, rank, client) {
            Some(session) => session,
            None => {
                let session = SessionId(inner.next_session);
                inner.next_session += 1;
                if inner.scheduler.attach(job, rank, session, client, now) {
                    tracing::info!(%job, %rank, %session, "rank attached again; the earlier trainer is no longer served");
                }
                session
            }
        };
        Ok(ControlResponse::Attached { job, dataset, workers: inner.scheduler.alive_workers(now), checkpoint, session })
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
                Some(ChunkGrant { lease, chunk, spec, manifest: dataset.manifest.clone(), dataset_version: dataset.version, session })
            })
            .collect();
        Ok(ControlResponse::Chunks { grants })
    }

    fn status(&self, now: Instant) -> ClusterStatus {
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
            datasets: inner.state.datasets.len() as u32,
            workers: inner.scheduler.worker_status(now),
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

impl Inner {
    /// Remove `job` durably and forget everything the scheduler holds of it.
    fn remove_job(&mut self, job: JobId) -> Result<(), CoordinatorError> {
        let Self { state, store, .. } = self;
        store.commit(state, Command::RemoveJob { job })?;
        self.scheduler.forget_job(job);
        self.ranks.retain(|(ranked_job, _), _| *ranked_job != job);
        self.failed.remove(&job);
        self.forget_plans_of_finished_runs();
        Ok(())
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
    fn check_not_failed(&self, job: JobId) -> Result<(), RemoteError> {
        match self.failed.get(&job) {
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
        let unchanged = self.state.checkpoints.get(&key.job) == Some(&checkpoint);
        if !self.scheduler.has_run(key) {
            self.plans.remove(&key);
        }
        if unchanged {
            return Ok(true);
        }
        self.store
            .commit(&mut self.state, Command::RecordCheckpoint { job: key.job, checkpoint })
            .map_err(|error| RemoteError::from(&error))?;
        Ok(true)
    }
}

fn validate_spec(spec: &JobSpec, rank: Rank) -> Result<(), RemoteError> {
    if spec.name.is_empty() || spec.name.len() > 256 {
        return Err(invalid("a job name must have 1 to 256 characters"));
    }
    if rank.0 >= spec.plan.world_size.get() {
        return Err(invalid(format!("{rank} is outside world size {} (ranks count from 0)", spec.plan.world_size)));
    }
    if spec.prefetch == 0 {
        return Err(invalid("prefetch must be at least 1 step"));
    }
    let transforms: TransformSpec =
        serde_json::from_str(&spec.transforms).map_err(|error| invalid(format!("the transform spec is not valid: {error}")))?;
    Recipe::new(&transforms).map_err(|error| invalid(format!("the transform spec is not valid: {error}")))?;
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
