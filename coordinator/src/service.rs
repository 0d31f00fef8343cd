//! The coordinator's request handling: validates requests, commits durable changes through
//! the [`Store`], and asks the [`Scheduler`] for decisions. Synchronous and quick: the lock is
//! held for the pure decisions and the append of one log line, never across network IO.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use stoker_common::api::CoordinatorApi;
use stoker_common::ids::{JobId, Rank, SessionId, Step};
use stoker_common::plan::{EpochPlan, ShardTable};
use stoker_common::proto::{
    ChunkGrant, ClusterStatus, ControlRequest, ControlResponse, DatasetInfo, ErrorCode, JobSpec, JobStatus, RankStatus, RemoteError,
};
use stoker_common::shard::Manifest;
use stoker_common::transform::{Recipe, TransformSpec};

use crate::config::CoordinatorConfig;
use crate::error::CoordinatorError;
use crate::scheduler::{Refusal, RunKey, Scheduler, SchedulerConfig};
use crate::state::{Applied, ClusterState, Command};
use crate::store::Store;

struct Inner {
    state: ClusterState,
    store: Store,
    scheduler: Scheduler,
    plans: BTreeMap<RunKey, Arc<EpochPlan>>,
    ranks: BTreeMap<(JobId, Rank), RankStatus>,
    /// The newest session of each attached rank (not durable: after a restart, the first
    /// session heard from is adopted).
    sessions: BTreeMap<(JobId, Rank), SessionId>,
    next_session: u64,
    /// Jobs that cannot go on (an `on_error=fail` sample), with the worker's reason. Not durable,
    /// and a new `Attach` clears it: a restarted trainer (the data fixed) tries again.
    failed: BTreeMap<JobId, String>,
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
    }
}

