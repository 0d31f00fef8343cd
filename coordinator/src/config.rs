//! Coordinator configuration: defaults in one place, validated into typed fields.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use crate::error::CoordinatorError;
use stoker_coordinator_core::CoreConfig;
use stoker_coordinator_core::scheduler::SchedulerConfig;
use stoker_store::{ObjectRoots, StoreConfig};

/// How a coordinator runs.
#[derive(Clone, Debug)]
pub struct CoordinatorConfig {
    /// Where datasets, jobs and checkpoints are kept.
    pub data_dir: PathBuf,
    /// A lease not renewed for this long expires; a worker silent this long is dead.
    pub lease_ttl: Duration,
    /// A lease none of whose batches was finished for this long expires even though its worker
    /// still lists it (the worker is stuck: a hung dataset open or decode, a delivery that
    /// never completes). Longer than the time one batch may take to make and deliver.
    pub lease_stall: Duration,
    /// A step a trainer reports missing is made again if it was delivered at least this long
    /// ago.
    pub missing_grace: Duration,
    /// How often workers heartbeat (a third of the TTL or less is sensible).
    pub heartbeat: Duration,
    /// Steps per chunk of work.
    pub chunk_steps: u32,
    /// A chunk that failed to deliver waits this long before it is granted again.
    pub retry_delay: Duration,
    /// A rank's trainer silent this long (trainers report at least every second) is absent:
    /// its chunks wait for it instead of occupying workers.
    pub trainer_ttl: Duration,
    /// A job no trainer was heard from for this long is removed (`None`: jobs are kept until
    /// `stoker job rm`). Measured from the coordinator's start for jobs not heard from since.
    pub job_ttl: Option<Duration>,
    /// This coordinator's Raft node id.
    pub node_id: u64,
    /// The Raft cluster to form, node id → address (`host:port`); empty: this node alone.
    pub peers: BTreeMap<u64, String>,
    /// Start without forming a cluster and wait to be added (`stoker cluster add-node`).
    pub join: bool,
    /// The address other coordinators and clients reach this one at; `None`: the address it
    /// listens on (or its entry in `peers`).
    pub advertise: Option<String>,
    /// The largest batch a job may have, in bytes (batch size × the bytes of one output
    /// sample): a job over it is refused when a trainer attaches, before any worker allocates
    /// its buffers (a batch size typed with a digit too many would have every worker that
    /// pulls the job allocate tens of GB).
    pub max_batch_bytes: u64,
    /// The most ranks a new job may have (`--max-world-size`).
    pub max_world_size: u32,
    /// The largest flow window a new job may ask for, in steps (`--max-prefetch`).
    pub max_prefetch: u32,
    /// The most jobs the coordinator keeps (`--max-jobs`): a trainer attaching a new job
    /// beyond it is refused.
    pub max_jobs: usize,
    /// The most datasets it keeps (`--max-datasets`).
    pub max_datasets: usize,
    /// The most jobs one trainer certificate's attaches may have created among those kept
    /// (`--max-jobs-per-certificate`).
    pub max_jobs_per_certificate: usize,
    /// The most bytes the replicated state may hold (`--max-state-bytes`): every job is charged
    /// 48 KiB, its dataset's record and 192 B per rank of its world size; every dataset its
    /// record (`stoker_coordinator_core::state_budget`). A new job or dataset over it is
    /// refused. At most half of the largest snapshot a follower takes.
    pub max_state_bytes: u64,
    /// Folders datasets must be in (`--dataset-root`, after symlinks are resolved); empty:
    /// anywhere the coordinator can read.
    pub dataset_roots: Vec<PathBuf>,
    /// How to reach object stores, for manifests at `s3://` URIs (`--s3-endpoint`).
    pub store: StoreConfig,
    /// Buckets and prefixes `s3://` manifests and their shards must be under (`--object-root`).
    pub object_roots: ObjectRoots,
    /// The most connections open at once, handshakes in progress included
    /// (`--max-connections`); more are refused before their handshake.
    pub max_connections: usize,
    /// The most connections open at once from one IP address (`--max-connections-per-address`).
    pub max_connections_per_address: usize,
    /// The most requests one connection may have open at once (`--max-streams-per-connection`;
    /// QUIC's stream limit: a well-behaved peer waits, one that goes over is disconnected).
    pub max_streams_per_connection: u32,
    /// How long one request may take to arrive (`--request-timeout-ms`); a slower sender's
    /// connection is closed.
    pub request_timeout: Duration,
}

