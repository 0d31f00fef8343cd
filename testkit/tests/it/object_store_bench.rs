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
//!
//! Then the cold epoch again with ranks that compute for a while on each batch (so that local
//! disk keeps up with them) and a link that can carry what they consume: where in the epoch the
//! ranks wait, step by step.

use std::path::Path;
use std::time::{Duration, Instant};

use stoker_client::Loader;
use stoker_format::Manifest;
use stoker_plan::ids::Epoch;
use stoker_plan::{Shuffle, Tail};
use stoker_testkit::fault_proxy::{FaultProxy, Faults};
use stoker_testkit::moto::MotoServer;
use stoker_testkit::netns::{Impairment, Lab};
use stoker_testkit::{ClusterConfig, TestCluster};

use crate::common::small_transforms;

/// One epoch of both ranks.
#[derive(Clone, Debug, Default)]
struct EpochFigure {
    /// The slower rank's time.
    seconds: f64,
    images: u64,
    /// Both ranks' wait for batches, as the loader counts it.
    waited: f64,
    /// Both ranks' wait for each step's batch, step by step (the time `next` took).
    step_waits: Vec<f64>,
}

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

/// Run `epochs` epochs on `cluster`, each rank spending `compute` on every batch (a training
/// step), calling `after_epoch` once both ranks finished each.
fn run_epochs(
    cluster: &TestCluster,
    dataset: &str,
    epochs: u64,
    compute: Duration,
    after_epoch: &(dyn Fn(u64) + Sync),
) -> Vec<EpochFigure> {
    let mut base = cluster.loader_config(dataset, 16);
    base.tail = Tail::Drop;
    base.shuffle = Shuffle::Window { shards: std::num::NonZeroU32::new(4).expect("4") };
    base.transforms = small_transforms();
    let barrier = std::sync::Barrier::new(2);
    let per_rank: Vec<Vec<EpochFigure>> = std::thread::scope(|scope| {
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
                        let mut step_waits = Vec::new();
                        loop {
                            let asked = Instant::now();
                            let Some(batch) = loader.next_batch() else { break };
                            step_waits.push(asked.elapsed().as_secs_f64());
                            images += batch.expect("batch").keys().len() as u64;
                            std::thread::sleep(compute);
                        }
                        figures.push(EpochFigure {
                            seconds: started.elapsed().as_secs_f64(),
                            images,
                            waited: loader.epoch_wait_seconds(),
                            step_waits,
                        });
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
            let of_epoch: Vec<&EpochFigure> = per_rank.iter().map(|figures| &figures[epoch]).collect();
            let steps = of_epoch.iter().map(|figure| figure.step_waits.len()).max().unwrap_or(0);
            EpochFigure {
                seconds: of_epoch.iter().map(|figure| figure.seconds).fold(0.0, f64::max),
                images: of_epoch.iter().map(|figure| figure.images).sum(),
                waited: of_epoch.iter().map(|figure| figure.waited).sum(),
                step_waits: (0..steps).map(|step| of_epoch.iter().filter_map(|figure| figure.step_waits.get(step)).sum()).collect(),
            }
        })
        .collect()
}

