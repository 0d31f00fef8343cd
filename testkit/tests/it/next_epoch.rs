//! Issue 16, item 5: the next epoch is made while the last steps of this one are consumed, so
//! a trainer that validates between epochs finds its first batches waiting.

use std::time::{Duration, Instant};

use stoker_client::Loader;
use stoker_plan::Tail;
use stoker_plan::ids::Epoch;

use crate::common::{cluster_with, config_for};

#[test]
fn the_first_batches_of_the_next_epoch_arrive_before_it_is_opened() {
    let cluster = cluster_with(1);
    let mut config = config_for(&cluster.loader_config("train", 8), 0, 1);
    config.tail = Tail::Drop;
    config.prefetch = 4;
    let mut loader = Loader::attach(&config).expect("attach");
    loader.set_epoch(Epoch(0));
    let steps = (&mut loader).inspect(|batch| assert!(batch.is_ok(), "{batch:?}")).count();
    assert_eq!(steps as u64, loader.len().expect("len"));
    // "Validation": the trainer does not ask for epoch 1 yet.
    let deadline = Instant::now() + Duration::from_secs(20);
    while loader.buffered_batches() < 4 {
        assert!(Instant::now() < deadline, "epoch 1's first window never arrived: {} batches", loader.buffered_batches());
        std::thread::sleep(Duration::from_millis(20));
    }
    loader.set_epoch(Epoch(1));
    let started = Instant::now();
    let first = loader.next_batch().expect("a batch").expect("valid");
    let first_latency = started.elapsed();
    let mut seen = vec![first.step().0];
    seen.extend((&mut loader).map(|batch| batch.expect("batch").step().0));
    assert_eq!(seen, (0..steps as u64).collect::<Vec<_>>(), "epoch 1 whole, in order, each step once");
    eprintln!("epoch 1's first batch {first_latency:?} after set_epoch (it was there already)");
    assert!(first_latency < Duration::from_secs(2), "{first_latency:?}");
}
