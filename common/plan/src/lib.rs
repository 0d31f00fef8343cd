#![doc = include_str!("../README.md")]
//!
//! The epoch planner (DESIGN §4): pure, deterministic functions from (shard counts, seed,
//! epoch, world size, batch size, shuffle, tail) to "which sample, with which augmentation seed,
//! goes into slot i of rank r's batch at step s".
//!
//! * [`prng`] and [`permutation`] are pinned algorithms and part of the contract (golden tests).
//! * [`order`] gives the epoch's sample order (shuffled by shard, by window, or fully).
//! * [`layout`] cuts the order into steps and ranks with a tail policy.
//! * [`EpochPlan`] combines both, resumes from a [`Checkpoint`], and derives per-sample
//!   augmentation seeds from (seed, epoch, position).
//! * [`tokens`] plans token corpora: documents packed into rows of `seq_len` tokens, laid out
//!   by the same [`Layout`], checkpoints counted in tokens.
//!
//! Memory: a plan holds one integer per window (`shards / k + 1`) beside the shard table (one
//! integer per shard, i.e. the manifest), and for a windowed shuffle of at most 1,024 shards the
//! shard order (4 bytes a shard, to spare the permutation's long cycle walk on small domains);
//! locating a sample allocates nothing. No structure proportional to the number of samples
//! exists anywhere.

/// Errors of planning and of transform specs.
pub mod error;
/// The fields of a sample a job reads (issue 32): spec and validation.
pub mod fields;
/// Identifier newtypes (`ShardId`, `Epoch`, `Step`, `Rank`, `JobId`, `WorkerId`, `LeaseId`).
pub mod ids;
/// Transform specs (serde) and the crop geometry they imply.
pub mod transform;

pub mod checkpoint;
pub mod layout;
pub mod mixing;
pub mod order;
pub mod permutation;
pub mod prng;
pub mod shard_table;
pub mod tokens;

use std::num::NonZeroU32;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

pub use self::checkpoint::{CHECKPOINT_VERSION, Checkpoint};
pub use self::layout::{Layout, Slot, Tail};
use self::order::EpochOrder;
pub use self::order::Shuffle;
use self::prng::{SeedDomain, derive_seed, mix64};
pub use self::shard_table::{SampleRef, ShardTable};
use crate::error::PlanError;
use crate::ids::{Epoch, Position, Rank, Step};

/// Everything that decides an epoch's plan besides the dataset and the epoch number.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlanSpec {
    /// Base seed of the job.
    pub seed: u64,
    /// Number of data-parallel ranks W.
    pub world_size: NonZeroU32,
    /// Per-rank batch size B.
    pub batch_size: NonZeroU32,
    /// Shuffle mode.
    #[serde(default)]
    pub shuffle: Shuffle,
    /// Tail policy.
    #[serde(default)]
    pub tail: Tail,
}

/// One planned sample: where it is in the epoch, which sample it is, and the seed of its
/// random augmentation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PlannedSample {
    /// Global position in the epoch.
    pub position: u64,
    /// The dataset sample.
    pub sample: SampleRef,
    /// Seed for this sample's augmentation: derived from (seed, epoch, position).
    pub augment_seed: u64,
}

/// The plan of one epoch from a start position (0, or a checkpoint's) to its end.
#[derive(Clone, Debug)]
pub struct EpochPlan {
    table: Arc<ShardTable>,
    spec: PlanSpec,
    epoch: Epoch,
    layout: Layout,
    order: EpochOrder,
}

impl EpochPlan {
    /// The plan of `epoch` from its beginning.
    pub fn new(table: Arc<ShardTable>, spec: PlanSpec, epoch: Epoch) -> Self {
        Self::starting_at(table, spec, epoch, Position(0))
    }

    /// The plan of the rest of a checkpoint's epoch, cut for `spec`'s world size, batch size
    /// and tail (which may differ from those in force when the checkpoint was taken).
    pub fn resume(table: Arc<ShardTable>, spec: PlanSpec, checkpoint: &Checkpoint) -> Result<Self, PlanError> {
        if checkpoint.version != CHECKPOINT_VERSION {
            return Err(PlanError::UnsupportedCheckpointVersion { found: checkpoint.version, supported: CHECKPOINT_VERSION });
        }
        let expected = order_fingerprint(&table, &spec);
        if checkpoint.order_fingerprint != expected {
            return Err(PlanError::CheckpointMismatch { checkpoint: checkpoint.order_fingerprint, plan: expected });
        }
        Ok(Self::starting_at(table, spec, checkpoint.epoch, checkpoint.position))
    }

    /// The plan of `epoch` from position `start` (what [`EpochPlan::resume`] builds once the
    /// checkpoint is checked; coordinators and workers that already agreed on `start` use it).
    pub fn starting_at(table: Arc<ShardTable>, spec: PlanSpec, epoch: Epoch, start: Position) -> Self {
        let layout = Layout::new(table.samples(), start.0, spec.world_size, spec.batch_size, spec.tail);
        let order = EpochOrder::new(&table, spec.shuffle, spec.seed, epoch);
        Self { table, spec, epoch, layout, order }
    }

