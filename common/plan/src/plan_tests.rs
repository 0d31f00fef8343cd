use std::collections::{HashMap, HashSet};

use proptest::prelude::*;

use super::*;
use crate::ids::ShardId;

fn nz(value: u32) -> NonZeroU32 {
    NonZeroU32::new(value).unwrap_or(NonZeroU32::MIN)
}

fn table(counts: &[u64]) -> Arc<ShardTable> {
    Arc::new(ShardTable::new(counts.iter().copied()).unwrap_or_else(|error| panic!("{error}")))
}

fn spec(seed: u64, world: u32, batch: u32, shuffle: Shuffle, tail: Tail) -> PlanSpec {
    PlanSpec { seed, world_size: nz(world), batch_size: nz(batch), shuffle, tail }
}

/// Every planned sample of the plan, by (rank, step), in order.
fn all_batches(plan: &EpochPlan) -> Vec<(Rank, Step, Vec<PlannedSample>)> {
    let mut out = Vec::new();
    for step in 0..plan.steps() {
        for rank in 0..plan.spec().world_size.get() {
            out.push((Rank(rank), Step(step), plan.batch(Rank(rank), Step(step)).collect()));
        }
    }
    out
}

fn samples_of(plan: &EpochPlan) -> Vec<SampleRef> {
    all_batches(plan).into_iter().flat_map(|(_, _, batch)| batch.into_iter().map(|planned| planned.sample)).collect()
}

fn every_sample(counts: &[u64]) -> HashSet<SampleRef> {
    counts
        .iter()
        .enumerate()
        .flat_map(|(shard, &count)| (0..count).map(move |index| SampleRef { shard: ShardId(shard as u32), index }))
        .collect()
}

fn shuffles() -> impl Strategy<Value = Shuffle> {
    prop_oneof![
        Just(Shuffle::None),
        Just(Shuffle::Full),
        (1u32..5).prop_map(|shards| Shuffle::Window { shards: nz(shards) }),
        (1u32..5, 1u32..4).prop_map(|(samples, blocks)| Shuffle::Block { samples: nz(samples), blocks: nz(blocks) }),
    ]
}

fn tails() -> impl Strategy<Value = Tail> {
    prop_oneof![Just(Tail::Drop), Just(Tail::Pad), Just(Tail::Partial)]
}

fn manifests() -> impl Strategy<Value = Vec<u64>> {
    prop::collection::vec(0u64..40, 1..12)
}

