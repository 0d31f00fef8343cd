//! Which shards a chunk, or the steps after it, read: from the run's epoch plan, pure. Grants
//! carry the shards of the rank's next steps (so the worker fetches them ahead), and the
//! scheduler prefers a worker that holds a chunk's shards.

use std::collections::BTreeSet;

use stoker_plan::EpochPlan;
use stoker_plan::ids::{Rank, ShardId, Step};
use stoker_proto::{Chunk, MAX_NEXT_SHARDS, NEXT_CHUNKS};

/// The shards that `rank`'s steps `first..first + steps` of `plan` read, each once, in the order
/// the plan first reads them, at most `max`.
pub(crate) fn shards_read(plan: &EpochPlan, rank: Rank, first: Step, steps: u64, max: usize) -> Vec<ShardId> {
    let mut seen = BTreeSet::new();
    let mut shards = Vec::new();
    let end = first.0.saturating_add(steps).min(plan.steps());
    for step in (first.0..end).map(Step) {
        for planned in plan.batch(rank, step) {
            if shards.len() >= max {
                return shards;
            }
            if seen.insert(planned.sample.shard) {
                shards.push(planned.sample.shard);
            }
        }
    }
    shards
}

/// The shards that the [`NEXT_CHUNKS`] chunks' worth of `chunk_steps` steps of the chunk's rank
/// after `chunk` read, in order, at most [`MAX_NEXT_SHARDS`] (what a grant carries).
pub(crate) fn next_shards(plan: &EpochPlan, chunk: &Chunk, chunk_steps: u32) -> Vec<ShardId> {
    let after = Step(chunk.first_step.0.saturating_add(u64::from(chunk.steps)));
    shards_read(plan, chunk.rank, after, u64::from(NEXT_CHUNKS) * u64::from(chunk_steps), MAX_NEXT_SHARDS)
}

#[cfg(test)]
mod tests {
    use std::num::NonZeroU32;
    use std::sync::Arc;

    use stoker_plan::ids::{Epoch, JobId, Position};
    use stoker_plan::{PlanSpec, ShardTable, Shuffle, Tail};

    use super::*;

    fn plan(shuffle: Shuffle) -> EpochPlan {
        let table = ShardTable::new([10, 10, 10, 10, 10, 10]).expect("counts");
        let spec = PlanSpec {
            seed: 1,
            world_size: NonZeroU32::new(2).expect("2"),
            batch_size: NonZeroU32::new(5).expect("5"),
            shuffle,
            tail: Tail::Drop,
        };
        EpochPlan::new(Arc::new(table), spec, Epoch(0))
    }

    #[test]
    fn the_next_shards_are_those_of_the_ranks_following_steps_in_order() {
        // Manifest order, 2 ranks of 5: step s of rank r reads positions 10s + 5r..10s + 5r + 5,
        // i.e. shard s (each shard holds 10 samples).
        let plan = plan(Shuffle::None);
        let chunk = Chunk { job: JobId(1), epoch: Epoch(0), start: Position(0), first_step: Step(0), rank: Rank(1), steps: 1 };
        assert_eq!(next_shards(&plan, &chunk, 2), vec![ShardId(1), ShardId(2), ShardId(3), ShardId(4)]);
        let last = Chunk { first_step: Step(5), ..chunk };
        assert!(next_shards(&plan, &last, 2).is_empty(), "nothing after the run's last step");
        assert_eq!(shards_read(&plan, Rank(0), Step(0), 6, 3).len(), 3, "at most max");
    }

    #[test]
    fn shuffled_plans_name_each_shard_once() {
        let plan = plan(Shuffle::Full);
        let shards = shards_read(&plan, Rank(0), Step(0), plan.steps(), usize::MAX);
        let unique: BTreeSet<ShardId> = shards.iter().copied().collect();
        assert_eq!(unique.len(), shards.len());
        assert!(shards.len() > 1);
    }
}
