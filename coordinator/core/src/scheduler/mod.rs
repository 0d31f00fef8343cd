//! Leader-only soft state (DESIGN §5): epoch runs with their steps and flow windows, leases
//! with TTLs, the worker registry, and each rank's seat (its trainer session, pass and run).
//! Pure: every method takes `now`; the service calls it under a lock and performs no IO
//! inside.
//!
//! * [`run`]: one epoch run's steps (queued, leased, delivered, consumed) and its window.
//! * [`seats`]: which trainer session holds each rank, its pass, its run, when last heard.

mod run;
mod seats;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use stoker_common::ids::{CertKey, Epoch, JobId, LeaseId, Position, Rank, SessionId, WorkerId};
use stoker_common::proto::{Chunk, LeaseProgress, WorkerInfo, WorkerStatus};
use tracing::{info, warn};

use crate::ids::IdSource;

pub use self::run::{Counted, Run, RunKey};
use self::seats::Seats;
pub use self::seats::{Opening, Reporting, SeatRefusal, Standing};

/// Timing of leases, workers and trainers.
#[derive(Clone, Copy, Debug)]
pub struct SchedulerConfig {
    /// A lease not renewed by a heartbeat for this long expires and its chunk is granted again;
    /// a worker silent this long is dead.
    pub lease_ttl: Duration,
    /// A lease none of whose batches was finished for this long is not renewed any more, even
    /// though its worker lists it: the worker is stuck on it (a hung dataset open or decode, a
    /// delivery that never completes).
    pub lease_stall: Duration,
    /// Steps per chunk.
    pub chunk_steps: u32,
    /// A failed chunk waits this long before it is granted again.
    pub retry_delay: Duration,
    /// A rank whose trainer has not been heard from (attach, open, progress) for this long
    /// is absent: its chunks wait instead of keeping workers busy pushing to nobody.
    pub trainer_ttl: Duration,
    /// A step a trainer reports missing is made again if it was delivered at least this long
    /// ago (a younger delivery may still be being read from the trainer's QUIC stack).
    pub missing_grace: Duration,
}

#[derive(Debug)]
struct Lease {
    chunk: Chunk,
    worker: WorkerId,
    expires: Instant,
    /// Batches the worker has finished, as of its last heartbeat.
    finished: u32,
    /// When `finished` last grew (or the lease was granted).
    progressed: Instant,
    /// When it was granted.
    granted: Instant,
}

#[derive(Debug)]
struct Worker {
    addr: SocketAddr,
    process: WorkerProcess,
    threads: u32,
    last_seen: Instant,
    images: u64,
    images_per_sec: f64,
}

/// Which worker process registers, and its how-many-th registration (see
/// `ControlRequest::RegisterWorker`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WorkerProcess {
    /// Random per process.
    pub instance: u64,
    /// Counts the process's registrations.
    pub attempt: u64,
}

/// Everything the scheduler refuses.
#[derive(Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The worker is not registered (or was declared dead): register again.
    UnknownWorker(WorkerId),
    /// A trainer's request the rank's seat refuses.
    Seat(SeatRefusal),
    /// The worker registered with another certificate than the request's.
    NotYours {
        /// The worker.
        worker: WorkerId,
        /// Its certificate.
        owner: CertKey,
        /// The request's.
        caller: CertKey,
    },
}

/// Counters for status and metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct JobCounts {
    /// Steps waiting.
    pub queued: u32,
    /// Chunks leased.
    pub leased: u32,
}

/// Chunks and steps of a job delivered.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Done {
    /// Chunks.
    pub chunks: u64,
    /// Steps (batches).
    pub steps: u64,
}

/// What an accepted progress report changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Recorded {
    /// Whether the run is known. After a coordinator restart it is not, and a rank still
    /// inside it opens it again.
    pub run_known: bool,
    /// The steps every rank has consumed, if the report was for the rank's current pass of a
    /// known run and every rank's position in it is known (what a checkpoint records).
    pub slowest_opt: Option<u64>,
}

