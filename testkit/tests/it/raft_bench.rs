//! Measurements for BENCHMARKS.md (issue 17), not run by `make test`:
//!
//! ```sh
//! STOKER_BENCH=1 cargo test --release -p stoker-testkit --test it raft_bench -- --ignored --nocapture --test-threads 1
//! ```

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use stoker_client::Loader;
use stoker_coordinator::state::Command;
use stoker_plan::ids::{Epoch, JobId, Position};
use stoker_plan::{Checkpoint, Tail};
use stoker_testkit::{ClusterConfig, TestCluster};

use crate::common::{config_for, dataset};

const KILLS: usize = 10;
/// `STOKER_BENCH_KILLS=N` runs fewer (to look at one with `RUST_LOG=info`).
fn kill_count() -> usize {
    std::env::var("STOKER_BENCH_KILLS").ok().and_then(|value| value.parse().ok()).unwrap_or(KILLS)
}

/// Benchmarks run only with `STOKER_BENCH=1` (`make test` runs ignored tests, and these take
/// minutes and measure nothing under its load).
fn benchmarking() -> bool {
    let asked = std::env::var_os("STOKER_BENCH").is_some();
    if !asked {
        eprintln!("a benchmark: set STOKER_BENCH=1 to run it");
    }
    asked
}

/// The longest gap between two batches of any rank within `[from, to]`, and batches per second
/// in it.
fn window(times: &[Vec<Instant>], from: Instant, to: Instant) -> (Duration, f64) {
    let mut longest = Duration::ZERO;
    let mut count = 0;
    for rank in times {
        let inside: Vec<Instant> = rank.iter().copied().filter(|at| *at >= from && *at <= to).collect();
        count += inside.len();
        longest = longest.max(inside.windows(2).map(|pair| pair[1] - pair[0]).max().unwrap_or_default());
    }
    (longest, count as f64 / (to - from).as_secs_f64())
}

