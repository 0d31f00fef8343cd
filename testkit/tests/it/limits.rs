//! Batch memory: a worker keeps a job's batch buffers within its budget, and leaves a job two
//! batches of which do not fit to other workers, instead of allocating them.

use std::time::Duration;

use stoker_proto::{ControlRequest, ControlResponse};
use stoker_testkit::{ClusterConfig, TestCluster};

use crate::common::{assert_in_order, config_for, consume, dataset};

/// One output sample of `small_transforms`: 32 x 32 x 3 bytes.
const SAMPLE_BYTES: u64 = 32 * 32 * 3;

fn cluster_with_budget(workers: usize, budget: u64) -> TestCluster {
    let config = ClusterConfig { workers, max_batch_memory: Some(budget), ..ClusterConfig::default() };
    let cluster = TestCluster::start(config).expect("cluster");
    cluster.add_dataset("train", &dataset()).expect("dataset");
    cluster.wait_for_workers().expect("workers");
    cluster
}

#[test]
fn a_budget_for_two_batches_still_delivers_every_step_once() {
    // Room for two batches of 8 and a half: the job's pipeline gets 2 buffers, not in-flight's 4.
    let cluster = cluster_with_budget(1, 8 * SAMPLE_BYTES * 5 / 2);
    let seen = consume(&cluster.loader_config("train", 8), 2, 2);
    // 120 samples, 2 ranks of batches of 8: 7 steps an epoch each (the tail dropped).
    assert_in_order(&seen, 7, 2);
}

#[test]
fn a_job_too_large_for_a_worker_is_left_to_it_and_made_by_others() {
    // Worker 0 has room for one batch of 8 only; a second worker with the default budget joins.
    let mut cluster = cluster_with_budget(1, 8 * SAMPLE_BYTES);
    let config = config_for(&cluster.loader_config("train", 8), 0, 1);
    {
        let mut config = config.clone();
        config.batch_timeout = Duration::from_secs(3);
        let mut loader = stoker_client::Loader::attach(&config).expect("attach");
        let waited = loader.next_batch();
        assert!(matches!(waited, Some(Err(stoker_client::ClientError::Timeout { .. }))), "made by a worker without room: {waited:?}");
        let status = match cluster.call(ControlRequest::Status) {
            Ok(ControlResponse::Status { status }) => status,
            other => panic!("status: {other:?}"),
        };
        assert!(
            status.workers.iter().all(|worker| worker.stuck_jobs.len() == 1
                && worker.stuck_jobs[0].job == loader.job()
                && worker.stuck_jobs[0].reason.contains("do not fit this worker's batch memory")),
            "every worker refuses the job and says why: {:?}",
            status.workers
        );
        assert!(status.jobs.iter().all(|job| job.checkpoint.is_none()), "the job did not fail and made nothing");
    }
    // Another worker, with room, makes the whole epoch; the first keeps refusing it.
    cluster.set_worker_batch_memory(None);
    cluster.add_worker().expect("a second worker");
    cluster.wait_for_workers().expect("workers");
    let seen = consume(&config, 1, 1);
    assert_in_order(&seen, 15, 1);
}

/// Issue 19: a trainer holding at most as many batches as its flow window (the least allowed)
/// still gets every step once, in order: what the limit drops (batches of the next epoch made
/// early, steps far ahead) is made again. Below the window it is refused up front.
#[test]
fn a_trainer_at_its_smallest_buffer_limit_still_gets_every_step_once() {
    let cluster = crate::common::cluster_with(2);
    let mut base = cluster.loader_config("train", 4);
    base.prefetch = 2;
    base.max_buffered_batches = Some(2);
    let seen = consume(&base, 2, 3);
    // 120 samples, 2 ranks of batches of 4: 15 steps an epoch each.
    assert_in_order(&seen, 15, 3);
    let mut tight = config_for(&base, 0, 1);
    tight.max_buffered_batches = Some(1);
    let error = stoker_client::Loader::attach(&tight).expect_err("below the flow window");
    assert!(error.to_string().contains("max_buffered_batches 1 is below prefetch 2"), "{error}");
}
