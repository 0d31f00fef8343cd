//! A restarted single coordinator keeps datasets, jobs and checkpoints (its command log).

use stoker_client::Loader;
use stoker_common::ids::Epoch;
use tracing::info;

use crate::common::{cluster_with, config_for};

#[test]
fn a_restarted_coordinator_keeps_datasets_jobs_and_checkpoints() {
    let mut cluster = cluster_with(1);
    let before = {
        info!("--- one rank consumes 5 steps");
        let config = config_for(&cluster.loader_config("train", 4), 0, 1);
        let mut loader = Loader::attach(&config).expect("attach");
        loader.set_epoch(Epoch(0));
        for batch in (&mut loader).take(5) {
            batch.expect("batch");
        }
        let core = cluster.coordinator().expect("coordinator");
        stoker_testkit::wait_until(std::time::Duration::from_secs(10), "the checkpoint of step 4 is recorded", || {
            core.state().checkpoints.values().any(|checkpoint| checkpoint.position.0 == 20)
        })
        .expect("checkpoint");
        core.state()
    };
    {
        info!("--- restart the coordinator on the same data directory");
        cluster.restart_coordinator().expect("restart");
        let after = cluster.coordinator().expect("coordinator").state();
        assert_eq!(after, before, "datasets, jobs and checkpoints survive");
        assert_eq!(after.datasets.len(), 1);
        assert_eq!(after.jobs.len(), 1);
    }
}
