//! What status and the metrics show of the core: [`Core::status`] for `stoker status`, and
//! [`Core::figures`] for the driver's metrics.

use std::time::Instant;

use stoker_plan::ids::{JobId, Rank, SessionId};
use stoker_proto::{ClusterStatus, JobDemand, JobStatus, RankStatus};

use crate::core::Core;
use crate::scheduler::Done;

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
    /// Their decode threads.
    pub worker_cores: u32,
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
    /// What it asks of the workers, once its ranks have reported for a few seconds.
    pub demand: Option<JobDemand>,
}

impl Core {
    /// What `stoker status` shows of this coordinator's state (the driver adds every
    /// coordinator's Raft view).
    pub fn status(&self, now: Instant) -> ClusterStatus {
        let (_, per_core) = self.scheduler.worker_cores(now);
        let jobs = self
            .state
            .jobs
            .iter()
            .map(|(id, spec)| {
                let counts = self.scheduler.job_counts(*id);
                let heard = self.scheduler.last_heard(*id).unwrap_or(self.started);
                JobStatus {
                    id: *id,
                    spec: spec.clone(),
                    steps_queued: counts.queued,
                    chunks_leased: counts.leased,
                    ranks: self.ranks.range((*id, Rank(0))..=(*id, Rank(u32::MAX))).map(|(_, status)| *status).collect(),
                    live_ranks: self.scheduler.live_trainers(*id, spec.plan.world_size.get(), now),
                    idle_seconds: now.saturating_duration_since(heard).as_secs_f64(),
                    checkpoint: self.state.checkpoints.get(id).copied(),
                    demand: self.job_demand(*id, per_core, now),
                }
            })
            .collect();
        ClusterStatus {
            coordinator: self.advertised.clone(),
            coordinators: Vec::new(),
            datasets: self.state.datasets.len() as u32,
            workers: self.scheduler.worker_status(now),
            jobs,
        }
    }

    /// What the metrics show: the leader's soft state (empty on a follower).
    pub fn figures(&self, now: Instant) -> Figures {
        let scheduler = &self.scheduler;
        let (worker_cores, per_core) = scheduler.worker_cores(now);
        let jobs = self
            .state
            .jobs
            .iter()
            .map(|(id, spec)| {
                let counts = scheduler.job_counts(*id);
                let ranks = self.ranks.range((*id, Rank(0))..=(*id, Rank(u32::MAX)));
                JobFigures {
                    name: spec.name.clone(),
                    world_size: spec.plan.world_size.get(),
                    batch_size: spec.plan.batch_size.get(),
                    steps_queued: counts.queued,
                    chunks_leased: counts.leased,
                    done: scheduler.done(*id),
                    window: scheduler.window_fill(*id),
                    live_ranks: scheduler.live_trainers(*id, spec.plan.world_size.get(), now).len(),
                    ranks: ranks.map(|(key, status)| (*status, self.totals.get(key).copied())).collect(),
                    demand: self.job_demand(*id, per_core, now),
                }
            })
            .collect();
        Figures {
            workers_alive: scheduler.alive_worker_count(now),
            worker_cores,
            leases_expired: scheduler.leases_expired(),
            chunks_failed: scheduler.chunks_failed(),
            sessions_superseded: scheduler.sessions_superseded(),
            jobs,
        }
    }

    /// What `job` asks of the workers at `now`, with `per_core` images a second per busy worker
    /// core.
    fn job_demand(&self, job: JobId, per_core: Option<f64>, now: Instant) -> Option<JobDemand> {
        let figures = self.demand.get(&job)?.figures(now)?;
        Some(JobDemand { samples_per_sec: figures.samples_per_sec, stall: figures.stall, worker_cores: figures.worker_cores(per_core) })
    }
}
