//! The trainer's side of the delivery protocol, pure (STYLE G4): which pass of which run the
//! rank is in, the batches it holds, what it has yielded, and what it tells the coordinator.
//! The [`crate::Loader`] drives it with batches from the network and the clock; the protocol
//! model in `testkit` drives the same code with simulated ones.
//!
//! What it guarantees, with the coordinator's scheduler:
//! * each step of a pass is yielded once, in order (the [`Reorder`] buffer drops copies);
//! * every step is eventually made: opening a run (a new pass) tells the coordinator the first
//!   step the rank needs and the steps it already holds, so steps delivered to a trainer that
//!   is gone, or dropped with a buffer (`set_epoch`, `load_state_dict`), are made again; and a
//!   rank that has waited [`TrainerProtocol::nack_after`] for a step reports it missing, so a
//!   step lost after delivery (refused, dropped as another run's, taken by an older trainer)
//!   is made again too.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use stoker_plan::ids::{Pass, Step};

use crate::reorder::{Offer, Reorder, RunId};

/// A batch as the protocol sees it: which run and step it is.
pub trait Delivered {
    /// The run the batch belongs to.
    fn run(&self) -> RunId;
    /// Its step.
    fn step(&self) -> Step;
}

/// Most steps a report names missing (a bound on the request; the flow window is smaller).
const MAX_MISSING: usize = 256;

/// An `OpenEpoch` to send.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Open {
    /// The run.
    pub run: RunId,
    /// The new pass.
    pub pass: Pass,
    /// Steps already consumed in it (0: a pass starts at the run's first step).
    pub consumed: u64,
    /// Steps already held (batches of the run that arrived before it was opened).
    pub holding: Vec<Step>,
}

/// The rank's standing, for a `ReportProgress`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Report {
    /// The run.
    pub run: RunId,
    /// The pass.
    pub pass: Pass,
    /// Steps in the run.
    pub steps: u64,
    /// Steps yielded.
    pub consumed: u64,
    /// Steps waited for at least `nack_after` (the next one and the gaps before batches held).
    pub missing: Vec<Step>,
}

/// What became of an offered batch.
#[derive(Debug, PartialEq, Eq)]
pub enum Offered {
    /// Kept for its step of the current run.
    Kept,
    /// A copy of a step already yielded or held: dropped.
    Duplicate,
    /// A later run's: kept until that run is opened.
    Early,
    /// An earlier run's: dropped.
    Dropped,
}

struct Current<B> {
    run: RunId,
    reorder: Reorder<B>,
    yielded_opt: Option<Step>,
}

/// One rank's protocol state.
pub struct TrainerProtocol<B> {
    pass: Pass,
    current_opt: Option<Current<B>>,
    /// Batches of runs not opened (yet): the next epoch's, made while this rank finished the
    /// current one, or the current run's kept across `close`; one per (run, step), so copies
    /// do not pile up. Bounded by the flow windows of those runs.
    early: BTreeMap<(RunId, u64), B>,
    nack_after: Duration,
    /// Most batches held (waiting and early); beyond it the farthest ahead is dropped.
    max_buffered: usize,
    /// Batches dropped for that limit.
    evicted: u64,
    /// Since when the rank has waited for its next step.
    waiting_since_opt: Option<Instant>,
}

impl<B> std::fmt::Debug for TrainerProtocol<B> {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("TrainerProtocol")
            .field("pass", &self.pass)
            .field("run", &self.current_opt.as_ref().map(|current| current.run))
            .field("early", &self.early.len())
            .finish_non_exhaustive()
    }
}

