//! Leader-only soft state (DESIGN §5): epoch runs with their chunk queues and flow windows,
//! leases with TTLs, and the worker registry. Pure: every method takes `now`; the service
//! calls it under a lock and performs no IO inside.

mod run;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use stoker_common::ids::{JobId, LeaseId, Rank, WorkerId};
use stoker_common::proto::{Chunk, WorkerInfo, WorkerStatus};
use tracing::{info, warn};

pub use self::run::{Run, RunKey};

/// Timing of leases and workers.
#[derive(Clone, Copy, Debug)]
pub struct SchedulerConfig {
    /// A lease not renewed by a heartbeat for this long expires and its chunk is granted again;
    /// a worker silent this long is dead.
    pub lease_ttl: Duration,
    /// Steps per chunk.
    pub chunk_steps: u32,
    /// A failed chunk waits this long before it is granted again.
    pub retry_delay: Duration,
    /// A rank whose trainer has not been heard from (attach, open, progress) for this long
    /// is absent: its chunks wait instead of keeping workers busy pushing to nobody.
    pub trainer_ttl: Duration,
}

#[derive(Debug)]
struct Lease {
    chunk: Chunk,
    worker: WorkerId,
    expires: Instant,
}

#[derive(Debug)]
struct Worker {
    addr: SocketAddr,
    threads: u32,
    last_seen: Instant,
    images: u64,
    images_per_sec: f64,
}

/// Everything the scheduler refuses.
#[derive(Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The worker is not registered (or was declared dead): register again.
    UnknownWorker(WorkerId),
}

/// Counters for status and metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct JobCounts {
    /// Chunks waiting.
    pub queued: u32,
    /// Chunks leased.
    pub leased: u32,
}