/// One row of the table; `counters` (of that epoch) and `dataset` (bytes) for a remote one.
fn row(what: &str, figure: &EpochFigure, counters: Option<(Counters, u64)>) {
    let EpochFigure { seconds, images, waited, .. } = *figure;
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

/// The benchmark's dataset, in a folder and in moto.
struct Bench {
    _dir: std::path::PathBuf,
    manifest_path: std::path::PathBuf,
    manifest: Manifest,
    moto: MotoServer,
}

impl Bench {
    /// 960 sample JPEGs in shards of about 128 KiB, on local disk and uploaded to `moto`.
    fn start(moto: MotoServer) -> Self {
        let dir = stoker_testkit::unique_temp_dir("stoker-s3-bench").expect("temp dir");
        let manifest_path = stoker_testkit::sample_dataset(&dir, 8, 120, 128 << 10).expect("dataset");
        let manifest = Manifest::load(&manifest_path).expect("manifest");
        moto.create_bucket("data").expect("bucket");
        moto.upload_folder(manifest_path.parent().expect("folder"), "s3://data/train").expect("upload");
        Self { _dir: dir, manifest_path, manifest, moto }
    }

    /// A link to moto of `latency` per request and `bandwidth` bytes a second per connection:
    /// the test proxy on `127.0.0.<host>`.
    fn link(&self, host: u8, latency: Duration, bandwidth: u64) -> FaultProxy {
        let link = Faults { latency_opt: Some(latency), bytes_per_second_opt: Some(bandwidth), ..Faults::default() };
        let proxy = FaultProxy::start(host, self.moto.addr(), link).expect("proxy");
        self.describe(&format!(
            "{} ms per request, {:.0} MB/s per connection (the test proxy)",
            latency.as_millis(),
            bandwidth as f64 / 1e6
        ));
        proxy
    }

    fn describe(&self, link: &str) {
        eprintln!(
            "dataset: {} images in {} shards, {:.1} MB; link: {link}",
            self.manifest.samples(),
            self.manifest.shards.len(),
            self.manifest.bytes() as f64 / 1e6,
        );
    }

    /// A cluster of 2 workers (chunks of 2 steps) reading the store at `endpoint`, each with a
    /// cache of `cache_bytes` and fetching `fetch_ahead` steps ahead.
    fn cluster(&self, endpoint: String, fetch_ahead: u32, cache_bytes: u64) -> TestCluster {
        let mut store = self.moto.store_config();
        store.endpoint_opt = Some(endpoint);
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
    }

    /// `epochs` epochs of the dataset in moto on `cluster`, with the counters of each.
    fn remote_epochs(&self, cluster: &TestCluster, epochs: u64, compute: Duration) -> Vec<(EpochFigure, Counters)> {
        cluster.add_dataset("remote", Path::new("s3://data/train")).expect("remote");
        let counted = std::sync::Mutex::new(vec![Counters::default()]);
        let figures = run_epochs(cluster, "remote", epochs, compute, &|_| counted.lock().expect("counters").push(Counters::of(cluster)));
        let counted = counted.into_inner().expect("counters");
        figures.into_iter().enumerate().map(|(epoch, figure)| (figure, counted[epoch + 1].since(counted[epoch]))).collect()
    }
}

const TABLE_HEAD: &str = "| run | images/s | data stall (share of the epoch the ranks waited) | fetched in the epoch, both workers (x the dataset) | cache hit rate |\n|---|---|---|---|---|";

#[test]
#[ignore = "a benchmark: run it by name (BENCHMARKS.md)"]
fn object_store_bench() {
    let bench = Bench::start(MotoServer::start(41, false).expect("moto"));
    let proxy = bench.link(42, Duration::from_millis(20), 4_000_000);
    bench_table(&bench, &proxy.endpoint());
}

/// The same benchmark with moto on a host of a netns lab behind its delay line (issue 30's
/// "the netns lab's delay line"): 10 ms each way on the store's link (20 ms a round trip) and
/// 100 Mbit/s each way, for every connection together; the cluster on another host. Needs root.
#[test]
#[ignore = "a benchmark: run it by name (BENCHMARKS.md)"]
fn object_store_bench_netns() {
    if let Some(reason) = stoker_testkit::netns::unavailable() {
        panic!("{reason}");
    }
    let lab = Lab::new(&["s3", "cluster"], 1500).expect("lab");
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                // Every thread the cluster, the ranks and moto's client start from here is on
                // this host.
                lab.enter("cluster").expect("enter the cluster's host");
                let bench = Bench::start(MotoServer::start_in(&lab, "s3").expect("moto"));
                let link = Impairment { delay: Duration::from_millis(10), rate_bits_per_sec: 100_000_000, ..Impairment::default() };
                lab.impair("s3", link).expect("impair the store's link");
                bench.describe("the netns lab's delay line: 20 ms a round trip, 100 Mbit/s for every connection together");
                bench_table(&bench, &bench.moto.endpoint());
                let (dropped, forwarded) = lab.delay_line_counts();
                eprintln!("delay line: {forwarded} packets forwarded, {dropped} dropped");
            })
            .join()
            .expect("the benchmark's host thread");
    });
}

