//! [`ClusterConfig`]: how a [`crate::TestCluster`] runs.

use std::path::{Path, PathBuf};
use std::time::Duration;

use stoker_coordinator::CoordinatorConfig;
use stoker_net::bulk::BatchTransport;
use stoker_store::StoreConfig;
use stoker_worker::WorkerConfig;

/// How the cluster runs.
#[derive(Clone, Debug)]
pub struct ClusterConfig {
    /// Workers started with the cluster.
    pub workers: usize,
    /// Decode threads per worker.
    pub threads_per_worker: usize,
    /// Lease TTL (short in fault tests so expiry is quick).
    pub lease_ttl: Duration,
    /// Worker heartbeat period.
    pub heartbeat: Duration,
    /// Steps per chunk.
    pub chunk_steps: u32,
    /// Coordinator data directory [default: a fresh temporary folder].
    pub data_dir: Option<PathBuf>,
    /// A lease without progress for this long expires (the coordinator's stall timeout).
    pub lease_stall: Duration,
    /// How long a worker's push of one batch may take.
    pub delivery_timeout: Duration,
    /// A worker releases a job's pipeline after this long without work.
    pub job_idle: Duration,
    /// Coordinators: 1 is a cluster of one (the embedded default); 3 form a Raft cluster on
    /// 127.0.0.1, each with its own data directory (`node-N` inside the cluster's).
    pub coordinators: usize,
    /// Workers time every sample and batch into their metrics (off only to measure the cost).
    pub time_samples: bool,
    /// The coordinators' largest batch, in bytes.
    pub max_batch_bytes: u64,
    /// Each worker's batch memory per job [default: the worker's].
    pub max_batch_memory: Option<u64>,
    /// Run `--insecure` (no certificates) instead of mutual TLS with a fresh cluster CA.
    pub insecure: bool,
    /// Changes every coordinator's configuration after the harness set it up (limits, say).
    pub configure_coordinator: Option<fn(&mut CoordinatorConfig)>,
    /// Every worker's [`WorkerConfig::before_dataset_open`] (a hung open, for tests).
    pub before_dataset_open: Option<fn(&Path)>,
    /// How every worker sends batches (bulk connections where trainers make them, by default).
    pub batch_transport: BatchTransport,
    /// How the coordinator and the workers reach object stores (a test's S3 server).
    pub object_store: Option<StoreConfig>,
    /// Every worker's shard cache: a folder of its own in this one (`worker-N`, N its index,
    /// so a worker started again at that index finds its files) of this many bytes.
    pub worker_cache: Option<(PathBuf, u64)>,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        Self {
            workers: 2,
            threads_per_worker: 1,
            lease_ttl: Duration::from_millis(1500),
            heartbeat: Duration::from_millis(250),
            chunk_steps: 2,
            data_dir: None,
            lease_stall: CoordinatorConfig::new(PathBuf::new()).lease_stall,
            delivery_timeout: WorkerConfig::new(1).delivery_timeout,
            job_idle: WorkerConfig::new(1).job_idle,
            coordinators: 1,
            time_samples: true,
            max_batch_bytes: stoker_coordinator::config::DEFAULT_MAX_BATCH_BYTES,
            max_batch_memory: None,
            insecure: false,
            configure_coordinator: None,
            before_dataset_open: None,
            batch_transport: BatchTransport::Tcp,
            object_store: None,
            worker_cache: None,
        }
    }
}
