//! Exactly once, in order, deterministic (DESIGN §5, §4.5).

use std::collections::{BTreeMap, BTreeSet};

use stoker_plan::Tail;
use stoker_testkit::{ClusterConfig, TestCluster};
use tracing::info;

use crate::common::{assert_in_order, cluster_with, consume, dataset};

const SAMPLES: usize = 120;

/// 2 epochs, 3 workers, 4 ranks: every (epoch, rank) gets every step once and in order; with
/// tail `partial` the ranks together get every key exactly once per epoch, with `drop` no key
/// twice.
#[test]
fn every_step_exactly_once_in_order_with_three_workers_and_four_ranks() {
    let cluster = cluster_with(3);
    {
        info!("--- tail partial: every key exactly once per epoch");
        let mut base = cluster.loader_config("train", 4);
        base.tail = Tail::Partial;
        let seen = consume(&base, 4, 2);
        assert_in_order(&seen, SAMPLES.div_ceil(16) as u64, 2);
        for epoch in 0..2 {
            let keys: Vec<&String> =
                seen.values().flatten().filter(|record| record.epoch == epoch).flat_map(|record| &record.keys).collect();
            let unique: BTreeSet<&String> = keys.iter().copied().collect();
            assert_eq!(keys.len(), SAMPLES, "epoch {epoch}: every sample once");
            assert_eq!(unique.len(), SAMPLES, "epoch {epoch}: no sample twice");
        }
    }
    {
        info!("--- tail drop: full steps only, no key twice");
        let mut base = cluster.loader_config("train", 4);
        base.tail = Tail::Drop;
        let seen = consume(&base, 4, 2);
        assert_in_order(&seen, (SAMPLES / 16) as u64, 2);
        for epoch in 0..2 {
            let keys: Vec<&String> =
                seen.values().flatten().filter(|record| record.epoch == epoch).flat_map(|record| &record.keys).collect();
            let unique: BTreeSet<&String> = keys.iter().copied().collect();
            assert_eq!(keys.len(), unique.len(), "epoch {epoch}: no sample twice");
            assert_eq!(keys.len(), SAMPLES / 16 * 16);
        }
    }
}

/// Checksums of every batch of an epoch are the same with 1 worker and with 3, and across runs.
#[test]
fn batches_are_identical_whatever_the_worker_count() {
    let manifest = dataset();
    let mut checksums: Vec<BTreeMap<(u32, u64, u64), u64>> = Vec::new();
    for workers in [1, 3, 1] {
        info!(workers, "--- one epoch");
        let cluster = TestCluster::start(ClusterConfig { workers, ..ClusterConfig::default() }).expect("cluster");
        cluster.add_dataset("train", &manifest).expect("dataset");
        cluster.wait_for_workers().expect("workers");
        let mut base = cluster.loader_config("train", 8);
        base.tail = Tail::Partial;
        let seen = consume(&base, 2, 1);
        checksums
            .push(seen.iter().flat_map(|(rank, records)| records.iter().map(move |r| ((*rank, r.epoch, r.step), r.checksum))).collect());
    }
    assert_eq!(checksums[0].len(), SAMPLES.div_ceil(16) * 2, "8 steps of 2 ranks");
    assert_eq!(checksums[0], checksums[1], "1 worker vs 3 workers");
    assert_eq!(checksums[0], checksums[2], "run 1 vs run 3");
}
