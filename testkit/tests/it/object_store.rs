//! Datasets in an object store (issue 30), against a real S3-compatible server the tests
//! start themselves (moto, `STOKER_PYTHON`'s venv; no mock of the client): trained exactly once
//! with the checksums of the local copy, the cache's bound, a cache too small, what a crash
//! mid-download leaves, and errors that name the URI and never a credential.

use std::collections::{BTreeMap, BTreeSet};
use std::num::NonZeroU32;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use stoker_client::{Loader, LoaderConfig};
use stoker_format::Manifest;
use stoker_plan::ids::Epoch;
use stoker_plan::{Shuffle, Tail};
use stoker_testkit::fault_proxy::{FaultProxy, Faults};
use stoker_testkit::moto::{MotoServer, TEST_ACCESS_KEY_ID, TEST_SECRET_ACCESS_KEY};
use stoker_testkit::{ClusterConfig, TestCluster};
use tracing::info;

use crate::common::{Seen, small_transforms};

/// Checksums by (rank, epoch, step), and every key seen, by epoch.
type Run = (BTreeMap<(u32, u64, u64), u64>, BTreeMap<u64, Vec<String>>);

/// A dataset of 6 classes × `per_class` images in shards of about `shard_bytes`, in a folder
/// of its own; returns its manifest.
fn local_dataset(per_class: u32, shard_bytes: u64) -> PathBuf {
    let dir = stoker_testkit::unique_temp_dir("stoker-s3-data").expect("temp dir");
    stoker_testkit::sample_dataset(&dir, 6, per_class, shard_bytes).expect("dataset")
}

/// Moto on `host` with bucket `data` holding the folder of `manifest` under `data/train`.
fn moto_with(host: u8, manifest: &Path) -> MotoServer {
    let moto = MotoServer::start(host, false).expect("moto");
    moto.create_bucket("data").expect("bucket");
    moto.upload_folder(manifest.parent().expect("a folder"), "s3://data/train").expect("upload");
    moto
}

fn cluster(moto: &MotoServer, cache: Option<(PathBuf, u64)>, chunk_steps: u32) -> TestCluster {
    let cluster = TestCluster::start(ClusterConfig {
        workers: 2,
        object_store: Some(moto.store_config()),
        worker_cache: cache,
        chunk_steps,
        ..ClusterConfig::default()
    })
    .expect("cluster");
    cluster.wait_for_workers().expect("workers");
    cluster
}

/// `world_size` ranks consume `epochs` epochs of `base` (each on its own thread).
fn consume(base: &LoaderConfig, world_size: u32, epochs: u64) -> Result<Run, String> {
    let handles: Vec<_> = (0..world_size)
        .map(|rank| {
            let mut config = base.clone();
            config.rank = Some(rank);
            config.world_size = Some(world_size);
            config.transforms = small_transforms();
            std::thread::spawn(move || -> Result<(u32, Vec<Seen>), String> {
                let mut loader = Loader::attach(&config).map_err(|error| error.to_string())?;
                let mut seen = Vec::new();
                for epoch in 0..epochs {
                    loader.set_epoch(Epoch(epoch));
                    for batch in &mut loader {
                        let batch = batch.map_err(|error| error.to_string())?;
                        seen.push(Seen { epoch, step: batch.step().0, keys: batch.keys().to_vec(), checksum: batch.checksum() });
                    }
                }
                Ok((rank, seen))
            })
        })
        .collect();
    let mut run: Run = Default::default();
    for handle in handles {
        let (rank, seen) = handle.join().map_err(|_| "a rank's thread panicked".to_owned())??;
        for record in seen {
            run.0.insert((rank, record.epoch, record.step), record.checksum);
            run.1.entry(record.epoch).or_default().extend(record.keys);
        }
    }
    Ok(run)
}

fn assert_every_key_once(run: &Run, samples: u64, epochs: u64) {
    for epoch in 0..epochs {
        let keys = run.1.get(&epoch).cloned().unwrap_or_default();
        let unique: BTreeSet<&String> = keys.iter().collect();
        assert_eq!((keys.len() as u64, unique.len() as u64), (samples, samples), "epoch {epoch}: every sample exactly once");
    }
}

