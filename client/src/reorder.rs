//! The trainer's reorder buffer (DESIGN §5): pure. Batches arrive from any worker in any
//! order, possibly twice (a lease granted again after a worker died); it yields each step of
//! the current run exactly once, strictly in order.

use std::collections::BTreeMap;

use stoker_plan::ids::{Epoch, Position, Step};

/// Which run a batch belongs to: (epoch, start position). Runs order by epoch, then start.
pub type RunId = (Epoch, Position);

/// Steps of one run waiting to be yielded.
#[derive(Debug)]
pub struct Reorder<B> {
    run: RunId,
    next: u64,
    steps: u64,
    waiting: BTreeMap<u64, B>,
    duplicates: u64,
}

/// What happened to an offered batch.
#[derive(Debug, PartialEq, Eq)]
pub enum Offer<B> {
    /// Kept for its step.
    Kept,
    /// A step already yielded or already waiting (dropped).
    Duplicate,
    /// Another run's batch, or a step past the run's end: handed back.
    Foreign(B),
}

impl<B> Reorder<B> {
    /// Expect steps `0..steps` of `run`.
    pub fn new(run: RunId, steps: u64) -> Self {
        Self { run, next: 0, steps, waiting: BTreeMap::new(), duplicates: 0 }
    }

    /// Offer the batch of `step` of `run`.
    pub fn offer(&mut self, run: RunId, step: Step, batch: B) -> Offer<B> {
        if run != self.run || step.0 >= self.steps {
            return Offer::Foreign(batch);
        }
        if step.0 < self.next || self.waiting.contains_key(&step.0) {
            self.duplicates += 1;
            return Offer::Duplicate;
        }
        self.waiting.insert(step.0, batch);
        Offer::Kept
    }

    /// The next step's batch, if it has arrived.
    pub fn pop(&mut self) -> Option<(Step, B)> {
        let batch = self.waiting.remove(&self.next)?;
        let step = Step(self.next);
        self.next += 1;
        Some((step, batch))
    }

    /// Drop the batch waiting farthest ahead, unless it is the next step's (which `pop`
    /// yields at once): the buffer is over its limit. Its step is then missing, and made again.
    pub fn evict_last(&mut self) -> Option<Step> {
        let (&last, _) = self.waiting.last_key_value()?;
        if last == self.next {
            return None;
        }
        self.waiting.remove(&last);
        Some(Step(last))
    }

    /// The step `pop` yields next.
    pub fn next_step(&self) -> Step {
        Step(self.next)
    }

    /// Whether every step was yielded.
    pub fn is_done(&self) -> bool {
        self.next >= self.steps
    }

    /// Batches waiting for earlier steps.
    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }

    /// The steps of the batches waiting, in order.
    pub fn waiting_steps(&self) -> impl Iterator<Item = Step> + '_ {
        self.waiting.keys().map(|&step| Step(step))
    }

    /// The steps not yet here that block the batches waiting: the next step, and every gap
    /// below the last batch waiting.
    pub fn missing_steps(&self) -> impl Iterator<Item = Step> + '_ {
        let last = self.waiting.keys().next_back().copied().unwrap_or(self.next);
        (self.next..=last.max(self.next)).filter(|step| *step < self.steps && !self.waiting.contains_key(step)).map(Step)
    }

    /// Steps in the run.
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// The batches waiting, taken out (the buffer is being left).
    pub fn into_waiting(self) -> impl Iterator<Item = B> {
        self.waiting.into_values()
    }

    /// Duplicates dropped so far.
    pub fn duplicates(&self) -> u64 {
        self.duplicates
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    const RUN: RunId = (Epoch(1), Position(0));

    proptest! {
        /// Whatever the arrival order and however many copies arrive, every step comes out
        /// exactly once and in order.
        #[test]
        fn every_step_exactly_once_in_order(
            steps in 1u64..40,
            arrivals in proptest::collection::vec((0u64..40, any::<bool>()), 0..200),
        ) {
            let mut reorder = Reorder::new(RUN, steps);
            let mut yielded = Vec::new();
            // Every step arrives at least once, after the random (possibly duplicated) arrivals.
            let all = arrivals.iter().map(|(step, _)| *step).chain(0..steps);
            for step in all {
                let _ = reorder.offer(RUN, Step(step), step);
                while let Some((popped, value)) = reorder.pop() {
                    prop_assert_eq!(popped.0, value);
                    yielded.push(popped.0);
                }
            }
            prop_assert_eq!(yielded, (0..steps).collect::<Vec<_>>());
            prop_assert!(reorder.is_done());
        }
    }

    #[test]
    fn another_runs_batches_are_foreign() {
        let mut reorder = Reorder::new(RUN, 3);
        assert_eq!(reorder.offer((Epoch(0), Position(0)), Step(0), ()), Offer::Foreign(()));
        assert_eq!(reorder.offer((Epoch(1), Position(64)), Step(0), ()), Offer::Foreign(()));
        assert_eq!(reorder.offer(RUN, Step(3), ()), Offer::Foreign(()));
        assert_eq!(reorder.offer(RUN, Step(1), ()), Offer::Kept);
        assert_eq!(reorder.offer(RUN, Step(1), ()), Offer::Duplicate);
        assert!(reorder.pop().is_none(), "step 0 has not arrived");
        assert_eq!(reorder.waiting(), 1);
        assert_eq!(reorder.missing_steps().collect::<Vec<_>>(), vec![Step(0)]);
    }

    #[test]
    fn the_missing_steps_are_the_next_and_the_gaps_below_the_last_batch_held() {
        let mut reorder = Reorder::new(RUN, 10);
        assert_eq!(reorder.missing_steps().collect::<Vec<_>>(), vec![Step(0)], "nothing held: the next step");
        for step in [1, 4, 5] {
            let _ = reorder.offer(RUN, Step(step), ());
        }
        assert_eq!(reorder.missing_steps().collect::<Vec<_>>(), vec![Step(0), Step(2), Step(3)]);
        let _ = reorder.offer(RUN, Step(0), ());
        while reorder.pop().is_some() {}
        assert_eq!(reorder.next_step(), Step(2));
        assert_eq!(reorder.missing_steps().collect::<Vec<_>>(), vec![Step(2), Step(3)]);
        let mut done = Reorder::new(RUN, 1);
        let _ = done.offer(RUN, Step(0), ());
        let _ = done.pop();
        assert_eq!(done.missing_steps().count(), 0, "a finished run misses nothing");
    }
}
