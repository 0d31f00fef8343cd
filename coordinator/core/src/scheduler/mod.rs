//! Leader-only soft state (DESIGN §5), pure: every method takes `now`, and the core calls it
//! with no IO. [`Scheduler`] is the facade the core uses; each concern has its own type:
//!
//! * [`run`]: one epoch run's steps (queued, leased, delivered, consumed) and its window.
//! * `runs`: every open run, cross-epoch prefetch, deliveries per job.
//! * [`seats`]: which trainer session holds each rank, its pass, its run, when last heard.
//! * `leases`: which worker holds which chunk until when, and which workers are stuck.
//! * `workers`: the worker registry (ids, certificates, liveness, speed).

mod leases;
mod run;
mod runs;
mod seats;
mod workers;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use stoker_plan::ids::{CertKey, JobId, LeaseId, Rank, SessionId, WorkerId};
use stoker_proto::{Chunk, Decoded, LeaseProgress, StuckJob, WorkerInfo, WorkerList, WorkerStatus};
use tracing::{info, warn};

use self::leases::Leases;
pub use self::run::{Counted, Run, RunKey};
use self::runs::Runs;
use self::seats::Seats;
pub use self::seats::{Opening, Reporting, SeatRefusal, Standing};
use self::workers::WorkerRegistry;
use crate::ids::IdSource;

/// The most epoch runs a job may have open at once. The ranks of a job are in one or two
/// epochs (one finishing, the next begun, perhaps opened early for them) and at most one
/// resumed start; each run keeps state for every rank of the job, so this bounds a job's
/// scheduling memory however its ranks open epochs (issue 31, item 1: one trainer certificate
/// opening a different epoch as each rank made a run per rank, W² rank entries).
pub const MAX_RUNS_PER_JOB: usize = 4;

/// The most workers registered at once under one certificate. Trainers dial every worker the
/// coordinator lists, so a worker certificate registering at made-up addresses would turn
/// trainers into a flood against them (issue 31, item 6); this bounds how many it can name.
/// Certificates shared by many workers (one per role, as `deploy/` makes them) bound the
/// workers of the cluster: give large pools a certificate per host or per group.
pub const MAX_WORKERS_PER_CERTIFICATE: usize = 512;

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

/// What a worker's heartbeat says it has made since it started.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Made {
    /// Images made.
    pub images: u64,
    /// Samples its decode threads made and the seconds they spent on them (zeros: not timed).
    pub decoded: Decoded,
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
    /// A certificate has [`MAX_WORKERS_PER_CERTIFICATE`] workers registered and registers another.
    TooManyWorkers {
        /// The certificate.
        key: CertKey,
    },
    /// A job has [`MAX_RUNS_PER_JOB`] runs open and a rank asked for another.
    TooManyRuns {
        /// The job.
        job: JobId,
        /// The runs it has open.
        open: Vec<RunKey>,
    },
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

/// Runs, seats, leases and workers, and the counters of what went wrong.
#[derive(Debug)]
pub struct Scheduler {
    config: SchedulerConfig,
    runs: Runs,
    seats: Seats,
    leases: Leases,
    workers: WorkerRegistry,
    leases_expired: u64,
    chunks_failed: u64,
    sessions_superseded: u64,
}

impl Scheduler {
    /// The worker id the next registration gets.
    pub fn next_worker_id(&self) -> u64 {
        self.workers.next_id()
    }

