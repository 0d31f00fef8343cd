//! The object-store benchmark of BENCHMARKS.md (issue 30), `#[ignore]`d: run it by name.
//!
//! ```text
//! STOKER_PYTHON=.venv/bin/python cargo test --release -p stoker-testkit --test it -- --ignored --nocapture \
//!     --exact object_store_bench::object_store_bench
//! ```
//!
//! One in-process cluster per row group (2 workers, 2 ranks), the same dataset read from local
//! disk and from moto behind a link of the fault proxy (the delay line: a fixed latency per
//! request and a bandwidth cap per connection): images per second, the ranks' data stall (the
//! share of the epoch a rank waited for batches), the bytes both workers fetched and the hit
//! rate of their caches, epoch by epoch: a cold epoch (empty caches) and warm ones, with
//! fetch-ahead on and off, with a cache per worker that holds the dataset and one of half of it.

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

/// The cache counters of both workers of `cluster` so far: bytes fetched, hits, misses.
#[derive(Clone, Copy, Debug, Default)]
struct Counters {
    fetched: u64,
    hits: u64,
    misses: u64,
}

impl Counters {
    fn of(cluster: &TestCluster) -> Self {
        let texts: Vec<String> = (0..2).map(|worker| cluster.worker_metrics_text(worker).expect("metrics")).collect();
        let sum = |name: &str| -> u64 {
            texts
                .iter()
                .flat_map(|text| text.lines())
                .filter_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.trim().parse::<f64>().ok())
                .map(|value| value as u64)
                .sum()
        };
        Self {
            fetched: sum("stoker_worker_fetched_bytes_total"),
            hits: sum("stoker_worker_cache_hits_total"),
            misses: sum("stoker_worker_cache_misses_total"),
        }
    }

    fn since(self, before: Self) -> Self {
        Self {
            fetched: self.fetched.saturating_sub(before.fetched),
            hits: self.hits.saturating_sub(before.hits),
            misses: self.misses.saturating_sub(before.misses),
        }
    }
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

/// One row of the table; `counters` (of that epoch) and `dataset` (bytes) for a remote one.
fn row(what: &str, (seconds, images, waited): (f64, u64, f64), counters: Option<(Counters, u64)>) {
    let stall = waited / (2.0 * seconds);
    let (fetched, hit_rate) = match counters {
        Some((counters, dataset)) => {
            let claims = counters.hits + counters.misses;
            let rate = if claims == 0 { 0.0 } else { 100.0 * counters.hits as f64 / claims as f64 };
            (format!("{:.2}x", counters.fetched as f64 / dataset as f64), format!("{rate:.0}%"))
        }
        None => (String::new(), String::new()),
    };
    eprintln!("| {what} | {:.0} | {:.0}% | {fetched} | {hit_rate} |", images as f64 / seconds, 100.0 * stall);
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
    eprintln!(
        "| run | images/s | data stall (share of the epoch the ranks waited) | fetched in the epoch, both workers (x the dataset) | cache hit rate |\n|---|---|---|---|---|"
    );
    let dataset_bytes = manifest.bytes();
    let cluster_with = |fetch_ahead: u32, cache_bytes: u64| {
        let mut store = moto.store_config();
        store.endpoint_opt = Some(proxy.endpoint());
        let cache = stoker_testkit::unique_temp_dir("stoker-s3-bench-cache").expect("temp dir");
        let cluster = TestCluster::start(ClusterConfig {
            workers: 2,
            object_store: Some(store),
            worker_cache: Some((cache, cache_bytes)),
            fetch_ahead_steps: Some(fetch_ahead),
            chunk_steps: 2,
            ..ClusterConfig::default()
        })
        .expect("cluster");
        cluster.wait_for_workers().expect("workers");
        cluster
    };
    {
        let cluster = cluster_with(0, 1 << 30);
        cluster.add_dataset("local", &manifest_path).expect("local");
        let figures = run_epochs(&cluster, "local", 2, &|_| {});
        row("local disk, epoch 0", figures[0], None);
        row("local disk, epoch 1", figures[1], None);
    }
    let epochs = 3;
    for (cache_name, cache_bytes) in [("the dataset", 1 << 30), ("half the dataset", dataset_bytes / 2)] {
        for fetch_ahead in [0, 8] {
            let cluster = cluster_with(fetch_ahead, cache_bytes);
            cluster.add_dataset("remote", Path::new("s3://data/train")).expect("remote");
            let counted = std::sync::Mutex::new(vec![Counters::default()]);
            let figures = run_epochs(&cluster, "remote", epochs, &|_| counted.lock().expect("counters").push(Counters::of(&cluster)));
            let counted = counted.into_inner().expect("counters");
            let mode = if fetch_ahead == 0 { "off" } else { "8 steps" };
            for (epoch, figures) in figures.into_iter().enumerate() {
                let when = if epoch == 0 { "cold epoch".to_owned() } else { format!("warm epoch {epoch}") };
                let counters = counted[epoch + 1].since(counted[epoch]);
                row(&format!("S3, cache of {cache_name}, fetch-ahead {mode}, {when}"), figures, Some((counters, dataset_bytes)));
            }
        }
    }
    let _ = Path::new(&dir);
}
