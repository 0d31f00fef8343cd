//! One epoch of one job being produced: where every step of every rank stands (queued for a
//! worker, leased, delivered, consumed) and the flow window. Pure: time is a parameter.
//!
//! A step of a rank is *pending* from the moment it is cut (enters the flow window) until the
//! rank has consumed it. While pending it is queued, leased to one worker, or delivered (its
//! batch reached the trainer's QUIC stack). Delivered is not consumed: a trainer that drops
//! its buffer (a restart, `set_epoch`, `load_state_dict`) or refuses a batch needs the step
//! again, and says so by opening the run again ([`Run::restart_rank`]) or by reporting the step
//! missing ([`Run::missing`]). That is what makes every loss path end in the step being made.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use stoker_plan::ids::{Epoch, JobId, LeaseId, Position, Rank, Step, WorkerId};
use stoker_proto::Chunk;

/// Which epoch run: a job's epoch from a start position (0, or a resumed checkpoint's).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RunKey {
    /// The job.
    pub job: JobId,
    /// The epoch.
    pub epoch: Epoch,
    /// First position.
    pub start: Position,
}

impl RunKey {
    /// The run a chunk belongs to.
    pub fn of(chunk: &Chunk) -> Self {
        Self { job: chunk.job, epoch: chunk.epoch, start: chunk.start }
    }
}

/// Where a pending step stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum StepState {
    /// Waiting for a worker, not granted before `not_before_opt`.
    Queued { not_before_opt: Option<Instant> },
    /// Granted under `lease`.
    Leased { lease: LeaseId },
    /// Its batch was delivered (or the trainer said it holds it) at `at`.
    Delivered { at: Instant },
}

/// How a rank was counted in when the run was created.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Counted {
    /// Its trainer is attached and may come to this run (it is in an earlier epoch, or in
    /// none yet): the run makes its steps and waits for it.
    MayCome,
    /// It is past this run (in a later epoch, or in this epoch from another start).
    Ahead,
    /// Its trainer detached, or this coordinator has not heard of it (it restarted since).
    Absent,
}

/// One rank's steps in the run.
#[derive(Debug)]
struct RankSteps {
    /// Steps `0..consumed` are consumed.
    consumed: u64,
    /// Steps `< cut` have entered the flow window for this rank (are or were pending): the
    /// only ones that may have been delivered to it.
    cut: u64,
    /// Steps in `consumed..cut` not yet consumed, by step.
    pending: BTreeMap<u64, StepState>,
    /// Whether the rank's position here is known: it opened the run, or is past it. An absent
    /// rank's is not, and no checkpoint of the run is taken while one is.
    accounted: bool,
}

/// The steps of one epoch run and how far each rank has consumed.
#[derive(Debug)]
pub struct Run {
    key: RunKey,
    steps: u64,
    prefetch: u64,
    chunk_steps: u32,
    ranks: Vec<RankSteps>,
    /// The queued steps, as (step, rank): the grant order.
    queued: BTreeSet<(u64, u32)>,
    /// Chunks (first step, rank) a puller passed over for chunks it holds the shards of, with
    /// who passed them over and how often: any other puller gets them first, and so does the
    /// one that passed them over once it has done so three times.
    passed_over: BTreeMap<(u64, u32), PassedOver>,
    /// How many ranks have consumed how many steps: the slowest is its first key (every rank
    /// counted, live or not).
    by_consumed: BTreeMap<u64, u32>,
    /// Ranks whose position here is not known (`!accounted`).
    unaccounted: u32,
    /// Which ranks' trainers are live, kept between pulls (see [`LiveView`]).
    view_opt: Option<LiveView>,
}

/// Which ranks' trainers are live, as of `at`, and what follows from it: kept between grants
/// so that a pull costs no scan of every rank (issue 35). Exact, not a sample: it is dropped
/// when a rank could become live (the scheduler calls [`Run::forget_liveness`] when a seat is
/// made, replaced, opened, detached or revived by a report) or when a rank leaves or restarts
/// here, and it expires at `until_opt`, when the first rank it holds live stops being so.
/// Progress of a live rank is applied to it in place.
#[derive(Debug)]
struct LiveView {
    at: Instant,
    /// When the first live rank stops being live (`None`: no rank is live).
    until_opt: Option<Instant>,
    live: Vec<bool>,
    /// How many live ranks have consumed how many steps: the window's base is the first key.
    live_by_consumed: BTreeMap<u64, u32>,
    /// The window end the last cut was made for, with this view's live ranks.
    cut_for_opt: Option<u64>,
}

