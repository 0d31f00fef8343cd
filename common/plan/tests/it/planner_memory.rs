//! DESIGN §4: "a billion-sample dataset must plan in memory proportional to one window".

use std::num::NonZeroU32;
use std::sync::Arc;

use stoker_plan::ids::{Epoch, Rank, Step};
use stoker_plan::{EpochPlan, PlanSpec, ShardTable, Shuffle, Tail};

use crate::allocation_counter::allocated_by;

const SHARDS: u64 = 1_000_000;
const SAMPLES_PER_SHARD: u64 = 1_000;

fn spec(shuffle: Shuffle) -> PlanSpec {
    PlanSpec {
        seed: 11,
        world_size: NonZeroU32::new(64).unwrap_or(NonZeroU32::MIN),
        batch_size: NonZeroU32::new(256).unwrap_or(NonZeroU32::MIN),
        shuffle,
        tail: Tail::Drop,
    }
}

/// A manifest of 1,000,000 shards × 1,000 samples (10⁹ samples): building a plan allocates one
/// integer per window (shards / k + 1), never anything per sample, and locating samples anywhere
/// in the epoch allocates nothing at all.
#[test]
fn locating_positions_in_a_billion_sample_epoch_allocates_nothing_per_sample() {
    let table = Arc::new(ShardTable::new((0..SHARDS).map(|_| SAMPLES_PER_SHARD)).unwrap_or_else(|error| panic!("{error}")));
    assert_eq!(table.samples(), SHARDS * SAMPLES_PER_SHARD);
    let window = 8u32;
    let cases = [
        ("window", Shuffle::Window { shards: NonZeroU32::new(window).unwrap_or(NonZeroU32::MIN) }, (SHARDS / u64::from(window) + 1) * 8),
        ("full", Shuffle::Full, 0),
        ("none", Shuffle::None, 0),
    ];
    for (name, shuffle, structure_bytes) in cases {
        let (plan_bytes, plan) = allocated_by(|| EpochPlan::new(table.clone(), spec(shuffle), Epoch(4)));
        assert_eq!(plan.heap_bytes() as u64, structure_bytes, "{name}: plan structure");
        // Construction allocates that structure and nothing proportional to the 10⁹ samples.
        assert!(plan_bytes <= structure_bytes + 4096, "{name}: building the plan allocated {plan_bytes} bytes");
        let window_samples = u64::from(window) * SAMPLES_PER_SHARD;
        assert!(plan_bytes < window_samples * 8 + (SHARDS / u64::from(window) + 1) * 8 + 4096);

        let steps = plan.steps();
        let (lookup_bytes, checksum) = allocated_by(|| {
            let mut checksum = 0u64;
            for probe in 0..2_000u64 {
                let step = Step(probe * 7_919 % steps);
                let rank = Rank((probe % 64) as u32);
                for planned in plan.batch(rank, step).take(4) {
                    checksum ^= planned.sample.index ^ u64::from(planned.sample.shard.0) ^ planned.augment_seed;
                }
            }
            checksum
        });
        assert_eq!(lookup_bytes, 0, "{name}: locating samples allocated");
        assert_ne!(checksum, 0);
    }
}
