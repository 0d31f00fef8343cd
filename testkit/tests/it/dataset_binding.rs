//! Issue 15, item 8: a batch must hold the samples its job's plan gives its step. Workers
//! planned from whatever manifest they read, cached per path and job id, and trainers never
//! checked the keys they got: a manifest rewritten in place, or a job id reused by a
//! coordinator that lost its state, gave wrong samples with no error. Jobs are now bound to
//! their dataset's version, workers refuse another manifest, pipelines are keyed by the job's
//! fingerprint, and trainers check each batch's plan digest.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use stoker_client::{Loader, LoaderConfig, Next};
use stoker_plan::ids::{Epoch, Rank, Step};
use stoker_plan::{EpochPlan, Tail};
use stoker_testkit::{ClusterConfig, TestCluster};
use stoker_worker::Dataset;
use tracing::info;

use crate::common::config_for;

/// The keys `config`'s rank must get at each step of `epoch`, from the dataset's own plan.
fn planned_keys(manifest: &Path, config: &LoaderConfig, epoch: Epoch) -> BTreeMap<u64, Vec<String>> {
    let dataset = Dataset::open(manifest).expect("open");
    let spec = config.job_spec().expect("spec");
    let plan = EpochPlan::new(dataset.table(), spec.plan, epoch);
    let rank = Rank(config.rank.unwrap_or(0));
    (0..plan.steps())
        .map(|step| {
            let keys = plan
                .batch(rank, Step(step))
                .map(|planned| dataset.with_sample(planned.sample, |sample| sample.expect("sample").key().to_owned()));
            (step, keys.collect())
        })
        .collect()
}

fn yielded_keys(loader: &mut Loader) -> BTreeMap<u64, Vec<String>> {
    loader.map(|batch| batch.expect("batch")).map(|batch| (batch.step().0, batch.keys().to_vec())).collect()
}

/// A manifest rewritten in place after its job started (here: its shards listed in reverse
/// order, which changes the plan): a worker opening it refuses to make the job's batches, and
/// once the original is back every batch holds the planned samples.
#[test]
fn a_manifest_rewritten_under_its_job_is_refused_not_trained_on() {
    let dir = stoker_testkit::unique_temp_dir("stoker-it-rewritten").expect("dir");
    let manifest = stoker_testkit::sample_dataset(&dir, 4, 10, 32 << 10).expect("dataset");
    let original = std::fs::read(&manifest).expect("manifest");
    let mut cluster = TestCluster::start(ClusterConfig { workers: 0, ..ClusterConfig::default() }).expect("cluster");
    cluster.add_dataset("mutable", &manifest).expect("dataset");
    let mut base = cluster.loader_config("mutable", 4);
    base.tail = Tail::Partial;
    let config = config_for(&base, 0, 1);
    let expected = planned_keys(&manifest, &config, Epoch(0));
    let mut loader = Loader::attach(&config).expect("attach");
    loader.set_epoch(Epoch(0));
    {
        info!("--- the manifest is rewritten in place; a worker joins");
        let mut rewritten = stoker_format::Manifest::load(&manifest).expect("load");
        rewritten.shards.reverse();
        rewritten.save(&manifest).expect("save");
        cluster.add_worker().expect("worker");
        cluster.wait_for_workers().expect("worker");
        let deadline = std::time::Instant::now() + Duration::from_secs(4);
        while std::time::Instant::now() < deadline {
            match loader.next_within(Duration::from_millis(200)).expect("no error") {
                Next::Waiting => {}
                other => panic!("a batch made from the rewritten manifest reached the trainer: {other:?}"),
            }
        }
    }
    {
        info!("--- the original manifest is back: the epoch completes with the planned samples");
        std::fs::write(&manifest, &original).expect("restore");
        let mut yielded = BTreeMap::new();
        if let Next::Batch(first) = loader.next_within(Duration::from_secs(30)).expect("a batch") {
            yielded.insert(first.step().0, first.keys().to_vec());
        }
        yielded.extend(yielded_keys(&mut loader));
        assert_eq!(yielded, expected);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A coordinator that lost its data directory starts numbering jobs from 1 again. A worker
/// that served the old job 1 kept its pipeline (its plan and transforms) under that id and
/// made the new job 1's batches with it. Now the worker keys pipelines by the job's
/// fingerprint, and the new job gets its own samples.
#[test]
fn a_job_id_reused_after_the_coordinator_lost_its_state_gets_its_own_samples() {
    let dir = stoker_testkit::unique_temp_dir("stoker-it-reused").expect("dir");
    let manifest = stoker_testkit::sample_dataset(&dir, 4, 10, 32 << 10).expect("dataset");
    let mut cluster = TestCluster::start(ClusterConfig { workers: 1, ..ClusterConfig::default() }).expect("cluster");
    cluster.add_dataset("train", &manifest).expect("dataset");
    cluster.wait_for_workers().expect("workers");
    let mut base = cluster.loader_config("train", 4);
    base.tail = Tail::Partial;
    {
        info!("--- job 1: seed 1, two batches");
        let mut first = config_for(&base, 0, 1);
        first.seed = 1;
        let mut loader = Loader::attach(&first).expect("attach");
        assert_eq!(loader.job().0, 1);
        loader.set_epoch(Epoch(0));
        for _ in 0..2 {
            loader.next_batch().expect("a batch").expect("valid");
        }
    }
    info!("--- the coordinator comes back without its data; job 1 is now another job (seed 2)");
    cluster.restart_coordinator_with_empty_state().expect("restart");
    cluster.add_dataset("train", &manifest).expect("dataset");
    cluster.wait_for_workers().expect("workers");
    let mut second = config_for(&base, 0, 1);
    second.seed = 2;
    let mut loader = Loader::attach(&second).expect("attach");
    assert_eq!(loader.job().0, 1, "the id is reused");
    loader.set_epoch(Epoch(0));
    let yielded = yielded_keys(&mut loader);
    assert_eq!(yielded, planned_keys(&manifest, &second, Epoch(0)), "the new job's own samples");
    drop(loader);
    drop(cluster);
    let _ = std::fs::remove_dir_all(&dir);
}
