//! Which shards a chunk, or the steps after it, read: from the run's epoch plan, pure. Grants
//! carry the shards of the rank's next steps (so the worker fetches them ahead), and the
//! scheduler prefers a worker that holds a chunk's shards.

use std::collections::{BTreeSet, HashMap, HashSet};

use stoker_plan::EpochPlan;
use stoker_plan::ids::{Rank, ShardId, Step};
use stoker_proto::{Chunk, HeldShards, MAX_HELD_DATASETS, MAX_HELD_SHARDS, MAX_NEXT_SHARDS, NEXT_CHUNKS, RemoteError};

use crate::errors::invalid;

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

/// The shards a pulling worker says its cache holds, by dataset version.
#[derive(Debug, Default)]
pub(crate) struct Holdings {
    by_version: HashMap<u64, HashSet<ShardId>>,
}

impl Holdings {
    /// A pull's report, refused if it is over the bounds ([`MAX_HELD_SHARDS`] shards,
    /// [`MAX_HELD_DATASETS`] datasets).
    pub(crate) fn of(held: &[HeldShards]) -> Result<Self, RemoteError> {
        let shards: usize = held.iter().map(|dataset| dataset.shards.len()).sum();
        if held.len() > MAX_HELD_DATASETS || shards > MAX_HELD_SHARDS {
            return Err(invalid(format!(
                "a pull reports {shards} shards of {} datasets held, over the limit of {MAX_HELD_SHARDS} shards of \
                 {MAX_HELD_DATASETS} datasets",
                held.len()
            )));
        }
        let mut by_version: HashMap<u64, HashSet<ShardId>> = HashMap::new();
        for dataset in held {
            by_version.entry(dataset.dataset_version).or_default().extend(dataset.shards.iter().copied());
        }
        Ok(Self { by_version })
    }

    /// Whether nothing is held.
    pub(crate) fn is_empty(&self) -> bool {
        self.by_version.values().all(HashSet::is_empty)
    }

    /// How many of the shards `chunk` reads (by `plan`, of the dataset of `version`) are held.
    pub(crate) fn count(&self, version: u64, plan: &EpochPlan, chunk: &Chunk) -> u32 {
        let Some(held) = self.by_version.get(&version) else { return 0 };
        let read = shards_read(plan, chunk.rank, chunk.first_step, u64::from(chunk.steps), usize::MAX);
        read.iter().filter(|shard| held.contains(shard)).count() as u32
    }
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
    fn holdings_count_the_shards_a_chunk_reads_and_refuse_reports_over_the_bound() {
        let plan = plan(Shuffle::None);
        let held = [HeldShards { dataset_version: 7, shards: vec![ShardId(1), ShardId(2)] }];
        let holdings = Holdings::of(&held).expect("within the bounds");
        let chunk = Chunk { job: JobId(1), epoch: Epoch(0), start: Position(0), first_step: Step(1), rank: Rank(0), steps: 3 };
        assert_eq!(holdings.count(7, &plan, &chunk), 2, "steps 1..4 read shards 1, 2 and 3");
        assert_eq!(holdings.count(8, &plan, &chunk), 0, "another dataset version");
        assert!(Holdings::of(&[]).expect("empty").is_empty());
        let flood = [HeldShards { dataset_version: 7, shards: vec![ShardId(0); MAX_HELD_SHARDS + 1] }];
        assert!(Holdings::of(&flood).is_err());
        let many = vec![HeldShards { dataset_version: 7, shards: Vec::new() }; MAX_HELD_DATASETS + 1];
        assert!(Holdings::of(&many).is_err());
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