/// Runs, leases, workers and seats.
#[derive(Debug)]
pub struct Scheduler {
    config: SchedulerConfig,
    runs: BTreeMap<RunKey, Run>,
    leases: BTreeMap<LeaseId, Lease>,
    workers: BTreeMap<WorkerId, Worker>,
    seats: Seats,
    /// Workers stuck on a job (a hung open or decode), and until when they get none of its
    /// work: each heartbeat sets the jobs its worker reports stuck, for a lease TTL (a stall
    /// taken back here counts too, until the next heartbeat). A worker stuck on a job would
    /// otherwise take the very steps it stalled on straight back.
    stalled: BTreeMap<(WorkerId, JobId), Instant>,
    next_worker: u64,
    /// The certificate each worker registered with: requests under its id must come with it.
    worker_keys: BTreeMap<WorkerId, CertKey>,
    leases_expired: u64,
    chunks_failed: u64,
    sessions_superseded: u64,
    /// Chunks and steps delivered, by job (for metrics; forgotten with the job).
    done: BTreeMap<JobId, Done>,
    /// Runs made early (cross-epoch prefetch) that no rank has opened yet.
    early: BTreeSet<RunKey>,
    /// Jobs a rank of which iterated an epoch again or went back (an evaluation loader
    /// reused at every validation, a resume): their next epoch is not made early, or it would
    /// be made, and thrown away, at every pass. A rank moving on to a later epoch clears it.
    not_early: BTreeSet<JobId>,
}

impl Scheduler {
    /// An empty scheduler. Ids start at `id_base` so that ids from before a coordinator restart
    /// are not reused (pass something like the start time in milliseconds).
    pub fn new(config: SchedulerConfig, id_base: u64) -> Self {
        Self {
            config,
            runs: BTreeMap::new(),
            leases: BTreeMap::new(),
            workers: BTreeMap::new(),
            seats: Seats::default(),
            stalled: BTreeMap::new(),
            next_worker: id_base,
            worker_keys: BTreeMap::new(),
            leases_expired: 0,
            chunks_failed: 0,
            sessions_superseded: 0,
            done: BTreeMap::new(),
            early: BTreeSet::new(),
            not_early: BTreeSet::new(),
        }
    }

    /// Leases that expired so far.
    pub fn leases_expired(&self) -> u64 {
        self.leases_expired
    }

    /// Chunks a worker reported failed (not delivered, or refused) so far.
    pub fn chunks_failed(&self) -> u64 {
        self.chunks_failed
    }

    /// A trainer (loader `client`) attached as `rank` of `job` with the new `session`: from now
    /// on only it is served for that rank. Returns whether it replaced an earlier one.
    pub fn attach(&mut self, job: JobId, rank: Rank, session: SessionId, client: u64, now: Instant) -> bool {
        let replaced = self.seats.attach(job, rank, session, client, now);
        self.sessions_superseded += u64::from(replaced);
        replaced
    }

    /// Trainer sessions replaced by a newer one of the same rank so far.
    pub fn sessions_superseded(&self) -> u64 {
        self.sessions_superseded
    }

    /// Chunks and steps of `job` delivered so far.
    pub fn done(&self, job: JobId) -> Done {
        self.done.get(&job).copied().unwrap_or_default()
    }

    /// Steps of `job` in flow windows and not yet consumed, and how many the windows of its
    /// ranks still consuming could hold: how full its flow window is.
    pub fn window_fill(&self, job: JobId) -> (u64, u64) {
        self.runs
            .iter()
            .filter(|(key, _)| key.job == job)
            .map(|(_, run)| run.window_fill())
            .fold((0, 0), |sum, fill| (sum.0 + fill.0, sum.1 + fill.1))
    }

    /// The session loader `client` already holds `rank` with (its attach was repeated).
    pub fn attached(&self, job: JobId, rank: Rank, client: u64) -> Option<SessionId> {
        self.seats.attached(job, rank, client)
    }

    /// Refuse a request of a session that is not the rank's newest.
    pub fn check_session(&mut self, job: JobId, rank: Rank, session: SessionId) -> Result<(), Refusal> {
        self.seats.check(job, rank, session).map_err(Refusal::Seat)
    }