impl LiveView {
    fn valid_at(&self, now: Instant) -> bool {
        now >= self.at && self.until_opt.is_none_or(|until| now < until)
    }
}

/// Move one rank's count in a consumed multiset from `from` to `to`.
fn recount(counts: &mut BTreeMap<u64, u32>, from: u64, to: u64) {
    if from == to {
        return;
    }
    if let Some(count) = counts.get_mut(&from) {
        *count -= 1;
        if *count == 0 {
            counts.remove(&from);
        }
    }
    *counts.entry(to).or_default() += 1;
}

/// How many times one puller may pass a chunk over before it goes first to that puller too.
const PASSES: u32 = 3;

/// Who passed a chunk over, and how many times.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct PassedOver {
    by: Option<WorkerId>,
    times: u32,
}

impl PassedOver {
    /// Whether `puller` gets the chunk before any other.
    fn first_for(self, puller: Option<WorkerId>) -> bool {
        self.times >= PASSES || puller.is_none() || self.by != puller
    }
}

/// How many grantable chunks past the `max` a puller asks for it may prefer (locality).
pub(crate) const LOCALITY_LOOKAHEAD: usize = 8;

impl Run {
    /// A run of `steps` steps for `world_size` ranks, counted in as `counted` says. Ranks that
    /// may not come (ahead, absent) hold no window and get no work here unless they open the
    /// run themselves.
    pub fn new(key: RunKey, steps: u64, world_size: u32, prefetch: u32, chunk_steps: u32, counted: impl Fn(Rank) -> Counted) -> Self {
        let ranks: Vec<RankSteps> = (0..world_size)
            .map(|rank| {
                let counted = counted(Rank(rank));
                let consumed = if counted == Counted::MayCome { 0 } else { steps };
                RankSteps { consumed, cut: 0, pending: BTreeMap::new(), accounted: counted != Counted::Absent }
            })
            .collect();
        let mut by_consumed: BTreeMap<u64, u32> = BTreeMap::new();
        for rank in &ranks {
            *by_consumed.entry(rank.consumed).or_default() += 1;
        }
        let unaccounted = ranks.iter().filter(|rank| !rank.accounted).count() as u32;
        Self {
            key,
            steps,
            prefetch: u64::from(prefetch.max(1)),
            chunk_steps: chunk_steps.max(1),
            ranks,
            queued: BTreeSet::new(),
            passed_over: BTreeMap::new(),
            by_consumed,
            unaccounted,
            view_opt: None,
        }
    }

    /// Whether the kept view holds `rank` as not live.
    pub fn kept_not_live(&self, rank: Rank) -> bool {
        self.view_opt.as_ref().is_some_and(|view| !view.live.get(rank.0 as usize).copied().unwrap_or(true))
    }

    /// Forget which trainers are live: a seat changed in a way that may make one live.
    pub fn forget_liveness(&mut self) {
        self.view_opt = None;
    }

    /// Set `rank`'s consumed steps and `accounted`, keeping the counts.
    fn set_position(&mut self, rank: usize, consumed: u64, accounted: bool) {
        let Some(entry) = self.ranks.get_mut(rank) else { return };
        recount(&mut self.by_consumed, entry.consumed, consumed);
        if let Some(view) = self.view_opt.as_mut().filter(|view| view.live.get(rank).copied().unwrap_or(false)) {
            recount(&mut view.live_by_consumed, entry.consumed, consumed);
        }
        match (entry.accounted, accounted) {
            (true, false) => self.unaccounted += 1,
            (false, true) => self.unaccounted -= 1,
            _ => {}
        }
        entry.consumed = consumed;
        entry.accounted = accounted;
    }