/// Runs, leases and workers.
#[derive(Debug)]
pub struct Scheduler {
    config: SchedulerConfig,
    runs: BTreeMap<RunKey, Run>,
    leases: BTreeMap<LeaseId, Lease>,
    workers: BTreeMap<WorkerId, Worker>,
    /// When each rank's trainer was last heard from.
    trainers: BTreeMap<(JobId, Rank), Instant>,
    next_lease: u64,
    next_worker: u64,
    leases_expired: u64,
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
            trainers: BTreeMap::new(),
            next_lease: id_base,
            next_worker: id_base,
            leases_expired: 0,
        }
    }

    /// Leases that expired so far.
    pub fn leases_expired(&self) -> u64 {
        self.leases_expired
    }

    /// `rank` starts the run `key` from its first step: create the run if it is new, or give
    /// the rank its steps again if it had progressed in it (a restarted trainer). The rank
    /// leaves any other run of the job (it moved on, or resumed elsewhere), so those no longer
    /// wait for it.
    pub fn open_run(&mut self, key: RunKey, rank: Rank, steps: u64, world_size: u32, prefetch: u32, now: Instant) {
        self.trainer_seen(key.job, rank, now);
        let chunk_steps = self.config.chunk_steps;
        let run = self.runs.entry(key).or_insert_with(|| {
            info!(job = %key.job, epoch = %key.epoch, start = key.start, steps, "epoch run opened");
            Run::new(key, steps, world_size, prefetch, chunk_steps)
        });
        run.restart_rank(rank);
        for (_, run) in self.runs.iter_mut().filter(|(other, _)| other.job == key.job && **other != key) {
            run.set_consumed(rank, run.steps());
        }
        self.runs.retain(|_, run| !run.is_finished());
    }

    /// `rank` consumed steps `0..consumed` of run `key`. Returns the slowest rank's consumed
    /// steps, or `None` if the run is unknown (a coordinator restart: the rank opens it again).
    pub fn record_progress(&mut self, key: RunKey, rank: Rank, consumed: u64, now: Instant) -> Option<u64> {
        self.trainer_seen(key.job, rank, now);
        let run = self.runs.get_mut(&key)?;
        run.set_consumed(rank, consumed);
        let slowest = run.slowest_consumed();
        if run.is_finished() {
            self.runs.remove(&key);
        }
        Some(slowest)
    }

    /// The trainer of `rank` is alive (it attached, opened an epoch or reported progress).
    pub fn trainer_seen(&mut self, job: JobId, rank: Rank, now: Instant) {
        self.trainers.insert((job, rank), now);
    }

    /// The trainer of `rank` stopped: its chunks wait until a trainer is seen again.
    pub fn trainer_left(&mut self, job: JobId, rank: Rank) {
        self.trainers.remove(&(job, rank));
    }

    /// Whether the run exists.
    pub fn has_run(&self, key: RunKey) -> bool {
        self.runs.contains_key(&key)
    }

    /// A worker joins.
    pub fn register_worker(&mut self, addr: SocketAddr, threads: u32, now: Instant) -> WorkerId {
        let id = WorkerId(self.next_worker);
        self.next_worker += 1;
        self.workers.insert(id, Worker { addr, threads, last_seen: now, images: 0, images_per_sec: 0.0 });
        info!(worker = %id, %addr, threads, "worker registered");
        id
    }

    /// A worker's heartbeat: renew the leases it still holds; return those it holds but that
    /// are no longer its own.
    pub fn heartbeat(&mut self, worker: WorkerId, leases: &[LeaseId], images: u64, now: Instant) -> Result<Vec<LeaseId>, Refusal> {
        self.expire(now);
        let entry = self.workers.get_mut(&worker).ok_or(Refusal::UnknownWorker(worker))?;
        let elapsed = now.saturating_duration_since(entry.last_seen).as_secs_f64();
        if elapsed > 0.0 {
            entry.images_per_sec = images.saturating_sub(entry.images) as f64 / elapsed;
        }
        entry.images = images;
        entry.last_seen = now;
        let expires = now + self.config.lease_ttl;
        let mut revoked = Vec::new();
        for lease in leases {
            match self.leases.get_mut(lease) {
                Some(held) if held.worker == worker => held.expires = expires,
                _ => revoked.push(*lease),
            }
        }
        Ok(revoked)
    }

    /// Grant up to `max` chunks to `worker`, in (step, rank) order over the open runs.
    pub fn pull(&mut self, worker: WorkerId, max: u32, now: Instant) -> Result<Vec<(LeaseId, Chunk)>, Refusal> {
        self.expire(now);
        let entry = self.workers.get_mut(&worker).ok_or(Refusal::UnknownWorker(worker))?;
        entry.last_seen = now;
        let mut granted = Vec::new();
        let mut room = max as usize;
        let (trainers, trainer_ttl) = (&self.trainers, self.config.trainer_ttl);
        for (key, run) in &mut self.runs {
            if room == 0 {
                break;
            }
            let live = |rank: Rank| trainers.get(&(key.job, rank)).is_some_and(|seen| now.saturating_duration_since(*seen) < trainer_ttl);
            let chunks = run.grant(room, now, live);
            room -= chunks.len();
            granted.extend(chunks);
        }
        let expires = now + self.config.lease_ttl;
        Ok(granted
            .into_iter()
            .map(|chunk| {
                let lease = LeaseId(self.next_lease);
                self.next_lease += 1;
                self.leases.insert(lease, Lease { chunk, worker, expires });
                (lease, chunk)
            })
            .collect())
    }

    /// A lease's chunk was delivered.
    pub fn chunk_done(&mut self, worker: WorkerId, lease: LeaseId) {
        if self.leases.get(&lease).is_some_and(|held| held.worker == worker) {
            self.leases.remove(&lease);
        }
    }

    /// A lease's chunk could not be delivered: grant it again after the retry delay.
    pub fn chunk_failed(&mut self, worker: WorkerId, lease: LeaseId, now: Instant) {
        if self.leases.get(&lease).is_none_or(|held| held.worker != worker) {
            return;
        }
        if let Some(held) = self.leases.remove(&lease) {
            self.requeue(held.chunk, Some(now + self.config.retry_delay));
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

    /// A worker leaves: its chunks are granted again at once.
    pub fn deregister(&mut self, worker: WorkerId) {
        self.workers.remove(&worker);
        let handed_back: Vec<LeaseId> = self.leases.iter().filter(|(_, held)| held.worker == worker).map(|(id, _)| *id).collect();
        for lease in handed_back {
            if let Some(held) = self.leases.remove(&lease) {
                self.requeue(held.chunk, None);
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
                self.requeue(held.chunk, None);
            }
        }
        let forget_after = self.config.lease_ttl * 10;
        self.workers.retain(|_, worker| now.saturating_duration_since(worker.last_seen) < forget_after);
        let forget_trainers_after = self.config.trainer_ttl * 10;
        self.trainers.retain(|_, seen| now.saturating_duration_since(*seen) < forget_trainers_after);
    }

    fn requeue(&mut self, chunk: Chunk, not_before_opt: Option<Instant>) {
        let key = RunKey { job: chunk.job, epoch: chunk.epoch, start: chunk.start };
        if let Some(run) = self.runs.get_mut(&key) {
            run.requeue(chunk, not_before_opt);
        }
    }

    fn is_alive(&self, worker: &Worker, now: Instant) -> bool {
        now.saturating_duration_since(worker.last_seen) < self.config.lease_ttl
    }

    /// Workers whose heartbeats arrive.
    pub fn alive_workers(&self, now: Instant) -> Vec<WorkerInfo> {
        self.workers
            .iter()
            .filter(|(_, worker)| self.is_alive(worker, now))
            .map(|(id, worker)| WorkerInfo { id: *id, addr: worker.addr })
            .collect()
    }

    /// Every known worker, for status.
    pub fn worker_status(&self, now: Instant) -> Vec<WorkerStatus> {
        self.workers
            .iter()
            .map(|(id, worker)| WorkerStatus {
                info: WorkerInfo { id: *id, addr: worker.addr },
                alive: self.is_alive(worker, now),
                threads: worker.threads,
                chunks_in_flight: self.leases.values().filter(|held| held.worker == *id).count() as u32,
                images_per_sec: worker.images_per_sec,
            })
            .collect()
    }

    /// Chunks queued and leased for `job`.
    pub fn job_counts(&self, job: JobId) -> JobCounts {
        JobCounts {
            queued: self.runs.iter().filter(|(key, _)| key.job == job).map(|(_, run)| run.queued_len() as u32).sum(),
            leased: self.leases.values().filter(|held| held.chunk.job == job).count() as u32,
        }
    }

    /// Chunks queued and leased over all jobs.
    pub fn totals(&self) -> JobCounts {
        JobCounts { queued: self.runs.values().map(|run| run.queued_len() as u32).sum(), leased: self.leases.len() as u32 }
    }
}

#[cfg(test)]
mod tests;