    /// The newest session of `rank`, if any.
    pub fn session_of(&self, job: JobId, rank: Rank) -> Option<SessionId> {
        self.seats.session_of(job, rank)
    }

    /// `rank`'s trainer opens `key` in `opening.pass`, needing every step from
    /// `opening.consumed` on but those it holds. A new pass starts the rank afresh in the run
    /// (creating it if it is new) and takes the rank out of every other run of the job; a
    /// repeated open of the current pass changes nothing; an older pass is refused as stale.
    ///
    /// A new run counts the job's other ranks in only if they may still come to it
    /// ([`Seats::counted`]); the others must not hold its flow window.
    pub fn open_run(&mut self, key: RunKey, rank: Rank, opening: &Opening, shape: RunShape, now: Instant) -> Result<(), Refusal> {
        let previous_opt = self.seats.run_of(key.job, rank, opening.session);
        let fresh = self.seats.open(key, rank, opening, now).map_err(Refusal::Seat)?;
        match previous_opt {
            Some(previous) if fresh && key.epoch <= previous.epoch => {
                self.not_early.insert(key.job);
            }
            Some(previous) if key.epoch > previous.epoch => {
                self.not_early.remove(&key.job);
            }
            _ => {}
        }
        self.early.remove(&key);
        if !fresh && self.runs.contains_key(&key) {
            return Ok(());
        }
        let chunk_steps = self.config.chunk_steps;
        let seats = &self.seats;
        let run = self.runs.entry(key).or_insert_with(|| {
            info!(job = %key.job, epoch = %key.epoch, start = %key.start, steps = shape.steps, "epoch run opened");
            Run::new(key, shape.steps, shape.world_size, shape.prefetch, chunk_steps, |other| {
                if other == rank { Counted::MayCome } else { seats.counted(key.job, other, key) }
            })
        });
        run.restart_rank(rank, opening.consumed, &opening.holding, now);
        for (_, other) in self.runs.iter_mut().filter(|(other, _)| other.job == key.job && **other != key) {
            other.depart(rank, key);
        }
        self.runs.retain(|_, run| !run.is_finished());
        Ok(())
    }

    /// `rank` consumed steps `0..consumed` of run `key` in `reporting.pass`, and has waited so
    /// long for `reporting.missing` that they must be lost. A report of an older pass (late, or
    /// sent twice) or of a detached session changes nothing.
    pub fn record_progress(&mut self, key: RunKey, rank: Rank, reporting: &Reporting, now: Instant) -> Result<Recorded, Refusal> {
        match self.seats.report(key, rank, reporting, now).map_err(Refusal::Seat)? {
            Standing::Current => {}
            Standing::Stale => return Ok(Recorded { run_known: true, slowest_opt: None }),
            Standing::Unopened => return Ok(Recorded { run_known: false, slowest_opt: None }),
        }
        let Some(run) = self.runs.get_mut(&key) else { return Ok(Recorded { run_known: false, slowest_opt: None }) };
        run.set_consumed(rank, reporting.consumed);
        let requeued = run.missing(rank, &reporting.missing, self.config.missing_grace, now);
        if requeued > 0 {
            warn!(job = %key.job, %rank, epoch = %key.epoch, requeued, "steps delivered but missing at the trainer: making them again");
        }
        let slowest_opt = run.checkpointable_consumed();
        let next_opt = (key.start == Position(0) && run.nearly_done()).then(|| run.shape());
        if run.is_finished() {
            self.runs.remove(&key);
        }
        if let Some(shape) = next_opt {
            self.open_next_epoch_early(key, shape);
        }
        Ok(Recorded { run_known: true, slowest_opt })
    }