proptest! {
    /// Drop: no sample twice, fewer than W*B left out. Partial: every sample exactly once.
    /// Pad: every sample at least once. All: every rank has the same number of steps.
    #[test]
    fn tail_policies_hold_over_random_manifests(counts in manifests(), seed in any::<u64>(), epoch in 0u64..5,
        world in 1u32..5, batch in 1u32..7, shuffle in shuffles(), tail in tails()) {
        let plan = EpochPlan::new(table(&counts), spec(seed, world, batch, shuffle, tail), Epoch(epoch));
        let samples = samples_of(&plan);
        let unique: HashSet<SampleRef> = samples.iter().copied().collect();
        let everything = every_sample(&counts);
        prop_assert!(unique.is_subset(&everything));
        let per_step = u64::from(world) * u64::from(batch);
        match tail {
            Tail::Drop => {
                prop_assert_eq!(unique.len(), samples.len(), "a sample repeats under drop");
                prop_assert!((everything.len() - unique.len()) < per_step as usize);
            }
            Tail::Partial => {
                prop_assert_eq!(unique.len(), samples.len(), "a sample repeats under partial");
                prop_assert_eq!(&unique, &everything);
            }
            Tail::Pad => {
                prop_assert_eq!(&unique, &everything);
                prop_assert_eq!(samples.len() as u64, plan.steps() * per_step);
            }
        }
        for (rank, step, batch_samples) in all_batches(&plan) {
            prop_assert!(step.0 < plan.steps());
            prop_assert_eq!(batch_samples.len() as u32, plan.layout().batch_len(rank, step));
        }
    }

    /// The order of samples by position depends on the dataset, seed, shuffle and epoch only:
    /// not on world size, batch size or tail, and not on anything else (two builds agree).
    #[test]
    fn order_is_independent_of_how_it_is_cut(counts in manifests(), seed in any::<u64>(), shuffle in shuffles(),
        world in 1u32..5, batch in 1u32..7) {
        let shards = table(&counts);
        let narrow = EpochPlan::new(shards.clone(), spec(seed, 1, 1, shuffle, Tail::Partial), Epoch(3));
        let wide = EpochPlan::new(shards.clone(), spec(seed, world, batch, shuffle, Tail::Partial), Epoch(3));
        let again = EpochPlan::new(shards, spec(seed, world, batch, shuffle, Tail::Partial), Epoch(3));
        let by_position = |plan: &EpochPlan| -> HashMap<u64, PlannedSample> {
            all_batches(plan).into_iter().flat_map(|(_, _, batch)| batch).map(|planned| (planned.position, planned)).collect()
        };
        prop_assert_eq!(by_position(&narrow), by_position(&wide));
        prop_assert_eq!(all_batches(&wide), all_batches(&again));
    }

    /// Resuming from a checkpoint after any step yields exactly the remaining positions: the
    /// same batches when W and B are unchanged; with new W/B, the remaining samples exactly
    /// (partial) or all but fewer than W'*B' of them (drop).
    #[test]
    fn resume_yields_exactly_the_remaining_positions(counts in manifests(), seed in any::<u64>(), shuffle in shuffles(),
        world in 1u32..5, batch in 1u32..7, new_world in 1u32..5, new_batch in 1u32..7, step_fraction in 0.0f64..1.0) {
        let shards = table(&counts);
        let original = EpochPlan::new(shards.clone(), spec(seed, world, batch, shuffle, Tail::Partial), Epoch(1));
        prop_assume!(original.steps() > 1);
        // Before the last step (after it, the checkpoint is the next epoch's start).
        let done_steps = (((original.steps() as f64) * step_fraction) as u64).min(original.steps() - 2);
        let checkpoint = original.checkpoint_after(Step(done_steps));
        let consumed: HashSet<SampleRef> = all_batches(&original).into_iter()
            .filter(|(_, step, _)| step.0 <= done_steps)
            .flat_map(|(_, _, batch)| batch.into_iter().map(|planned| planned.sample)).collect();
        let remaining: HashSet<SampleRef> = every_sample(&counts).difference(&consumed).copied().collect();

        let same = EpochPlan::resume(shards.clone(), *original.spec(), &checkpoint).unwrap_or_else(|error| panic!("{error}"));
        let offset = original.steps() - same.steps();
        for (rank, step, batch_samples) in all_batches(&same) {
            let original_batch: Vec<PlannedSample> = original.batch(rank, Step(step.0 + offset)).collect();
            prop_assert_eq!(batch_samples, original_batch);
        }

        let repartitioned = EpochPlan::resume(shards.clone(), spec(seed, new_world, new_batch, shuffle, Tail::Partial), &checkpoint)
            .unwrap_or_else(|error| panic!("{error}"));
        let resumed = samples_of(&repartitioned);
        prop_assert_eq!(resumed.len(), remaining.len());
        prop_assert_eq!(resumed.into_iter().collect::<HashSet<_>>(), remaining.clone());

        let dropped = EpochPlan::resume(shards, spec(seed, new_world, new_batch, shuffle, Tail::Drop), &checkpoint)
            .unwrap_or_else(|error| panic!("{error}"));
        let resumed_drop: HashSet<SampleRef> = samples_of(&dropped).into_iter().collect();
        prop_assert!(resumed_drop.is_subset(&remaining));
        prop_assert!(remaining.len() - resumed_drop.len() < (new_world * new_batch) as usize);
    }

    /// With window shuffle, the positions of window w come from exactly the shards of that
    /// window — at most k of them — and use up every sample of those shards.
    #[test]
    fn a_window_draws_from_at_most_k_shards(counts in prop::collection::vec(0u64..30, 1..20), seed in any::<u64>(), k in 1u32..5) {
        let plan = EpochPlan::new(table(&counts), spec(seed, 1, 1, Shuffle::Window { shards: nz(k) }, Tail::Partial), Epoch(0));
        let window_starts = plan.window_starts().unwrap_or_default().to_vec();
        prop_assert_eq!(window_starts.len() as u32, (counts.len() as u32).div_ceil(k) + 1);
        for bounds in window_starts.windows(2) {
            let samples: Vec<SampleRef> = (bounds[0]..bounds[1]).map(|position| plan.sample_at(position).sample).collect();
            let shards: HashSet<ShardId> = samples.iter().map(|sample| sample.shard).collect();
            prop_assert!(shards.len() as u32 <= k);
            let held: u64 = shards.iter().map(|&shard| plan.table().count(shard)).sum();
            prop_assert_eq!(held, bounds[1] - bounds[0]);
        }
    }
}

#[test]
fn epochs_and_seeds_change_the_order() {
    let shards = table(&[50, 50, 50, 50]);
    let order = |seed: u64, epoch: u64| -> Vec<SampleRef> {
        samples_of(&EpochPlan::new(shards.clone(), spec(seed, 2, 4, Shuffle::default(), Tail::Drop), Epoch(epoch)))
    };
    assert_ne!(order(0, 0), order(0, 1));
    assert_ne!(order(0, 0), order(1, 0));
    assert_eq!(order(5, 5), order(5, 5));
}

