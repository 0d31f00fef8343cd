//! Shared helpers: a dataset per test, and ranks consuming on their own threads.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

use stoker_client::{Loader, LoaderConfig};
use stoker_net::connect;
use stoker_plan::Shuffle;
use stoker_plan::ids::Epoch;
use stoker_plan::transform::{Size, Transform, TransformSpec};
use stoker_proto::wire::{self, CONTROL_FRAME_LIMIT};
use stoker_proto::{RemoteError, TrainerHello};

/// What a rank saw of one step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Seen {
    pub(crate) epoch: u64,
    pub(crate) step: u64,
    pub(crate) keys: Vec<String>,
    pub(crate) checksum: u64,
}

/// 6 classes × 20 images packed into ~6 shards, made once per test binary.
/// The first open of epoch 0 by rank 0's trainer of `session`.
pub(crate) fn first_open(job: stoker_plan::ids::JobId, session: stoker_plan::ids::SessionId) -> stoker_proto::ControlRequest {
    use stoker_plan::ids::{Pass, Position, Rank};
    stoker_proto::ControlRequest::OpenEpoch {
        job,
        rank: Rank(0),
        epoch: Epoch(0),
        start: Position(0),
        session,
        pass: Pass(1),
        consumed: 0,
        holding: Vec::new(),
    }
}

pub(crate) fn dataset() -> PathBuf {
    static MANIFEST: OnceLock<PathBuf> = OnceLock::new();
    MANIFEST
        .get_or_init(|| {
            let dir = stoker_testkit::unique_temp_dir("stoker-it-data").expect("temp dir");
            stoker_testkit::sample_dataset(&dir, 6, 20, 64 << 10).expect("dataset")
        })
        .clone()
}

/// A cluster of `workers` workers with the test dataset registered as "train", every worker
/// alive.
pub(crate) fn cluster_with(workers: usize) -> stoker_testkit::TestCluster {
    let cluster = stoker_testkit::TestCluster::start(stoker_testkit::ClusterConfig { workers, ..Default::default() }).expect("cluster");
    cluster.add_dataset("train", &dataset()).expect("dataset");
    cluster.wait_for_workers().expect("workers");
    cluster
}

/// Small crops so debug builds stay quick.
pub(crate) fn small_transforms() -> TransformSpec {
    TransformSpec::new(vec![
        Transform::RandomResizedCrop {
            size: Size::square(32),
            scale: (0.08, 1.0),
            ratio: (3.0 / 4.0, 4.0 / 3.0),
            interpolation: Default::default(),
        },
        Transform::RandomHorizontalFlip { p: 0.5 },
    ])
}

pub(crate) fn config_for(base: &LoaderConfig, rank: u32, world_size: u32) -> LoaderConfig {
    let mut config = base.clone();
    config.rank = Some(rank);
    config.world_size = Some(world_size);
    config.shuffle = Shuffle::Full;
    config.transforms = small_transforms();
    config
}

/// Every rank consumes `epochs` epochs on its own thread; returns what each rank saw, in order.
pub(crate) fn consume(base: &LoaderConfig, world_size: u32, epochs: u64) -> BTreeMap<u32, Vec<Seen>> {
    let handles: Vec<_> = (0..world_size)
        .map(|rank| {
            let config = config_for(base, rank, world_size);
            std::thread::spawn(move || {
                let mut loader = Loader::attach(&config).expect("attach");
                let mut seen = Vec::new();
                for epoch in 0..epochs {
                    loader.set_epoch(Epoch(epoch));
                    for batch in &mut loader {
                        let batch = batch.expect("batch");
                        seen.push(Seen { epoch, step: batch.step().0, keys: batch.keys().to_vec(), checksum: batch.checksum() });
                    }
                }
                (rank, seen)
            })
        })
        .collect();
    handles.into_iter().map(|handle| handle.join().expect("rank thread")).collect()
}

/// Per (epoch, rank), steps are 0, 1, 2, ... with none missing or repeated.
pub(crate) fn assert_in_order(seen: &BTreeMap<u32, Vec<Seen>>, steps_per_epoch: u64, epochs: u64) {
    for (rank, records) in seen {
        for epoch in 0..epochs {
            let steps: Vec<u64> = records.iter().filter(|record| record.epoch == epoch).map(|record| record.step).collect();
            assert_eq!(steps, (0..steps_per_epoch).collect::<Vec<_>>(), "rank {rank} epoch {epoch}");
        }
    }
}

/// Say `hello` to `worker` as a trainer does: the connection (kept open by the caller, as a
/// trainer keeps it) and the worker's answer.
pub(crate) async fn trainer_hello(
    endpoint: &quinn::Endpoint,
    worker: std::net::SocketAddr,
    hello: TrainerHello,
) -> (quinn::Connection, Result<(), RemoteError>) {
    let connection = connect(endpoint, worker, Duration::from_secs(5)).await.expect("connect");
    let (mut send, mut recv) = connection.open_bi().await.expect("stream");
    send.write_all(&wire::encode(&hello, CONTROL_FRAME_LIMIT).expect("encode")).await.expect("write");
    let _ = send.finish();
    let answer = stoker_net::frame::read_frame::<Result<(), RemoteError>>(&mut recv, CONTROL_FRAME_LIMIT).await.expect("answer");
    (connection, answer)
}

/// Wait (up to 20 s) until worker `index` has a trainer connection open.
pub(crate) fn wait_for_open_trainer(cluster: &stoker_testkit::TestCluster, index: usize) {
    stoker_testkit::wait_until(Duration::from_secs(20), "a trainer connected to the worker", || {
        cluster.worker(index).is_some_and(|worker| worker.open_trainers() > 0)
    })
    .expect("a trainer connection");
}
