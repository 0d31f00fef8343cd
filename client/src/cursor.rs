//! Where a trainer rank stands in its epochs, with no I/O: the epoch iterated, the pass over
//! it that is open (its plan), where a resume or seek starts it, and the checkpoint that
//! describes all of that. [`Waits`] keeps the rank's time spent waiting for data. The
//! [`crate::Loader`] drives both; time is a parameter.

use std::sync::Arc;
use std::time::{Duration, Instant};

use stoker_plan::ids::{Epoch, Step};
use stoker_plan::{Checkpoint, EpochPlan, Layout, PlanSpec, ShardTable};
use stoker_proto::ControlRequest;

use crate::error::ClientError;

/// A rank's position in its epochs.
#[derive(Debug)]
pub(crate) struct EpochCursor {
    table: Arc<ShardTable>,
    spec: PlanSpec,
    epoch: Epoch,
    /// Where the epoch it names starts instead of at its beginning (a resume or a seek).
    resume_opt: Option<Checkpoint>,
    /// The plan of the open pass's run; `None` until the epoch is opened.
    plan_opt: Option<Arc<EpochPlan>>,
    /// Steps of the epoch before the open run's start (non-zero after a resume).
    step_offset: u64,
    /// Where the rank stands after a pass ran to its end (the next epoch's start), until the
    /// next pass opens or `set_epoch` picks another epoch.
    completed_opt: Option<Checkpoint>,
    /// An `OpenEpoch` the coordinator could not be reached for (it restarts), with its plan:
    /// sent again, unchanged, by the next call.
    opening_opt: Option<(ControlRequest, Arc<EpochPlan>)>,
    /// The last batch of the pass was yielded: the next call ends the pass.
    finished: bool,
}

impl EpochCursor {
    /// At the start of epoch 0 of the dataset `table` under `spec`.
    pub(crate) fn new(table: Arc<ShardTable>, spec: PlanSpec) -> Self {
        Self {
            table,
            spec,
            epoch: Epoch(0),
            resume_opt: None,
            plan_opt: None,
            step_offset: 0,
            completed_opt: None,
            opening_opt: None,
            finished: false,
        }
    }

    /// The epoch iterated.
    pub(crate) fn epoch(&self) -> Epoch {
        self.epoch
    }

    /// Iterate `epoch` next (from its start, or from the resumed position if a resume named it).
    pub(crate) fn set_epoch(&mut self, epoch: Epoch) {
        self.epoch = epoch;
        self.plan_opt = None;
        self.completed_opt = None;
        self.opening_opt = None;
        self.finished = false;
    }

    /// Continue from `checkpoint` (possibly taken with another world size or batch size).
    pub(crate) fn resume(&mut self, checkpoint: &Checkpoint) -> Result<(), ClientError> {
        EpochPlan::resume(Arc::clone(&self.table), self.spec, checkpoint).map_err(|error| ClientError::Resume {
            message: format!("{error} (was the checkpoint taken with another dataset, seed or shuffle?)"),
        })?;
        self.resume_opt = Some(*checkpoint);
        self.set_epoch(checkpoint.epoch);
        Ok(())
    }

    /// Go to global step `global_step`, counted over all epochs from epoch 0 step 0.
    pub(crate) fn seek_step(&mut self, global_step: u64) -> Result<(), ClientError> {
        let steps = self.epoch_steps();
        if steps == 0 {
            return Err(ClientError::Config {
                message: "an epoch has no steps at this world size and batch size: nothing to seek".to_owned(),
            });
        }
        let epoch = Epoch(global_step / steps);
        let step = global_step % steps;
        self.resume_opt = match step {
            0 => None,
            _ => Some(EpochPlan::new(Arc::clone(&self.table), self.spec, epoch).checkpoint_after(Step(step - 1))),
        };
        self.set_epoch(epoch);
        Ok(())
    }

