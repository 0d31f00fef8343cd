//! A worker process `kill -9`ed while it downloads a shard of a dataset in S3 (moto behind a
//! slow link): the partial file it leaves is never mapped; the worker started again on the same
//! cache deletes it, downloads the shard whole, and the trainers see every sample once.

use std::path::Path;
use std::time::{Duration, Instant};

use stoker_format::Manifest;
use stoker_testkit::fault_proxy::{FaultProxy, Faults};
use stoker_testkit::moto::MotoServer;

use crate::support::{
    assert_two_ranks_saw_every_key_once, path_str, spawn_two_consumers, start_node, stoker_command as stoker, wait_for_consumers,
};

/// Files in `dir` ending in `.part`.
fn partial_files(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries.flatten().map(|entry| entry.file_name().to_string_lossy().into_owned()).filter(|name| name.ends_with(".part")).collect()
        })
        .unwrap_or_default()
}

#[test]
#[ignore = "needs STOKER_PYTHON with moto[server] (make test)"]
fn a_worker_killed_mid_download_never_maps_the_partial_file_after_its_restart() {
    let dir = stoker_testkit::unique_temp_dir("stoker-s3-kill").expect("temp dir");
    let manifest_path = stoker_testkit::sample_dataset(&dir, 6, 20, 64 << 10).expect("dataset");
    let manifest = Manifest::load(&manifest_path).expect("manifest");
    let moto = MotoServer::start(31, false).expect("moto");
    moto.create_bucket("data").expect("bucket");
    moto.upload_folder(manifest_path.parent().expect("a folder"), "s3://data/train").expect("upload");
    // 40 KB/s: a 64 KiB shard takes over a second to arrive, time to catch it midway.
    let proxy = FaultProxy::start(32, moto.addr(), Faults { bytes_per_second_opt: Some(40_000), ..Faults::default() }).expect("proxy");
    let endpoint = proxy.endpoint();
    let data_dir = dir.join("coordinator");
    let (_coordinator, coordinator) = start_node(&[
        "coordinator",
        "--listen",
        "127.0.0.1:0",
        "--data-dir",
        path_str(&data_dir),
        "--lease-ttl-ms",
        "1500",
        "--s3-endpoint",
        &endpoint,
    ]);
    let added = stoker().args(["dataset", "add", "train", "s3://data/train", "--coordinator", &coordinator]).output().expect("add");
    assert!(added.status.success(), "{}", String::from_utf8_lossy(&added.stderr));
    let cache = dir.join("cache");
    let worker_args = [
        "worker",
        "--coordinator",
        &coordinator,
        "--listen",
        "127.0.0.2:0",
        "--threads",
        "1",
        "--s3-endpoint",
        &endpoint,
        "--cache-dir",
        path_str(&cache),
        "--cache-size",
        "64MiB",
    ];
    let (mut victim, _) = start_node(&worker_args);
    let consumers = spawn_two_consumers(&coordinator, &dir, "50");
    let deadline = Instant::now() + Duration::from_secs(60);
    while partial_files(&cache).is_empty() {
        assert!(Instant::now() < deadline, "the worker never started a download");
        std::thread::park_timeout(Duration::from_millis(2));
    }
    victim.0.kill().expect("kill -9");
    let _ = victim.0.wait();
    let left = partial_files(&cache);
    assert!(!left.is_empty(), "the kill left a partial download");
    let (_restarted, _) = start_node(&worker_args);
    wait_for_consumers(consumers, Duration::from_secs(180));
    assert_two_ranks_saw_every_key_once(&dir);
    assert!(partial_files(&cache).is_empty(), "the restarted worker deleted the partial downloads");
    let sizes: Vec<u64> = manifest.shards.iter().map(|shard| shard.bytes).collect();
    for entry in std::fs::read_dir(&cache).expect("cache").flatten() {
        let bytes = entry.metadata().expect("metadata").len();
        assert!(sizes.contains(&bytes), "{:?} has {bytes} bytes, the size of no shard", entry.file_name());
    }
    let _ = std::fs::remove_dir_all(&dir);
}
