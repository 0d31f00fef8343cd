//! One epoch of one job being produced: its chunk queue in (step, rank) order and its flow
//! window. Pure: time is a parameter.

use std::collections::BTreeMap;
use std::time::Instant;

use stoker_common::ids::{Epoch, JobId, Rank, Step};
use stoker_common::proto::Chunk;

/// Which epoch run: a job's epoch from a start position (0, or a resumed checkpoint's).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RunKey {
    /// The job.
    pub job: JobId,
    /// The epoch.
    pub epoch: Epoch,
    /// First position.
    pub start: u64,
}

#[derive(Clone, Copy, Debug)]
struct Queued {
    steps: u32,
    not_before_opt: Option<Instant>,
}

/// The chunks of one epoch run not yet granted, and how far each rank has consumed.
#[derive(Debug)]
pub struct Run {
    key: RunKey,
    steps: u64,
    prefetch: u64,
    chunk_steps: u32,
    /// Steps consumed per rank.
    consumed: Vec<u64>,
    /// Steps `< cut` have been cut into chunks.
    cut: u64,
    /// Chunks waiting for a worker, by (first step, rank).
    queued: BTreeMap<(u64, u32), Queued>,
}

impl Run {
    /// A run of `steps` steps for `world_size` ranks.
    pub fn new(key: RunKey, steps: u64, world_size: u32, prefetch: u32, chunk_steps: u32) -> Self {
        Self {
            key,
            steps,
            prefetch: u64::from(prefetch.max(1)),
            chunk_steps: chunk_steps.max(1),
            consumed: vec![0; world_size as usize],
            cut: 0,
            queued: BTreeMap::new(),
        }
    }

    /// Steps in the run.
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// Steps every rank has consumed.
    pub fn slowest_consumed(&self) -> u64 {
        self.consumed.iter().copied().min().unwrap_or(self.steps)
    }

    /// Steps `rank` has consumed.
    pub fn consumed(&self, rank: Rank) -> u64 {
        self.consumed.get(rank.0 as usize).copied().unwrap_or(0)
    }

    /// Whether every rank has consumed every step.
    pub fn is_finished(&self) -> bool {
        self.slowest_consumed() >= self.steps
    }

    /// Chunks waiting.
    pub fn queued_len(&self) -> usize {
        self.queued.len()
    }

    /// Record that `rank` consumed steps `0..consumed`; drops queued chunks it no longer needs.
    pub fn set_consumed(&mut self, rank: Rank, consumed: u64) {
        let Some(entry) = self.consumed.get_mut(rank.0 as usize) else { return };
        *entry = (*entry).max(consumed.min(self.steps));
        let done = *entry;
        self.queued.retain(|&(first, chunk_rank), queued| chunk_rank != rank.0 || first + u64::from(queued.steps) > done);
    }

    /// `rank` iterates the run again from its first step (a restarted trainer, or a second
    /// pass over the same epoch): forget its progress and queue its steps again. Chunks of it
    /// still leased may deliver twice; the trainer drops the duplicates.
    pub fn restart_rank(&mut self, rank: Rank) {
        let Some(entry) = self.consumed.get_mut(rank.0 as usize) else { return };
        if *entry == 0 {
            return;
        }
        *entry = 0;
        let mut first = 0;
        while first < self.cut {
            let steps = u64::from(self.chunk_steps).min(self.cut - first);
            self.queued.insert((first, rank.0), Queued { steps: steps as u32, not_before_opt: None });
            first += steps;
        }
    }

    /// Queue a chunk again (its lease expired or failed), trimmed to the steps its rank still
    /// needs; not granted before `not_before_opt`.
    pub fn requeue(&mut self, chunk: Chunk, not_before_opt: Option<Instant>) {
        let end = chunk.first_step.0 + u64::from(chunk.steps);
        let first = chunk.first_step.0.max(self.consumed(chunk.rank));
        if first >= end {
            return;
        }
        let steps = u32::try_from(end - first).unwrap_or(u32::MAX);
        self.queued.insert((first, chunk.rank.0), Queued { steps, not_before_opt });
    }

    /// Grant up to `max` chunks that are inside the flow window and not held back at `now`.
    pub fn grant(&mut self, max: usize, now: Instant, trainer_live: impl Fn(Rank) -> bool) -> Vec<Chunk> {
        let window_end = self.slowest_consumed() + self.prefetch;
        self.cut_chunks(window_end);
        let ready: Vec<(u64, u32)> = self
            .queued
            .iter()
            .filter(|&(&(first, rank), queued)| {
                first < window_end && queued.not_before_opt.is_none_or(|not_before| not_before <= now) && trainer_live(Rank(rank))
            })
            .map(|(&key, _)| key)
            .take(max)
            .collect();
        ready
            .into_iter()
            .filter_map(|key| {
                let queued = self.queued.remove(&key)?;
                Some(Chunk {
                    job: self.key.job,
                    epoch: self.key.epoch,
                    start: self.key.start,
                    first_step: Step(key.0),
                    rank: Rank(key.1),
                    steps: queued.steps,
                })
            })
            .collect()
    }

