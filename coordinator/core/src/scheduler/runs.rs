//! The open epoch runs of every job: opening them (and the next epoch's early, for
//! cross-epoch prefetch), consumption, delivery, requeues, and what they hold.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use stoker_plan::ids::{Epoch, JobId, LeaseId, Position, Rank};
use stoker_proto::Chunk;
use tracing::{info, warn};

use super::run::{Counted, Run, RunKey};
use super::seats::{Opening, Reporting, Seats};
use super::{Done, RunShape, SchedulerConfig};

/// Runs by key, with what is delivered per job.
#[derive(Debug)]
pub(super) struct Runs {
    config: SchedulerConfig,
    runs: BTreeMap<RunKey, Run>,
    /// Chunks and steps delivered, by job (for metrics; forgotten with the job).
    done: BTreeMap<JobId, Done>,
    /// Runs made early (cross-epoch prefetch) that no rank has opened yet.
    early: BTreeSet<RunKey>,
    /// Jobs a rank of which iterated an epoch again or went back (an evaluation loader
    /// reused at every validation, a resume): their next epoch is not made early, or it would
    /// be made, and thrown away, at every pass. A rank moving on to a later epoch clears it.
    not_early: BTreeSet<JobId>,
}

/// What a progress report found in its run.
#[derive(Clone, Copy, Debug)]
pub(super) struct Consumed {
    /// The steps every rank has consumed, if every rank's position in it is known.
    pub(super) slowest_opt: Option<u64>,
}

impl Runs {
    /// No runs.
    pub(super) fn new(config: SchedulerConfig) -> Self {
        Self { config, runs: BTreeMap::new(), done: BTreeMap::new(), early: BTreeSet::new(), not_early: BTreeSet::new() }
    }

