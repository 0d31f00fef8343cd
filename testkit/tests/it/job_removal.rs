//! Issue 16, item 7: a job removed under a live trainer (`stoker job rm --force`) makes that
//! trainer fail with an error that says so, instead of waiting for batches that never come.

use std::time::{Duration, Instant};

use stoker_client::{ClientError, Loader};
use stoker_plan::ids::Epoch;

use crate::common::{cluster_with, config_for};

#[test]
fn a_trainer_of_a_job_removed_under_it_fails_saying_so() {
    let cluster = cluster_with(1);
    let mut config = config_for(&cluster.loader_config("train", 4), 0, 1);
    config.job_name = Some("removed-under-it".to_owned());
    config.batch_timeout = Duration::from_secs(120);
    let mut loader = Loader::attach(&config).expect("attach");
    loader.set_epoch(Epoch(0));
    loader.next_batch().expect("a batch").expect("valid");
    let refused = cluster.remove_job("removed-under-it", false);
    assert!(refused.is_err_and(|error| error.message.contains("--force")), "a live trainer: refused without --force");
    cluster.remove_job("removed-under-it", true).expect("removed");
    let started = Instant::now();
    let outcome = loop {
        match loader.next_batch() {
            Some(Ok(_)) => assert!(started.elapsed() < Duration::from_secs(30), "batches kept coming"),
            other => break other,
        }
    };
    let waited = started.elapsed();
    match outcome {
        Some(Err(ClientError::Coordinator { source })) => assert!(source.message.contains("removed"), "{source:?}"),
        other => panic!("expected the removal error, got {other:?}"),
    }
    assert!(waited < Duration::from_secs(30), "it failed within {waited:?}, not at the batch timeout");
}