    /// Cross-epoch prefetch: the run of epoch `key.epoch + 1` from its start, made when run
    /// `key` (from its start) is within its flow window of the end, so that workers make the
    /// next epoch's first steps while the last ones of this epoch are consumed (and while the
    /// trainer validates between epochs) instead of idling until a rank opens it. Every rank
    /// whose trainer is in this epoch counts in (`Seats::counted`: it may come); the batches
    /// reach its trainer early, which names them in `holding` when it opens the run, so none
    /// is made twice. Nothing happens if a rank already opened a later run of the job.
    fn open_next_epoch_early(&mut self, key: RunKey, shape: RunShape) {
        let next = RunKey { epoch: Epoch(key.epoch.0 + 1), start: Position(0), job: key.job };
        if self.not_early.contains(&key.job) || self.runs.keys().any(|other| other.job == key.job && other.epoch >= next.epoch) {
            return;
        }
        let seats = &self.seats;
        let run = Run::new(next, shape.steps, shape.world_size, shape.prefetch, self.config.chunk_steps, |rank| {
            seats.counted(key.job, rank, next)
        });
        if run.is_finished() {
            return;
        }
        info!(job = %key.job, epoch = %next.epoch, steps = shape.steps, "next epoch's run opened early (cross-epoch prefetch)");
        self.runs.insert(next, run);
        let runs = &self.runs;
        self.early.retain(|early| runs.contains_key(early));
        self.early.insert(next);
    }

    /// The trainer of `rank` stopped: nothing more of this session is taken for a sign of
    /// life, and the rank leaves every run of the job, so it holds no flow window for the
    /// ranks that go on (its last progress report may never have gone out). A trainer that
    /// attaches as the rank again opens the run it needs and is counted in again.
    pub fn detach(&mut self, job: JobId, rank: Rank, session: SessionId) -> Result<(), Refusal> {
        self.seats.detach(job, rank, session).map_err(Refusal::Seat)?;
        for (_, run) in self.runs.iter_mut().filter(|(key, _)| key.job == job) {
            run.detach(rank);
        }
        self.runs.retain(|_, run| !run.is_finished());
        Ok(())
    }

    /// Whether the run exists.
    pub fn has_run(&self, key: RunKey) -> bool {
        self.runs.contains_key(&key)
    }

    /// Jobs that may still need work: a run is open, or a trainer is attached.
    pub fn live_jobs(&self, now: Instant) -> Vec<JobId> {
        let mut jobs: Vec<JobId> = self.runs.keys().map(|key| key.job).collect();
        jobs.extend(self.seats.attached_jobs(now, self.config.trainer_ttl * 10));
        jobs.sort_unstable();
        jobs.dedup();
        jobs
    }

    /// A worker joins.
    pub fn register_worker(&mut self, addr: SocketAddr, threads: u32, process: WorkerProcess, now: Instant) -> WorkerId {
        self.register_worker_as(addr, threads, process, CertKey::UNCHECKED, now)
    }

    /// [`Scheduler::register_worker`] for a worker proving `key`: only a registration with the
    /// same certificate replaces an earlier one of the process.
    pub fn register_worker_as(&mut self, addr: SocketAddr, threads: u32, process: WorkerProcess, key: CertKey, now: Instant) -> WorkerId {
        // A process registering again (it asked again when an answer was lost, or the
        // coordinator forgot it) replaces its earlier registrations: their leases go back at
        // once, and a late request under an old id is refused rather than granted work the
        // worker no longer counts as its own. A late registration never replaces a newer one.
        let mut replaced = Vec::new();
        for (id, worker) in &self.workers {
            let same_key = self.worker_keys.get(id).is_none_or(|owner| owner.admits(&key));
            if worker.process.instance == process.instance && worker.process.attempt < process.attempt && same_key {
                replaced.push(*id);
            } else if worker.addr == addr && worker.process.instance != process.instance {
                warn!(%addr, worker = %id, "another worker process registered at the address this worker advertises: \
                    trainers cannot tell them apart; give each worker its own --advertise address");
            }
        }
        for old in replaced {
            self.deregister(old);
        }
        let id = WorkerId(self.next_worker);
        self.next_worker += 1;
        self.workers.insert(id, Worker { addr, process, threads, last_seen: now, images: 0, images_per_sec: 0.0 });
        self.worker_keys.insert(id, key);
        let workers = &self.workers;
        self.worker_keys.retain(|known, _| workers.contains_key(known));
        info!(worker = %id, %addr, threads, "worker registered");
        id
    }