    /// `rank` opens `key` in `opening` (`fresh`: a new pass; `previous_opt`: the run its session
    /// was in): a new pass starts the rank afresh in the run (creating it if it is new) and
    /// takes it out of every other run of the job. The other ranks of a new run count in only
    /// if they may still come to it ([`Seats::counted`]).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn open(
        &mut self,
        key: RunKey,
        rank: Rank,
        opening: &Opening,
        fresh: bool,
        previous_opt: Option<RunKey>,
        shape: RunShape,
        seats: &Seats,
        now: Instant,
    ) {
        let chunk_steps = self.config.chunk_steps;
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
            return;
        }
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
    }

    /// `rank` consumed steps `0..consumed` of `key` and misses `reporting.missing`; `None` if
    /// the run is unknown. A run from its start that is nearly done opens the next epoch's
    /// early.
    pub(super) fn consumed(&mut self, key: RunKey, rank: Rank, reporting: &Reporting, seats: &Seats, now: Instant) -> Option<Consumed> {
        let run = self.runs.get_mut(&key)?;
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
            self.open_next_epoch_early(key, shape, seats);
        }
        Some(Consumed { slowest_opt })
    }

    /// Cross-epoch prefetch: the run of epoch `key.epoch + 1` from its start, made when run
    /// `key` (from its start) is within its flow window of the end, so that workers make the
    /// next epoch's first steps while the last ones of this epoch are consumed (and while the
    /// trainer validates between epochs) instead of idling until a rank opens it. Every rank
    /// whose trainer is in this epoch counts in (`Seats::counted`: it may come); the batches
    /// reach its trainer early, which names them in `holding` when it opens the run, so none
    /// is made twice. Nothing happens if a rank already opened a later run of the job.
    fn open_next_epoch_early(&mut self, key: RunKey, shape: RunShape, seats: &Seats) {
        let chunk_steps = self.config.chunk_steps;
        let next = RunKey { epoch: Epoch(key.epoch.0 + 1), start: Position(0), job: key.job };
        // Early only while a run is left for the ranks to open one of their own.
        let full = self.keys_of(key.job).count() + 1 >= super::MAX_RUNS_PER_JOB;
        if full || self.not_early.contains(&key.job) || self.runs.keys().any(|other| other.job == key.job && other.epoch >= next.epoch) {
            return;
        }
        let run = Run::new(next, shape.steps, shape.world_size, shape.prefetch, chunk_steps, |rank| seats.counted(key.job, rank, next));
        if run.is_finished() {
            return;
        }
        info!(job = %key.job, epoch = %next.epoch, steps = shape.steps, "next epoch's run opened early (cross-epoch prefetch)");
        self.runs.insert(next, run);
        let runs = &self.runs;
        self.early.retain(|early| runs.contains_key(early));
        self.early.insert(next);
    }

    /// `rank` of `job` leaves every run of the job.
    pub(super) fn detach(&mut self, job: JobId, rank: Rank) {
        for (_, run) in self.runs.iter_mut().filter(|(key, _)| key.job == job) {
            run.detach(rank);
        }
        self.runs.retain(|_, run| !run.is_finished());
    }

    /// Whether a run of `job` keeps `rank` as not live (a report from it must refresh them).
    pub(super) fn kept_not_live(&self, job: JobId, rank: Rank) -> bool {
        self.runs.iter().any(|(key, run)| key.job == job && run.kept_not_live(rank))
    }

    /// A seat of `job` changed in a way that may make a rank's trainer live: every run of the
    /// job forgets which are ([`Run::forget_liveness`]).
    pub(super) fn forget_liveness(&mut self, job: JobId) {
        for (_, run) in self.runs.iter_mut().filter(|(key, _)| key.job == job) {
            run.forget_liveness();
        }
    }

    /// Whether the run exists.
    pub(super) fn has(&self, key: RunKey) -> bool {
        self.runs.contains_key(&key)
    }

    /// The oldest of `candidates` in which no rank that `in_run` says is in it (live, and the
    /// run is the one its trainer opened last) has steps left.
    pub(super) fn oldest_idle(&self, candidates: &[RunKey], in_run: impl Fn(RunKey, Rank) -> bool) -> Option<RunKey> {
        let idle = |key: &&RunKey| self.runs.get(*key).is_some_and(|run| !run.needed_by_any(|rank| in_run(**key, rank)));
        candidates.iter().filter(idle).min_by_key(|key| (key.epoch, key.start)).copied()
    }

    /// Drop run `key` (leases of it that finish later find no run and change nothing).
    pub(super) fn drop_run(&mut self, key: RunKey) {
        self.runs.remove(&key);
        self.early.remove(&key);
    }

    /// The runs of `job`.
    pub(super) fn keys_of(&self, job: JobId) -> impl Iterator<Item = RunKey> + '_ {
        self.runs.keys().copied().filter(move |key| key.job == job)
    }

    /// The jobs with a run open.
    pub(super) fn jobs(&self) -> impl Iterator<Item = JobId> + '_ {
        self.runs.keys().map(|key| key.job)
    }

    /// Every run, in the order workers are granted from: runs trainers opened first, then
    /// those opened early for them (cross-epoch prefetch), so that one job's next epoch never
    /// takes a worker from another job's current one.
    pub(super) fn in_grant_order(&mut self) -> Vec<(&RunKey, &mut Run)> {
        let early = &self.early;
        let mut order: Vec<(&RunKey, &mut Run)> = self.runs.iter_mut().collect();
        order.sort_by_key(|(key, _)| early.contains(*key));
        order
    }

    /// `chunk` (under `lease`) was delivered at `now`.
    pub(super) fn delivered(&mut self, chunk: &Chunk, lease: LeaseId, now: Instant) {
        let done = self.done.entry(chunk.job).or_default();
        done.chunks += 1;
        done.steps += u64::from(chunk.steps);
        if let Some(run) = self.runs.get_mut(&RunKey::of(chunk)) {
            run.delivered(chunk, lease, now);
        }
    }

    /// `chunk` (under `lease`) goes back to its run's queue, granted again from
    /// `not_before_opt` on (at once if `None`).
    pub(super) fn requeue(&mut self, chunk: &Chunk, lease: LeaseId, not_before_opt: Option<Instant>) {
        if let Some(run) = self.runs.get_mut(&RunKey::of(chunk)) {
            run.requeue(chunk, lease, not_before_opt);
        }
    }

    /// Drop every run of `job` (it failed: nothing of it is granted any more).
    pub(super) fn drop_runs_of(&mut self, job: JobId) {
        self.runs.retain(|key, _| key.job != job);
    }

    /// Forget everything of `job` (it was removed).
    pub(super) fn forget_job(&mut self, job: JobId) {
        self.drop_runs_of(job);
        self.early.retain(|key| key.job != job);
        self.not_early.remove(&job);
        self.done.remove(&job);
    }

    /// Chunks and steps of `job` delivered so far.
    pub(super) fn done(&self, job: JobId) -> Done {
        self.done.get(&job).copied().unwrap_or_default()
    }

    /// Steps of `job` in flow windows and not yet consumed, and how many its windows hold.
    pub(super) fn window_fill(&self, job: JobId) -> (u64, u64) {
        self.runs
            .iter()
            .filter(|(key, _)| key.job == job)
            .map(|(_, run)| run.window_fill())
            .fold((0, 0), |sum, fill| (sum.0 + fill.0, sum.1 + fill.1))
    }

    /// Steps of `job` queued.
    pub(super) fn queued_of(&self, job: JobId) -> u32 {
        self.runs.iter().filter(|(key, _)| key.job == job).map(|(_, run)| run.queued_len() as u32).sum()
    }

    /// Steps queued over all jobs.
    pub(super) fn queued(&self) -> u32 {
        self.runs.values().map(|run| run.queued_len() as u32).sum()
    }

    /// Steps of `key` that `rank` has consumed, if the run exists.
    pub(super) fn consumed_of(&self, key: RunKey, rank: Rank) -> Option<u64> {
        self.runs.get(&key).map(|run| run.consumed(rank))
    }
}