fn assert_no_credentials(text: &str) {
    assert!(!text.contains(TEST_SECRET_ACCESS_KEY), "the secret key leaked: {text}");
    assert!(!text.contains(TEST_ACCESS_KEY_ID), "the access key id leaked: {text}");
}

/// Bytes of the files in `dir`.
fn folder_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|entries| entries.flatten().filter_map(|entry| entry.metadata().ok()).map(|meta| meta.len()).sum())
        .unwrap_or(0)
}

/// A dataset packed to `s3://` and trained on by 2 workers and 2 ranks over 2 epochs: every
/// sample exactly once per epoch, and every batch's checksum the one the same dataset read
/// from a local path gives.
#[test]
#[ignore = "needs STOKER_PYTHON with moto[server] (make test)"]
fn a_dataset_in_s3_is_trained_exactly_once_with_the_checksums_of_its_local_copy() {
    let manifest = local_dataset(20, 64 << 10);
    let samples = Manifest::load(&manifest).expect("manifest").samples();
    let moto = moto_with(21, &manifest);
    let cache = stoker_testkit::unique_temp_dir("stoker-s3-cache").expect("temp dir");
    let cluster = cluster(&moto, Some((cache, 64 << 20)), 2);
    let local = {
        info!("--- the local copy");
        cluster.add_dataset("local", &manifest).expect("local dataset");
        let mut base = cluster.loader_config("local", 8);
        base.tail = Tail::Partial;
        consume(&base, 2, 2).expect("local run")
    };
    info!("--- the copy in S3");
    let added = cluster.add_dataset("remote", Path::new("s3://data/train")).expect("s3 dataset");
    assert_eq!(added.manifest, "s3://data/train/manifest.json");
    let mut base = cluster.loader_config("remote", 8);
    base.tail = Tail::Partial;
    let remote = consume(&base, 2, 2).expect("s3 run");
    assert_every_key_once(&remote, samples, 2);
    assert_eq!(remote.0, local.0, "every batch as from the local copy");
    let metrics: String = (0..2).map(|worker| cluster.worker_metrics_text(worker).expect("metrics")).collect();
    assert!(metrics.contains("stoker_worker_cache_misses_total"), "{metrics}");
    assert_no_credentials(&metrics);
}

/// Three epochs of a dataset three times the cache (shuffle window of 2 shards): the files in
/// each worker's cache never exceed its bound, shards are evicted, and every sample comes once
/// per epoch. A cache below one chunk's shards is refused with the size it needs.
#[test]
#[ignore = "needs STOKER_PYTHON with moto[server] (make test)"]
fn the_cache_stays_under_its_bound_and_a_cache_below_the_working_set_is_refused_with_the_size_needed() {
    let manifest_path = local_dataset(24, 16 << 10);
    let manifest = Manifest::load(&manifest_path).expect("manifest");
    let largest = manifest.shards.iter().map(|shard| shard.bytes).max().unwrap_or(0);
    let capacity = (manifest.bytes() / 3).max(6 * largest);
    info!(shards = manifest.shards.len(), bytes = manifest.bytes(), capacity, "dataset and cache");
    assert!(manifest.bytes() >= 3 * capacity - 3 * largest, "the dataset is about 3x the cache");
    let moto = moto_with(22, &manifest_path);
    let cache = stoker_testkit::unique_temp_dir("stoker-s3-cache").expect("temp dir");
    {
        info!("--- 3 epochs, the cache's files measured all along");
        let cluster = cluster(&moto, Some((cache.clone(), capacity)), 1);
        cluster.add_dataset("train", Path::new("s3://data/train/manifest.json")).expect("dataset");
        let (stop, most) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU64::new(0)));
        let watcher = {
            let (stop, most, cache) = (Arc::clone(&stop), Arc::clone(&most), cache.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    for worker in 0..2 {
                        most.fetch_max(folder_bytes(&cache.join(format!("worker-{worker}"))), Ordering::Relaxed);
                    }
                    std::thread::park_timeout(Duration::from_millis(5));
                }
            })
        };
        let mut base = cluster.loader_config("train", 4);
        base.tail = Tail::Partial;
        base.shuffle = Shuffle::Window { shards: NonZeroU32::new(2).expect("2") };
        let run = consume(&base, 2, 3).expect("3 epochs");
        stop.store(true, Ordering::Relaxed);
        watcher.join().expect("watcher");
        assert_every_key_once(&run, manifest.samples(), 3);
        let most = most.load(Ordering::Relaxed);
        assert!(most <= capacity, "a worker's cache held {most} bytes, over its bound of {capacity}");
        let metrics: String = (0..2).map(|worker| cluster.worker_metrics_text(worker).expect("metrics")).collect();
        let evictions: u64 = metrics
            .lines()
            .filter_map(|line| line.strip_prefix("stoker_worker_cache_evictions_total "))
            .filter_map(|value| value.trim().parse::<u64>().ok())
            .sum();
        assert!(evictions > 0, "a dataset 3x the cache evicts: {metrics}");
        info!(most, capacity, evictions, "--- the bound held");
    }
    {
        info!("--- a cache of one shard, a job whose chunks read every shard: refused, with the size needed");
        let small = stoker_testkit::unique_temp_dir("stoker-s3-cache").expect("temp dir");
        let cluster = cluster(&moto, Some((small, largest)), 1);
        cluster.add_dataset("train", Path::new("s3://data/train/manifest.json")).expect("dataset");
        let mut base = cluster.loader_config("train", 4);
        base.shuffle = Shuffle::Full;
        let error = consume(&base, 1, 1).expect_err("refused");
        assert!(error.contains("--cache-size"), "{error}");
        assert!(error.contains(&largest.to_string()), "names the cache's size: {error}");
        assert!(error.chars().filter(char::is_ascii_digit).count() > 4, "names the size needed: {error}");
        assert_no_credentials(&error);
    }
}