    /// A worker's heartbeat: renew the leases it still holds and works on; return those it
    /// holds but that are no longer its own (expired, stalled, granted again). It gets no work
    /// of `stuck_jobs` until a heartbeat no longer lists them.
    pub fn heartbeat(
        &mut self,
        worker: WorkerId,
        leases: &[LeaseProgress],
        images: u64,
        stuck_jobs: &[JobId],
        now: Instant,
    ) -> Result<Vec<LeaseId>, Refusal> {
        self.expire(now);
        let entry = self.workers.get_mut(&worker).ok_or(Refusal::UnknownWorker(worker))?;
        let until = now + self.config.lease_ttl;
        self.stalled.retain(|(stuck, job), _| *stuck != worker || stuck_jobs.contains(job));
        for job in stuck_jobs {
            if self.stalled.insert((worker, *job), until).is_none() {
                warn!(%worker, %job, "the worker's pipeline for the job is stuck: it gets none of the job's work until it recovers");
            }
        }
        let elapsed = now.saturating_duration_since(entry.last_seen).as_secs_f64();
        if elapsed > 0.0 {
            entry.images_per_sec = images.saturating_sub(entry.images) as f64 / elapsed;
        }
        entry.images = images;
        entry.last_seen = now;
        let expires = now + self.config.lease_ttl;
        let mut revoked = Vec::new();
        let mut stalled = Vec::new();
        for progress in leases {
            match self.leases.get_mut(&progress.lease) {
                Some(held) if held.worker == worker => {
                    if progress.finished > held.finished {
                        held.finished = progress.finished;
                        held.progressed = now;
                    }
                    if now.saturating_duration_since(held.progressed) < self.config.lease_stall {
                        held.expires = expires;
                    } else {
                        stalled.push(progress.lease);
                    }
                }
                _ => revoked.push(progress.lease),
            }
        }
        for lease in stalled {
            if let Some(held) = self.leases.remove(&lease) {
                warn!(%lease, %worker, job = %held.chunk.job, rank = %held.chunk.rank, step = %held.chunk.first_step,
                    stalled_seconds = now.saturating_duration_since(held.progressed).as_secs_f64(),
                    "lease made no progress: granting it to another worker");
                self.leases_expired += 1;
                self.stalled.insert((worker, held.chunk.job), until);
                self.requeue(&held.chunk, lease, None);
                revoked.push(lease);
            }
        }
        Ok(revoked)
    }

    /// Refuse `caller` speaking for `worker` if the worker registered with another certificate.
    pub fn check_worker_key(&self, worker: WorkerId, caller: CertKey) -> Result<(), Refusal> {
        match self.worker_keys.get(&worker) {
            Some(key) if !key.admits(&caller) => Err(Refusal::NotYours { worker, owner: *key, caller }),
            _ => Ok(()),
        }
    }

    /// Grant up to `max` chunks to `worker`, in (step, rank) order over the open runs, under
    /// lease ids drawn from `ids` (unpredictable: a peer cannot guess another worker's lease).
    pub fn pull(&mut self, worker: WorkerId, max: u32, now: Instant, ids: &mut dyn IdSource) -> Result<Vec<(LeaseId, Chunk)>, Refusal> {
        self.expire(now);
        let entry = self.workers.get_mut(&worker).ok_or(Refusal::UnknownWorker(worker))?;
        entry.last_seen = now;
        let mut granted = Vec::new();
        let mut room = max as usize;
        let (seats, trainer_ttl) = (&self.seats, self.config.trainer_ttl);
        let leases = &self.leases;
        let stalled = &self.stalled;
        let early = &self.early;
        // Runs trainers opened first, then those opened early for them (cross-epoch prefetch):
        // one job's next epoch never takes a worker from another job's current one.
        let mut order: Vec<(&RunKey, &mut Run)> = self.runs.iter_mut().collect();
        order.sort_by_key(|(key, _)| early.contains(*key));
        for (key, run) in order {
            if room == 0 {
                break;
            }
            if stalled.get(&(worker, key.job)).is_some_and(|until| *until > now) {
                continue;
            }
            let live = |rank: Rank| seats.is_live(key.job, rank, now, trainer_ttl);
            let chunks = run.grant(room, now, live, || {
                // 2^64 ids: a clash with a live lease is a formality, but cheap to rule out.
                let mut lease = LeaseId(ids.next_u64());
                while lease.0 == 0 || leases.contains_key(&lease) {
                    lease = LeaseId(ids.next_u64());
                }
                lease
            });
            room -= chunks.len();
            granted.extend(chunks);
        }
        let expires = now + self.config.lease_ttl;
        for (lease, chunk) in &granted {
            self.leases.insert(*lease, Lease { chunk: *chunk, worker, expires, finished: 0, progressed: now, granted: now });
        }
        Ok(granted)
    }