#[test]
#[ignore = "benchmark: run by hand for BENCHMARKS.md"]
fn raft_bench_failover_gap_over_leader_kills() {
    if !benchmarking() {
        return;
    }
    let config = ClusterConfig { workers: 2, coordinators: 3, ..Default::default() };
    let mut cluster = TestCluster::start(config).expect("cluster");
    cluster.add_dataset("train", &dataset()).expect("dataset");
    cluster.wait_for_workers().expect("workers");
    let mut base = cluster.loader_config("train", 4);
    base.tail = Tail::Partial;
    base.prefetch = 4;
    let stop = Arc::new(AtomicBool::new(false));
    let times: Arc<Vec<Mutex<Vec<Instant>>>> = Arc::new((0..2).map(|_| Mutex::new(Vec::new())).collect());
    let ranks: Vec<_> = (0..2u32)
        .map(|rank| {
            let config = config_for(&base, rank, 2);
            let (stop, times) = (Arc::clone(&stop), Arc::clone(&times));
            std::thread::spawn(move || {
                let mut loader = Loader::attach(&config).expect("attach");
                for epoch in 0..100_000 {
                    loader.set_epoch(Epoch(epoch));
                    for batch in &mut loader {
                        batch.expect("batch");
                        times[rank as usize].lock().expect("times").push(Instant::now());
                        // ~50 batches a second per rank: a trainer's pace, not a flood.
                        std::thread::park_timeout(Duration::from_millis(20));
                    }
                    if stop.load(Ordering::Relaxed) {
                        return;
                    }
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs(3));
    let mut kills = Vec::new();
    for _ in 0..kill_count() {
        let leader = cluster.wait_for_leader(Duration::from_secs(10)).expect("leader");
        let killed = Instant::now();
        tracing::info!(leader, "BENCH: killing the leader");
        cluster.kill_coordinator_node(leader);
        let elected = cluster.wait_for_leader(Duration::from_secs(10)).expect("new leader");
        let election = killed.elapsed();
        assert_ne!(elected, leader);
        std::thread::sleep(Duration::from_millis(4000));
        cluster.start_coordinator_node(leader).expect("restart");
        std::thread::sleep(Duration::from_millis(3000));
        kills.push((killed, election));
    }
    stop.store(true, Ordering::Relaxed);
    for rank in ranks {
        rank.join().expect("rank");
    }
    let times: Vec<Vec<Instant>> = times.iter().map(|rank| rank.lock().expect("times").clone()).collect();
    let first = times.iter().filter_map(|rank| rank.first()).min().copied().expect("batches");
    let (quiet_gap, quiet_rate) = window(&times, first + Duration::from_millis(500), kills[0].0);
    eprintln!("| kill | new leader after | longest gap of a rank across the kill | batches/s 2 s before | batches/s 1–3 s after |");
    eprintln!("|---|---|---|---|---|");
    let mut gaps = Vec::new();
    for (index, (killed, election)) in kills.iter().enumerate() {
        // The longest gap between two batches of a rank that starts from 1 s before the kill
        // to 6 s after it (it may end later).
        let (from, to) = (*killed - Duration::from_secs(1), *killed + Duration::from_secs(6));
        let gap = times
            .iter()
            .flat_map(|rank| rank.windows(2).filter(|pair| pair[0] >= from && pair[0] <= to).map(|pair| pair[1] - pair[0]))
            .max()
            .unwrap_or_default();
        let (_, before) = window(&times, *killed - Duration::from_secs(2), *killed);
        let (_, after) = window(&times, *killed + Duration::from_secs(1), *killed + Duration::from_secs(3));
        eprintln!(
            "| {} | {:.0} ms | {:.0} ms | {before:.0} | {after:.0} |",
            index + 1,
            election.as_secs_f64() * 1e3,
            gap.as_secs_f64() * 1e3
        );
        gaps.push(gap);
    }
    gaps.sort();
    eprintln!(
        "no kill: longest gap {:.0} ms at {quiet_rate:.0} batches/s; over {} kills: median gap {:.0} ms, worst {:.0} ms",
        quiet_gap.as_secs_f64() * 1e3,
        gaps.len(),
        gaps[gaps.len() / 2].as_secs_f64() * 1e3,
        gaps[gaps.len() - 1].as_secs_f64() * 1e3
    );
}

/// Committed commands per second on one coordinator and on three (loopback), one at a time
/// (latency) and 64 in flight (what batching gives).
#[test]
#[ignore = "benchmark: run by hand for BENCHMARKS.md"]
fn raft_bench_write_throughput() {
    if !benchmarking() {
        return;
    }
    eprintln!("| coordinators | in flight | commits | seconds | commits/s | ms per commit |");
    eprintln!("|---|---|---|---|---|---|");
    for coordinators in [1, 3] {
        let cluster = TestCluster::start(ClusterConfig { workers: 0, coordinators, ..Default::default() }).expect("cluster");
        let leader = cluster.wait_for_leader(Duration::from_secs(10)).expect("leader");
        let handle = cluster.coordinator_node(leader).expect("leader handle");
        let command = |index: u64| Command::RecordCheckpoint {
            job: JobId(u64::MAX),
            checkpoint: Checkpoint { version: 1, epoch: Epoch(0), position: Position(index), order_fingerprint: 0 },
        };
        for in_flight in [1u64, 64] {
            let commits = if in_flight == 1 { 500 } else { 10_000 };
            let started = Instant::now();
            let raft = handle.raft();
            cluster.block_on(async {
                for wave in 0..commits / in_flight {
                    let pending: Vec<_> = (0..in_flight)
                        .map(|index| {
                            let (raft, command) = (raft.clone(), command(wave * in_flight + index));
                            tokio::spawn(async move { raft.client_write(command).await.map(|_| ()).map_err(|error| error.to_string()) })
                        })
                        .collect();
                    for commit in pending {
                        commit.await.expect("task").expect("commit");
                    }
                }
            });
            let seconds = started.elapsed().as_secs_f64();
            eprintln!(
                "| {coordinators} | {in_flight} | {commits} | {seconds:.2} | {:.0} | {:.2} |",
                commits as f64 / seconds,
                seconds * 1e3 / commits as f64 * in_flight as f64
            );
        }
    }
}
