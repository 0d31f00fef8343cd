//! The sample order of one epoch (DESIGN §4.1–4.2): which sample the `i`-th place of the
//! epoch holds. Evaluated one index at a time; nothing proportional to the sample count is
//! ever built.

use std::num::NonZeroU32;

use serde::{Deserialize, Serialize};

use super::permutation::Permutation;
use super::prng::{SeedDomain, derive_seed};
use super::shard_table::{SampleRef, ShardTable};
use crate::error::PlanError;
use crate::ids::{Epoch, ShardId};

/// How an epoch is shuffled.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Shuffle {
    /// Manifest order: shards in order, samples in tar order.
    None,
    /// Shards permuted per epoch, then cut into windows of `shards` shards whose samples are
    /// permuted. The working set of the whole cluster is about one window.
    Window {
        /// Shards per window (k).
        shards: NonZeroU32,
    },
    /// One permutation of every sample. Each sample may come from any shard: best mixing,
    /// no locality.
    Full,
}

impl Default for Shuffle {
    fn default() -> Self {
        Self::Window { shards: NonZeroU32::new(8).unwrap_or(NonZeroU32::MIN) }
    }
}

impl std::str::FromStr for Shuffle {
    type Err = PlanError;

    /// `none`, `full`, `window` (8 shards) or `window:K`.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "none" => Ok(Self::None),
            "full" => Ok(Self::Full),
            "window" => Ok(Self::default()),
            other => other
                .strip_prefix("window:")
                .and_then(|shards| shards.parse().ok())
                .and_then(NonZeroU32::new)
                .map(|shards| Self::Window { shards })
                .ok_or_else(|| PlanError::UnknownMode {
                    what: "shuffle",
                    given: other.to_owned(),
                    expected: "none, full, window or window:K",
                }),
        }
    }
}

/// The order of one epoch.
#[derive(Clone, Debug)]
pub(crate) enum EpochOrder {
    Sequential,
    Windowed(WindowedOrder),
    Full(Permutation),
}

/// Up to this many shards, a windowed order keeps its shard sequence (4 bytes a shard). Below
/// 256 shards the permutation's cycle walk takes ~256/shards encryptions per lookup (64 for
/// 4 shards, ~1.6 µs), and every sample looks up several.
const SHARD_SEQUENCE_MAX: u32 = 1024;

#[derive(Clone, Debug)]
pub(crate) struct WindowedOrder {
    shard_order: Permutation,
    /// `shard_order` evaluated for every slot, when there are at most [`SHARD_SEQUENCE_MAX`]
    /// shards; empty otherwise (the plan's memory then stays one integer per window).
    shard_sequence: Vec<ShardId>,
    window_shards: u32,
    /// `window_starts[w]` = samples in windows `0..w`; one entry per window plus one.
    window_starts: Vec<u64>,
    seed: u64,
    epoch: Epoch,
}

impl EpochOrder {
    pub(crate) fn new(table: &ShardTable, shuffle: Shuffle, seed: u64, epoch: Epoch) -> Self {
        match shuffle {
            Shuffle::None => Self::Sequential,
            Shuffle::Full => Self::Full(Permutation::new(table.samples(), derive_seed(SeedDomain::FullSamples, &[seed, epoch.0]))),
            Shuffle::Window { shards } => Self::Windowed(WindowedOrder::new(table, shards.get(), seed, epoch)),
        }
    }

    /// The sample at place `order_index` of the epoch (`< table.samples()`).
    pub(crate) fn sample_at(&self, table: &ShardTable, order_index: u64) -> SampleRef {
        match self {
            Self::Sequential => table.locate(order_index),
            Self::Full(permutation) => table.locate(permutation.apply(order_index)),
            Self::Windowed(windowed) => windowed.sample_at(table, order_index),
        }
    }

    pub(crate) fn window_starts(&self) -> Option<&[u64]> {
        match self {
            Self::Windowed(windowed) => Some(&windowed.window_starts),
            Self::Sequential | Self::Full(_) => None,
        }
    }

    pub(crate) fn heap_bytes(&self) -> usize {
        match self {
            Self::Sequential | Self::Full(_) => 0,
            Self::Windowed(windowed) => {
                windowed.window_starts.capacity() * size_of::<u64>() + windowed.shard_sequence.capacity() * size_of::<ShardId>()
            }
        }
    }
}

impl WindowedOrder {
    fn new(table: &ShardTable, window_shards: u32, seed: u64, epoch: Epoch) -> Self {
        let shards = table.shards();
        let shard_order = Permutation::new(u64::from(shards), derive_seed(SeedDomain::ShardOrder, &[seed, epoch.0]));
        let windows = shards.div_ceil(window_shards);
        let mut window_starts = Vec::with_capacity(windows as usize + 1);
        let keep_sequence = shards <= SHARD_SEQUENCE_MAX;
        let mut shard_sequence = Vec::with_capacity(if keep_sequence { shards as usize } else { 0 });
        let mut total = 0u64;
        window_starts.push(0);
        for window in 0..windows {
            let first = window * window_shards;
            let last = (first + window_shards).min(shards);
            for slot in first..last {
                let shard = ShardId(shard_order.apply(u64::from(slot)) as u32);
                if keep_sequence {
                    shard_sequence.push(shard);
                }
                total += table.count(shard);
            }
            window_starts.push(total);
        }
        Self { shard_order, shard_sequence, window_shards, window_starts, seed, epoch }
    }

    /// The shard at `slot` of the epoch's shard order.
    fn shard_at(&self, slot: u32) -> ShardId {
        match self.shard_sequence.get(slot as usize) {
            Some(&shard) => shard,
            None => ShardId(self.shard_order.apply(u64::from(slot)) as u32),
        }
    }

    fn sample_at(&self, table: &ShardTable, order_index: u64) -> SampleRef {
        let window = self.window_starts.partition_point(|&start| start <= order_index) - 1;
        let window_start = self.window_starts[window];
        let window_len = self.window_starts[window + 1] - window_start;
        let key = derive_seed(SeedDomain::WindowSamples, &[self.seed, self.epoch.0, window as u64]);
        let mut remaining = Permutation::new(window_len, key).apply(order_index - window_start);
        let first_slot = window as u32 * self.window_shards;
        let last_slot = (first_slot + self.window_shards).min(table.shards());
        for slot in first_slot..last_slot {
            let shard = self.shard_at(slot);
            let count = table.count(shard);
            if remaining < count {
                return SampleRef { shard, index: remaining };
            }
            remaining -= count;
        }
        unreachable!("window {window} holds {window_len} samples but its shards hold fewer")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kept shard sequence is only a cache: without it, every position gives the same sample.
    #[test]
    fn the_kept_shard_sequence_changes_no_sample() {
        let counts = (0..40u64).map(|shard| 1 + shard * 7 % 13);
        let table = ShardTable::new(counts).unwrap_or_else(|error| panic!("{error}"));
        for (window, seed) in [(1, 3), (3, 4), (8, 5), (64, 6)] {
            let cached = WindowedOrder::new(&table, window, seed, Epoch(2));
            assert_eq!(cached.shard_sequence.len(), 40);
            let computed = WindowedOrder { shard_sequence: Vec::new(), ..cached.clone() };
            for index in 0..table.samples() {
                assert_eq!(cached.sample_at(&table, index), computed.sample_at(&table, index), "window {window}, index {index}");
            }
        }
    }
}