    /// Steps of an epoch for this rank, from the epoch's start.
    pub(crate) fn epoch_steps(&self) -> u64 {
        let plan = &self.spec;
        Layout::new(self.table.samples(), 0, plan.world_size, plan.batch_size, plan.tail).steps()
    }

    /// The plan of the epoch's next pass: from the resumed position if the resume names it.
    pub(crate) fn next_plan(&self) -> Result<EpochPlan, ClientError> {
        match self.resume_opt {
            Some(checkpoint) if checkpoint.epoch == self.epoch => EpochPlan::resume(Arc::clone(&self.table), self.spec, &checkpoint)
                .map_err(|error| ClientError::Resume { message: error.to_string() }),
            _ => Ok(EpochPlan::new(Arc::clone(&self.table), self.spec, self.epoch)),
        }
    }

    /// Whether a pass is open.
    pub(crate) fn is_open(&self) -> bool {
        self.plan_opt.is_some()
    }

    /// The pass of `plan` is open.
    pub(crate) fn opened(&mut self, plan: Arc<EpochPlan>) {
        self.step_offset = self.epoch_steps().saturating_sub(plan.steps());
        self.plan_opt = Some(plan);
        self.completed_opt = None;
    }

    /// The pass ran to its end: remember where that leaves the rank.
    pub(crate) fn end_pass(&mut self) {
        if let Some(plan) = self.plan_opt.take() {
            self.completed_opt = Some(plan.checkpoint_after(Step(plan.steps().saturating_sub(1))));
        }
        self.finished = false;
    }

    /// Steps of the epoch before the open run's start.
    pub(crate) fn step_offset(&self) -> u64 {
        self.step_offset
    }

    /// The open that could not be sent, to send again.
    pub(crate) fn take_opening(&mut self) -> Option<(ControlRequest, Arc<EpochPlan>)> {
        self.opening_opt.take()
    }

    /// Keep an open that could not be sent, for the next call.
    pub(crate) fn keep_opening(&mut self, request: ControlRequest, plan: Arc<EpochPlan>) {
        self.opening_opt = Some((request, plan));
    }

    /// Mark whether the pass's last batch was yielded.
    pub(crate) fn set_finished(&mut self, finished: bool) {
        self.finished = finished;
    }

    /// Whether the pass's last batch was yielded (the next call ends the pass).
    pub(crate) fn is_finished(&self) -> bool {
        self.finished
    }

    /// Where the rank stands when the steps up to `yielded_opt` of the open pass were yielded:
    /// every step before the checkpoint has been. After an epoch's last batch that is the next
    /// epoch's start.
    pub(crate) fn checkpoint(&self, yielded_opt: Option<Step>) -> Result<Checkpoint, ClientError> {
        Ok(match (&self.plan_opt, self.completed_opt) {
            (Some(plan), _) => match yielded_opt {
                Some(step) => plan.checkpoint_after(step),
                None => plan.checkpoint_at_start(),
            },
            (None, Some(completed)) => completed,
            (None, None) => self.next_plan()?.checkpoint_at_start(),
        })
    }

    /// Where the rank stood before step `step` (numbered from the epoch's start) of the open
    /// pass, when that step was yielded (`yielded_opt` at or past it): the checkpoint of a batch
    /// handed back unused. `None` without an open pass or for a step not yet yielded.
    pub(crate) fn checkpoint_before(&self, step: u64, yielded_opt: Option<Step>) -> Option<Checkpoint> {
        let plan = self.plan_opt.as_ref()?;
        let step_in_run = step.checked_sub(self.step_offset)?;
        if yielded_opt.is_none_or(|yielded| yielded.0 < step_in_run) {
            return None;
        }
        Some(match step_in_run {
            0 => plan.checkpoint_at_start(),
            _ => plan.checkpoint_after(Step(step_in_run - 1)),
        })
    }

