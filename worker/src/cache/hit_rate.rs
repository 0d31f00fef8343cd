//! A pure simulation of the cache over real epoch plans: one worker makes every chunk of three
//! epochs in the coordinator's grant order ((step, rank), `CHUNK_STEPS` steps of one rank a
//! chunk), with a cache of half the dataset, evicting by the plan or least recently used, the
//! plan knowing the next few chunks and, as the worker does, what the next epoch reads first
//! (as much as the cache holds). It prints the hit rates BENCHMARKS.md quotes:
//!
//! ```text
//! cargo nextest run -p stoker-worker plan_driven_eviction_against_lru --no-capture
//! ```

use std::collections::BTreeSet;
use std::num::NonZeroU32;
use std::sync::Arc;

use stoker_plan::ids::{Epoch, Rank, ShardId, Step};
use stoker_plan::{EpochPlan, PlanSpec, ShardTable, Shuffle, Tail};

use super::table::{CacheTable, Claim};

const SHARDS: u32 = 128;
const SAMPLES_PER_SHARD: u64 = 500;
const WORLD_SIZE: u32 = 4;
const BATCH_SIZE: u32 = 64;
const CHUNK_STEPS: u64 = 4;
const EPOCHS: u64 = 3;

/// How the cache learns the future.
#[derive(Clone, Copy, Debug)]
enum Policy {
    /// Nothing planned: least recently used.
    Lru,
    /// The shards of the next `chunks` chunks planned (what grants and queued chunks tell),
    /// and if `next_epoch`, the first shards the next epoch reads (as many as the cache holds)
    /// planned after them (what the worker's own copy of the next epoch's plan tells).
    Plan { chunks: usize, next_epoch: bool },
}

/// Shard reads and downloads of one epoch.
#[derive(Clone, Copy, Debug, Default)]
struct Tally {
    reads: u64,
    downloads: u64,
}

impl Tally {
    fn hit_rate(self) -> f64 {
        (self.reads - self.downloads) as f64 / self.reads as f64
    }
}

/// Each chunk's shards, epoch by epoch, in grant order.
fn chunks(shuffle: Shuffle) -> Vec<Vec<BTreeSet<ShardId>>> {
    let table = Arc::new(ShardTable::new((0..SHARDS).map(|_| SAMPLES_PER_SHARD)).expect("a valid shard table"));
    let spec = PlanSpec {
        seed: 7,
        world_size: NonZeroU32::new(WORLD_SIZE).expect("not zero"),
        batch_size: NonZeroU32::new(BATCH_SIZE).expect("not zero"),
        shuffle,
        tail: Tail::default(),
    };
    (0..EPOCHS)
        .map(|epoch| {
            let plan = EpochPlan::new(Arc::clone(&table), spec, Epoch(epoch));
            let mut chunks = Vec::new();
            for first in (0..plan.steps()).step_by(CHUNK_STEPS as usize) {
                for rank in (0..WORLD_SIZE).map(Rank) {
                    let steps = first..(first + CHUNK_STEPS).min(plan.steps());
                    chunks.push(steps.flat_map(|step| plan.batch(rank, Step(step)).map(|planned| planned.sample.shard)).collect());
                }
            }
            chunks
        })
        .collect()
}

