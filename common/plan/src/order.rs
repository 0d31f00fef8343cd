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
    /// The dataset (in manifest order, rotated by a per-epoch offset) cut into blocks of
    /// `samples` consecutive samples; the blocks permuted per epoch and cut into windows of
    /// `blocks` blocks whose samples are permuted. Mixes about as well as `full` whatever order
    /// the shards were written in, as long as a window holds many more blocks than a global
    /// batch has samples (a block holds one or two classes of class-sorted data; a batch then
    /// draws nearly every sample from another block, and the blocks come from anywhere in the
    /// dataset). The working set of the cluster is one window: `samples * blocks` samples in
    /// runs of `samples` consecutive ones, from up to `blocks` shards; reads within it are in
    /// random order. The `N mod samples` samples left after the last whole block (a different
    /// run each epoch, through the rotation) end the epoch, permuted among themselves.
    Block {
        /// Consecutive samples per block.
        samples: NonZeroU32,
        /// Blocks per window.
        blocks: NonZeroU32,
    },
}

impl Shuffle {
    /// `block` with its defaults: blocks of 8 samples, windows of 4,096 blocks (32,768
    /// samples): on ImageNet sorted by class, global batches of 256 hold 99% of the classes of
    /// a random batch, of 2,048 93% (a simulation; `stoker inspect` measures a dataset).
    pub const BLOCK_DEFAULT: Self =
        Self::Block { samples: NonZeroU32::new(8).expect("8 is not zero"), blocks: NonZeroU32::new(4096).expect("4096 is not zero") };
}

impl Default for Shuffle {
    fn default() -> Self {
        Self::Window { shards: NonZeroU32::new(8).unwrap_or(NonZeroU32::MIN) }
    }
}

impl std::str::FromStr for Shuffle {
    type Err = PlanError;

    /// `none`, `full`, `window` (8 shards), `window:K`, `block` (8 samples, 4,096 blocks) or
    /// `block:S:N` (blocks of S samples, windows of N blocks).
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let unknown = || PlanError::UnknownMode {
            what: "shuffle",
            given: text.to_owned(),
            expected: "none, full, window, window:K (K shards a window), block or block:S:N (blocks of S samples, N blocks a window)",
        };
        match text {
            "none" => Ok(Self::None),
            "full" => Ok(Self::Full),
            "window" => Ok(Self::default()),
            "block" => Ok(Self::BLOCK_DEFAULT),
            other if other.starts_with("block:") => {
                let mut parts = other["block:".len()..].split(':').map(|part| part.parse::<u32>().ok().and_then(NonZeroU32::new));
                match (parts.next(), parts.next(), parts.next()) {
                    (Some(Some(samples)), Some(Some(blocks)), None) => Ok(Self::Block { samples, blocks }),
                    _ => Err(unknown()),
                }
            }
            other => other
                .strip_prefix("window:")
                .and_then(|shards| shards.parse().ok())
                .and_then(NonZeroU32::new)
                .map(|shards| Self::Window { shards })
                .ok_or_else(unknown),
        }
    }
}

impl std::fmt::Display for Shuffle {
    /// The form [`std::str::FromStr`] reads.
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::None => formatter.write_str("none"),
            Self::Full => formatter.write_str("full"),
            Self::Window { shards } => write!(formatter, "window:{shards}"),
            Self::Block { samples, blocks } => write!(formatter, "block:{samples}:{blocks}"),
        }
    }
}

