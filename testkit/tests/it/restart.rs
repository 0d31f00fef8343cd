//! A restarted single coordinator keeps datasets, jobs and checkpoints (its command log).

use std::time::Duration;

use stoker_client::Loader;
use stoker_plan::ids::Epoch;
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
        stoker_testkit::wait_until(Duration::from_secs(10), "the checkpoint of step 4 is recorded", || {
            core.state().checkpoints.values().any(|checkpoint| checkpoint.position.0 == 20)
        })
        .expect("checkpoint");
        // The trainer detaches as it goes, taking its session record along (a commit).
        drop(loader);
        stoker_testkit::wait_until(Duration::from_secs(10), "the detach is committed", || core.state().sessions.is_empty())
            .expect("detached");
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

/// Found by review: an `OpenEpoch` that met the coordinator's restart returned `Unavailable`
/// from `next_batch`, which ends a training loop (Python's `for batch in loader`). The open is
/// tried again until the batch timeout, and the epoch goes on once the coordinator is back.
#[test]
fn a_trainer_opening_an_epoch_while_the_coordinator_restarts_waits_for_it() {
    let mut cluster = cluster_with(1);
    let mut base = cluster.loader_config("train", 4);
    base.batch_timeout = Duration::from_secs(60);
    let config = config_for(&base, 0, 1);
    let mut loader = Loader::attach(&config).expect("attach");
    loader.set_epoch(Epoch(0));
    assert_eq!((&mut loader).inspect(|batch| assert!(batch.is_ok(), "{batch:?}")).count(), 30);
    info!("--- the coordinator stops; the trainer starts epoch 1");
    cluster.stop_coordinator();
    loader.set_epoch(Epoch(1));
    let waited = std::thread::scope(|scope| {
        let iterating = scope.spawn(|| (&mut loader).map(|batch| batch.expect("every step arrives").step().0).collect::<Vec<_>>());
        // Longer than a call's 10 s timeout: a shorter outage hides behind QUIC's handshake
        // retransmissions.
        let back_at = std::time::Instant::now() + Duration::from_secs(12);
        while let Some(left) = back_at.checked_duration_since(std::time::Instant::now()) {
            std::thread::park_timeout(left);
        }
        info!("--- the coordinator is back");
        cluster.start_coordinator_again().expect("restart");
        iterating.join().expect("trainer")
    });
    assert_eq!(waited, (0..30).collect::<Vec<_>>());
}
