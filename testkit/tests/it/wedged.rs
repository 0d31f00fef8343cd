//! Issue 15, item 6: a worker stuck on one thing must not keep its chunks, nor stop serving
//! everything else. Both tests wedged the worker (and timed out the trainer) before: leases
//! were renewed for as long as the worker listed them, `send_batch` waited forever, and a
//! dataset being opened held the lock every job's pull went through.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use stoker_client::Loader;
use stoker_format::{Manifest, ManifestShard};
use stoker_net::{Role, Tuning, client_endpoint};
use stoker_plan::Tail;
use stoker_plan::ids::{Epoch, Rank};
use stoker_plan::transform::{Size, Transform, TransformSpec};
use stoker_proto::expect_response;
use stoker_proto::{ControlRequest, TrainerHello};
use stoker_testkit::{ClusterConfig, TestCluster, wait_until};
use tracing::info;

use crate::common::{config_for, dataset, trainer_hello};

/// A trainer that says hello and then reads nothing: the worker's pushes to it block on QUIC
/// flow control. They time out and their chunks are made again, so the trainer that replaces
/// it gets every step, from the same worker.
#[test]
fn a_trainer_that_stops_reading_does_not_hold_the_worker() {
    let config = ClusterConfig { workers: 1, delivery_timeout: Duration::from_secs(2), ..ClusterConfig::default() };
    let cluster = TestCluster::start(config).expect("cluster");
    cluster.add_dataset("train", &dataset()).expect("dataset");
    cluster.wait_for_workers().expect("workers");
    let worker_addr = cluster.worker(0).expect("worker").local_addr();
    let mut base = cluster.loader_config("train", 16);
    base.tail = Tail::Partial;
    base.batch_timeout = Duration::from_secs(30);
    let mut config = config_for(&base, 0, 1);
    // 256×256 crops: a 3 MB batch, over the 1.25 MB a stream may carry unread by default.
    config.transforms = TransformSpec::new(vec![Transform::RandomResizedCrop {
        size: Size::square(256),
        scale: (0.08, 1.0),
        ratio: (3.0 / 4.0, 4.0 / 3.0),
        interpolation: Default::default(),
    }]);
    let spec = config.job_spec().expect("spec");
    let tls = cluster.tls(Role::Trainer);
    info!("--- a trainer attaches, opens epoch 0, says hello, and never reads");
    let attached = cluster.call(ControlRequest::Attach { spec, rank: Rank(0), client: 77 }).expect("attach");
    let (job, _, _, _, session) = expect_response!(attached, Attached { job, dataset, workers, checkpoint, session }).expect("attached");
    let open = crate::common::first_open(job, session);
    cluster.call(open).expect("open");
    let (_endpoint, silent) = cluster.block_on(async {
        let endpoint = client_endpoint(&tls, worker_addr, Tuning { batch_windows: false, ..Tuning::default() }).expect("endpoint");
        let (connection, answer) = trainer_hello(&endpoint, worker_addr, TrainerHello { job, rank: Rank(0), session, bulk: false }).await;
        assert_eq!(answer, Ok(()));
        (endpoint, connection)
    });
    // quinn's default stream window is 1.25 MB: two batches blocked at it have sent 2.5 MB.
    wait_until(Duration::from_secs(30), "two pushes are stuck at the silent trainer's window", || silent.stats().udp_rx.bytes >= 2_400_000)
        .expect("stuck");
    info!("--- a new trainer of the rank iterates the epoch");
    let mut loader = Loader::attach(&config).expect("attach");
    loader.set_epoch(Epoch(0));
    let steps: Vec<u64> = (&mut loader).map(|batch| batch.expect("every step arrives").step().0).collect();
    assert_eq!(steps, (0..8).collect::<Vec<_>>(), "120 samples / batch 16, partial tail");
}