    /// Steps delivered ahead of what the ranks still consuming have consumed (batches waiting
    /// at their trainers), and what the flow windows of those ranks hold.
    pub fn window_fill(&self) -> (u64, u64) {
        let consuming = self.ranks.iter().filter(|rank| rank.consumed < self.steps);
        consuming.fold((0, 0), |(delivered, capacity), rank| {
            let ahead = rank.pending.values().filter(|state| matches!(state, StepState::Delivered { .. })).count() as u64;
            (delivered + ahead, capacity + self.prefetch)
        })
    }

    /// Steps in the run.
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// Steps, ranks and flow window of the run.
    pub fn shape(&self) -> super::RunShape {
        super::RunShape {
            steps: self.steps,
            world_size: self.ranks.len() as u32,
            prefetch: u32::try_from(self.prefetch).unwrap_or(u32::MAX),
        }
    }

    /// Whether every rank still to consume here is within the flow window of the run's end:
    /// the steps left fit in the window, so workers would idle until the next epoch opens.
    pub fn nearly_done(&self) -> bool {
        self.steps.saturating_sub(self.slowest_consumed()) <= self.prefetch
    }

    /// Steps every rank has consumed.
    pub fn slowest_consumed(&self) -> u64 {
        self.by_consumed.first_key_value().map_or(self.steps, |(&consumed, _)| consumed)
    }

    /// Steps `rank` has consumed.
    pub fn consumed(&self, rank: Rank) -> u64 {
        self.ranks.get(rank.0 as usize).map_or(0, |steps| steps.consumed)
    }

    /// Whether a rank that `live` says is live has steps here it has not consumed.
    pub fn needed_by_any(&self, live: impl Fn(Rank) -> bool) -> bool {
        self.ranks
            .iter()
            .enumerate()
            .any(|(rank, steps)| steps.consumed < self.steps && live(Rank(u32::try_from(rank).unwrap_or(u32::MAX))))
    }

    /// Whether every rank has consumed every step (or moved past the run).
    pub fn is_finished(&self) -> bool {
        self.slowest_consumed() >= self.steps
    }

    /// Steps every rank has consumed, if every rank's position is known (a checkpoint of the
    /// job): not while a rank that was absent when the run was made has not opened it.
    pub fn checkpointable_consumed(&self) -> Option<u64> {
        (self.unaccounted == 0).then(|| self.slowest_consumed())
    }

    /// Steps (of all ranks) waiting for a worker.
    pub fn queued_len(&self) -> usize {
        self.queued.len()
    }

    /// Record that `rank` consumed steps `0..consumed` (never less than already recorded: a
    /// pass only moves forward; a new pass goes through [`Run::restart_rank`]).
    pub fn set_consumed(&mut self, rank: Rank, consumed: u64) {
        let consumed = consumed.min(self.steps);
        let Some(entry) = self.ranks.get(rank.0 as usize) else { return };
        if consumed <= entry.consumed {
            return;
        }
        let accounted = entry.accounted;
        self.set_position(rank.0 as usize, consumed, accounted);
        let Some(entry) = self.ranks.get_mut(rank.0 as usize) else { return };
        let still_pending = entry.pending.split_off(&consumed);
        for step in std::mem::replace(&mut entry.pending, still_pending).into_keys() {
            self.queued.remove(&(step, rank.0));
        }
    }

    /// `rank` left the run for run `to`: it needs nothing more here and holds no window. Its
    /// position is known to be past this run only if `to` is of a later epoch; one that went
    /// back (a restarted trainer resuming an earlier epoch) or elsewhere in this epoch is not
    /// counted past it, so no job checkpoint of this run claims steps it has not consumed.
    pub fn depart(&mut self, rank: Rank, to: RunKey) {
        self.leave(rank, to.epoch > self.key.epoch);
    }

    /// `rank`'s trainer detached: it leaves the run, and its position is no longer known.
    pub fn detach(&mut self, rank: Rank) {
        self.leave(rank, false);
    }

    fn leave(&mut self, rank: Rank, past: bool) {
        self.set_consumed(rank, self.steps);
        let steps = self.steps;
        self.set_position(rank.0 as usize, steps, past);
        self.view_opt = None;
    }

