//! Which shards a chunk, or the steps after it, read: from the run's epoch plan, pure. Grants
//! carry the shards of the rank's next steps (so the worker fetches them ahead), and the
//! scheduler prefers a worker that holds or is fetching a chunk's shards, and passes over,
//! for another, a chunk whose shards another worker holds or is fetching ([`Locality`]).

use std::collections::{BTreeSet, HashMap, HashSet};

use stoker_plan::EpochPlan;
use stoker_plan::ids::{Rank, ShardId, Step, WorkerId};
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

    /// Whether `shard` of the dataset of `version` is held.
    fn holds(&self, version: u64, shard: ShardId) -> bool {
        self.by_version.get(&version).is_some_and(|held| held.contains(&shard))
    }

    /// Add `shards` of the dataset of `version` (what a grant tells the worker to read), as
    /// long as it holds fewer than twice [`MAX_HELD_SHARDS`] in all.
    fn add(&mut self, version: u64, shards: impl IntoIterator<Item = ShardId>) {
        let mut room = (2 * MAX_HELD_SHARDS).saturating_sub(self.len());
        let held = self.by_version.entry(version).or_default();
        for shard in shards {
            if room == 0 {
                return;
            }
            if held.insert(shard) {
                room -= 1;
            }
        }
    }

    fn len(&self) -> usize {
        self.by_version.values().map(HashSet::len).sum()
    }

    fn each(&self) -> impl Iterator<Item = (u64, ShardId)> + '_ {
        self.by_version.iter().flat_map(|(&version, shards)| shards.iter().map(move |&shard| (version, shard)))
    }
}

/// What the coordinator knows of where shards are or are going, per worker: what the worker's
/// last pull reported its cache holds (downloaded or downloading) and what that pull's grants
/// told it to read (the chunks' shards, and the `next_shards` it fetches ahead). The leader's
/// soft state, replaced at each pull; a worker the scheduler forgot is dropped at the next
/// pull. It lets the scheduler grant a rank's next chunk to the worker already fetching its
/// shards, and keep a second worker off shards the first is fetching, so that a cold epoch
/// downloads each shard about once, not once per worker.
#[derive(Debug, Default)]
pub(crate) struct Locality {
    by_worker: HashMap<WorkerId, Holdings>,
    /// For each shard some worker holds or was told to read, how many workers.
    claimed: HashMap<(u64, ShardId), u32>,
    /// The worker registry's removals at the last [`Locality::retain`].
    removals_seen: Option<u64>,
}

impl Locality {
    /// `worker`'s pull reported `held`: it replaces what was known of `worker`.
    pub(crate) fn report(&mut self, worker: WorkerId, held: Holdings) {
        self.forget(worker);
        for key in held.each() {
            *self.claimed.entry(key).or_default() += 1;
        }
        self.by_worker.insert(worker, held);
    }

    /// `worker` was granted a chunk that reads, or told to fetch ahead, `shards` of the dataset
    /// of `version`.
    pub(crate) fn told(&mut self, worker: WorkerId, version: u64, shards: &[ShardId]) {
        let holdings = self.by_worker.entry(worker).or_default();
        let fresh: Vec<ShardId> = shards.iter().copied().filter(|&shard| !holdings.holds(version, shard)).collect();
        let before = holdings.len();
        holdings.add(version, fresh.iter().copied());
        let added = holdings.len() - before;
        for &shard in fresh.iter().take(added) {
            *self.claimed.entry((version, shard)).or_default() += 1;
        }
    }

    /// Drop what is known of `worker`.
    pub(crate) fn forget(&mut self, worker: WorkerId) {
        let Some(old) = self.by_worker.remove(&worker) else { return };
        for key in old.each() {
            if let Some(count) = self.claimed.get_mut(&key) {
                *count = count.saturating_sub(1);
                if *count == 0 {
                    self.claimed.remove(&key);
                }
            }
        }
    }