impl<B> TrainerProtocol<B>
where
    B: Delivered,
{
    /// A rank in no run yet, that reports steps missing after waiting `nack_after` for them.
    pub fn new(nack_after: Duration) -> Self {
        Self {
            pass: Pass(0),
            current_opt: None,
            early: BTreeMap::new(),
            nack_after,
            max_buffered: usize::MAX,
            evicted: 0,
            waiting_since_opt: None,
        }
    }

    /// Hold at most `max_buffered` batches (at least 1): past it, the batch farthest ahead
    /// (a later run's first, then the current run's highest step, never the next step's) is
    /// dropped, and made again when the rank reports it missing. Bounds what a worker sending
    /// batches far ahead (a bug, or a hostile one) can make the trainer keep.
    pub fn with_max_buffered(mut self, max_buffered: usize) -> Self {
        self.max_buffered = max_buffered.max(1);
        self
    }

    /// Batches dropped so far because more than the limit were held.
    pub fn evicted(&self) -> u64 {
        self.evicted
    }

    fn enforce_limit(&mut self) {
        while self.buffered() > self.max_buffered {
            if self.early.pop_last().is_none() && self.current_opt.as_mut().and_then(|current| current.reorder.evict_last()).is_none() {
                return;
            }
            self.evicted += 1;
        }
    }

    /// How long the rank waits for a step before reporting it missing.
    pub fn nack_after(&self) -> Duration {
        self.nack_after
    }

    /// Start a new pass over `run` of `steps` steps: batches of it already held move into the
    /// pass (and are named in the open, so they are not made again); earlier runs' are dropped.
    pub fn open(&mut self, run: RunId, steps: u64) -> Open {
        self.close();
        self.pass = Pass(self.pass.0 + 1);
        let mut reorder = Reorder::new(run, steps);
        let later = self.early.split_off(&((run.0, stoker_plan::ids::Position(run.1.0.saturating_add(1))), 0));
        for ((batch_run, step), batch) in std::mem::replace(&mut self.early, later) {
            if batch_run == run {
                let _ = reorder.offer(batch_run, Step(step), batch);
            }
        }
        let holding = reorder.waiting_steps().collect();
        self.current_opt = Some(Current { run, reorder, yielded_opt: None });
        self.waiting_since_opt = None;
        Open { run, pass: self.pass, consumed: 0, holding }
    }

    /// Leave the current run (`set_epoch`, a resume, the end of an epoch): its batches not yet
    /// yielded are kept, so that opening the same run again does not make them again.
    pub fn close(&mut self) {
        if let Some(current) = self.current_opt.take() {
            for batch in current.reorder.into_waiting() {
                self.early.insert((batch.run(), batch.step().0), batch);
            }
        }
        self.waiting_since_opt = None;
    }

    /// A batch arrived.
    pub fn offer(&mut self, batch: B) -> Offered {
        let offered = self.take(batch);
        self.enforce_limit();
        offered
    }

    fn take(&mut self, batch: B) -> Offered {
        let (run, step) = (batch.run(), batch.step());
        let Some(current) = self.current_opt.as_mut() else { return self.keep_early(run, step, batch) };
        match current.reorder.offer(run, step, batch) {
            Offer::Kept => Offered::Kept,
            Offer::Duplicate => Offered::Duplicate,
            Offer::Foreign(batch) if run > current.run => self.keep_early(run, step, batch),
            Offer::Foreign(_) => Offered::Dropped,
        }
    }

    fn keep_early(&mut self, run: RunId, step: Step, batch: B) -> Offered {
        match self.early.entry((run, step.0)) {
            std::collections::btree_map::Entry::Occupied(_) => Offered::Duplicate,
            std::collections::btree_map::Entry::Vacant(entry) => {
                entry.insert(batch);
                Offered::Early
            }
        }
    }

    /// The next step's batch, if it is here.
    pub fn pop(&mut self) -> Option<(Step, B)> {
        let current = self.current_opt.as_mut()?;
        let (step, batch) = current.reorder.pop()?;
        current.yielded_opt = Some(step);
        self.waiting_since_opt = None;
        Some((step, batch))
    }

    /// The rank found nothing to yield at `now`: it waits (from the first such call).
    pub fn waiting(&mut self, now: Instant) {
        self.waiting_since_opt.get_or_insert(now);
    }

    /// When the steps waited for will be reported missing, if the rank waits.
    pub fn nack_due(&self) -> Option<Instant> {
        self.waiting_since_opt.map(|since| since + self.nack_after)
    }

    /// Whether the pass is open and every step of it was yielded.
    pub fn is_done(&self) -> bool {
        self.current_opt.as_ref().is_some_and(|current| current.reorder.is_done())
    }

    /// The current pass's run, if one is open.
    pub fn run(&self) -> Option<RunId> {
        self.current_opt.as_ref().map(|current| current.run)
    }

    /// The current pass.
    pub fn pass(&self) -> Pass {
        self.pass
    }

    /// The last step yielded in the current pass.
    pub fn yielded(&self) -> Option<Step> {
        self.current_opt.as_ref().and_then(|current| current.yielded_opt)
    }

    /// How often a waiting training loop says it still waits: half of `nack_after`, between
    /// 10 ms and 500 ms, so the reporter (which reports at least every second) always finds the
    /// last wait within `nack_after` while the loop waits.
    pub fn waiting_refresh(&self) -> Duration {
        (self.nack_after / 2).clamp(Duration::from_millis(10), Duration::from_millis(500))
    }

    /// The step waited for next.
    pub fn next_step(&self) -> Option<Step> {
        self.current_opt.as_ref().map(|current| current.reorder.next_step())
    }

    /// Batches held and not yet yielded: waiting for earlier steps, or of runs not opened.
    pub fn buffered(&self) -> usize {
        self.current_opt.as_ref().map_or(0, |current| current.reorder.waiting()) + self.early.len()
    }

    /// Of [`Self::buffered`], the batches of later runs (made early).
    pub fn early(&self) -> usize {
        self.early.len()
    }

    /// Copies dropped in the current pass.
    pub fn duplicates(&self) -> u64 {
        self.current_opt.as_ref().map_or(0, |current| current.reorder.duplicates())
    }

    /// What to report at `now`: steps consumed, and, once the rank has waited `nack_after`,
    /// the steps it is missing (send them through a [`MissingDamper`]).
    pub fn report(&self, now: Instant) -> Option<Report> {
        let current = self.current_opt.as_ref()?;
        let consumed = current.reorder.next_step().0;
        let overdue = self.nack_due().is_some_and(|due| now >= due);
        let missing =
            if overdue && !current.reorder.is_done() { current.reorder.missing_steps().take(MAX_MISSING).collect() } else { Vec::new() };
        Some(Report { run: current.run, pass: self.pass, steps: current.reorder.steps(), consumed, missing })
    }
}