/// The order of one epoch.
#[derive(Clone, Debug)]
pub(crate) enum EpochOrder {
    Sequential,
    Windowed(WindowedOrder),
    Full(Permutation),
    Blocked(BlockedOrder),
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
            Shuffle::Block { samples, blocks } => {
                Self::Blocked(BlockedOrder::new(table.samples(), samples.get(), blocks.get(), seed, epoch))
            }
        }
    }

    /// The sample at place `order_index` of the epoch (`< table.samples()`).
    pub(crate) fn sample_at(&self, table: &ShardTable, order_index: u64) -> SampleRef {
        match self {
            Self::Sequential => table.locate(order_index),
            Self::Full(permutation) => table.locate(permutation.apply(order_index)),
            Self::Windowed(windowed) => windowed.sample_at(table, order_index),
            Self::Blocked(blocked) => table.locate(blocked.global_index(order_index)),
        }
    }

    pub(crate) fn window_starts(&self) -> Option<&[u64]> {
        match self {
            Self::Windowed(windowed) => Some(&windowed.window_starts),
            Self::Sequential | Self::Full(_) | Self::Blocked(_) => None,
        }
    }

    pub(crate) fn heap_bytes(&self) -> usize {
        match self {
            Self::Sequential | Self::Full(_) | Self::Blocked(_) => 0,
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

/// The order of a block shuffle (see [`Shuffle::Block`]): O(1) memory, two permutations and a
/// division per lookup.
#[derive(Clone, Debug)]
pub(crate) struct BlockedOrder {
    /// Order of the whole blocks.
    block_order: Permutation,
    block_samples: u64,
    window_blocks: u64,
    /// Samples in whole blocks (`samples - tail`).
    blocked_samples: u64,
    /// All samples of the dataset.
    samples: u64,
    /// Where the block grid starts in manifest order this epoch.
    rotation: u64,
    /// The last samples, fewer than a block, permuted at the end of the epoch.
    tail: Permutation,
    seed: u64,
    epoch: Epoch,
}

impl BlockedOrder {
    fn new(samples: u64, block_samples: u32, window_blocks: u32, seed: u64, epoch: Epoch) -> Self {
        let block_samples = u64::from(block_samples);
        let blocks = samples / block_samples;
        let blocked_samples = blocks * block_samples;
        let key = derive_seed(SeedDomain::BlockOrder, &[seed, epoch.0]);
        let rotation = if samples == 0 { 0 } else { derive_seed(SeedDomain::BlockRotation, &[seed, epoch.0]) % samples };
        Self {
            block_order: Permutation::new(blocks, key),
            block_samples,
            window_blocks: u64::from(window_blocks),
            blocked_samples,
            samples,
            rotation,
            tail: Permutation::new(samples - blocked_samples, derive_seed(SeedDomain::BlockWindowSamples, &[seed, epoch.0, u64::MAX])),
            seed,
            epoch,
        }
    }

    /// The manifest-order index of the sample at `order_index` of the epoch.
    fn global_index(&self, order_index: u64) -> u64 {
        let rotated = self.rotated_index(order_index);
        // `rotated + rotation` < 2 * samples: no overflow below 2^63 samples.
        let shifted = rotated + self.rotation;
        if shifted >= self.samples { shifted - self.samples } else { shifted }
    }

    /// The index, in the rotated sample space, of the sample at `order_index`.
    fn rotated_index(&self, order_index: u64) -> u64 {
        if order_index >= self.blocked_samples {
            return self.blocked_samples + self.tail.apply(order_index - self.blocked_samples);
        }
        let window_len = self.window_blocks * self.block_samples;
        let window = order_index / window_len;
        let window_start = window * window_len;
        let len = window_len.min(self.blocked_samples - window_start);
        let key = derive_seed(SeedDomain::BlockWindowSamples, &[self.seed, self.epoch.0, window]);
        let inside = Permutation::new(len, key).apply(order_index - window_start);
        let slot = window * self.window_blocks + inside / self.block_samples;
        self.block_order.apply(slot) * self.block_samples + inside % self.block_samples
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

    /// Every sample exactly once, a window's samples come from its blocks only, and reads stay
    /// inside blocks.
    #[test]
    fn a_block_shuffle_is_a_permutation_whose_windows_hold_whole_blocks() {
        for (samples, block, blocks) in [(0u64, 4u32, 2u32), (3, 4, 2), (100, 1, 7), (1000, 16, 8), (1003, 16, 8), (999, 1000, 3)] {
            let order = BlockedOrder::new(samples, block, blocks, 11, Epoch(3));
            let mut seen = vec![false; samples as usize];
            for index in 0..samples {
                let global = order.global_index(index) as usize;
                assert!(!std::mem::replace(&mut seen[global], true), "{global} twice ({samples}, {block}, {blocks})");
            }
            let window_len = u64::from(block) * u64::from(blocks);
            for window_start in (0..order.blocked_samples).step_by(window_len as usize) {
                let end = (window_start + window_len).min(order.blocked_samples);
                let mut touched: Vec<u64> = (window_start..end).map(|index| order.rotated_index(index) / u64::from(block)).collect();
                touched.sort_unstable();
                touched.dedup();
                assert_eq!(touched.len() as u64, (end - window_start) / u64::from(block), "whole blocks, each fully");
            }
        }
    }

    /// Found by review: the samples after the last whole block always ended the epoch, so
    /// `tail=drop` dropped the same ones every epoch. The block grid is rotated per epoch.
    #[test]
    fn the_samples_left_after_the_last_block_differ_between_epochs() {
        let tails: Vec<Vec<u64>> = (0..6)
            .map(|epoch| {
                let order = BlockedOrder::new(1000, 64, 4, 3, Epoch(epoch));
                let mut tail: Vec<u64> = (order.blocked_samples..1000).map(|index| order.global_index(index)).collect();
                tail.sort_unstable();
                tail
            })
            .collect();
        assert!(tails.iter().all(|tail| tail.len() == 1000 % 64));
        let distinct: std::collections::BTreeSet<&Vec<u64>> = tails.iter().collect();
        assert_eq!(distinct.len(), tails.len(), "{tails:?}");
    }

    #[test]
    fn block_modes_read_and_print_alike() {
        for text in ["block", "block:8:32", "window:3", "none", "full"] {
            let shuffle: Shuffle = text.parse().expect("valid");
            assert_eq!(shuffle.to_string().parse::<Shuffle>().expect("round trip"), shuffle);
        }
        assert_eq!("block".parse::<Shuffle>().expect("valid"), Shuffle::BLOCK_DEFAULT);
        for bad in ["block:", "block:8", "block:0:4", "block:8:4:2", "blocks"] {
            assert!(bad.parse::<Shuffle>().is_err(), "{bad}");
        }
    }
}