/// What a worker killed mid-download leaves in its cache (a `.part` file, and a shard file cut
/// short by an older build or a full disk) is never mapped: the worker deletes the partial
/// file when it starts, downloads the shard again, and every batch is the local copy's.
#[test]
#[ignore = "needs STOKER_PYTHON with moto[server] (make test)"]
fn a_partial_download_left_by_a_crash_is_never_used_after_the_restart() {
    let manifest_path = local_dataset(10, 32 << 10);
    let manifest = Manifest::load(&manifest_path).expect("manifest");
    let moto = moto_with(23, &manifest_path);
    let cache = stoker_testkit::unique_temp_dir("stoker-s3-cache").expect("temp dir");
    let (first, second) = (&manifest.shards[0], &manifest.shards[1]);
    let name_of = |uri: &str| stoker_worker::cache::file_name(&format!("s3://data/train/{uri}"));
    for worker in 0..2 {
        let dir = cache.join(format!("worker-{worker}"));
        std::fs::create_dir_all(&dir).expect("cache folder");
        let shard = std::fs::read(manifest_path.with_file_name(&first.uri)).expect("shard");
        std::fs::write(dir.join(format!("{}.part", name_of(&first.uri))), &shard[..shard.len() / 2]).expect("partial");
        let other = std::fs::read(manifest_path.with_file_name(&second.uri)).expect("shard");
        std::fs::write(dir.join(name_of(&second.uri)), &other[..other.len() - 1024]).expect("cut");
    }
    let cluster = cluster(&moto, Some((cache.clone(), 64 << 20)), 2);
    cluster.add_dataset("local", &manifest_path).expect("local");
    cluster.add_dataset("remote", Path::new("s3://data/train/manifest.json")).expect("remote");
    let (mut local, mut remote) = (cluster.loader_config("local", 8), cluster.loader_config("remote", 8));
    local.tail = Tail::Partial;
    remote.tail = Tail::Partial;
    let local = consume(&local, 2, 1).expect("local");
    let remote = consume(&remote, 2, 1).expect("remote");
    assert_eq!(remote.0, local.0, "every batch as from the local copy");
    for worker in 0..2 {
        let dir = cache.join(format!("worker-{worker}"));
        let names = || -> Vec<String> {
            std::fs::read_dir(&dir).expect("cache").flatten().map(|entry| entry.file_name().to_string_lossy().into_owned()).collect()
        };
        // Downloads fetched ahead may still be in flight when the epoch ends (their `.part`
        // files are the live ones): they finish within moments; the crash's never does.
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while names().iter().any(|name| name.ends_with(".part")) && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        let names = names();
        assert!(!names.iter().any(|name| name.ends_with(".part")), "worker {worker}: the partial file is gone: {names:?}");
        if let Ok(meta) = std::fs::metadata(dir.join(name_of(&second.uri))) {
            assert_eq!(meta.len(), second.bytes, "worker {worker}: the cut file was replaced");
        }
    }
}