impl Coordinator {
    /// Load the state in `config.data_dir`. `advertised` is the address status reports.
    pub fn open(config: CoordinatorConfig, advertised: String) -> Result<Self, CoordinatorError> {
        let config = config.validate()?;
        let (store, state) = Store::open(&config.data_dir)?;
        let id_base = SystemTime::now().duration_since(UNIX_EPOCH).map_or(1, |elapsed| elapsed.as_millis() as u64 * 1000);
        let scheduler = Scheduler::new(
            SchedulerConfig {
                lease_ttl: config.lease_ttl,
                chunk_steps: config.chunk_steps,
                retry_delay: config.retry_delay,
                trainer_ttl: config.trainer_ttl,
            },
            id_base,
        );
        let inner = Inner {
            state,
            store,
            scheduler,
            plans: BTreeMap::new(),
            ranks: BTreeMap::new(),
            sessions: BTreeMap::new(),
            next_session: id_base,
            failed: BTreeMap::new(),
        };
        Ok(Self { inner: Mutex::new(inner), config, advertised })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves consistent data (apply is all-or-nothing).
        self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Expire leases and forget dead workers (also done on every request).
    pub fn tick(&self, now: Instant) {
        self.lock().scheduler.expire(now);
    }

    /// Answer one request.
    pub fn handle(&self, request: ControlRequest, now: Instant) -> Result<ControlResponse, RemoteError> {
        match request {
            ControlRequest::AddDataset { name, manifest } => self.add_dataset(name, &manifest),
            ControlRequest::ListDatasets => {
                Ok(ControlResponse::Datasets { datasets: self.lock().state.datasets.values().cloned().collect() })
            }
            ControlRequest::Attach { spec, rank } => self.attach(spec, rank, now),
            ControlRequest::OpenEpoch { job, rank, epoch, start, session } => {
                let mut inner = self.lock();
                inner.check_session(job, rank, session)?;
                inner.check_not_failed(job)?;
                let steps = inner.open_run(RunKey { job, epoch, start }, rank, now)?;
                Ok(ControlResponse::EpochOpened { steps })
            }
            ControlRequest::ReportProgress { job, rank, epoch, start, consumed, wait_seconds, session } => {
                let mut inner = self.lock();
                inner.check_session(job, rank, session)?;
                inner.check_not_failed(job)?;
                let run_known = inner.record_progress(RunKey { job, epoch, start }, rank, consumed, wait_seconds, now)?;
                Ok(ControlResponse::ProgressRecorded { workers: inner.scheduler.alive_workers(now), run_known })
            }
            ControlRequest::RegisterWorker { addr, threads } => {
                let worker = self.lock().scheduler.register_worker(addr, threads, now);
                Ok(ControlResponse::WorkerRegistered {
                    worker,
                    heartbeat_millis: self.config.heartbeat.as_millis() as u64,
                    lease_ttl_millis: self.config.lease_ttl.as_millis() as u64,
                })
            }
            ControlRequest::Heartbeat { worker, leases, images } => {
                let revoked = self.lock().scheduler.heartbeat(worker, &leases, images, now).map_err(refused)?;
                Ok(ControlResponse::HeartbeatAck { revoked })
            }
            ControlRequest::PullChunks { worker, max } => self.pull(worker, max, now),
            ControlRequest::ChunkDone { worker, lease } => {
                self.lock().scheduler.chunk_done(worker, lease);
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
                }
                Ok(ControlResponse::Ack)
            }
            ControlRequest::Deregister { worker } => {
                self.lock().scheduler.deregister(worker);
                Ok(ControlResponse::Ack)
            }
            ControlRequest::Status => Ok(ControlResponse::Status { status: self.status(now) }),
            ControlRequest::Detach { job, rank, session } => {
                let mut inner = self.lock();
                inner.check_session(job, rank, session)?;
                inner.scheduler.trainer_left(job, rank);
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
        let loaded = Manifest::load(&path).map_err(|error| invalid(error.to_string()))?;
        let dataset = DatasetInfo {
            name,
            manifest: path.to_string_lossy().into_owned(),
            shard_counts: loaded.shards.iter().map(|shard| shard.samples).collect(),
        };
        ShardTable::new(dataset.shard_counts.iter().copied()).map_err(|error| invalid(error.to_string()))?;
        let mut inner = self.lock();
        let Inner { state, store, .. } = &mut *inner;
        store.commit(state, Command::AddDataset { dataset: dataset.clone() }).map_err(|error| RemoteError::from(&error))?;
        tracing::info!(dataset = %dataset.name, manifest = %dataset.manifest, "dataset added");
        Ok(ControlResponse::DatasetAdded { dataset })
    }

    fn attach(&self, spec: JobSpec, rank: Rank, now: Instant) -> Result<ControlResponse, RemoteError> {
        validate_spec(&spec, rank)?;
        let mut inner = self.lock();
        let Some(dataset) = inner.state.datasets.get(&spec.dataset).cloned() else {
            return Err(not_found(format!(
                "dataset {:?} is not registered: add it with `stoker dataset add {} PATH`",
                spec.dataset, spec.dataset
            )));
        };
        let job = match inner.state.job_named(&spec.name) {
            Some((id, existing)) if *existing == spec => id,
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
        let session = SessionId(inner.next_session);
        inner.next_session += 1;
        inner.scheduler.trainer_seen(job, rank, now);
        if inner.sessions.insert((job, rank), session).is_some() {
            tracing::info!(%job, %rank, %session, "rank attached again; the earlier trainer is no longer served");
        }
        Ok(ControlResponse::Attached { job, dataset, workers: inner.scheduler.alive_workers(now), checkpoint, session })
    }

    fn pull(&self, worker: stoker_common::ids::WorkerId, max: u32, now: Instant) -> Result<ControlResponse, RemoteError> {
        let mut inner = self.lock();
        let granted = inner.scheduler.pull(worker, max, now).map_err(refused)?;
        let grants = granted
            .into_iter()
            .filter_map(|(lease, chunk)| {
                let spec = inner.state.jobs.get(&chunk.job)?.clone();
                let manifest = inner.state.datasets.get(&spec.dataset)?.manifest.clone();
                let session = inner.sessions.get(&(chunk.job, chunk.rank)).copied().unwrap_or(SessionId(0));
                Some(ChunkGrant { lease, chunk, spec, manifest, session })
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
                JobStatus {
                    id: *id,
                    spec: spec.clone(),
                    chunks_queued: counts.queued,
                    chunks_leased: counts.leased,
                    ranks: inner.ranks.range((*id, Rank(0))..=(*id, Rank(u32::MAX))).map(|(_, status)| *status).collect(),
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

    /// A copy of the durable state (for tests and status).
    pub fn state(&self) -> ClusterState {
        self.lock().state.clone()
    }
}

impl Inner {
    /// Refuse a trainer whose rank has been attached again since (the newest trainer of a rank
    /// is the one served); adopt an unknown session (this coordinator restarted since).
    fn check_session(&mut self, job: JobId, rank: Rank, session: SessionId) -> Result<(), RemoteError> {
        if !self.state.jobs.contains_key(&job) {
            return Err(not_found(format!("{job} does not exist: attach first")));
        }
        match self.sessions.entry((job, rank)) {
            std::collections::btree_map::Entry::Occupied(newest) if *newest.get() != session => Err(RemoteError::new(
                ErrorCode::Superseded,
                format!("another trainer attached as {rank} of {job} since this one ({session}); only the newest is served"),
            )),
            std::collections::btree_map::Entry::Occupied(_) => Ok(()),
            std::collections::btree_map::Entry::Vacant(entry) => {
                entry.insert(session);
                Ok(())
            }
        }
    }

    /// Refuse the requests of a failed job's trainers, with the reason it failed.
    fn check_not_failed(&self, job: JobId) -> Result<(), RemoteError> {
        match self.failed.get(&job) {
            Some(reason) => Err(RemoteError::new(ErrorCode::JobFailed, format!("{job} failed: {reason}"))),
            None => Ok(()),
        }
    }

    fn open_run(&mut self, key: RunKey, rank: Rank, now: Instant) -> Result<u64, RemoteError> {
        let Some(spec) = self.state.jobs.get(&key.job) else {
            return Err(not_found(format!("{} does not exist: attach first", key.job)));
        };
        if rank.0 >= spec.plan.world_size.get() {
            return Err(invalid(format!("{rank} is outside world size {}", spec.plan.world_size)));
        }
        let plan = match self.plans.get(&key) {
            Some(plan) => Arc::clone(plan),
            None => {
                let dataset =
                    self.state.datasets.get(&spec.dataset).ok_or_else(|| not_found(format!("dataset {:?} was removed", spec.dataset)))?;
                let table = ShardTable::new(dataset.shard_counts.iter().copied()).map_err(|error| invalid(error.to_string()))?;
                if key.start > table.samples() {
                    return Err(invalid(format!("start position {} is past the epoch's {} samples", key.start, table.samples())));
                }
                Arc::new(EpochPlan::starting_at(Arc::new(table), spec.plan, key.epoch, key.start))
            }
        };
        self.scheduler.open_run(key, rank, plan.steps(), spec.plan.world_size.get(), spec.prefetch, now);
        self.plans.insert(key, Arc::clone(&plan));
        let status = self.ranks.entry((key.job, rank)).or_insert(RankStatus {
            rank,
            epoch: key.epoch,
            consumed: Step(0),
            steps: plan.steps(),
            wait_seconds: 0.0,
        });
        status.epoch = key.epoch;
        status.consumed = Step(0);
        status.steps = plan.steps();
        Ok(plan.steps())
    }

    /// Record a rank's progress; `false` if the run is unknown (finished, or lost in a
    /// coordinator restart: a rank still inside it opens it again). A late report of a
    /// finished run must not re-create it, so unknown runs are never opened here.
    fn record_progress(&mut self, key: RunKey, rank: Rank, consumed: u64, wait_seconds: f64, now: Instant) -> Result<bool, RemoteError> {
        if let Some(status) = self.ranks.get_mut(&(key.job, rank)).filter(|status| status.epoch == key.epoch) {
            status.consumed = Step(consumed);
            status.wait_seconds = wait_seconds;
        }
        let Some(slowest) = self.scheduler.record_progress(key, rank, consumed, now) else {
            return Ok(false);
        };
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
