//! Sample counts of a dataset's shards in manifest order: what the planner plans over.

use xxhash_rust::xxh3::Xxh3;

use crate::error::PlanError;
use crate::ids::ShardId;

/// One sample of the dataset: the `index`-th sample of shard `shard`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SampleRef {
    /// Shard, by manifest index.
    pub shard: ShardId,
    /// Sample index inside the shard (index order, i.e. tar order).
    pub index: u64,
}

/// Cumulative sample counts per shard. Memory: one `u64` per shard — the size of the manifest
/// itself, never of the sample count.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardTable {
    /// `starts[i]` = samples in shards `0..i`; `starts.len() == shards + 1`.
    starts: Vec<u64>,
    fingerprint: u64,
}

impl ShardTable {
    /// A table from the sample count of each shard, in manifest order.
    pub fn new<I>(counts: I) -> Result<Self, PlanError>
    where
        I: IntoIterator<Item = u64>,
    {
        let counts = counts.into_iter();
        let mut starts = Vec::with_capacity(counts.size_hint().0 + 1);
        let mut hasher = Xxh3::new();
        let mut total = 0u64;
        starts.push(0);
        for count in counts {
            hasher.update(&count.to_le_bytes());
            total = total.checked_add(count).ok_or(PlanError::TooManySamples)?;
            starts.push(total);
        }
        let shards = starts.len() - 1;
        if u32::try_from(shards).is_err() {
            return Err(PlanError::TooManyShards { shards });
        }
        Ok(Self { starts, fingerprint: hasher.digest() })
    }

    /// Number of shards.
    pub fn shards(&self) -> u32 {
        // Checked to fit in `new`.
        (self.starts.len() - 1) as u32
    }

    /// Number of samples in all shards.
    pub fn samples(&self) -> u64 {
        self.starts.last().copied().unwrap_or(0)
    }

    /// Samples in `shard` (0 for a shard past the end).
    pub fn count(&self, shard: ShardId) -> u64 {
        let index = shard.0 as usize;
        match (self.starts.get(index), self.starts.get(index + 1)) {
            (Some(start), Some(end)) => end - start,
            _ => 0,
        }
    }

    /// The sample at `global_index` of the dataset in manifest order. `global_index` must be
    /// `< samples()`.
    pub fn locate(&self, global_index: u64) -> SampleRef {
        debug_assert!(global_index < self.samples());
        // The last start <= global_index; empty shards share a start and are skipped over.
        let shard = self.starts.partition_point(|&start| start <= global_index) - 1;
        SampleRef { shard: ShardId(shard as u32), index: global_index - self.starts[shard] }
    }

    /// A hash of the shard counts: two tables with the same fingerprint plan identically.
    pub fn fingerprint(&self) -> u64 {
        self.fingerprint
    }

    /// Heap bytes held.
    pub fn heap_bytes(&self) -> usize {
        self.starts.capacity() * size_of::<u64>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locate_skips_empty_shards() {
        let table = ShardTable::new([2, 0, 3]).unwrap_or_else(|error| panic!("{error}"));
        let located: Vec<SampleRef> = (0..5).map(|index| table.locate(index)).collect();
        assert_eq!(located[1], SampleRef { shard: ShardId(0), index: 1 });
        assert_eq!(located[2], SampleRef { shard: ShardId(2), index: 0 });
        assert_eq!(located[4], SampleRef { shard: ShardId(2), index: 2 });
        assert_eq!(table.count(ShardId(1)), 0);
        assert_eq!(table.count(ShardId(9)), 0);
    }

    #[test]
    fn fingerprint_depends_on_counts_and_their_order() {
        let fingerprint = |counts: &[u64]| ShardTable::new(counts.iter().copied()).map(|table| table.fingerprint()).ok();
        assert_eq!(fingerprint(&[1, 2]), fingerprint(&[1, 2]));
        assert_ne!(fingerprint(&[1, 2]), fingerprint(&[2, 1]));
    }

    #[test]
    fn sample_overflow_is_an_error() {
        assert!(matches!(ShardTable::new([u64::MAX, 1]), Err(PlanError::TooManySamples)));
    }
}