    /// A lease's chunk was delivered. Returns how long the lease was held, if it was
    /// `worker`'s.
    pub fn chunk_done(&mut self, worker: WorkerId, lease: LeaseId, now: Instant) -> Option<Duration> {
        if self.leases.get(&lease).is_none_or(|held| held.worker != worker) {
            return None;
        }
        let held = self.leases.remove(&lease)?;
        let done = self.done.entry(held.chunk.job).or_default();
        done.chunks += 1;
        done.steps += u64::from(held.chunk.steps);
        if let Some(run) = self.runs.get_mut(&RunKey::of(&held.chunk)) {
            run.delivered(&held.chunk, lease, now);
        }
        Some(now.saturating_duration_since(held.granted))
    }

    /// A lease's chunk could not be delivered: grant it again after the retry delay.
    pub fn chunk_failed(&mut self, worker: WorkerId, lease: LeaseId, now: Instant) {
        if self.leases.get(&lease).is_none_or(|held| held.worker != worker) {
            return;
        }
        if let Some(held) = self.leases.remove(&lease) {
            self.chunks_failed += 1;
            self.requeue(&held.chunk, lease, Some(now + self.config.retry_delay));
        }
    }

    /// A lease's chunk can never be made: forget it and every run of its job (nothing of the
    /// job is granted any more). Returns the job, if the lease was `worker`'s.
    pub fn chunk_fatal(&mut self, worker: WorkerId, lease: LeaseId) -> Option<JobId> {
        if self.leases.get(&lease).is_none_or(|held| held.worker != worker) {
            return None;
        }
        let job = self.leases.remove(&lease)?.chunk.job;
        self.runs.retain(|key, _| key.job != job);
        Some(job)
    }

    /// Trainers of `job` heard from within the trainer TTL and not detached.
    pub fn live_trainers(&self, job: JobId, world_size: u32, now: Instant) -> Vec<Rank> {
        (0..world_size).map(Rank).filter(|rank| self.seats.is_live(job, *rank, now, self.config.trainer_ttl)).collect()
    }

    /// When a trainer of `job` was last heard from, since this scheduler started.
    pub fn last_heard(&self, job: JobId) -> Option<Instant> {
        self.seats.heard(job)
    }

    /// Forget everything of `job` (it was removed): its runs, seats and leases. Workers
    /// holding its leases are told at their next heartbeat (the leases are no longer theirs).
    pub fn forget_job(&mut self, job: JobId) {
        self.runs.retain(|key, _| key.job != job);
        self.early.retain(|key| key.job != job);
        self.not_early.remove(&job);
        self.leases.retain(|_, held| held.chunk.job != job);
        self.stalled.retain(|(_, stalled_job), _| *stalled_job != job);
        self.seats.forget_job(job);
        self.done.remove(&job);
    }

    /// A worker leaves: its chunks are granted again at once.
    pub fn deregister(&mut self, worker: WorkerId) {
        self.workers.remove(&worker);
        let handed_back: Vec<LeaseId> = self.leases.iter().filter(|(_, held)| held.worker == worker).map(|(id, _)| *id).collect();
        for lease in handed_back {
            if let Some(held) = self.leases.remove(&lease) {
                self.requeue(&held.chunk, lease, None);
            }
        }
        info!(%worker, "worker left");
    }