    /// `rank` (a new pass: a restarted trainer, a second iteration of the epoch, a resume)
    /// needs every step from `consumed` on except those in `holding`. Steps delivered before
    /// and not held (they went to a trainer that is gone, or were dropped with its buffer)
    /// are queued again; steps queued or leased stay so (a leased one may arrive twice; the
    /// trainer drops the copy).
    pub fn restart_rank(&mut self, rank: Rank, consumed: u64, holding: &[Step], now: Instant) {
        let consumed = consumed.min(self.steps);
        if rank.0 as usize >= self.ranks.len() {
            return;
        }
        self.set_position(rank.0 as usize, consumed, true);
        self.view_opt = None;
        let Some(entry) = self.ranks.get_mut(rank.0 as usize) else { return };
        let held: BTreeSet<u64> = holding.iter().map(|step| step.0).collect();
        let still_pending = entry.pending.split_off(&consumed);
        for step in std::mem::replace(&mut entry.pending, still_pending).into_keys() {
            self.queued.remove(&(step, rank.0));
        }
        for step in consumed..entry.cut {
            let state = entry.pending.get(&step).copied();
            match (state, held.contains(&step)) {
                (Some(StepState::Queued { .. } | StepState::Leased { .. }), _) => {}
                (_, true) => {
                    entry.pending.insert(step, StepState::Delivered { at: now });
                }
                (Some(StepState::Delivered { .. }) | None, false) => {
                    entry.pending.insert(step, StepState::Queued { not_before_opt: None });
                    self.queued.insert((step, rank.0));
                }
            }
        }
    }

    /// The trainer of `rank` has waited for `steps` long enough to conclude they are lost:
    /// those delivered at least `grace` ago are queued again (a step queued or leased is on
    /// its way; one delivered just now may still be being read). Returns how many.
    pub fn missing(&mut self, rank: Rank, steps: &[Step], grace: Duration, now: Instant) -> usize {
        let Some(entry) = self.ranks.get_mut(rank.0 as usize) else { return 0 };
        let mut requeued = 0;
        for step in steps {
            if let Some(state) = entry.pending.get_mut(&step.0)
                && let StepState::Delivered { at } = *state
                && now.saturating_duration_since(at) >= grace
            {
                *state = StepState::Queued { not_before_opt: None };
                self.queued.insert((step.0, rank.0));
                requeued += 1;
            }
        }
        requeued
    }

    /// The steps of `chunk` leased under `lease` were delivered at `now`.
    pub fn delivered(&mut self, chunk: &Chunk, lease: LeaseId, now: Instant) {
        self.settle(chunk, lease, StepState::Delivered { at: now });
    }

    /// The steps of `chunk` leased under `lease` were not delivered (the lease expired or
    /// failed): queue them again, not granted before `not_before_opt`.
    pub fn requeue(&mut self, chunk: &Chunk, lease: LeaseId, not_before_opt: Option<Instant>) {
        let rank = chunk.rank.0;
        for step in chunk_steps(chunk) {
            if self.settle_step(rank, step, lease, StepState::Queued { not_before_opt }) {
                self.queued.insert((step, rank));
            }
        }
    }

    fn settle(&mut self, chunk: &Chunk, lease: LeaseId, state: StepState) {
        for step in chunk_steps(chunk) {
            self.settle_step(chunk.rank.0, step, lease, state);
        }
    }

    /// Move a step leased under `lease` to `state`; `false` if it is not (any more) leased
    /// under it: consumed meanwhile, or queued again and granted under another lease.
    fn settle_step(&mut self, rank: u32, step: u64, lease: LeaseId, state: StepState) -> bool {
        let Some(entry) = self.ranks.get_mut(rank as usize) else { return false };
        match entry.pending.get_mut(&step) {
            Some(current) if *current == (StepState::Leased { lease }) => {
                *current = state;
                true
            }
            _ => false,
        }
    }