#[cfg(test)]
#[path = "protocol_tests.rs"]
mod tests;

/// Decides which reports carry their `missing` steps to the coordinator: at most once per
/// `nack_after`, and only while the trainer is actually waiting for them. A report is sent
/// again every second whether or not the training loop still iterates; without this, a
/// trainer that stopped iterating while it waited (Ctrl-C in a notebook, a caught timeout,
/// validation after `set_epoch`) would have the same steps made again every few seconds, for
/// as long as its loader lived.
#[derive(Debug)]
pub struct MissingDamper {
    nack_after: Duration,
    sent_at_opt: Option<Instant>,
}

impl MissingDamper {
    /// Missing steps at most once per `nack_after`.
    pub fn new(nack_after: Duration) -> Self {
        Self { nack_after, sent_at_opt: None }
    }

    /// The `missing` list to send at `now`: `missing` if the trainer waited at `waited_at_opt`
    /// (its last wait, if it is waiting) within `nack_after` and none reached the coordinator
    /// in the last `nack_after`; else nothing. Call [`Self::delivered`] once it is answered.
    pub fn filter(&self, missing: Vec<Step>, waited_at_opt: Option<Instant>, now: Instant) -> Vec<Step> {
        let waiting = waited_at_opt.is_some_and(|waited_at| now.saturating_duration_since(waited_at) <= self.nack_after);
        let due = self.sent_at_opt.is_none_or(|sent_at| now.saturating_duration_since(sent_at) >= self.nack_after);
        if missing.is_empty() || !waiting || !due {
            return Vec::new();
        }
        missing
    }

    /// A report sent at `sent_at` with a non-empty `missing` list was answered: the next goes
    /// out `nack_after` later. (One that failed does not hold the next back.)
    pub fn delivered(&mut self, sent_at: Instant) {
        self.sent_at_opt = Some(sent_at);
    }
}
