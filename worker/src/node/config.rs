//! How a worker runs: [`WorkerConfig`] and its defaults.

use std::net::SocketAddr;
use std::time::Duration;

use std::path::PathBuf;

use stoker_format::DatasetRoots;
use stoker_net::bulk::BatchTransport;
use stoker_net::{DEFAULT_MAX_CONNECTIONS, DEFAULT_MAX_CONNECTIONS_PER_ADDRESS, Tuning};
use stoker_store::{ObjectRoots, StoreConfig};

/// Where a worker keeps shards of datasets in object stores (`--cache-dir`, `--cache-size`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CacheConfig {
    /// The folder (created if missing; files of an earlier run are reused after checks).
    pub dir: PathBuf,
    /// The bound, in bytes, never exceeded by the files it holds.
    pub capacity: u64,
}

/// How a worker runs.
#[derive(Clone, Debug)]
pub struct WorkerConfig {
    /// Decode threads per job pipeline.
    pub threads: usize,
    /// Batches being made or delivered at once; the worker pulls work only below this.
    pub in_flight: usize,
    /// Address trainers use to reach this worker [default: the socket's address].
    pub advertise: Option<SocketAddr>,
    /// How long a batch waits for its trainer to connect before its chunk is failed.
    pub trainer_patience: Duration,
    /// How long one batch's delivery may take (until the trainer acknowledged every byte)
    /// before it is failed and made again: a trainer that stopped reading does not hold the
    /// worker's slots forever.
    pub delivery_timeout: Duration,
    /// A job's pipeline (threads, batch buffers, mapped dataset) is released after this long
    /// without work here, and at once when the coordinator no longer lists the job as live.
    pub job_idle: Duration,
    /// QUIC transport settings (the largest UDP payload).
    pub tuning: Tuning,
    /// Bytes of batch buffers one job's pipeline may hold (its batches in flight × one
    /// batch's bytes). A job whose batches are large gets fewer buffers; a job two batches of
    /// which do not fit is refused here (reported stuck, so other workers make it), with this
    /// named in the log.
    pub max_batch_memory: u64,
    /// Time every sample and batch into the metrics (`stoker_worker_decode_seconds`,
    /// `stoker_worker_batch_make_seconds`); off only to measure what that costs.
    pub time_samples: bool,
    /// Folders datasets must be in (`--dataset-root`): a job whose manifest or shards are
    /// elsewhere is refused here (logged, reported stuck) before anything of it is read.
    pub dataset_roots: DatasetRoots,
    /// How to reach object stores (`--s3-endpoint`, `--s3-region`).
    pub store: StoreConfig,
    /// Buckets and prefixes datasets in object stores must be under (`--object-root`).
    pub object_roots: ObjectRoots,
    /// The shard cache for datasets in object stores; `None`: such jobs are refused here.
    pub cache_opt: Option<CacheConfig>,
    /// Steps of the grant's rank after each granted chunk whose shards, of those the grant names
    /// (`next_shards`), are downloaded ahead (`--fetch-ahead-steps`); 0: nothing is fetched
    /// ahead.
    pub fetch_ahead_steps: u32,
    /// The most trainer connections open at once, handshakes included (`--max-connections`).
    pub max_connections: usize,
    /// The most from one IP address (`--max-connections-per-address`).
    pub max_connections_per_address: usize,
    /// Called on the blocking thread just before a dataset is opened. Tests make it block, as
    /// a hung network file system would (a FIFO no longer can: dataset files are opened only
    /// if regular); `None` in every real worker.
    #[doc(hidden)]
    pub before_dataset_open: Option<fn(&std::path::Path)>,
    /// How batches go out (`--batch-transport`): with [`BatchTransport::Tcp`] the worker also
    /// listens on TCP at its address's port for trainers' bulk connections.
    pub batch_transport: BatchTransport,
}

impl WorkerConfig {
    /// Defaults for `threads` decode threads: twice as many batches in flight (at least 4), 3 s
    /// trainer patience, 30 s delivery timeout, pipelines released after 60 s idle.
    pub fn new(threads: usize) -> Self {
        let threads = threads.max(1);
        Self {
            threads,
            in_flight: (2 * threads).max(4),
            advertise: None,
            trainer_patience: Duration::from_secs(3),
            delivery_timeout: Duration::from_secs(30),
            job_idle: Duration::from_secs(60),
            tuning: Tuning::default(),
            max_batch_memory: default_batch_memory(),
            time_samples: true,
            dataset_roots: DatasetRoots::anywhere(),
            store: StoreConfig::default(),
            object_roots: ObjectRoots::anywhere(),
            cache_opt: None,
            fetch_ahead_steps: 8,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_connections_per_address: DEFAULT_MAX_CONNECTIONS_PER_ADDRESS,
            before_dataset_open: None,
            batch_transport: BatchTransport::Tcp,
        }
    }
}

/// Half the memory this process may use: the machine's (`/proc/meminfo`) or its container's
/// limit (cgroup v2 `memory.max`, v1 `memory.limit_in_bytes`), whichever is less; 8 GiB where
/// neither can be read. What a job's batch buffers may take by default.
pub fn default_batch_memory() -> u64 {
    let machine = std::fs::read_to_string("/proc/meminfo").ok().and_then(|text| {
        text.lines().find_map(|line| line.strip_prefix("MemTotal:")?.trim().strip_suffix("kB")?.trim().parse::<u64>().ok())
    });
    let container = ["/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"]
        .iter()
        .find_map(|path| std::fs::read_to_string(path).ok()?.trim().parse::<u64>().ok());
    let limit = match (machine.map(|kib| kib.saturating_mul(1024)), container) {
        (Some(machine), Some(container)) => machine.min(container),
        (Some(bytes), None) | (None, Some(bytes)) => bytes,
        (None, None) => 16 << 30,
    };
    limit / 2
}