    /// Cut steps below `window_end` into chunks for every rank.
    fn cut_chunks(&mut self, window_end: u64) {
        while self.cut < self.steps && self.cut < window_end {
            let steps = u64::from(self.chunk_steps).min(self.steps - self.cut);
            for (rank, &consumed) in self.consumed.iter().enumerate() {
                if self.cut + steps > consumed {
                    let rank = u32::try_from(rank).unwrap_or(u32::MAX);
                    self.queued.insert((self.cut, rank), Queued { steps: steps as u32, not_before_opt: None });
                }
            }
            self.cut += steps;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    fn key() -> RunKey {
        RunKey { job: JobId(1), epoch: Epoch(0), start: 0 }
    }

    fn covered(chunks: &[Chunk]) -> BTreeSet<(u32, u64)> {
        chunks.iter().flat_map(|c| (c.first_step.0..c.first_step.0 + u64::from(c.steps)).map(move |s| (c.rank.0, s))).collect()
    }

    #[test]
    fn chunks_come_in_step_then_rank_order_within_the_window() {
        let now = Instant::now();
        let mut run = Run::new(key(), 10, 2, 4, 2);
        let granted = run.grant(100, now, |_| true);
        let order: Vec<(u64, u32)> = granted.iter().map(|c| (c.first_step.0, c.rank.0)).collect();
        assert_eq!(order, vec![(0, 0), (0, 1), (2, 0), (2, 1)], "steps 0..4 only: the window is 4");
        assert!(run.grant(100, now, |_| true).is_empty(), "nothing more until a rank consumes");
        run.set_consumed(Rank(0), 4);
        assert!(run.grant(100, now, |_| true).is_empty(), "the slowest rank holds the window");
        run.set_consumed(Rank(1), 2);
        let next: Vec<(u64, u32)> = run.grant(100, now, |_| true).iter().map(|c| (c.first_step.0, c.rank.0)).collect();
        assert_eq!(next, vec![(4, 0), (4, 1)]);
    }

    #[test]
    fn every_step_of_every_rank_is_granted_once_without_failures() {
        let now = Instant::now();
        let mut run = Run::new(key(), 7, 3, 3, 2);
        let mut all = Vec::new();
        for _ in 0..20 {
            let granted = run.grant(2, now, |_| true);
            all.extend(granted.iter().copied());
            let slowest = run.slowest_consumed();
            for rank in 0..3 {
                run.set_consumed(Rank(rank), (slowest + 1).min(7));
            }
        }
        let steps: Vec<(u32, u64)> =
            all.iter().flat_map(|c| (c.first_step.0..c.first_step.0 + u64::from(c.steps)).map(move |s| (c.rank.0, s))).collect();
        let unique = covered(&all);
        assert_eq!(steps.len(), unique.len(), "no step granted twice");
        assert_eq!(unique.len(), 21, "3 ranks x 7 steps");
        assert!(run.is_finished());
    }

    #[test]
    fn a_rank_that_starts_the_run_again_gets_every_step_again() {
        let now = Instant::now();
        let mut run = Run::new(key(), 4, 2, 10, 2);
        let first = covered(&run.grant(100, now, |_| true));
        run.set_consumed(Rank(0), 4);
        run.restart_rank(Rank(0));
        assert_eq!(run.consumed(Rank(0)), 0);
        let again = covered(&run.grant(100, now, |_| true));
        assert_eq!(again, first.iter().filter(|(rank, _)| *rank == 0).copied().collect(), "rank 0's steps, once more");
        run.restart_rank(Rank(1));
        assert!(run.grant(100, now, |_| true).is_empty(), "a rank that had consumed nothing is left alone");
    }

    #[test]
    fn a_requeued_chunk_is_trimmed_to_what_its_rank_still_needs_and_waits() {
        let now = Instant::now();
        let later = now + std::time::Duration::from_secs(1);
        let mut run = Run::new(key(), 10, 1, 10, 4);
        let granted = run.grant(1, now, |_| true);
        assert_eq!(granted[0].steps, 4);
        run.set_consumed(Rank(0), 1);
        run.requeue(granted[0], Some(later));
        let waiting: Vec<Chunk> = run.grant(10, now, |_| true);
        assert!(waiting.iter().all(|c| c.first_step.0 >= 4), "the requeued chunk waits until later: {waiting:?}");
        let retried = run.grant(10, later, |_| true);
        assert_eq!(retried.len(), 1);
        assert_eq!((retried[0].first_step, retried[0].steps), (Step(1), 3));
    }
}
