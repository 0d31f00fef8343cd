//! How well a plan mixes labels: distinct labels per global batch of the plan, against a
//! global batch of the same size drawn uniformly at random from the whole dataset. SGD and
//! BatchNorm assume i.i.d. batches; a plan that reads a few class-sorted shards at a time gives
//! batches of a handful of classes, a silent accuracy loss that nothing else reports.
//!
//! Both sides are sampled (`batches` global batches each), so the cost is bounded whatever the
//! dataset's size: `stoker inspect` reads one label per sample looked at.

use std::collections::HashSet;
use std::num::NonZeroU32;
use std::sync::Arc;

use super::prng::SplitMix64;
use super::{EpochPlan, PlanSpec, SampleRef, ShardTable, Shuffle, Tail};
use crate::ids::{Epoch, Rank, Step};

/// Distinct labels per global batch, of a plan and of uniform random batches.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LabelMixing {
    /// Global batches looked at on each side.
    pub batches: u64,
    /// Samples per global batch.
    pub batch_samples: u64,
    /// Mean distinct labels in a global batch of the plan.
    pub plan_distinct: f64,
    /// Mean distinct labels in a uniform random batch of the same size.
    pub random_distinct: f64,
}

impl LabelMixing {
    /// The plan's distinct labels as a share of a random batch's (1.0: as good as random).
    pub fn ratio(&self) -> f64 {
        if self.random_distinct > 0.0 { self.plan_distinct / self.random_distinct } else { 1.0 }
    }
}

/// Measure `shuffle` with global batches of `batch_samples` over epoch 0 of `table`, looking
/// at `batches` batches spread evenly over the epoch and as many random ones. `label` gives a
/// sample's label (`None`: unlabelled, not counted). `None` if the epoch has no full batch.
pub fn label_mixing(
    table: Arc<ShardTable>,
    shuffle: Shuffle,
    seed: u64,
    batch_samples: NonZeroU32,
    batches: u64,
    mut label: impl FnMut(SampleRef) -> Option<i64>,
) -> Option<LabelMixing> {
    let spec = PlanSpec { seed, world_size: NonZeroU32::MIN, batch_size: batch_samples, shuffle, tail: Tail::Drop };
    let plan = EpochPlan::new(Arc::clone(&table), spec, Epoch(0));
    let steps = plan.steps();
    let batches = batches.min(steps);
    if batches == 0 {
        return None;
    }
    let mut distinct = HashSet::new();
    let mut plan_total = 0usize;
    for index in 0..batches {
        distinct.clear();
        let step = Step(index * steps / batches);
        distinct.extend(plan.batch(Rank(0), step).filter_map(|planned| label(planned.sample)));
        plan_total += distinct.len();
    }
    // Random batches are drawn without replacement, as a plan's batch is.
    let mut random = SplitMix64::new(seed ^ 0x6d69_7869_6e67);
    let mut random_total = 0usize;
    let mut drawn = HashSet::new();
    for _ in 0..batches {
        distinct.clear();
        drawn.clear();
        while (drawn.len() as u64) < u64::from(batch_samples.get()) {
            let global = random.next_u64() % table.samples();
            if drawn.insert(global)
                && let Some(value) = label(table.locate(global))
            {
                distinct.insert(value);
            }
        }
        random_total += distinct.len();
    }
    Some(LabelMixing {
        batches,
        batch_samples: u64::from(batch_samples.get()),
        plan_distinct: plan_total as f64 / batches as f64,
        random_distinct: random_total as f64 / batches as f64,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 100 classes of 60 samples each, class-sorted, in shards of 100 samples (a shard holds
    /// two classes, as `stoker pack --no-shuffle` writes them).
    fn class_sorted() -> (Arc<ShardTable>, impl FnMut(SampleRef) -> Option<i64>) {
        let table = Arc::new(ShardTable::new(std::iter::repeat_n(100u64, 60)).unwrap_or_else(|error| panic!("{error}")));
        let label = |sample: SampleRef| Some((u64::from(sample.shard.0) * 100 + sample.index) as i64 / 60);
        (table, label)
    }

    fn mixing(shuffle: Shuffle) -> LabelMixing {
        let (table, label) = class_sorted();
        label_mixing(table, shuffle, 1, NonZeroU32::new(64).unwrap_or(NonZeroU32::MIN), 50, label).unwrap_or_else(|| panic!("batches"))
    }

    #[test]
    fn a_window_over_class_sorted_shards_mixes_few_classes_and_a_block_shuffle_as_many_as_random() {
        let window = mixing(Shuffle::default());
        let block =
            mixing(Shuffle::Block { samples: NonZeroU32::new(16).unwrap_or(NonZeroU32::MIN), blocks: NonZeroU32::MIN.saturating_add(255) });
        let full = mixing(Shuffle::Full);
        assert!(window.random_distinct > 40.0, "{window:?}");
        assert!(window.ratio() < 0.5, "8 shards hold ~14 classes: {window:?}");
        assert!(block.ratio() > 0.9, "{block:?}");
        assert!(full.ratio() > 0.9, "{full:?}");
        assert!((mixing(Shuffle::None).plan_distinct - 2.0).abs() < 0.5, "in order, a batch spans one or two classes");
    }

    /// Found by review: the first block default (64 samples, 256 blocks) mixed 67% of a random
    /// batch's classes on ImageNet sorted by class: a batch of 256 drew from ~160 blocks, each a
    /// single class. The default must mix at ImageNet's scale, for global batches of 256 and
    /// 2,048, where `window` does not.
    #[test]
    fn the_default_block_shuffle_mixes_class_sorted_imagenet() {
        const PER_CLASS: u64 = 1281;
        // ~256 MiB shards of ~110 KB JPEGs: 2,300 samples, about two classes each.
        let table = Arc::new(ShardTable::new(std::iter::repeat_n(2300u64, 557)).unwrap_or_else(|error| panic!("{error}")));
        let label = |sample: SampleRef| Some((u64::from(sample.shard.0) * 2300 + sample.index) as i64 / PER_CLASS as i64);
        for (global_batch, floor) in [(256u32, 0.95), (2048, 0.9)] {
            let batch = NonZeroU32::new(global_batch).unwrap_or(NonZeroU32::MIN);
            let measure = |shuffle| label_mixing(Arc::clone(&table), shuffle, 5, batch, 40, label).unwrap_or_else(|| panic!("batches"));
            let block = measure(Shuffle::BLOCK_DEFAULT);
            assert!(block.ratio() >= floor, "global batch {global_batch}: {block:?}");
            let window = measure(Shuffle::default());
            assert!(window.ratio() < 0.5, "global batch {global_batch}: {window:?}");
        }
    }

    #[test]
    fn unlabelled_samples_are_not_counted_and_a_dataset_without_a_full_batch_has_no_figure() {
        let (table, _) = class_sorted();
        let none = label_mixing(Arc::clone(&table), Shuffle::Full, 1, NonZeroU32::MIN, 10, |_| None);
        assert_eq!(none.map(|mixing| (mixing.plan_distinct, mixing.ratio())), Some((0.0, 1.0)));
        let small = Arc::new(ShardTable::new([3u64]).unwrap_or_else(|error| panic!("{error}")));
        assert!(label_mixing(small, Shuffle::Full, 1, NonZeroU32::new(4).unwrap_or(NonZeroU32::MIN), 10, |_| Some(0)).is_none());
    }
}