/// [`CoordinatorConfig::max_batch_bytes`] by default: 1 GiB (a batch of 256 ImageNet crops as
/// u8 is 38.5 MB; as f32, 154 MB).
pub const DEFAULT_MAX_BATCH_BYTES: u64 = 1 << 30;
/// [`CoordinatorConfig::max_world_size`] by default.
pub const DEFAULT_MAX_WORLD_SIZE: u32 = 16_384;
/// [`CoordinatorConfig::max_prefetch`] by default.
pub const DEFAULT_MAX_PREFETCH: u32 = 1_024;
/// [`CoordinatorConfig::max_jobs`] by default.
pub const DEFAULT_MAX_JOBS: usize = 1_000;
/// [`CoordinatorConfig::max_datasets`] by default.
pub const DEFAULT_MAX_DATASETS: usize = 1_000;
/// [`CoordinatorConfig::max_jobs_per_certificate`] by default: a quarter of the jobs kept.
pub const DEFAULT_MAX_JOBS_PER_CERTIFICATE: usize = 250;
/// [`CoordinatorConfig::max_state_bytes`] by default: 256 MiB, a quarter of the largest
/// snapshot a follower takes (80 jobs of 16,384 ranks, or 1,000 jobs of 1,024).
pub const DEFAULT_MAX_STATE_BYTES: u64 = 256 << 20;
/// The most `--max-state-bytes` may be: half the largest snapshot a follower takes, so that a
/// snapshot of a full state always reaches a lagging follower.
pub const MAX_STATE_BYTES_LIMIT: u64 = crate::raft::MAX_SNAPSHOT_BYTES / 2;
/// The least `--max-state-bytes` may be: room for a few jobs.
pub const MIN_STATE_BYTES: u64 = 1 << 20;
/// [`CoordinatorConfig::max_connections`] by default.
pub const DEFAULT_MAX_CONNECTIONS: usize = stoker_net::DEFAULT_MAX_CONNECTIONS;
/// [`CoordinatorConfig::max_connections_per_address`] by default.
pub const DEFAULT_MAX_CONNECTIONS_PER_ADDRESS: usize = stoker_net::DEFAULT_MAX_CONNECTIONS_PER_ADDRESS;
/// [`CoordinatorConfig::max_streams_per_connection`] by default: a worker or trainer has a
/// few requests open at once, a Raft leader a few per follower.
pub const DEFAULT_MAX_STREAMS_PER_CONNECTION: u32 = 64;

impl CoordinatorConfig {
    /// Defaults for `data_dir`: 3 s leases that stall after 60 s without progress, 500 ms
    /// heartbeats, 2-step chunks, 500 ms retry delay, 5 s trainer TTL, 1 s grace for steps
    /// reported missing, jobs kept for 7 days without a trainer.
    pub fn new(data_dir: PathBuf) -> Self {
        Self {
            data_dir,
            lease_ttl: Duration::from_secs(3),
            lease_stall: Duration::from_secs(60),
            missing_grace: Duration::from_secs(1),
            heartbeat: Duration::from_millis(500),
            chunk_steps: 2,
            retry_delay: Duration::from_millis(500),
            trainer_ttl: Duration::from_secs(5),
            job_ttl: Some(Duration::from_secs(7 * 24 * 3600)),
            node_id: 1,
            peers: BTreeMap::new(),
            join: false,
            advertise: None,
            max_batch_bytes: DEFAULT_MAX_BATCH_BYTES,
            max_world_size: DEFAULT_MAX_WORLD_SIZE,
            max_prefetch: DEFAULT_MAX_PREFETCH,
            max_jobs: DEFAULT_MAX_JOBS,
            max_datasets: DEFAULT_MAX_DATASETS,
            max_jobs_per_certificate: DEFAULT_MAX_JOBS_PER_CERTIFICATE,
            max_state_bytes: DEFAULT_MAX_STATE_BYTES,
            dataset_roots: Vec::new(),
            store: StoreConfig::default(),
            object_roots: ObjectRoots::anywhere(),
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_connections_per_address: DEFAULT_MAX_CONNECTIONS_PER_ADDRESS,
            max_streams_per_connection: DEFAULT_MAX_STREAMS_PER_CONNECTION,
            request_timeout: stoker_net::REQUEST_TIMEOUT,
        }
    }

