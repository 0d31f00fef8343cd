//! Positions ↔ (rank, step, slot): how one epoch's sample sequence is cut into batches
//! (DESIGN §4.3–4.4, §4.6). Pure arithmetic; knows nothing of shards or shuffling.
//!
//! A layout covers the positions from `start` (0 for a fresh epoch, the checkpoint position
//! on resume) to the end of the epoch. Full steps give rank `r` at step `s` the positions
//! `start + s*W*B + r*B + i`. With [`Tail::Partial`] the last step splits what is left as evenly
//! as possible, lower ranks taking the extra sample, each rank's share contiguous.

use std::num::NonZeroU32;

use serde::{Deserialize, Serialize};

use crate::ids::{Rank, Step};

/// What happens to the samples that do not fill a last full step on every rank.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Tail {
    /// `floor(N / (W*B))` full steps; the rest of the epoch is not used (training default).
    #[default]
    Drop,
    /// `ceil(N / (W*B))` full steps; positions past N wrap to the start of the epoch, so a few
    /// samples repeat (what `DistributedSampler` does).
    Pad,
    /// `ceil(N / (W*B))` steps; the last one splits the remainder over the ranks as evenly as
    /// possible. Every sample exactly once: the mode for evaluation.
    Partial,
}

impl std::str::FromStr for Tail {
    type Err = crate::error::PlanError;

    /// `drop`, `pad` or `partial`.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "drop" => Ok(Self::Drop),
            "pad" => Ok(Self::Pad),
            "partial" => Ok(Self::Partial),
            other => Err(crate::error::PlanError::UnknownMode { what: "tail", given: other.to_owned(), expected: "drop, pad or partial" }),
        }
    }
}

/// How positions `start..` of an epoch of `samples` samples are cut into steps and ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    samples: u64,
    start: u64,
    world_size: NonZeroU32,
    batch_size: NonZeroU32,
    tail: Tail,
    steps: u64,
}

/// Where a position sits in a layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Slot {
    /// The rank whose batch holds the position.
    pub rank: Rank,
    /// The step of that batch (relative to the layout's start).
    pub step: Step,
    /// Index inside the batch.
    pub index: u32,
}

impl Layout {
    /// The layout of positions `start..` of an epoch of `samples` samples.
    pub fn new(samples: u64, start: u64, world_size: NonZeroU32, batch_size: NonZeroU32, tail: Tail) -> Self {
        let remaining = samples.saturating_sub(start);
        let per_step = u64::from(world_size.get()) * u64::from(batch_size.get());
        let steps = match tail {
            Tail::Drop => remaining / per_step,
            Tail::Pad | Tail::Partial => remaining.div_ceil(per_step),
        };
        Self { samples, start, world_size, batch_size, tail, steps }
    }

    /// Number of steps; the same for every rank.
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// First position of the layout.
    pub fn start(&self) -> u64 {
        self.start
    }

    /// One past the last position the layout uses.
    pub fn end(&self) -> u64 {
        match self.tail {
            Tail::Partial => self.samples.max(self.start),
            Tail::Drop | Tail::Pad => self.start + self.steps * self.per_step(),
        }
    }

    /// Samples in the epoch.
    pub fn samples(&self) -> u64 {
        self.samples
    }

    /// World size W.
    pub fn world_size(&self) -> NonZeroU32 {
        self.world_size
    }

    /// Per-rank batch size B.
    pub fn batch_size(&self) -> NonZeroU32 {
        self.batch_size
    }

    /// Tail policy.
    pub fn tail(&self) -> Tail {
        self.tail
    }

    fn per_step(&self) -> u64 {
        u64::from(self.world_size.get()) * u64::from(self.batch_size.get())
    }

    fn is_short_last_step(&self, step: Step) -> bool {
        self.tail == Tail::Partial && step.0 + 1 == self.steps && self.start + self.steps * self.per_step() > self.samples
    }

    /// Samples in the last step, in Partial mode, across all ranks.
    fn last_step_samples(&self) -> u64 {
        self.samples - self.start - (self.steps - 1) * self.per_step()
    }

    /// Offset of `rank`'s share inside the short last step and the share's length.
    fn short_step_share(&self, rank: Rank) -> (u64, u64) {
        let world_size = u64::from(self.world_size.get());
        let rank_index = u64::from(rank.0);
        let remainder = self.last_step_samples();
        let (base, extra) = (remainder / world_size, remainder % world_size);
        let offset = rank_index * base + rank_index.min(extra);
        (offset, base + u64::from(rank_index < extra))
    }

    /// Length of `rank`'s batch at `step` (0 when out of range).
    pub fn batch_len(&self, rank: Rank, step: Step) -> u32 {
        if step.0 >= self.steps || rank.0 >= self.world_size.get() {
            return 0;
        }
        if self.is_short_last_step(step) {
            // A share is at most ceil(remainder / W) <= B, so it fits in u32.
            return self.short_step_share(rank).1 as u32;
        }
        self.batch_size.get()
    }

    /// The position at (`rank`, `step`, `index`), or `None` when there is no such slot.
    pub fn position(&self, rank: Rank, step: Step, index: u32) -> Option<u64> {
        if index >= self.batch_len(rank, step) {
            return None;
        }
        let step_start = self.start + step.0 * self.per_step();
        if self.is_short_last_step(step) {
            let (offset, _) = self.short_step_share(rank);
            return Some(step_start + offset + u64::from(index));
        }
        Some(step_start + u64::from(rank.0) * u64::from(self.batch_size.get()) + u64::from(index))
    }

    /// The slot that holds `position`, or `None` when the layout does not use it.
    pub fn slot(&self, position: u64) -> Option<Slot> {
        if position < self.start || position >= self.end() {
            return None;
        }
        let relative = position - self.start;
        let step = Step(relative / self.per_step());
        let in_step = relative % self.per_step();
        if self.is_short_last_step(step) {
            let world_size = u64::from(self.world_size.get());
            let remainder = self.last_step_samples();
            let (base, extra) = (remainder / world_size, remainder % world_size);
            // The first `extra` ranks hold base+1 samples each.
            let boundary = extra * (base + 1);
            let (rank, index) = if in_step < boundary {
                (in_step / (base + 1), in_step % (base + 1))
            } else {
                (extra + (in_step - boundary) / base, (in_step - boundary) % base)
            };
            return Some(Slot { rank: Rank(rank as u32), step, index: index as u32 });
        }
        let batch_size = u64::from(self.batch_size.get());
        Some(Slot { rank: Rank((in_step / batch_size) as u32), step, index: (in_step % batch_size) as u32 })
    }

    /// Index into the epoch's sample order for `position`: the position itself, except that
    /// [`Tail::Pad`] wraps positions past the end to the start of the epoch.
    pub fn order_index(&self, position: u64) -> u64 {
        if position >= self.samples && self.samples > 0 { position % self.samples } else { position }
    }

    /// The position just after `step` is consumed (what a checkpoint taken then records).
    pub fn position_after(&self, step: Step) -> u64 {
        if step.0 + 1 >= self.steps {
            return self.end();
        }
        self.start + (step.0 + 1) * self.per_step()
    }
}

#[cfg(test)]
#[path = "layout_tests.rs"]
mod tests;