    /// Which ranks are live at `now` (`live_until` says until when each is, `None`: not live),
    /// from the kept view while it holds, else looked up afresh. With it, the steps every rank
    /// whose trainer is live has consumed: the flow window's base (`None` when no trainer is
    /// live). A rank whose trainer is gone (crashed, detached, not heard from since a restart of
    /// the coordinator) gets nothing made meanwhile, so it need not hold back the ranks that are
    /// consuming; when its trainer is back, it counts again.
    fn live_view(&mut self, now: Instant, live_until: impl Fn(Rank) -> Option<Instant>) -> &mut LiveView {
        if let Some(view) = self.view_opt.take().filter(|view| view.valid_at(now)) {
            return self.view_opt.insert(view);
        }
        {
            let mut view = LiveView {
                at: now,
                until_opt: None,
                live: Vec::with_capacity(self.ranks.len()),
                live_by_consumed: BTreeMap::new(),
                cut_for_opt: None,
            };
            for (rank, entry) in self.ranks.iter().enumerate() {
                let until_opt = live_until(Rank(u32::try_from(rank).unwrap_or(u32::MAX))).filter(|until| *until > now);
                view.live.push(until_opt.is_some());
                if let Some(until) = until_opt {
                    view.until_opt = Some(view.until_opt.map_or(until, |first: Instant| first.min(until)));
                    *view.live_by_consumed.entry(entry.consumed).or_default() += 1;
                }
            }
            self.view_opt.insert(view)
        }
    }

    /// Grant up to `max` chunks that start inside the flow window, whose rank's trainer is
    /// live and that are not held back at `now`: runs of consecutive queued steps of one rank,
    /// at most the chunk size, in (step, rank) order, but for locality: among the first `max +`
    /// [`LOCALITY_LOOKAHEAD`] such chunks those of higher `affinity` (the puller holds more of
    /// their shards) go first. `next_lease` names each grant. (No puller named: a chunk passed
    /// over goes to the next puller whatever its affinity.) Liveness as `trainer_live` says
    /// now, nothing of it kept.
    pub fn grant(
        &mut self,
        max: usize,
        now: Instant,
        trainer_live: impl Fn(Rank) -> bool,
        affinity: impl Fn(&Chunk) -> u32,
        next_lease: impl FnMut() -> LeaseId,
    ) -> Vec<(LeaseId, Chunk)> {
        self.view_opt = None;
        let until = now + Duration::from_secs(1);
        let granted = self.grant_to(None, max, now, |rank| trainer_live(rank).then_some(until), affinity, next_lease);
        self.view_opt = None;
        granted
    }

    /// [`Run::grant`] to `puller`, with liveness kept between calls: `live_until` says until
    /// when a rank's trainer is live (`None`: it is not), and the scheduler calls
    /// [`Run::forget_liveness`] whenever a rank could become live otherwise than by time. A
    /// chunk the puller passes over for another goes first to any other puller whatever its
    /// affinity (the one fetching its shards, say), and to this one too once it has passed it
    /// over three times: a preference delays a chunk by three pulls of one worker at most and
    /// never waits for another worker.
    pub fn grant_to(
        &mut self,
        puller: Option<WorkerId>,
        max: usize,
        now: Instant,
        live_until: impl Fn(Rank) -> Option<Instant>,
        affinity: impl Fn(&Chunk) -> u32,
        mut next_lease: impl FnMut() -> LeaseId,
    ) -> Vec<(LeaseId, Chunk)> {
        let prefetch = self.prefetch;
        let view = self.live_view(now, live_until);
        // No trainer live: nothing is made, and nothing more enters the window (a job whose
        // trainers all died costs no work at each pull).
        let Some(slowest) = view.live_by_consumed.first_key_value().map(|(&consumed, _)| consumed) else { return Vec::new() };
        let window_end = slowest + prefetch;
        let cut_already = view.cut_for_opt == Some(window_end);
        view.cut_for_opt = Some(window_end);
        let live = std::mem::take(&mut view.live);
        if !cut_already {
            self.cut_chunks(window_end, &live);
        }
        let queued = &self.queued;
        self.passed_over.retain(|start, _| queued.contains(start));
        let candidates = self.grantable(window_end, max.saturating_add(LOCALITY_LOOKAHEAD), now, &live);
        if let Some(view) = self.view_opt.as_mut() {
            view.live = live;
        }
        let scores: Vec<u32> = candidates
            .iter()
            .map(|chunk| {
                let first = self.passed_over.get(&(chunk.first_step.0, chunk.rank.0)).is_some_and(|passed| passed.first_for(puller));
                if first { u32::MAX } else { affinity(chunk) }
            })
            .collect();
        let mut order: Vec<usize> = (0..candidates.len()).collect();
        order.sort_by_key(|&at| (Reverse(scores.get(at).copied().unwrap_or(0)), at));
        let chosen: BTreeSet<usize> = order.into_iter().take(max).collect();
        let last_chosen = chosen.last().copied().unwrap_or(0);
        for (at, chunk) in candidates.iter().enumerate().take(last_chosen) {
            if !chosen.contains(&at) {
                let passed = self.passed_over.entry((chunk.first_step.0, chunk.rank.0)).or_insert(PassedOver { by: puller, times: 0 });
                // Passed over by another than the first: it goes first to everyone now.
                passed.times = if passed.by == puller { passed.times + 1 } else { PASSES };
            }
        }
        let mut granted = Vec::new();
        for chunk in chosen.into_iter().filter_map(|at| candidates.get(at).copied()) {
            let lease = next_lease();
            let rank = chunk.rank.0;
            self.passed_over.remove(&(chunk.first_step.0, rank));
            for step in chunk_steps(&chunk) {
                self.queued.remove(&(step, rank));
                if let Some(entry) = self.ranks.get_mut(rank as usize) {
                    entry.pending.insert(step, StepState::Leased { lease });
                }
            }
            granted.push((lease, chunk));
        }
        granted
    }