    /// The epoch planned.
    pub fn epoch(&self) -> Epoch {
        self.epoch
    }

    /// The first position of this plan: 0, or a resumed checkpoint's.
    pub fn start(&self) -> Position {
        Position(self.layout.start())
    }

    /// The spec planned with.
    pub fn spec(&self) -> &PlanSpec {
        &self.spec
    }

    /// Steps of this plan (from its start), equal for every rank.
    pub fn steps(&self) -> u64 {
        self.layout.steps()
    }

    /// The position/slot arithmetic of this plan.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// The shard table planned over.
    pub fn table(&self) -> &ShardTable {
        &self.table
    }

    /// What sits at `position`. `position` must be one the layout uses.
    pub fn sample_at(&self, position: u64) -> PlannedSample {
        let order_index = self.layout.order_index(position);
        PlannedSample {
            position,
            sample: self.order.sample_at(&self.table, order_index),
            augment_seed: augment_seed(self.spec.seed, self.epoch, position),
        }
    }

    /// The samples of `rank`'s batch at `step`, in slot order (empty when out of range).
    pub fn batch(&self, rank: Rank, step: Step) -> impl ExactSizeIterator<Item = PlannedSample> + '_ {
        let len = self.layout.batch_len(rank, step);
        let first = self.layout.position(rank, step, 0).unwrap_or(0);
        // A batch's positions are contiguous (DESIGN §4.4 and the Partial split).
        (0..len).map(move |index| self.sample_at(first + u64::from(index)))
    }

    /// The checkpoint that records every step up to and including `step` as consumed. After
    /// the epoch's last step it is the next epoch's start: a state saved at the end of epoch e
    /// resumes at epoch e+1, step 0 (as PyTorch's `StatefulDataLoader` and Mosaic Streaming
    /// do), never at the finished epoch again, nor at a position past the data (a `pad` tail's
    /// last step wraps beyond it).
    pub fn checkpoint_after(&self, step: Step) -> Checkpoint {
        if step.0 + 1 >= self.steps() {
            return Checkpoint {
                version: CHECKPOINT_VERSION,
                epoch: Epoch(self.epoch.0 + 1),
                position: Position(0),
                order_fingerprint: order_fingerprint(&self.table, &self.spec),
            };
        }
        Checkpoint {
            version: CHECKPOINT_VERSION,
            epoch: self.epoch,
            position: Position(self.layout.position_after(step)),
            order_fingerprint: order_fingerprint(&self.table, &self.spec),
        }
    }

    /// The checkpoint of this plan's start: nothing of it consumed yet.
    pub fn checkpoint_at_start(&self) -> Checkpoint {
        Checkpoint {
            version: CHECKPOINT_VERSION,
            epoch: self.epoch,
            position: Position(self.layout.start()),
            order_fingerprint: order_fingerprint(&self.table, &self.spec),
        }
    }

    /// A fingerprint of what `rank`'s batch at `step` must hold: the dataset's version, the
    /// run, and every sample's place in the dataset with its augmentation seed. Workers send it
    /// in the batch header and trainers compare it with their own plan's, so a batch made from
    /// another manifest or another plan (a dataset changed under its job, a job id reused
    /// after the coordinator lost its state) is refused instead of trained on. Cheap: no
    /// sample is read, only the plan evaluated (~0.1 µs a sample).
    pub fn batch_digest(&self, dataset_version: u64, rank: Rank, step: Step) -> u64 {
        let mut digest = mix64(dataset_version ^ mix64(self.epoch.0 ^ mix64(self.layout.start() ^ mix64(u64::from(rank.0)))));
        digest = mix64(digest ^ step.0);
        for planned in self.batch(rank, step) {
            let place = (u64::from(planned.sample.shard.0) << 40) ^ planned.sample.index;
            digest = mix64(digest ^ mix64(place ^ mix64(planned.augment_seed)));
        }
        digest
    }

    /// With window shuffle, where each window starts in the epoch's sample order (one entry
    /// per window plus the total); `None` for the other shuffle modes.
    pub fn window_starts(&self) -> Option<&[u64]> {
        self.order.window_starts()
    }

    /// Heap bytes this plan holds besides the shared shard table.
    pub fn heap_bytes(&self) -> usize {
        self.order.heap_bytes()
    }
}

/// Seed of the random augmentation of the sample at `position` of `epoch` (DESIGN §4.5).
pub fn augment_seed(seed: u64, epoch: Epoch, position: u64) -> u64 {
    derive_seed(SeedDomain::Augment, &[seed, epoch.0, position])
}

/// Identifies the sample order: shard counts, seed and shuffle mode, not W, B or tail.
fn order_fingerprint(table: &ShardTable, spec: &PlanSpec) -> u64 {
    let shuffle_code = match spec.shuffle {
        Shuffle::None => 0,
        Shuffle::Full => 1,
        Shuffle::Window { shards } => 2 + u64::from(shards.get()),
        Shuffle::Block { samples, blocks } => mix64(u64::from(samples.get()) << 32 | u64::from(blocks.get())) | 1 << 63,
    };
    mix64(table.fingerprint() ^ mix64(spec.seed ^ mix64(shuffle_code)))
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;