/// Local disk, then the store at `endpoint` with caches of the dataset and of half of it,
/// fetch-ahead off and on, three epochs each.
fn bench_table(bench: &Bench, endpoint: &str) {
    eprintln!("{TABLE_HEAD}");
    let dataset_bytes = bench.manifest.bytes();
    {
        let cluster = bench.cluster(endpoint.to_owned(), 0, 1 << 30);
        cluster.add_dataset("local", &bench.manifest_path).expect("local");
        let figures = run_epochs(&cluster, "local", 2, Duration::ZERO, &|_| {});
        row("local disk, epoch 0", &figures[0], None);
        row("local disk, epoch 1", &figures[1], None);
    }
    for (cache_name, cache_bytes) in [("the dataset", 1 << 30), ("half the dataset", dataset_bytes / 2)] {
        for fetch_ahead in [0, 8] {
            let cluster = bench.cluster(endpoint.to_owned(), fetch_ahead, cache_bytes);
            let mode = if fetch_ahead == 0 { "off" } else { "8 steps" };
            for (epoch, (figure, counters)) in bench.remote_epochs(&cluster, 3, Duration::ZERO).iter().enumerate() {
                let when = if epoch == 0 { "cold epoch".to_owned() } else { format!("warm epoch {epoch}") };
                row(&format!("S3, cache of {cache_name}, fetch-ahead {mode}, {when}"), figure, Some((*counters, dataset_bytes)));
            }
        }
    }
}

/// Where the ranks wait in an epoch: both ranks' wait at each step, in ms, and the share of
/// the ranks' time they waited after the first chunk (its first `chunk_steps` steps).
fn stall_by_step(what: &str, figure: &EpochFigure, chunk_steps: usize) {
    let waits: Vec<String> = figure.step_waits.iter().map(|wait| format!("{:.0}", wait * 1e3)).collect();
    let first: f64 = figure.step_waits.iter().take(chunk_steps).sum();
    let after: f64 = figure.step_waits.iter().skip(chunk_steps).sum();
    eprintln!("{what}: both ranks' wait per step (ms): {}", waits.join(" "));
    eprintln!(
        "{what}: waited {:.0} ms in the first chunk (steps 0-{}), {:.0} ms after it, {:.0}% of the epoch's rank time",
        first * 1e3,
        chunk_steps - 1,
        after * 1e3,
        100.0 * figure.waited / (2.0 * figure.seconds)
    );
}

/// The cold epoch of ranks that compute 40 ms on each batch (800 images a second from both,
/// 12 MB/s of this dataset: local disk keeps up) with a link that carries that (20 ms per
/// request, 32 MB/s per connection): is the stall confined to the first window?
#[test]
#[ignore = "a benchmark: run it by name (BENCHMARKS.md)"]
fn object_store_cold_stall() {
    let bench = Bench::start(MotoServer::start(43, false).expect("moto"));
    let proxy = bench.link(44, Duration::from_millis(20), 32_000_000);
    let compute = Duration::from_millis(40);
    let dataset_bytes = bench.manifest.bytes();
    eprintln!("ranks compute {} ms a batch", compute.as_millis());
    eprintln!("{TABLE_HEAD}");
    let mut details = Vec::new();
    {
        let cluster = bench.cluster(proxy.endpoint(), 0, 1 << 30);
        cluster.add_dataset("local", &bench.manifest_path).expect("local");
        let figures = run_epochs(&cluster, "local", 2, compute, &|_| {});
        row("local disk, epoch 0", &figures[0], None);
        row("local disk, epoch 1", &figures[1], None);
        details.push(("local disk, epoch 0".to_owned(), figures[0].clone()));
    }
    for fetch_ahead in [0, 8] {
        let cluster = bench.cluster(proxy.endpoint(), fetch_ahead, 1 << 30);
        let mode = if fetch_ahead == 0 { "off" } else { "8 steps" };
        for (epoch, (figure, counters)) in bench.remote_epochs(&cluster, 2, compute).into_iter().enumerate() {
            let what = format!("S3, fetch-ahead {mode}, {}", if epoch == 0 { "cold epoch" } else { "warm epoch" });
            row(&what, &figure, Some((counters, dataset_bytes)));
            details.push((what, figure));
        }
    }
    for (what, figure) in &details {
        stall_by_step(what, figure, 2);
    }
}
