//! Planner cost: building an epoch plan over 1,000,000 shards × 1,000 samples, and locating
//! samples (per sample, batch of 256) with each shuffle mode. The baseline is `none`
//! (manifest order: a binary search only).
#![allow(missing_docs)] // criterion_group! generates an undocumented function.

use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::Arc;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use stoker_plan::ids::{Epoch, Rank, Step};
use stoker_plan::{EpochPlan, PlanSpec, ShardTable, Shuffle, Tail};

fn spec(shuffle: Shuffle) -> PlanSpec {
    PlanSpec {
        seed: 3,
        world_size: NonZeroU32::new(64).unwrap_or(NonZeroU32::MIN),
        batch_size: NonZeroU32::new(256).unwrap_or(NonZeroU32::MIN),
        shuffle,
        tail: Tail::Drop,
    }
}

fn bench_planner(criterion: &mut Criterion) {
    let table = Arc::new(ShardTable::new((0..1_000_000u64).map(|_| 1_000)).unwrap_or_else(|error| panic!("{error}")));
    let modes = [
        ("none", Shuffle::None),
        ("window8", Shuffle::Window { shards: NonZeroU32::new(8).unwrap_or(NonZeroU32::MIN) }),
        ("full", Shuffle::Full),
        ("block8x4096", Shuffle::BLOCK_DEFAULT),
    ];
    let mut group = criterion.benchmark_group("plan_build_1M_shards");
    group.sample_size(10);
    for (name, shuffle) in modes {
        group.bench_function(name, |bencher| bencher.iter(|| EpochPlan::new(table.clone(), spec(shuffle), Epoch(black_box(1))).steps()));
    }
    group.finish();

    let mut group = criterion.benchmark_group("plan_batch_of_256");
    group.throughput(Throughput::Elements(256));
    for (name, shuffle) in modes {
        let plan = EpochPlan::new(table.clone(), spec(shuffle), Epoch(1));
        let mut step = 0u64;
        group.bench_function(name, |bencher| {
            bencher.iter(|| {
                step = (step + 7_919) % plan.steps();
                plan.batch(Rank(5), Step(step)).fold(0u64, |acc, planned| acc ^ planned.sample.index ^ planned.augment_seed)
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench_planner);
criterion_main!(benches);