    /// Up to `limit` chunks that could be granted now, in (step, rank) order: each a run of
    /// consecutive queued, ready steps of a live rank, below `window_end`, at most the chunk size.
    fn grantable(&self, window_end: u64, limit: usize, now: Instant, live: &[bool]) -> Vec<Chunk> {
        let mut covered = BTreeSet::new();
        let mut chunks = Vec::new();
        for &(first, rank) in self.queued.range(..(window_end, 0)) {
            if chunks.len() >= limit {
                break;
            }
            if covered.contains(&(first, rank)) || !self.ready(rank, first, now) || !live.get(rank as usize).copied().unwrap_or(false) {
                continue;
            }
            let mut steps = 1;
            while steps < self.chunk_steps
                && self.queued.contains(&(first + u64::from(steps), rank))
                && self.ready(rank, first + u64::from(steps), now)
            {
                steps += 1;
            }
            covered.extend((first..first + u64::from(steps)).map(|step| (step, rank)));
            chunks.push(Chunk {
                job: self.key.job,
                epoch: self.key.epoch,
                start: self.key.start,
                first_step: Step(first),
                rank: Rank(rank),
                steps,
            });
        }
        chunks
    }

    fn ready(&self, rank: u32, step: u64, now: Instant) -> bool {
        let state_opt = self.ranks.get(rank as usize).and_then(|entry| entry.pending.get(&step));
        matches!(state_opt, Some(StepState::Queued { not_before_opt }) if not_before_opt.is_none_or(|not_before| not_before <= now))
    }

    /// Let the steps below `window_end` (rounded up to whole chunks) enter the window, for
    /// every rank whose trainer is live. A rank whose trainer is not live is cut when it is
    /// back, from where it was: the run holds no more of its steps than the window did.
    fn cut_chunks(&mut self, window_end: u64, live: &[bool]) {
        let chunk = u64::from(self.chunk_steps);
        let target = window_end.div_ceil(chunk).saturating_mul(chunk).min(self.steps);
        for (rank, entry) in self.ranks.iter_mut().enumerate() {
            // Not live, cut already, or departed (consumed is the run's end; its cut stays where
            // it was, so a re-open knows which steps may have reached it).
            if !live.get(rank).copied().unwrap_or(false) || entry.cut >= target || entry.consumed >= target {
                continue;
            }
            let rank = u32::try_from(rank).unwrap_or(u32::MAX);
            for step in entry.cut.max(entry.consumed)..target {
                entry.pending.insert(step, StepState::Queued { not_before_opt: None });
                self.queued.insert((step, rank));
            }
            entry.cut = target;
        }
    }
}

fn chunk_steps(chunk: &Chunk) -> std::ops::Range<u64> {
    chunk.first_step.0..chunk.first_step.0 + u64::from(chunk.steps)
}

#[cfg(test)]
#[path = "run_tests.rs"]
mod tests;
