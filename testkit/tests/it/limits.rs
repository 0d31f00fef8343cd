//! Batch memory: a worker keeps a job's batch buffers within its budget, and a job one batch
//! of which is over it fails with the budget named, instead of the worker allocating it.

use std::time::{Duration, Instant};

use stoker_common::proto::ErrorCode;
use stoker_testkit::{ClusterConfig, TestCluster};

use crate::common::{assert_in_order, config_for, consume, dataset};

/// One output sample of `small_transforms`: 32 x 32 x 3 bytes.
const SAMPLE_BYTES: u64 = 32 * 32 * 3;

fn cluster_with_budget(budget: u64) -> TestCluster {
    let config = ClusterConfig { workers: 1, max_batch_memory: Some(budget), ..ClusterConfig::default() };
    let cluster = TestCluster::start(config).expect("cluster");
    cluster.add_dataset("train", &dataset()).expect("dataset");
    cluster.wait_for_workers().expect("workers");
    cluster
}

#[test]
fn a_budget_for_one_batch_still_delivers_every_step_once() {
    // Room for one batch of 8 and a half: the job's pipeline gets one buffer, not in-flight's 4.
    let cluster = cluster_with_budget(8 * SAMPLE_BYTES * 3 / 2);
    let seen = consume(&cluster.loader_config("train", 8), 2, 2);
    // 120 samples, 2 ranks of batches of 8: 7 steps an epoch each (the tail dropped).
    assert_in_order(&seen, 7, 2);
}

#[test]
fn a_job_whose_batch_is_over_the_budget_fails_with_the_budget_named() {
    let cluster = cluster_with_budget(4 * SAMPLE_BYTES);
    let config = config_for(&cluster.loader_config("train", 8), 0, 1);
    let mut loader = stoker_client::Loader::attach(&config).expect("attach");
    let started = Instant::now();
    let error = match loader.next_batch() {
        Some(Err(error)) => error,
        other => panic!("a batch over the budget was made: {other:?}"),
    };
    assert!(started.elapsed() < Duration::from_secs(30), "the failure took {:?}", started.elapsed());
    let stoker_client::ClientError::Coordinator { source } = &error else { panic!("not the coordinator's verdict: {error}") };
    assert_eq!(source.code, ErrorCode::JobFailed, "{error}");
    assert!(error.to_string().contains("--max-batch-memory"), "{error}");
}