/// Run every chunk through a cache of half the dataset (shards of one size).
fn simulate(epochs: &[Vec<BTreeSet<ShardId>>], policy: Policy) -> Vec<Tally> {
    const SHARD_BYTES: u64 = 1 << 20;
    let mut table = CacheTable::new(u64::from(SHARDS / 2) * SHARD_BYTES);
    let all: Vec<&BTreeSet<ShardId>> = epochs.iter().flatten().collect();
    let name = |shard: &ShardId| format!("s{}", shard.0);
    let (horizon, next_epoch) = match policy {
        Policy::Lru => (0, false),
        Policy::Plan { chunks, next_epoch } => (chunks, next_epoch),
    };
    for (turn, shards) in all.iter().enumerate().take(horizon) {
        shards.iter().for_each(|shard| table.plan(&name(shard), SHARD_BYTES, turn as u64));
    }
    let mut tallies = vec![Tally::default(); epochs.len()];
    let mut turn = 0_usize;
    for (epoch, chunks) in epochs.iter().enumerate() {
        if let Some(next) = epochs.get(epoch + 1).filter(|_| next_epoch) {
            // Each of the next epoch's first shards at the turn that first reads it (after every
            // turn of this epoch), until the cache is full of them.
            let base = turn + chunks.len();
            let mut first = BTreeSet::new();
            'reads: for (at, shards) in next.iter().enumerate() {
                for shard in shards {
                    if first.len() >= (SHARDS / 2) as usize {
                        break 'reads;
                    }
                    if first.insert(*shard) {
                        table.plan(&name(shard), SHARD_BYTES, (base + at) as u64);
                    }
                }
            }
        }
        for shards in chunks {
            if let Some(coming) = all.get(turn + horizon).filter(|_| horizon > 0) {
                coming.iter().for_each(|shard| table.plan(&name(shard), SHARD_BYTES, (turn + horizon) as u64));
            }
            for shard in shards {
                let name = name(shard);
                tallies[epoch].reads += 1;
                match table.claim(&name, SHARD_BYTES) {
                    Claim::Hit => {}
                    Claim::Download { .. } => {
                        tallies[epoch].downloads += 1;
                        table.downloaded(&name);
                    }
                    other => panic!("{other:?}: a chunk's shards fit in half the dataset"),
                }
            }
            for shard in shards {
                table.unplan(&name(shard), turn as u64);
                table.unpin(&name(shard));
            }
            turn += 1;
        }
    }
    tallies
}

#[test]
fn plan_driven_eviction_against_lru() {
    eprintln!(
        "{SHARDS} shards of {SAMPLES_PER_SHARD} samples, {WORLD_SIZE} ranks x {BATCH_SIZE}, chunks of {CHUNK_STEPS} steps, \
         cache of {} shards; hit rate of shard reads (downloads) per epoch",
        SHARDS / 2
    );
    for shuffle in ["none", "window:8", "window:16"] {
        let shuffle: Shuffle = shuffle.parse().expect("a shuffle");
        let epochs = chunks(shuffle);
        let lru = simulate(&epochs, Policy::Lru);
        eprintln!("| {shuffle} | LRU | {} |", row(&lru));
        for (chunks, next_epoch) in [(4, false), (16, false), (4, true), (16, true), (usize::MAX / 2, false)] {
            let plan = simulate(&epochs, Policy::Plan { chunks, next_epoch });
            let label = match (chunks > 1 << 20, next_epoch) {
                (true, _) => "plan, whole future".to_owned(),
                (false, false) => format!("plan, next {chunks} chunks"),
                (false, true) => format!("plan, next {chunks} chunks + next epoch's first reads"),
            };
            eprintln!("| {shuffle} | {label} | {} |", row(&plan));
            for (epoch, (plan, lru)) in plan.iter().zip(&lru).enumerate() {
                assert!(plan.downloads <= lru.downloads, "{shuffle}, epoch {epoch}: plan {plan:?}, LRU {lru:?}");
            }
            if next_epoch {
                // Knowing where the next epoch starts is what Belady's gain at the boundary needs.
                let warm: u64 = plan.iter().skip(1).map(|tally| tally.downloads).sum();
                let lru_warm: u64 = lru.iter().skip(1).map(|tally| tally.downloads).sum();
                assert!(warm * 10 <= lru_warm * 9, "{shuffle}, {label}: {warm} warm downloads against LRU's {lru_warm}");
            }
        }
    }
}

fn row(tallies: &[Tally]) -> String {
    let cells: Vec<String> = tallies.iter().map(|tally| format!("{:.1}% ({})", 100.0 * tally.hit_rate(), tally.downloads)).collect();
    cells.join(" | ")
}