    /// Expire leases not renewed in time and forget workers silent for ten lease TTLs.
    pub fn expire(&mut self, now: Instant) {
        let expired: Vec<LeaseId> = self.leases.iter().filter(|(_, held)| held.expires <= now).map(|(id, _)| *id).collect();
        for lease in expired {
            if let Some(held) = self.leases.remove(&lease) {
                warn!(%lease, worker = %held.worker, job = %held.chunk.job, rank = %held.chunk.rank, step = %held.chunk.first_step, "lease expired");
                self.leases_expired += 1;
                self.requeue(&held.chunk, lease, None);
            }
        }
        let forget_after = self.config.lease_ttl * 10;
        self.workers.retain(|_, worker| now.saturating_duration_since(worker.last_seen) < forget_after);
        self.stalled.retain(|_, until| *until > now);
    }

    fn requeue(&mut self, chunk: &Chunk, lease: LeaseId, not_before_opt: Option<Instant>) {
        if let Some(run) = self.runs.get_mut(&RunKey::of(chunk)) {
            run.requeue(chunk, lease, not_before_opt);
        }
    }

    fn is_alive(&self, worker: &Worker, now: Instant) -> bool {
        now.saturating_duration_since(worker.last_seen) < self.config.lease_ttl
    }

    fn worker_key(&self, worker: WorkerId) -> CertKey {
        self.worker_keys.get(&worker).copied().unwrap_or(CertKey::UNCHECKED)
    }

    /// Workers whose heartbeats arrive.
    pub fn alive_workers(&self, now: Instant) -> Vec<WorkerInfo> {
        self.workers
            .iter()
            .filter(|(_, worker)| self.is_alive(worker, now))
            .map(|(id, worker)| WorkerInfo { id: *id, addr: worker.addr, key: self.worker_key(*id) })
            .collect()
    }

    /// Every known worker, for status.
    pub fn worker_status(&self, now: Instant) -> Vec<WorkerStatus> {
        self.workers
            .iter()
            .map(|(id, worker)| WorkerStatus {
                info: WorkerInfo { id: *id, addr: worker.addr, key: self.worker_key(*id) },
                alive: self.is_alive(worker, now),
                threads: worker.threads,
                chunks_in_flight: self.leases.values().filter(|held| held.worker == *id).count() as u32,
                images_per_sec: worker.images_per_sec,
                stuck_jobs: self
                    .stalled
                    .range((*id, JobId(0))..=(*id, JobId(u64::MAX)))
                    .filter(|(_, until)| **until > now)
                    .map(|((_, job), _)| *job)
                    .collect(),
            })
            .collect()
    }

    /// Steps queued and chunks leased for `job`.
    pub fn job_counts(&self, job: JobId) -> JobCounts {
        JobCounts {
            queued: self.runs.iter().filter(|(key, _)| key.job == job).map(|(_, run)| run.queued_len() as u32).sum(),
            leased: self.leases.values().filter(|held| held.chunk.job == job).count() as u32,
        }
    }

    /// Steps queued and chunks leased over all jobs.
    pub fn totals(&self) -> JobCounts {
        JobCounts { queued: self.runs.values().map(|run| run.queued_len() as u32).sum(), leased: self.leases.len() as u32 }
    }

    /// Steps of `key` that `rank` has consumed, if the run exists (for tests and status).
    pub fn consumed(&self, key: RunKey, rank: Rank) -> Option<u64> {
        self.runs.get(&key).map(|run| run.consumed(rank))
    }
}

/// The size of a run, as the job's spec and plan give it.
#[derive(Clone, Copy, Debug)]
pub struct RunShape {
    /// Steps in the run.
    pub steps: u64,
    /// Ranks of the job.
    pub world_size: u32,
    /// The job's flow window.
    pub prefetch: u32,
}

#[cfg(test)]
mod tests;