/// A missing bucket, a missing object and credentials the store refuses: each a clear error
/// naming the URI, with no credential anywhere in it.
#[test]
#[ignore = "needs STOKER_PYTHON with moto[server] (make test)"]
fn missing_buckets_and_objects_and_refused_credentials_are_named_without_credentials() {
    let manifest_path = local_dataset(5, 32 << 10);
    let moto = moto_with(24, &manifest_path);
    let cache = stoker_testkit::unique_temp_dir("stoker-s3-cache").expect("temp dir");
    let cluster = cluster(&moto, Some((cache, 64 << 20)), 2);
    {
        info!("--- a missing bucket");
        let error = cluster.add_dataset("nobucket", Path::new("s3://no-such-bucket/train/manifest.json")).expect_err("refused");
        assert!(error.contains("s3://no-such-bucket/train/manifest.json") && error.contains("not found"), "{error}");
        assert_no_credentials(&error);
    }
    {
        info!("--- a manifest whose shards are missing: the job fails naming the shard");
        let only_manifest = stoker_testkit::unique_temp_dir("stoker-s3-broken").expect("temp dir");
        std::fs::copy(&manifest_path, only_manifest.join("manifest.json")).expect("copy");
        moto.upload_folder(&only_manifest, "s3://data/broken").expect("upload");
        cluster.add_dataset("broken", Path::new("s3://data/broken/manifest.json")).expect("the manifest itself is there");
        let error = consume(&cluster.loader_config("broken", 4), 1, 1).expect_err("fails");
        assert!(error.contains("s3://data/broken/") && error.contains("not found"), "{error}");
        assert_no_credentials(&error);
    }
    {
        info!("--- a store that refuses the credentials");
        let strict = MotoServer::start(25, true).expect("moto with authentication");
        let refusing =
            TestCluster::start(ClusterConfig { workers: 0, object_store: Some(strict.store_config()), ..ClusterConfig::default() })
                .expect("cluster");
        let error = refusing.add_dataset("denied", Path::new("s3://data/train/manifest.json")).expect_err("refused");
        assert!(error.contains("s3://data/train/manifest.json") && error.contains("access denied"), "{error}");
        assert_no_credentials(&error);
    }
}