    /// Check the values fit together.
    pub fn validate(self) -> Result<Self, CoordinatorError> {
        if self.max_batch_bytes == 0 || self.max_batch_bytes > stoker_proto::wire::BATCH_PAYLOAD_LIMIT {
            return Err(CoordinatorError::Config {
                message: format!(
                    "the largest batch ({} bytes) must be above 0 and at most the {} bytes a trainer takes",
                    self.max_batch_bytes,
                    stoker_proto::wire::BATCH_PAYLOAD_LIMIT
                ),
            });
        }
        if self.max_world_size == 0 || self.max_prefetch == 0 || self.max_jobs == 0 || self.max_datasets == 0 {
            return Err(CoordinatorError::Config {
                message: "--max-world-size, --max-prefetch, --max-jobs and --max-datasets must be at least 1".to_owned(),
            });
        }
        if self.max_jobs_per_certificate == 0 {
            return Err(CoordinatorError::Config { message: "--max-jobs-per-certificate must be at least 1".to_owned() });
        }
        if !(MIN_STATE_BYTES..=MAX_STATE_BYTES_LIMIT).contains(&self.max_state_bytes) {
            return Err(CoordinatorError::Config {
                message: format!(
                    "--max-state-bytes {} must be from {MIN_STATE_BYTES} to {MAX_STATE_BYTES_LIMIT} (half the largest snapshot \
                     a lagging follower takes)",
                    self.max_state_bytes
                ),
            });
        }
        if self.max_connections == 0 || self.max_connections_per_address == 0 || self.max_streams_per_connection < 4 {
            return Err(CoordinatorError::Config {
                message: "--max-connections and --max-connections-per-address must be at least 1, --max-streams-per-connection \
                          at least 4"
                    .to_owned(),
            });
        }
        if self.request_timeout < Duration::from_millis(100) {
            return Err(CoordinatorError::Config {
                message: format!(
                    "--request-timeout-ms {:?} is too short for any request to arrive: give at least 100 ms",
                    self.request_timeout
                ),
            });
        }
        let mut roots = Vec::new();
        for root in &self.dataset_roots {
            let resolved = root.canonicalize().map_err(|error| CoordinatorError::Config {
                message: format!("--dataset-root {}: {error} (give an existing folder)", root.display()),
            })?;
            roots.push(resolved);
        }
        let mut config = self;
        config.dataset_roots = roots;
        config.validate_timing()
    }

    fn validate_timing(self) -> Result<Self, CoordinatorError> {
        if self.heartbeat.is_zero() || self.heartbeat >= self.lease_ttl {
            return Err(CoordinatorError::Config {
                message: format!("the heartbeat ({:?}) must be shorter than the lease TTL ({:?})", self.heartbeat, self.lease_ttl),
            });
        }
        if self.trainer_ttl <= Duration::from_secs(1) {
            return Err(CoordinatorError::Config {
                message: format!("the trainer TTL ({:?}) must be longer than the trainers' 1 s progress interval", self.trainer_ttl),
            });
        }
        if self.job_ttl.is_some_and(|ttl| ttl <= self.trainer_ttl) {
            return Err(CoordinatorError::Config {
                message: format!("the job TTL ({:?}) must be longer than the trainer TTL ({:?})", self.job_ttl, self.trainer_ttl),
            });
        }
        if !self.peers.is_empty() && !self.join && !self.peers.contains_key(&self.node_id) {
            let ids: Vec<String> = self.peers.keys().map(ToString::to_string).collect();
            return Err(CoordinatorError::Config {
                message: format!(
                    "node id {} is not among the peers ({}): give this node's own entry in --peers, or --join to be added later",
                    self.node_id,
                    ids.join(", ")
                ),
            });
        }
        if self.chunk_steps == 0 {
            return Err(CoordinatorError::Config { message: "chunk steps must be at least 1".to_owned() });
        }
        if self.lease_stall <= self.lease_ttl {
            return Err(CoordinatorError::Config {
                message: format!(
                    "the lease stall timeout ({:?}) must be longer than the lease TTL ({:?}): it is how long one batch may take",
                    self.lease_stall, self.lease_ttl
                ),
            });
        }
        Ok(self)
    }

    /// The scheduler's share of the settings.
    pub fn scheduler(&self) -> SchedulerConfig {
        SchedulerConfig {
            lease_ttl: self.lease_ttl,
            lease_stall: self.lease_stall,
            chunk_steps: self.chunk_steps,
            retry_delay: self.retry_delay,
            trainer_ttl: self.trainer_ttl,
            missing_grace: self.missing_grace,
        }
    }

    /// The core's share of the settings.
    pub fn core(&self) -> CoreConfig {
        CoreConfig {
            scheduler: self.scheduler(),
            heartbeat: self.heartbeat,
            job_ttl: self.job_ttl,
            max_batch_bytes: self.max_batch_bytes,
            max_world_size: self.max_world_size,
            max_prefetch: self.max_prefetch,
            max_jobs: self.max_jobs,
            max_datasets: self.max_datasets,
            max_jobs_per_certificate: self.max_jobs_per_certificate,
            max_state_bytes: self.max_state_bytes,
        }
    }
}