    /// Steps of the current epoch not yielded yet, when the open pass yielded up to
    /// `yielded_opt`: all of them before it starts, those after the resumed position after a
    /// resume, 0 once it ended.
    pub(crate) fn remaining(&self, yielded_opt: Option<Step>) -> Result<u64, ClientError> {
        match (&self.plan_opt, self.completed_opt) {
            (Some(plan), _) => Ok(plan.steps() - yielded_opt.map_or(0, |step| step.0 + 1)),
            (None, Some(_)) => Ok(0),
            (None, None) => Ok(self.next_plan()?.steps()),
        }
    }
}

/// A rank's time spent waiting for data, and the deadline of the wait for its next step.
#[derive(Debug)]
pub(crate) struct Waits {
    batch_timeout: Duration,
    /// Since the loader started.
    waited: Duration,
    /// Of `waited`, the part since the last `set_epoch`.
    epoch_waited: Duration,
    /// When waiting for the next step gives up; set by the first wait for it.
    deadline_opt: Option<Instant>,
}

impl Waits {
    /// No wait yet; a step is waited for at most `batch_timeout`.
    pub(crate) fn new(batch_timeout: Duration) -> Self {
        Self { batch_timeout, waited: Duration::ZERO, epoch_waited: Duration::ZERO, deadline_opt: None }
    }

    /// The wait for the next step gives up at this time (set by the first wait, `now`).
    pub(crate) fn deadline(&mut self, now: Instant) -> Instant {
        *self.deadline_opt.get_or_insert(now + self.batch_timeout)
    }

    /// The step came (or the wait was given up): the next wait has a deadline of its own.
    pub(crate) fn clear_deadline(&mut self) {
        self.deadline_opt = None;
    }

    /// A new epoch: its wait counts from zero, and so does its deadline.
    pub(crate) fn new_epoch(&mut self) {
        self.epoch_waited = Duration::ZERO;
        self.deadline_opt = None;
    }

    /// The rank waited `waited` more.
    pub(crate) fn add(&mut self, waited: Duration) {
        self.waited += waited;
        self.epoch_waited += waited;
    }

    /// Waited in all.
    pub(crate) fn total(&self) -> Duration {
        self.waited
    }

    /// Waited since the last new epoch.
    pub(crate) fn this_epoch(&self) -> Duration {
        self.epoch_waited
    }

    /// How long a step is waited for.
    pub(crate) fn batch_timeout(&self) -> Duration {
        self.batch_timeout
    }
}

#[cfg(test)]
mod tests {
    use std::num::NonZeroU32;
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use stoker_plan::ids::{Epoch, Position, Step};
    use stoker_plan::{EpochPlan, PlanSpec, ShardTable, Shuffle, Tail};

    use super::{EpochCursor, Waits};

    /// 100 samples in 4 shards, one rank, batches of 10: 10 steps an epoch.
    fn cursor() -> (EpochCursor, Arc<ShardTable>, PlanSpec) {
        let table = Arc::new(ShardTable::new([25, 25, 25, 25]).expect("table"));
        let spec = PlanSpec {
            seed: 7,
            world_size: NonZeroU32::MIN,
            batch_size: NonZeroU32::new(10).expect("10"),
            shuffle: Shuffle::Full,
            tail: Tail::Drop,
        };
        (EpochCursor::new(Arc::clone(&table), spec), table, spec)
    }

    #[test]
    fn a_fresh_cursor_stands_at_the_start_of_epoch_zero() {
        let (cursor, table, spec) = cursor();
        assert_eq!(cursor.epoch(), Epoch(0));
        assert!(!cursor.is_open());
        assert_eq!(cursor.epoch_steps(), 10);
        assert_eq!(cursor.remaining(None).expect("remaining"), 10);
        assert_eq!(cursor.checkpoint(None).expect("checkpoint"), EpochPlan::new(table, spec, Epoch(0)).checkpoint_at_start());
    }