    /// Keep only the workers `known` says are still registered, when the registry's count of
    /// removals moved since the last look (a look visits every worker: not one per pull).
    pub(crate) fn retain(&mut self, removals: u64, known: impl Fn(WorkerId) -> bool) {
        if self.removals_seen == Some(removals) {
            return;
        }
        self.removals_seen = Some(removals);
        let gone: Vec<WorkerId> = self.by_worker.keys().copied().filter(|&worker| !known(worker)).collect();
        for worker in gone {
            self.forget(worker);
        }
    }

    /// Those of `shards` (of the dataset of `version`) that no worker other than `worker` holds
    /// or was told to read, in their order: what a grant to `worker` names as the next shards
    /// to fetch ahead. Two workers granted chunks of the same steps (every rank's chunk of a
    /// step reads the same window of shards) would otherwise both fetch them (measured: a warm
    /// epoch with a cache of half the dataset fetched 1.4x the dataset with fetch-ahead, 0.8-1.0x
    /// without); this way the first fetches them and the scheduler grants it their chunks.
    pub(crate) fn not_claimed_by_others(&self, worker: WorkerId, version: u64, shards: Vec<ShardId>) -> Vec<ShardId> {
        let own = self.by_worker.get(&worker);
        shards
            .into_iter()
            .filter(|&shard| {
                let mine = own.is_some_and(|holdings| holdings.holds(version, shard));
                self.claimed.get(&(version, shard)).copied().unwrap_or(0) <= u32::from(mine)
            })
            .collect()
    }

    /// Whether no worker holds or was told anything.
    pub(crate) fn is_empty(&self) -> bool {
        self.claimed.is_empty()
    }

    /// How much `worker` should get `chunk` (of the dataset of `version`, read by `plan`): first
    /// by how many of its shards `worker` holds or is fetching, then by how few of the others
    /// only other workers do (see [`affinity`]).
    pub(crate) fn affinity(&self, worker: WorkerId, version: u64, plan: &EpochPlan, chunk: &Chunk) -> u32 {
        let read = shards_read(plan, chunk.rank, chunk.first_step, u64::from(chunk.steps), usize::MAX);
        let own = self.by_worker.get(&worker);
        let (mut mine, mut others) = (0_u32, 0_u32);
        for shard in read {
            let is_mine = own.is_some_and(|holdings| holdings.holds(version, shard));
            let claims = self.claimed.get(&(version, shard)).copied().unwrap_or(0);
            if is_mine {
                mine += 1;
            } else if claims > 0 {
                others += 1;
            }
        }
        affinity(mine, others)
    }
}