#[test]
fn resume_refuses_a_checkpoint_of_another_dataset_or_version() {
    let plan = EpochPlan::new(table(&[10, 10]), spec(1, 1, 2, Shuffle::default(), Tail::Drop), Epoch(0));
    let checkpoint = plan.checkpoint_after(Step(2));
    let other = table(&[10, 11]);
    assert!(matches!(EpochPlan::resume(other, *plan.spec(), &checkpoint), Err(PlanError::CheckpointMismatch { .. })));
    let other_seed = spec(2, 1, 2, Shuffle::default(), Tail::Drop);
    assert!(EpochPlan::resume(table(&[10, 10]), other_seed, &checkpoint).is_err());
    let future = Checkpoint { version: 99, ..checkpoint };
    assert!(matches!(
        EpochPlan::resume(table(&[10, 10]), *plan.spec(), &future),
        Err(PlanError::UnsupportedCheckpointVersion { found: 99, .. })
    ));
}

#[test]
fn plan_spec_reads_from_json_with_defaults() {
    let parsed: PlanSpec =
        serde_json::from_str(r#"{"seed": 3, "world_size": 2, "batch_size": 4}"#).unwrap_or_else(|error| panic!("{error}"));
    assert_eq!(parsed.shuffle, Shuffle::Window { shards: nz(8) });
    assert_eq!(parsed.tail, Tail::Drop);
    assert!(serde_json::from_str::<PlanSpec>(r#"{"seed": 3, "world_size": 0, "batch_size": 4}"#).is_err());
    assert!(serde_json::from_str::<PlanSpec>(r#"{"seed": 3, "world_size": 1, "batch_size": 4, "sed": 1}"#).is_err());
}

/// Golden values: a fixed manifest and spec must always give these batches. If this fails,
/// the plan contract changed: every job's data order and every checkpoint are affected.
#[test]
fn plans_are_pinned() {
    let shards = table(&[3, 5, 0, 4]);
    let first_batch = |shuffle: Shuffle| -> Vec<(u32, u64)> {
        EpochPlan::new(shards.clone(), spec(7, 2, 3, shuffle, Tail::Drop), Epoch(1))
            .batch(Rank(1), Step(0))
            .map(|planned| (planned.sample.shard.0, planned.sample.index))
            .collect()
    };
    assert_eq!(first_batch(Shuffle::None), vec![(1, 0), (1, 1), (1, 2)]);
    assert_eq!(first_batch(Shuffle::Window { shards: nz(2) }), GOLDEN_WINDOW.to_vec());
    assert_eq!(first_batch(Shuffle::Full), GOLDEN_FULL.to_vec());
    assert_eq!(first_batch(Shuffle::Block { samples: nz(2), blocks: nz(2) }), GOLDEN_BLOCK.to_vec());
    assert_eq!(augment_seed(7, Epoch(1), 3), GOLDEN_AUGMENT);
}

const GOLDEN_WINDOW: [(u32, u64); 3] = [(1, 2), (1, 1), (3, 0)];
const GOLDEN_BLOCK: [(u32, u64); 3] = [(1, 4), (1, 2), (1, 3)];
const GOLDEN_FULL: [(u32, u64); 3] = [(3, 2), (0, 0), (1, 4)];
const GOLDEN_AUGMENT: u64 = 15_585_931_656_404_915_346;

/// Regression (issue 16, item 2): the state saved after an epoch's last step recorded the
/// finished epoch, so a restarted run trained it again; with `tail="pad"` its position lay past
/// the data and the coordinator refused to open it (found by the protocol model). It is now the
/// next epoch's start, for every tail.
#[test]
fn the_checkpoint_after_an_epochs_last_step_is_the_next_epochs_start() {
    for tail in [Tail::Drop, Tail::Pad, Tail::Partial] {
        let shards = table(&[5, 3, 7, 4]);
        let plan = EpochPlan::new(Arc::clone(&shards), spec(9, 3, 1, Shuffle::Full, tail), Epoch(4));
        let last = Step(plan.steps() - 1);
        let checkpoint = plan.checkpoint_after(last);
        assert_eq!((checkpoint.epoch, checkpoint.position), (Epoch(5), Position(0)), "{tail:?}");
        let resumed = EpochPlan::resume(Arc::clone(&shards), *plan.spec(), &checkpoint).expect("resumes");
        assert_eq!(resumed.steps(), EpochPlan::new(shards, *plan.spec(), Epoch(5)).steps(), "{tail:?}: a whole epoch 5");
        let before_last = plan.checkpoint_after(Step(last.0 - 1));
        assert_eq!(before_last.epoch, Epoch(4), "{tail:?}");
        assert!(before_last.position.0 <= 19, "{tail:?}: inside the data");
    }
}