    #[test]
    fn an_open_pass_checkpoints_after_the_last_yielded_step_and_its_end_at_the_next_epoch() {
        let (mut cursor, table, spec) = cursor();
        let plan = Arc::new(cursor.next_plan().expect("plan"));
        cursor.opened(Arc::clone(&plan));
        assert!(cursor.is_open());
        assert_eq!(cursor.step_offset(), 0);
        assert_eq!(cursor.checkpoint(None).expect("checkpoint"), plan.checkpoint_at_start());
        assert_eq!(cursor.checkpoint(Some(Step(2))).expect("checkpoint"), plan.checkpoint_after(Step(2)));
        assert_eq!(cursor.remaining(Some(Step(2))).expect("remaining"), 7);
        cursor.set_finished(true);
        assert!(cursor.is_finished());
        cursor.end_pass();
        assert!(!cursor.is_open() && !cursor.is_finished());
        assert_eq!(cursor.remaining(None).expect("remaining"), 0);
        let next = cursor.checkpoint(None).expect("checkpoint");
        assert_eq!(next, EpochPlan::new(table, spec, Epoch(1)).checkpoint_at_start());
        // Iterating again without set_epoch starts the epoch over.
        assert_eq!(cursor.next_plan().expect("plan").steps(), 10);
    }

    #[test]
    fn a_resume_starts_its_epoch_after_the_checkpoint_and_counts_the_steps_before_it() {
        let (mut cursor, table, spec) = cursor();
        let checkpoint = EpochPlan::new(Arc::clone(&table), spec, Epoch(3)).checkpoint_after(Step(3));
        cursor.resume(&checkpoint).expect("resume");
        assert_eq!(cursor.epoch(), Epoch(3));
        assert_eq!(cursor.remaining(None).expect("remaining"), 6);
        let plan = Arc::new(cursor.next_plan().expect("plan"));
        assert_eq!(plan.start(), checkpoint.position);
        cursor.opened(plan);
        assert_eq!(cursor.step_offset(), 4);
        // Another epoch starts at its beginning.
        cursor.set_epoch(Epoch(4));
        assert_eq!(cursor.next_plan().expect("plan").start(), Position(0));
    }

    #[test]
    fn a_checkpoint_of_another_dataset_is_refused() {
        let (mut cursor, _, spec) = cursor();
        let other = Arc::new(ShardTable::new([50, 50]).expect("table"));
        let checkpoint = EpochPlan::new(other, spec, Epoch(1)).checkpoint_after(Step(1));
        assert!(cursor.resume(&checkpoint).is_err());
        assert_eq!(cursor.epoch(), Epoch(0), "a refused resume moves nothing");
    }

    #[test]
    fn seeking_a_global_step_picks_its_epoch_and_step() {
        let (mut cursor, table, spec) = cursor();
        cursor.seek_step(23).expect("seek");
        assert_eq!(cursor.epoch(), Epoch(2));
        let plan = cursor.next_plan().expect("plan");
        assert_eq!(plan.start(), EpochPlan::new(Arc::clone(&table), spec, Epoch(2)).checkpoint_after(Step(2)).position);
        cursor.seek_step(30).expect("seek");
        assert_eq!(cursor.epoch(), Epoch(3));
        assert_eq!(cursor.next_plan().expect("plan").start(), Position(0));
    }

    #[test]
    fn the_wait_deadline_holds_until_cleared_and_waits_add_up() {
        let mut waits = Waits::new(Duration::from_secs(5));
        let now = Instant::now();
        let deadline = waits.deadline(now);
        assert_eq!(deadline, now + Duration::from_secs(5));
        assert_eq!(waits.deadline(now + Duration::from_secs(1)), deadline);
        waits.clear_deadline();
        assert_eq!(waits.deadline(now + Duration::from_secs(1)), now + Duration::from_secs(6));
        waits.add(Duration::from_millis(300));
        waits.new_epoch();
        waits.add(Duration::from_millis(200));
        assert_eq!(waits.total(), Duration::from_millis(500));
        assert_eq!(waits.this_epoch(), Duration::from_millis(200));
    }
}