/// Behind a proxy that answers 503 to 20% of requests and cuts 5% of bodies midway, an epoch
/// of an s3:// dataset completes exactly once with the local copy's checksums, and the
/// workers count the retries.
#[test]
#[ignore = "needs STOKER_PYTHON with moto[server] (make test)"]
fn an_epoch_completes_exactly_once_through_a_store_that_fails_a_fifth_of_requests() {
    let manifest_path = local_dataset(20, 32 << 10);
    let samples = Manifest::load(&manifest_path).expect("manifest").samples();
    let moto = moto_with(26, &manifest_path);
    let faults = Faults { unavailable: 0.20, cut: 0.05, seed: 30, ..Faults::default() };
    let proxy = FaultProxy::start(27, moto.addr(), faults).expect("proxy");
    let mut store = moto.store_config();
    store.endpoint_opt = Some(proxy.endpoint());
    store.attempts = 20;
    // Shards of ~32 KiB read as ranged GETs of 8 KiB, so that ranges fail and resume too.
    store.range_bytes = 8 << 10;
    let cache = stoker_testkit::unique_temp_dir("stoker-s3-cache").expect("temp dir");
    let cluster = TestCluster::start(ClusterConfig {
        workers: 2,
        object_store: Some(store),
        worker_cache: Some((cache, 64 << 20)),
        ..ClusterConfig::default()
    })
    .expect("cluster");
    cluster.wait_for_workers().expect("workers");
    cluster.add_dataset("local", &manifest_path).expect("local");
    cluster.add_dataset("remote", Path::new("s3://data/train/manifest.json")).expect("remote, through the faults");
    let (mut local, mut remote) = (cluster.loader_config("local", 8), cluster.loader_config("remote", 8));
    local.tail = Tail::Partial;
    remote.tail = Tail::Partial;
    let local = consume(&local, 2, 1).expect("local");
    let remote = consume(&remote, 2, 1).expect("remote, through the faults");
    assert_every_key_once(&remote, samples, 1);
    assert_eq!(remote.0, local.0, "every batch as from the local copy");
    let counts = proxy.counts();
    let (unavailable, cut) = (counts.unavailable.load(Ordering::Relaxed), counts.cut.load(Ordering::Relaxed));
    info!(requests = counts.requests.load(Ordering::Relaxed), unavailable, cut, "--- faults injected");
    assert!(unavailable > 0 && cut > 0, "the proxy failed requests ({unavailable}) and cut bodies ({cut})");
    let metrics: String = (0..2).map(|worker| cluster.worker_metrics_text(worker).expect("metrics")).collect();
    let retried: u64 = metrics
        .lines()
        .filter_map(|line| line.strip_prefix("stoker_worker_object_requests_total{outcome=\"retried\"} "))
        .filter_map(|value| value.trim().parse::<u64>().ok())
        .sum();
    assert!(retried > 0, "retries are counted: {metrics}");
    assert_no_credentials(&metrics);
}

/// A download larger than the range size is read as ranged GETs, several at once, each
/// resuming on its own: through 503s and cut bodies the file is the object, byte for byte.
#[test]
#[ignore = "needs STOKER_PYTHON with moto[server] (make test)"]
fn a_large_download_is_read_in_ranges_that_each_survive_faults() {
    let dir = stoker_testkit::unique_temp_dir("stoker-s3-ranges").expect("temp dir");
    let source = dir.join("object.bin");
    let body: Vec<u8> = (0..300_000_u32).map(|index| (index.wrapping_mul(2_654_435_761) >> 24) as u8).collect();
    std::fs::write(&source, &body).expect("write");
    let moto = MotoServer::start(28, false).expect("moto");
    moto.create_bucket("data").expect("bucket");
    let uri = stoker_store::ObjectUri::parse("s3://data/big/object.bin").expect("uri");
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let direct = stoker_store::ObjectStores::new(moto.store_config(), stoker_store::ObjectRoots::anywhere());
    runtime.block_on(direct.upload(&source, &uri)).expect("upload");
    let faults = Faults { unavailable: 0.2, cut: 0.2, seed: 11, ..Faults::default() };
    let proxy = FaultProxy::start(29, moto.addr(), faults).expect("proxy");
    let mut config = moto.store_config();
    config.endpoint_opt = Some(proxy.endpoint());
    config.attempts = 20;
    config.range_bytes = 16 << 10;
    let stores = stoker_store::ObjectStores::new(config, stoker_store::ObjectRoots::anywhere());
    let copy = dir.join("copy.bin");
    let size = runtime.block_on(stores.download(&uri, &copy, Some(body.len() as u64))).expect("download through the faults");
    assert_eq!(size, body.len() as u64);
    assert!(std::fs::read(&copy).expect("read") == body, "the copy is the object, byte for byte");
    let counts = proxy.counts();
    let ranges = body.len().div_ceil(16 << 10) as u64;
    assert!(counts.requests.load(Ordering::Relaxed) > ranges, "a HEAD and at least one GET per range of {ranges}");
    assert!(counts.cut.load(Ordering::Relaxed) > 0 && counts.unavailable.load(Ordering::Relaxed) > 0, "faults were injected");
    let wrong = runtime.block_on(stores.download(&uri, &dir.join("wrong.bin"), Some(body.len() as u64 + 1)));
    assert!(matches!(wrong, Err(stoker_store::StoreError::SizeMismatch { .. })), "{wrong:?}");
}