    /// An empty scheduler. Worker ids start at `id_base` so that ids from before a coordinator
    /// restart are not reused (a leader passes the base of its term's range).
    pub fn new(config: SchedulerConfig, id_base: u64) -> Self {
        Self {
            config,
            runs: Runs::new(config),
            seats: Seats::default(),
            leases: Leases::default(),
            workers: WorkerRegistry::new(id_base),
            leases_expired: 0,
            chunks_failed: 0,
            sessions_superseded: 0,
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

    /// Trainer sessions replaced by a newer one of the same rank so far.
    pub fn sessions_superseded(&self) -> u64 {
        self.sessions_superseded
    }

    // ----- trainers and runs -----

    /// A trainer (loader `client`) attached as `rank` of `job` with the new `session`: from now
    /// on only it is served for that rank. Returns whether it replaced an earlier one.
    pub fn attach(&mut self, job: JobId, rank: Rank, session: SessionId, client: u64, now: Instant) -> bool {
        let replaced = self.seats.attach(job, rank, session, client, now);
        self.runs.forget_liveness(job);
        self.sessions_superseded += u64::from(replaced);
        replaced
    }

    /// The session loader `client` already holds `rank` with (its attach was repeated).
    pub fn attached(&self, job: JobId, rank: Rank, client: u64) -> Option<SessionId> {
        self.seats.attached(job, rank, client)
    }

    /// Refuse a request of a session that is not the rank's newest.
    pub fn check_session(&mut self, job: JobId, rank: Rank, session: SessionId) -> Result<(), Refusal> {
        let before = self.seats.session_of(job, rank);
        let checked = self.seats.check(job, rank, session).map_err(Refusal::Seat);
        if self.seats.session_of(job, rank) != before {
            // A seat adopted or replaced: its trainer is not live until heard from.
            self.runs.forget_liveness(job);
        }
        checked
    }

    /// The newest session of `rank`, if any.
    pub fn session_of(&self, job: JobId, rank: Rank) -> Option<SessionId> {
        self.seats.session_of(job, rank)
    }

    /// `rank`'s trainer opens `key` in `opening.pass`, needing every step from
    /// `opening.consumed` on but those it holds. A new pass starts the rank afresh in the run
    /// (creating it if it is new) and takes the rank out of every other run of the job; a
    /// repeated open of the current pass changes nothing; an older pass is refused as stale.
    /// A new run is refused while the job has [`MAX_RUNS_PER_JOB`] others open (the rank's
    /// own run, which it leaves, not counted).
    pub fn open_run(&mut self, key: RunKey, rank: Rank, opening: &Opening, shape: RunShape, now: Instant) -> Result<(), Refusal> {
        let previous_opt = self.seats.run_of(key.job, rank, opening.session);
        if !self.runs.has(key) {
            let open: Vec<RunKey> = self.runs.keys_of(key.job).filter(|open| Some(*open) != previous_opt).collect();
            if open.len() >= MAX_RUNS_PER_JOB {
                // Room is made by dropping the oldest run no live trainer is in (its ranks'
                // trainers died without detaching, or went to other runs); a rank that comes
                // back re-opens it. A rank that has not opened a run yet but is counted in to
                // come (an earlier epoch's rank, for a run made early or left behind by another
                // rank's resume) does not keep it: found by the protocol model (seed 14336), where
                // four such runs of one epoch held the job's room and refused that very rank's
                // open for ever.
                let (seats, ttl) = (&self.seats, self.config.trainer_ttl);
                let in_run = |run: RunKey, rank: Rank| seats.is_live(key.job, rank, now, ttl) && seats.run_now(key.job, rank) == Some(run);
                let idle_opt = self.runs.oldest_idle(&open, in_run);
                let Some(idle) = idle_opt else { return Err(Refusal::TooManyRuns { job: key.job, open }) };
                warn!(job = %key.job, epoch = %idle.epoch, start = %idle.start, "dropping an epoch run no live trainer needs: a job keeps at most {MAX_RUNS_PER_JOB}");
                self.runs.drop_run(idle);
            }
        }
        let opened = self.seats.open(key, rank, opening, now).map_err(Refusal::Seat);
        // Even a refused open may have adopted a seat (`Seats::seat`).
        self.runs.forget_liveness(key.job);
        let fresh = opened?;
        self.runs.open(key, rank, opening, fresh, previous_opt, shape, &self.seats, now);
        Ok(())
    }

    /// `rank` consumed steps `0..consumed` of run `key` in `reporting.pass`, and has waited so
    /// long for `reporting.missing` that they must be lost. A report of an older pass (late, or
    /// sent twice) or of a detached session changes nothing.
    pub fn record_progress(&mut self, key: RunKey, rank: Rank, reporting: &Reporting, now: Instant) -> Result<Recorded, Refusal> {
        let (live_before, session_before) =
            (self.seats.is_live(key.job, rank, now, self.config.trainer_ttl), self.seats.session_of(key.job, rank));
        let standing = self.seats.report(key, rank, reporting, now).map_err(Refusal::Seat);
        // Requests reach the core with their `now` out of order (taken before the lock, reused
        // after a commit): a report stamped before the rank's expiry may come after a pull that
        // found it expired, so a kept view that holds the rank as not live is refreshed too
        // (found by review).
        if !live_before || self.seats.session_of(key.job, rank) != session_before || self.runs.kept_not_live(key.job, rank) {
            // A report revives a trainer that was not live (or adopts its seat): runs that
            // keep liveness must look again. A live one's report only extends its life.
            self.runs.forget_liveness(key.job);
        }
        match standing? {
            Standing::Current => {}
            Standing::Stale => return Ok(Recorded { run_known: true, slowest_opt: None }),
            Standing::Unopened => return Ok(Recorded { run_known: false, slowest_opt: None }),
        }
        let consumed = self.runs.consumed(key, rank, reporting, &self.seats, now);
        Ok(match consumed {
            Some(consumed) => Recorded { run_known: true, slowest_opt: consumed.slowest_opt },
            None => Recorded { run_known: false, slowest_opt: None },
        })
    }

    /// The trainer of `rank` stopped: nothing more of this session is taken for a sign of
    /// life, and the rank leaves every run of the job, so it holds no flow window for the
    /// ranks that go on (its last progress report may never have gone out). A trainer that
    /// attaches as the rank again opens the run it needs and is counted in again.
    pub fn detach(&mut self, job: JobId, rank: Rank, session: SessionId) -> Result<(), Refusal> {
        let detached = self.seats.detach(job, rank, session).map_err(Refusal::Seat);
        self.runs.forget_liveness(job);
        detached?;
        self.runs.detach(job, rank);
        Ok(())
    }

    /// Whether the run exists.
    pub fn has_run(&self, key: RunKey) -> bool {
        self.runs.has(key)
    }

    /// Jobs that may still need work: a run is open, or a trainer is attached.
    pub fn live_jobs(&self, now: Instant) -> Vec<JobId> {
        let mut jobs: Vec<JobId> = self.runs.jobs().collect();
        jobs.extend(self.seats.attached_jobs(now, self.config.trainer_ttl * 10));
        jobs.sort_unstable();
        jobs.dedup();
        jobs
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
        self.runs.forget_job(job);
        self.leases.forget_job(job);
        self.seats.forget_job(job);
    }

    // ----- workers and leases -----

    /// A worker joins (`--insecure`: no certificate; for tests).
    #[cfg(test)]
    pub(crate) fn register_worker(&mut self, addr: SocketAddr, threads: u32, process: WorkerProcess, now: Instant) -> WorkerId {
        match self.register_worker_as(addr, threads, process, CertKey::UNCHECKED, now) {
            Ok(worker) => worker,
            Err(refusal) => panic!("{refusal:?}"),
        }
    }

    /// A worker proving `key` joins: only a registration with the same certificate replaces an
    /// earlier one of the process. Refused while `key` has [`MAX_WORKERS_PER_CERTIFICATE`]
    /// others registered.
    pub fn register_worker_as(
        &mut self,
        addr: SocketAddr,
        threads: u32,
        process: WorkerProcess,
        key: CertKey,
        now: Instant,
    ) -> Result<WorkerId, Refusal> {
        // A process registering again (it asked again when an answer was lost, or the
        // coordinator forgot it) replaces its earlier registrations: their leases go back at
        // once, and a late request under an old id is refused rather than granted work the
        // worker no longer counts as its own. A late registration never replaces a newer one.
        let replaced = self.workers.replaced_by(addr, process, key);
        if self.workers.count_of(key).saturating_sub(replaced.len()) >= MAX_WORKERS_PER_CERTIFICATE {
            return Err(Refusal::TooManyWorkers { key });
        }
        for old in replaced {
            self.deregister(old);
        }
        let id = self.workers.insert(addr, threads, process, key, now);
        info!(worker = %id, %addr, threads, "worker registered");
        Ok(id)
    }

    /// Refuse `caller` speaking for `worker` if the worker registered with another certificate.
    pub fn check_worker_key(&self, worker: WorkerId, caller: CertKey) -> Result<(), Refusal> {
        self.workers.check_key(worker, caller)
    }

    /// A worker's heartbeat: renew the leases it still holds and works on; return those it
    /// holds but that are no longer its own (expired, stalled, granted again). It gets no work
    /// of `stuck_jobs` until a heartbeat no longer lists them.
    pub fn heartbeat(
        &mut self,
        worker: WorkerId,
        leases: &[LeaseProgress],
        made: Made,
        stuck_jobs: &[StuckJob],
        now: Instant,
    ) -> Result<Vec<LeaseId>, Refusal> {
        self.expire(now);
        self.workers.heartbeat(worker, made.images, made.decoded, now)?;
        let until = now + self.config.lease_ttl;
        self.leases.set_stuck(worker, stuck_jobs, until);
        let renewal = self.leases.renew(worker, leases, now, self.config.lease_ttl, self.config.lease_stall, until);
        let mut revoked = renewal.revoked;
        for (lease, held) in renewal.stalled {
            warn!(%lease, %worker, job = %held.chunk.job, rank = %held.chunk.rank, step = %held.chunk.first_step,
                stalled_seconds = now.saturating_duration_since(held.progressed).as_secs_f64(),
                "lease made no progress: granting it to another worker");
            self.leases_expired += 1;
            self.runs.requeue(&held.chunk, lease, None);
            revoked.push(lease);
        }
        Ok(revoked)
    }

    /// Grant up to `max` chunks to `worker`, in (step, rank) order over the open runs, under
    /// lease ids drawn from `ids` (unpredictable: a peer cannot guess another worker's lease).
    pub fn pull(&mut self, worker: WorkerId, max: u32, now: Instant, ids: &mut dyn IdSource) -> Result<Vec<(LeaseId, Chunk)>, Refusal> {
        self.pull_preferring(worker, max, now, ids, &|_| 0)
    }

    /// [`Scheduler::pull`], preferring within each run the chunks of higher `affinity` (how
    /// many of the chunk's shards the worker holds) among the next few in grant order; a chunk
    /// passed over goes first to the next other puller, or to this one after it passed it over
    /// three times (see [`Run::grant_to`]). Leases are unchanged:
    /// every chunk is still leased to one worker at a time.
    pub fn pull_preferring(
        &mut self,
        worker: WorkerId,
        max: u32,
        now: Instant,
        ids: &mut dyn IdSource,
        affinity: &dyn Fn(&Chunk) -> u32,
    ) -> Result<Vec<(LeaseId, Chunk)>, Refusal> {
        self.expire(now);
        self.workers.seen(worker, now)?;
        let mut granted = Vec::new();
        let mut room = max as usize;
        let (seats, trainer_ttl, leases) = (&self.seats, self.config.trainer_ttl, &self.leases);
        for (key, run) in self.runs.in_grant_order() {
            if room == 0 {
                break;
            }
            if leases.is_stuck(worker, key.job, now) {
                continue;
            }
            let live = |rank: Rank| seats.live_until(key.job, rank, trainer_ttl);
            let chunks = run.grant_to(Some(worker), room, now, live, affinity, || {
                // 2^64 ids: a clash with a live lease is a formality, but cheap to rule out.
                let mut lease = LeaseId(ids.next_u64());
                while lease.0 == 0 || leases.contains(lease) || granted.iter().any(|(taken, _): &(LeaseId, Chunk)| *taken == lease) {
                    lease = LeaseId(ids.next_u64());
                }
                lease
            });
            room -= chunks.len();
            granted.extend(chunks);
        }
        for (lease, chunk) in &granted {
            self.leases.grant(*lease, *chunk, worker, now, self.config.lease_ttl);
        }
        Ok(granted)
    }

    /// A lease's chunk was delivered. Returns how long the lease was held, if it was
    /// `worker`'s.
    pub fn chunk_done(&mut self, worker: WorkerId, lease: LeaseId, now: Instant) -> Option<Duration> {
        let held = self.leases.take(worker, lease)?;
        self.runs.delivered(&held.chunk, lease, now);
        Some(now.saturating_duration_since(held.granted))
    }

    /// A lease's chunk could not be delivered: grant it again after the retry delay.
    pub fn chunk_failed(&mut self, worker: WorkerId, lease: LeaseId, now: Instant) {
        if let Some(held) = self.leases.take(worker, lease) {
            self.chunks_failed += 1;
            self.runs.requeue(&held.chunk, lease, Some(now + self.config.retry_delay));
        }
    }

    /// Take a lease back from `worker` and queue its chunk again at once, counting nothing
    /// (a grant the core would not hand out: the owner of its session is not known).
    pub fn withdraw(&mut self, worker: WorkerId, lease: LeaseId) {
        if let Some(held) = self.leases.take(worker, lease) {
            self.runs.requeue(&held.chunk, lease, None);
        }
    }

    /// A lease's chunk can never be made: forget it and every run of its job (nothing of the
    /// job is granted any more). Returns the job, if the lease was `worker`'s.
    pub fn chunk_fatal(&mut self, worker: WorkerId, lease: LeaseId) -> Option<JobId> {
        let job = self.leases.take(worker, lease)?.chunk.job;
        self.runs.drop_runs_of(job);
        Some(job)
    }

    /// Whether `worker` is registered (not left, not forgotten).
    pub fn is_registered(&self, worker: WorkerId) -> bool {
        self.workers.contains(worker)
    }

    /// Workers removed so far (left, replaced, forgotten): while it stays the same, no worker
    /// seen registered has gone.
    pub fn worker_removals(&self) -> u64 {
        self.workers.removals()
    }

    /// A worker leaves: its chunks are granted again at once.
    pub fn deregister(&mut self, worker: WorkerId) {
        self.workers.remove(worker);
        for (lease, held) in self.leases.take_all_of(worker) {
            self.runs.requeue(&held.chunk, lease, None);
        }
        info!(%worker, "worker left");
    }

    /// Expire leases not renewed in time and forget workers silent for ten lease TTLs.
    pub fn expire(&mut self, now: Instant) {
        for (lease, held) in self.leases.take_expired(now) {
            warn!(%lease, worker = %held.worker, job = %held.chunk.job, rank = %held.chunk.rank, step = %held.chunk.first_step, "lease expired");
            self.leases_expired += 1;
            self.runs.requeue(&held.chunk, lease, None);
        }
        self.workers.forget_silent(now, self.config.lease_ttl * 10);
        self.leases.forget_stalls(now);
    }

    // ----- figures -----

    /// Workers whose heartbeats arrive, with the list's version (O(1) while the list holds).
    pub fn alive_workers(&mut self, now: Instant) -> &WorkerList {
        self.workers.alive(now, self.config.lease_ttl)
    }

    /// How many workers' heartbeats arrive (looks at every worker).
    pub fn alive_worker_count(&self, now: Instant) -> usize {
        self.workers.alive_count(now, self.config.lease_ttl)
    }

    /// Decode threads of the workers whose heartbeats arrive, and the images a second one of
    /// them makes when busy (`None` until a worker has measured it). Looks at every worker.
    pub fn worker_cores(&self, now: Instant) -> (u32, Option<f64>) {
        self.workers.cores(now, self.config.lease_ttl)
    }

    /// Every known worker, for status.
    pub fn worker_status(&self, now: Instant) -> Vec<WorkerStatus> {
        self.workers
            .iter()
            .filter_map(|(id, worker)| Some((id, worker, self.workers.key_of(id)?)))
            .map(|(id, worker, key)| WorkerStatus {
                info: WorkerInfo { id, addr: worker.addr, key },
                alive: worker.is_alive(now, self.config.lease_ttl),
                threads: worker.threads,
                chunks_in_flight: self.leases.in_flight(id),
                images_per_sec: worker.images_per_sec,
                images_per_core_sec: worker.images_per_core_sec,
                stuck_jobs: self.leases.stuck_jobs(id, now),
            })
            .collect()
    }

    /// Chunks and steps of `job` delivered so far.
    pub fn done(&self, job: JobId) -> Done {
        self.runs.done(job)
    }

    /// Steps of `job` in flow windows and not yet consumed, and how many the windows of its
    /// ranks still consuming could hold: how full its flow window is.
    pub fn window_fill(&self, job: JobId) -> (u64, u64) {
        self.runs.window_fill(job)
    }

    /// Steps queued and chunks leased for `job`.
    pub fn job_counts(&self, job: JobId) -> JobCounts {
        JobCounts { queued: self.runs.queued_of(job), leased: self.leases.count_of_job(job) }
    }

    /// Steps queued and chunks leased over all jobs.
    pub fn totals(&self) -> JobCounts {
        JobCounts { queued: self.runs.queued(), leased: self.leases.len() as u32 }
    }

    /// Steps of `key` that `rank` has consumed, if the run exists (for tests and status).
    pub fn consumed(&self, key: RunKey, rank: Rank) -> Option<u64> {
        self.runs.consumed_of(key, rank)
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
