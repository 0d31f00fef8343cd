//! The object-store benchmark of BENCHMARKS.md (issue 30), `#[ignore]`d: run it by name.
//!
//! ```text
//! STOKER_PYTHON=.venv/bin/python cargo test -p stoker-testkit --test it -- --ignored --nocapture \
//!     object_store_bench
//! ```
//!
//! One in-process cluster per row (2 workers, 2 ranks), the same dataset read from local disk
//! and from moto behind a link of the fault proxy (a fixed latency per request and a bandwidth
//! cap): images per second and the ranks' data stall (the share of the epoch a rank waited for
//! batches) for a cold epoch (empty caches) and a warm one, with fetch-ahead on and off.

use std::path::Path;
use std::time::{Duration, Instant};

use stoker_client::Loader;
use stoker_format::Manifest;
use stoker_plan::ids::Epoch;
use stoker_plan::{Shuffle, Tail};
use stoker_testkit::fault_proxy::{FaultProxy, Faults};
use stoker_testkit::moto::MotoServer;
use stoker_testkit::{ClusterConfig, TestCluster};

use crate::common::small_transforms;

/// Per epoch: (seconds, images, the ranks' total wait seconds).
type EpochFigures = Vec<(f64, u64, f64)>;

/// Bytes the workers of `cluster` fetched from the store so far, both together.
fn fetched_bytes(cluster: &TestCluster) -> u64 {
    (0..2)
        .map(|worker| cluster.worker_metrics_text(worker).expect("metrics"))
        .flat_map(|text| {
            text.lines()
                .filter_map(|line| line.strip_prefix("stoker_worker_fetched_bytes_total ").and_then(|v| v.trim().parse::<u64>().ok()))
                .collect::<Vec<_>>()
        })
        .sum()
}

/// Run `epochs` epochs on `cluster`, calling `after_epoch` once both ranks finished each.
fn run_epochs(cluster: &TestCluster, dataset: &str, epochs: u64, after_epoch: &(dyn Fn(u64) + Sync)) -> EpochFigures {
    let mut base = cluster.loader_config(dataset, 16);
    base.tail = Tail::Drop;
    base.shuffle = Shuffle::Window { shards: std::num::NonZeroU32::new(4).expect("4") };
    base.transforms = small_transforms();
    let barrier = std::sync::Barrier::new(2);
    let per_rank: Vec<EpochFigures> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..2_u32)
            .map(|rank| {
                let mut config = base.clone();
                config.rank = Some(rank);
                config.world_size = Some(2);
                let barrier = &barrier;
                scope.spawn(move || {
                    let mut loader = Loader::attach(&config).expect("attach");
                    let mut figures = Vec::new();
                    for epoch in 0..epochs {
                        loader.set_epoch(Epoch(epoch));
                        let started = Instant::now();
                        let mut images = 0;
                        for batch in &mut loader {
                            images += batch.expect("batch").keys().len() as u64;
                        }
                        figures.push((started.elapsed().as_secs_f64(), images, loader.epoch_wait_seconds()));
                        if barrier.wait().is_leader() {
                            after_epoch(epoch);
                        }
                        barrier.wait();
                    }
                    figures
                })
            })
            .collect();
        handles.into_iter().map(|handle| handle.join().expect("rank")).collect()
    });
    (0..epochs as usize)
        .map(|epoch| {
            let seconds = per_rank.iter().map(|figures| figures[epoch].0).fold(0.0, f64::max);
            let images = per_rank.iter().map(|figures| figures[epoch].1).sum();
            let waited = per_rank.iter().map(|figures| figures[epoch].2).sum();
            (seconds, images, waited)
        })
        .collect()
}

fn row(what: &str, (seconds, images, waited): (f64, u64, f64)) {
    let stall = waited / (2.0 * seconds);
    eprintln!("| {what} | {:.0} | {:.0}% |", images as f64 / seconds, 100.0 * stall);
}

#[test]
#[ignore = "a benchmark: run it by name (BENCHMARKS.md)"]
fn object_store_bench() {
    let dir = stoker_testkit::unique_temp_dir("stoker-s3-bench").expect("temp dir");
    let manifest_path = stoker_testkit::sample_dataset(&dir, 8, 120, 128 << 10).expect("dataset");
    let manifest = Manifest::load(&manifest_path).expect("manifest");
    let moto = MotoServer::start(41, false).expect("moto");
    moto.create_bucket("data").expect("bucket");
    moto.upload_folder(manifest_path.parent().expect("folder"), "s3://data/train").expect("upload");
    let latency = Duration::from_millis(20);
    let bandwidth = 4_000_000;
    let link = Faults { latency_opt: Some(latency), bytes_per_second_opt: Some(bandwidth), ..Faults::default() };
    let proxy = FaultProxy::start(42, moto.addr(), link).expect("proxy");
    eprintln!(
        "dataset: {} images in {} shards, {:.1} MB; link: {} ms per request, {:.0} MB/s per connection",
        manifest.samples(),
        manifest.shards.len(),
        manifest.bytes() as f64 / 1e6,
        latency.as_millis(),
        bandwidth as f64 / 1e6
    );
    eprintln!("| run | images/s | data stall (share of the epoch the ranks waited) |\n|---|---|---|");
    let cluster_with = |fetch_ahead: u32| {
        let mut store = moto.store_config();
        store.endpoint_opt = Some(proxy.endpoint());
        let cache = stoker_testkit::unique_temp_dir("stoker-s3-bench-cache").expect("temp dir");
        let cluster = TestCluster::start(ClusterConfig {
            workers: 2,
            object_store: Some(store),
            worker_cache: Some((cache, 1 << 30)),
            fetch_ahead_steps: Some(fetch_ahead),
            chunk_steps: 2,
            ..ClusterConfig::default()
        })
        .expect("cluster");
        cluster.wait_for_workers().expect("workers");
        cluster
    };
    {
        let cluster = cluster_with(0);
        cluster.add_dataset("local", &manifest_path).expect("local");
        let figures = run_epochs(&cluster, "local", 2, &|_| {});
        row("local disk, epoch 0", figures[0]);
        row("local disk, epoch 1", figures[1]);
    }
    for fetch_ahead in [0, 8] {
        let cluster = cluster_with(fetch_ahead);
        cluster.add_dataset("remote", Path::new("s3://data/train")).expect("remote");
        let cold = std::sync::atomic::AtomicU64::new(0);
        let figures = run_epochs(&cluster, "remote", 2, &|epoch| {
            if epoch == 0 {
                cold.store(fetched_bytes(&cluster), std::sync::atomic::Ordering::Relaxed);
            }
        });
        let mode = if fetch_ahead == 0 { "off" } else { "8 steps" };
        row(&format!("S3, fetch-ahead {mode}, cold epoch"), figures[0]);
        row(&format!("S3, fetch-ahead {mode}, warm epoch"), figures[1]);
        let (cold, total) = (cold.load(std::sync::atomic::Ordering::Relaxed), fetched_bytes(&cluster));
        let dataset = manifest.bytes() as f64;
        eprintln!(
            "(fetch-ahead {mode}: {:.2}x the dataset fetched over both epochs, both workers: {:.2}x in the cold epoch, {:.2}x in the warm one)",
            total as f64 / dataset,
            cold as f64 / dataset,
            total.saturating_sub(cold) as f64 / dataset
        );
    }
    let _ = Path::new(&dir);
}