/// A chunk's score for a puller (higher is granted first): by `mine`, the shards it reads that
/// the puller holds or is fetching, then by fewer `others`, those only other workers hold or
/// are fetching. Below `u32::MAX`, which the scheduler keeps for chunks passed over once.
pub(crate) fn affinity(mine: u32, others: u32) -> u32 {
    const LOW: u32 = 0xFFFF;
    (mine.min(0x7FFF) << 16) | (LOW - others.min(LOW))
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
        let mut locality = Locality::default();
        locality.report(WorkerId(1), Holdings::of(&held).expect("within the bounds"));
        let chunk = Chunk { job: JobId(1), epoch: Epoch(0), start: Position(0), first_step: Step(1), rank: Rank(0), steps: 3 };
        assert_eq!(locality.affinity(WorkerId(1), 7, &plan, &chunk), affinity(2, 0), "steps 1..4 read shards 1, 2 and 3");
        assert_eq!(locality.affinity(WorkerId(1), 8, &plan, &chunk), affinity(0, 0), "another dataset version");
        locality.report(WorkerId(1), Holdings::of(&[]).expect("empty"));
        assert!(locality.is_empty());
        let flood = [HeldShards { dataset_version: 7, shards: vec![ShardId(0); MAX_HELD_SHARDS + 1] }];
        assert!(Holdings::of(&flood).is_err());
        let many = vec![HeldShards { dataset_version: 7, shards: Vec::new() }; MAX_HELD_DATASETS + 1];
        assert!(Holdings::of(&many).is_err());
    }

    #[test]
    fn a_puller_prefers_chunks_it_fetches_then_those_no_other_worker_fetches() {
        // Manifest order, 2 ranks of 5: step s reads shard s.
        let plan = plan(Shuffle::None);
        let chunk =
            |first: u64| Chunk { job: JobId(1), epoch: Epoch(0), start: Position(0), first_step: Step(first), rank: Rank(0), steps: 2 };
        let (me, other) = (WorkerId(1), WorkerId(2));
        let mut locality = Locality::default();
        assert!(locality.is_empty());
        locality.report(me, Holdings::of(&[HeldShards { dataset_version: 7, shards: vec![ShardId(0)] }]).expect("bounded"));
        locality.told(other, 7, &[ShardId(2), ShardId(3)]);
        let (mine, nobodys, others) = (chunk(0), chunk(4), chunk(2));
        let score = |locality: &Locality, chunk: &Chunk| locality.affinity(me, 7, &plan, chunk);
        assert!(score(&locality, &mine) > score(&locality, &nobodys), "held first");
        assert!(score(&locality, &nobodys) > score(&locality, &others), "what another worker fetches last");
        assert!(score(&locality, &mine) < u32::MAX, "below the score of a chunk passed over");
        assert_eq!(locality.affinity(other, 7, &plan, &others), affinity(2, 0));
        assert_eq!(locality.affinity(me, 8, &plan, &mine), affinity(0, 0), "another dataset version");
        // A new report replaces what was known; a worker forgotten claims nothing.
        locality.report(me, Holdings::default());
        assert_eq!(score(&locality, &mine), affinity(0, 0));
        locality.retain(1, |worker| worker != other);
        assert_eq!(score(&locality, &others), affinity(0, 0));
        assert!(locality.is_empty(), "{locality:?}");
        // Workers are looked at again only once the registry has removed one since.
        locality.report(other, Holdings::of(&[HeldShards { dataset_version: 7, shards: vec![ShardId(4)] }]).expect("holdings"));
        locality.retain(1, |worker| worker != other);
        assert!(!locality.is_empty(), "no removal since the last look: nothing looked at");
        locality.retain(2, |worker| worker != other);
        assert!(locality.is_empty(), "{locality:?}");
    }

    #[test]
    fn the_next_shards_leave_out_those_another_worker_holds_or_fetches() {
        let (me, other) = (WorkerId(1), WorkerId(2));
        let next = vec![ShardId(3), ShardId(1), ShardId(2), ShardId(4)];
        let mut locality = Locality::default();
        assert_eq!(locality.not_claimed_by_others(me, 7, next.clone()), next, "nobody holds anything");
        locality.report(me, Holdings::of(&[HeldShards { dataset_version: 7, shards: vec![ShardId(1)] }]).expect("bounded"));
        locality.report(other, Holdings::of(&[HeldShards { dataset_version: 7, shards: vec![ShardId(2)] }]).expect("bounded"));
        locality.told(other, 7, &[ShardId(4)]);
        assert_eq!(locality.not_claimed_by_others(me, 7, next.clone()), vec![ShardId(3), ShardId(1)], "in order, its own kept");
        assert_eq!(locality.not_claimed_by_others(me, 8, next.clone()), next, "another dataset version");
        locality.told(me, 7, &[ShardId(2)]);
        assert_eq!(locality.not_claimed_by_others(me, 7, vec![ShardId(2)]), Vec::<ShardId>::new(), "held by both: the other has it");
        locality.forget(other);
        assert_eq!(locality.not_claimed_by_others(me, 7, next.clone()), next);
    }

    #[test]
    fn what_a_worker_is_told_is_bounded() {
        let mut locality = Locality::default();
        let many: Vec<ShardId> = (0..3 * MAX_HELD_SHARDS as u32).map(ShardId).collect();
        locality.told(WorkerId(1), 7, &many);
        locality.told(WorkerId(1), 7, &many);
        assert_eq!(locality.claimed.len(), 2 * MAX_HELD_SHARDS);
        assert!(locality.claimed.values().all(|&count| count == 1));
        locality.forget(WorkerId(1));
        assert!(locality.is_empty());
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