/// A job whose dataset open hangs (as on a hung NFS mount: the worker's open blocks, through
/// its test hook) and a healthy job on the same worker. The healthy job's epoch completes; the
/// stuck job's lease expires although the worker keeps listing it. (A FIFO made this hang
/// before dataset files were opened only if regular; now a FIFO is refused at once.)
#[test]
fn a_dataset_that_never_opens_stops_neither_other_jobs_nor_lease_expiry() {
    let config = ClusterConfig {
        workers: 1,
        lease_stall: Duration::from_secs(3),
        before_dataset_open: Some(hang_while_stuck),
        ..ClusterConfig::default()
    };
    let cluster = TestCluster::start(config).expect("cluster");
    cluster.add_dataset("train", &dataset()).expect("dataset");
    let dir = stoker_testkit::unique_temp_dir("stoker-it-hung-open").expect("dir");
    std::fs::write(dir.join("shard-000000.tar"), vec![0u8; 1024]).expect("shard");
    HUNG.store(true, Ordering::Release);
    let _unblock = Unblock;
    let manifest = Manifest {
        version: stoker_format::manifest::MANIFEST_VERSION,
        shards: vec![ManifestShard { uri: "shard-000000.tar".into(), samples: 40, bytes: 1 << 20 }],
        classes: Vec::new(),
        packed: None,
    };
    manifest.save(&dir.join("manifest.json")).expect("manifest");
    cluster.add_dataset("stuck", &dir.join("manifest.json")).expect("dataset");
    cluster.wait_for_workers().expect("workers");
    let mut stuck_config = config_for(&cluster.loader_config("stuck", 4), 0, 1);
    stuck_config.batch_timeout = Duration::from_secs(15);
    info!("--- a trainer of the stuck dataset: the worker starts opening it, and hangs");
    let stuck = std::thread::spawn(move || {
        let mut loader = Loader::attach(&stuck_config).expect("attach");
        loader.set_epoch(Epoch(0));
        loader.next_batch().map(|batch| batch.map(drop))
    });
    let core = cluster.coordinator().expect("coordinator");
    wait_until(Duration::from_secs(20), "the worker holds a lease of the stuck job", || {
        let status = core.status(std::time::Instant::now());
        status.jobs.iter().any(|job| job.spec.dataset == "stuck" && job.chunks_leased > 0)
    })
    .expect("leased");
    {
        info!("--- a healthy job on the same worker runs its whole epoch");
        let mut config = config_for(&cluster.loader_config("train", 4), 0, 1);
        config.tail = Tail::Partial;
        config.batch_timeout = Duration::from_secs(30);
        let mut loader = Loader::attach(&config).expect("attach");
        loader.set_epoch(Epoch(0));
        let steps = (&mut loader).inspect(|batch| assert!(batch.is_ok(), "{batch:?}")).count();
        assert_eq!(steps, 30);
    }
    wait_until(Duration::from_secs(20), "the stuck lease expires without progress", || core.leases_expired() >= 1).expect("expired");
    info!("--- the worker reports the job stuck, and is granted none of it while it is");
    let stuck_job = |status: &stoker_proto::ClusterStatus| {
        status.jobs.iter().find(|job| job.spec.dataset == "stuck").map(|job| (job.id, job.chunks_leased))
    };
    let status = || core.status(std::time::Instant::now());
    wait_until(Duration::from_secs(10), "the worker reports the job stuck", || {
        let status = status();
        let job_opt = stuck_job(&status).map(|(job, _)| job);
        status.workers.iter().any(|worker| job_opt.is_some_and(|job| worker.stuck_jobs.iter().any(|stuck| stuck.job == job)))
    })
    .expect("reported stuck");
    let failed = core.chunks_failed();
    for _ in 0..10 {
        std::thread::sleep(Duration::from_millis(200));
        assert_eq!(stuck_job(&status()).map(|(_, leased)| leased), Some(0), "no lease of the stuck job goes back to the stuck worker");
    }
    assert_eq!(core.chunks_failed(), failed, "nothing of the stuck job is granted to its worker to be refused");
    info!("--- unblock the open, so no thread is left hanging");
    drop(_unblock);
    let outcome = stuck.join().expect("stuck trainer");
    assert!(!matches!(outcome, Some(Ok(()))), "no batch of a dataset that does not exist: {outcome:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Whether opens of the "stuck" dataset hang.
static HUNG: AtomicBool = AtomicBool::new(false);

/// The worker's hook: an open of a dataset under a `stoker-it-hung-open` folder blocks while
/// [`HUNG`] is set (at most 2 minutes).
fn hang_while_stuck(path: &std::path::Path) {
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while path.to_string_lossy().contains("stoker-it-hung-open") && HUNG.load(Ordering::Acquire) && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// On drop (also when the test fails), lets the hung open go on, so no thread is left hanging.
struct Unblock;

impl Drop for Unblock {
    fn drop(&mut self) {
        HUNG.store(false, Ordering::Release);
    }
}
