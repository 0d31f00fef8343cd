//! Workers crash, join and leave in the middle of an epoch; exactly-once still holds.

use std::time::{Duration, Instant};

use stoker_plan::Tail;
use stoker_testkit::{TestCluster, poll_until, wait_until};
use tracing::info;

use crate::common::{Seen, assert_in_order, cluster_with, config_for};

const SAMPLES: u64 = 120;

/// Start `world_size` ranks that each take `pause` per batch; returns their join handles.
fn slow_ranks(cluster: &TestCluster, world_size: u32, pause: Duration) -> Vec<std::thread::JoinHandle<Vec<Seen>>> {
    let mut base = cluster.loader_config("train", 4);
    base.tail = Tail::Partial;
    base.prefetch = 4;
    (0..world_size)
        .map(|rank| {
            let config = config_for(&base, rank, world_size);
            std::thread::spawn(move || {
                let mut loader = stoker_client::Loader::attach(&config).expect("attach");
                let mut seen = Vec::new();
                for epoch in 0..2 {
                    loader.set_epoch(stoker_plan::ids::Epoch(epoch));
                    for batch in &mut loader {
                        let batch = batch.expect("batch");
                        seen.push(Seen { epoch, step: batch.step().0, keys: batch.keys().to_vec(), checksum: batch.checksum() });
                        std::thread::park_timeout(pause);
                    }
                }
                seen
            })
        })
        .collect()
}

fn finish(handles: Vec<std::thread::JoinHandle<Vec<Seen>>>) -> std::collections::BTreeMap<u32, Vec<Seen>> {
    handles.into_iter().enumerate().map(|(rank, handle)| (rank as u32, handle.join().expect("rank thread"))).collect()
}

fn assert_every_key_once_per_epoch(seen: &std::collections::BTreeMap<u32, Vec<Seen>>) {
    for epoch in 0..2 {
        let mut keys: Vec<&String> = seen.values().flatten().filter(|r| r.epoch == epoch).flat_map(|r| &r.keys).collect();
        keys.sort();
        let total = keys.len();
        keys.dedup();
        assert_eq!((total, keys.len()), (SAMPLES as usize, SAMPLES as usize), "epoch {epoch}: every key exactly once");
    }
}

fn chunks_held_by(cluster: &TestCluster, index: usize) -> u32 {
    let Some(addr) = cluster.worker(index).map(|worker| worker.local_addr()) else { return 0 };
    match cluster.coordinator().map(|core| core.status(Instant::now())) {
        Some(status) => status.workers.iter().filter(|worker| worker.info.addr == addr).map(|worker| worker.chunks_in_flight).sum(),
        None => 0,
    }
}

/// A worker killed while it holds leases: they expire, are granted again, and every rank
/// still gets every step once and in order.
#[test]
fn a_worker_killed_mid_chunk_loses_nothing() {
    let mut cluster = cluster_with(3);
    let ranks = slow_ranks(&cluster, 2, Duration::from_millis(15));
    {
        info!("--- kill worker 0 while it holds a lease");
        let (timeout, interval) = (Duration::from_secs(30), Duration::from_millis(1));
        poll_until(timeout, interval, "worker 0 holds a lease", || chunks_held_by(&cluster, 0) > 0).expect("lease");
        cluster.kill_worker(0);
    }
    {
        info!("--- its leases expire and the epoch completes");
        let core = cluster.coordinator().expect("coordinator");
        wait_until(Duration::from_secs(30), "a lease expired", || core.leases_expired() > 0).expect("expiry");
        let seen = finish(ranks);
        assert_in_order(&seen, SAMPLES.div_ceil(8), 2);
        assert_every_key_once_per_epoch(&seen);
    }
}

/// A worker that joins mid-epoch receives work; one that leaves gracefully hands its leases
/// back (no expiry needed); every step still arrives once and in order.
#[test]
fn workers_join_and_leave_mid_epoch() {
    let mut cluster = cluster_with(1);
    let ranks = slow_ranks(&cluster, 2, Duration::from_millis(15));
    {
        info!("--- a second worker joins and gets work");
        wait_until(Duration::from_secs(30), "the first batches", || cluster.worker(0).is_some_and(|w| w.batches_pushed() >= 2))
            .expect("start");
        let joined = cluster.add_worker().expect("worker");
        wait_until(Duration::from_secs(30), "the new worker pushes batches", || {
            cluster.worker(joined).is_some_and(|worker| worker.batches_pushed() >= 2)
        })
        .expect("new worker works");
    }
    {
        info!("--- the first worker leaves gracefully");
        cluster.shutdown_worker(0);
        let seen = finish(ranks);
        assert_in_order(&seen, SAMPLES.div_ceil(8), 2);
        assert_every_key_once_per_epoch(&seen);
        assert_eq!(cluster.coordinator().expect("coordinator").leases_expired(), 0, "leases were handed back, not expired");
    }
}
