//! A sample that cannot be decoded under `on_error=fail` fails the job: every trainer gets an
//! error naming the shard and the key, instead of the chunk being retried forever.

use std::num::NonZeroUsize;
use std::time::{Duration, Instant};

use stoker_format::pack::{PackOptions, pack};
use stoker_plan::transform::OnError;
use stoker_proto::ErrorCode;
use stoker_testkit::{ClusterConfig, TestCluster};

use super::common::small_transforms;

#[test]
fn a_bad_sample_under_on_error_fail_fails_the_job_with_its_shard_and_key() {
    let dir = stoker_testkit::unique_temp_dir("stoker-bad-sample").expect("temp dir");
    stoker_testkit::sample_dataset(&dir, 2, 10, 64 << 10).expect("dataset");
    let victim = dir.join("images").join("class_001").join("img_00004.jpg");
    assert!(victim.exists(), "the sample generator's layout changed: {}", victim.display());
    std::fs::write(&victim, b"this is not a JPEG").expect("corrupt");
    let options = PackOptions {
        input: dir.join("images"),
        output: dir.join("shards"),
        shard_size: 64 << 10,
        threads: NonZeroUsize::MIN,
        prefix: "shard".to_owned(),
        overwrite: true,
        rewrite_jpeg: Some(stoker_worker::make_seekable_for_pack),
        shuffle_seed: None,
    };
    pack(&options, &mut |_| {}).expect("pack");
    let cluster = TestCluster::start(ClusterConfig { workers: 1, ..ClusterConfig::default() }).expect("cluster");
    cluster.add_dataset("bad", &dir.join("shards").join("manifest.json")).expect("dataset");
    cluster.wait_for_workers().expect("workers");
    let mut config = cluster.loader_config("bad", 4);
    config.transforms = small_transforms();
    config.transforms.on_error = OnError::Fail;
    config.rank = Some(0);
    config.world_size = Some(1);
    let mut loader = stoker_client::Loader::attach(&config).expect("attach");
    let started = Instant::now();
    let mut batches = 0;
    let error = loop {
        match loader.next_batch() {
            Some(Ok(_)) => batches += 1,
            Some(Err(error)) => break error,
            None => panic!("the epoch ended after {batches} batches without the bad sample failing it"),
        }
        assert!(batches <= 5, "20 samples in batches of 4 are 5 steps");
    };
    assert!(started.elapsed() < Duration::from_secs(30), "the failure took {:?}", started.elapsed());
    let stoker_client::ClientError::Coordinator { source } = &error else { panic!("not the coordinator's verdict: {error}") };
    assert_eq!(source.code, ErrorCode::JobFailed, "{error}");
    let message = error.to_string();
    assert!(message.contains("img_00004") && message.contains("shard") && message.contains("on_error=fail"), "{message}");
    assert!(!error.is_retryable());
    let again = loader.next_batch().expect("still failed").expect_err("the job stays failed");
    assert!(again.to_string().contains("img_00004"), "{again}");
    let _ = std::fs::remove_dir_all(&dir);
}
