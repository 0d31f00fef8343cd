//! Command-line arguments. Help text is written once, here, in the doc comments.

use std::num::NonZeroU32;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use stoker_net::bulk::BatchTransport;
use stoker_obs::MetricsListen;
use stoker_plan::Shuffle;

/// Stoker: a distributed data loader for deep-learning training.
///
/// Pack images into shards (`pack`, `index`, `inspect`), run a cluster (`coordinator`,
/// `worker`, `dataset add`), watch it (`status`), check it from a trainer node (`consume`),
/// measure it (`bench`), or try everything on one machine (`demo`). Coordinators replicate
/// with Raft (`coordinator --peers`, `cluster add-node`); coordinators and workers serve
/// Prometheus metrics (`--metrics-listen`; deploy/ has dashboards and alerts). Every connection
/// is mutual TLS: one machine needs no set-up (a local CA), a cluster a CA and a certificate per
/// node (`certs`, `--tls-dir`). Not built yet: object stores.
#[derive(Debug, Parser)]
#[command(name = "stoker", version, propagate_version = true)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Pack an ImageFolder (one folder of images per class) into WebDataset tar shards, with an
    /// index beside each shard and a manifest.json. Output is deterministic.
    Pack(PackArgs),
    /// Index existing WebDataset shards (writes SHARD.tar.idx beside each) and optionally write
    /// a manifest for them.
    Index(IndexArgs),
    /// Show what a shard or a dataset manifest holds: samples, members by extension, sizes.
    Inspect(InspectArgs),
    /// Run a coordinator: datasets, jobs, checkpoints, and the work plan of every job.
    Coordinator(CoordinatorArgs),
    /// Run a worker: decode and augment batches and send them to trainers.
    Worker(WorkerArgs),
    /// Register or list datasets at the coordinator.
    #[command(subcommand)]
    Dataset(DatasetCommand),
    /// List or remove jobs at the coordinator.
    #[command(subcommand)]
    Job(JobCommand),
    /// Change the coordinators of a replicated cluster (Raft membership, through the leader).
    #[command(subcommand)]
    Cluster(ClusterCommand),
    /// Show every coordinator (role, term, log), workers, jobs and each rank's progress and
    /// data stall.
    Status(StatusArgs),
    /// Attach as one trainer rank without a model and consume as fast as possible (or at
    /// --rate): checks a deployment from a trainer node, and drives tests.
    Consume(ConsumeArgs),
    /// Generate a sample dataset and run a coordinator, 2 workers and 2 trainer ranks on
    /// loopback for 2 epochs; verify every sample arrives exactly once per epoch.
    #[cfg(feature = "demo")]
    Demo(DemoArgs),
    /// Make the cluster CA and the certificates of nodes and clients (mutual TLS), revoke
    /// them, and show what a certificate is.
    #[command(subcommand)]
    Certs(CertsCommand),
    /// Apply a transform spec to one JPEG as a worker does, once per augmentation seed, and
    /// print what was drawn (crop box, flip, DCT scale) as JSON lines: preview an augmentation,
    /// or compare it with another library (python/tests/test_torchvision_parity.py does).
    Transform(TransformArgs),
    /// Measure throughput on real data.
    #[command(subcommand)]
    Bench(BenchCommand),
}

#[derive(Debug, Subcommand)]
pub(crate) enum CertsCommand {
    /// Make a cluster CA in --dir (ca.pem, and ca.key readable by its owner only). Keep ca.key
    /// off the nodes: it signs certificates.
    Init(CertsInitArgs),
    /// Issue a certificate for a node or client, signed by the CA in --dir, into --out: the
    /// TLS directory (ca.pem, node.pem, node.key) that --tls-dir takes.
    Issue(CertsIssueArgs),
    /// Deny a certificate: append its SHA-256 to a deny list. Copy the list to every node's
    /// TLS directory as `revoked`; nodes read it again when it changes and refuse the
    /// certificate at its next handshake.
    Revoke(CertsRevokeArgs),
    /// Show a certificate (a PEM file or a TLS directory): role, name, SHA-256, validity.
    Show(CertsShowArgs),
}

#[derive(Debug, Args)]
pub(crate) struct CertsInitArgs {
    /// Where the CA goes (created; refused if a CA is there already).
    #[arg(long, value_name = "DIR")]
    pub(crate) dir: PathBuf,
    /// The CA's name (its common name).
    #[arg(long, default_value = "Stoker cluster CA")]
    pub(crate) name: String,
    /// Days the CA is valid.
    #[arg(long, default_value_t = 3650, value_parser = clap::value_parser!(u64).range(1..=36_500))]
    pub(crate) days: u64,
}

#[derive(Debug, Args)]
pub(crate) struct CertsIssueArgs {
    /// The CA directory (`stoker certs init --dir`).
    #[arg(long, value_name = "DIR")]
    pub(crate) dir: PathBuf,
    /// What the holder may do: coordinator (serve, Raft), worker (pull chunks, push batches),
    /// trainer (attach, open epochs, take batches), admin (add and remove datasets, jobs and
    /// coordinators).
    #[arg(long, value_parser = ["coordinator", "worker", "trainer", "admin"])]
    pub(crate) role: String,
    /// The holder's name (shown in logs and by `certs show`), e.g. the host name.
    #[arg(long)]
    pub(crate) name: String,
    /// The TLS directory to write (ca.pem, node.pem, node.key; existing ones are replaced).
    #[arg(long, value_name = "DIR")]
    pub(crate) out: PathBuf,
    /// DNS names or IP addresses of the holder, added to the certificate (informational:
    /// peers check the CA, the role, and for workers the exact certificate, not names).
    #[arg(long = "host", value_name = "NAME")]
    pub(crate) hosts: Vec<String>,
    /// Days the certificate is valid.
    #[arg(long, default_value_t = 365, value_parser = clap::value_parser!(u64).range(1..=3650))]
    pub(crate) days: u64,
    /// The CAs the holder trusts, written as its ca.pem [default: the CA of --dir]. During a
    /// CA rotation give a file with both CAs (`cat old/ca.pem new/ca.pem`).
    #[arg(long, value_name = "FILE")]
    pub(crate) trust: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub(crate) struct CertsRevokeArgs {
    /// The certificate to deny (a PEM file, or a TLS directory's node.pem).
    pub(crate) cert: PathBuf,
    /// The deny list to append to (created if missing); nodes read it as `revoked` in their
    /// TLS directory.
    #[arg(long, value_name = "FILE")]
    pub(crate) deny_list: PathBuf,
}

#[derive(Debug, Args)]
pub(crate) struct CertsShowArgs {
    /// A PEM certificate file, or a TLS directory (its node.pem and ca.pem are shown).
    pub(crate) path: PathBuf,
}

#[derive(Debug, Subcommand)]
pub(crate) enum BenchCommand {
    /// Run the worker pipeline (decode + RandomResizedCrop + flip by default) over a dataset
    /// for a while, then, in the same run, plain full JPEG decode of the same images with the
    /// same threads (the floor), and report both and their ratio.
    Pipeline(BenchPipelineArgs),
    /// Run a whole cluster in this process (coordinator, N workers, R trainer ranks over QUIC
    /// on loopback) over a dataset and report images/s, per-rank wait, first-batch latency and
    /// peak memory.
    #[cfg(feature = "demo")]
    Cluster(BenchClusterArgs),
    /// Move batches to one trainer over one connection, on loopback or between two hosts
    /// (--netns), through the same send and receive code as workers and trainers, and report
    /// GB/s, CPU-seconds per GB on each side and for the machine, and the trainer's CPU per
    /// batch: plain TCP (the baseline), rustls's TLS stream, bulk connections (the default),
    /// and QUIC from quinn's defaults to Stoker's settings.
    #[cfg(feature = "demo")]
    Delivery(BenchDeliveryArgs),
}

/// Where the coordinator is, for the commands that call it, and this client's certificate.
#[derive(Debug, Args)]
pub(crate) struct CoordinatorAddr {
    /// The coordinator's address HOST:PORT, or the addresses of a replicated coordinator's nodes
    /// as HOST:PORT,HOST:PORT,... (calls follow the leader among them).
    #[arg(long, env = "STOKER_COORDINATOR", default_value = "127.0.0.1:7400")]
    pub(crate) coordinator: String,
    #[command(flatten)]
    pub(crate) tls: TlsArgs,
}

/// Where this node's certificate comes from (mutual TLS, DESIGN §10).
#[derive(Debug, Args)]
pub(crate) struct TlsArgs {
    /// This node's TLS directory: ca.pem (the cluster CA, or two during a rotation), node.pem
    /// and node.key (its certificate, whose role must fit the command), and optionally
    /// `revoked` (SHA-256 fingerprints refused). `stoker certs issue` writes one. [default:
    /// the local CA in ~/.local/share/stoker/local-ca, made on first use: one machine only]
    #[arg(long, env = "STOKER_TLS_DIR", value_name = "DIR")]
    pub(crate) tls_dir: Option<PathBuf>,
    /// Check no certificates: traffic is encrypted, but anyone who reaches a Stoker port may
    /// do anything (take batches, fail jobs). For demos on a trusted network; every node says
    /// so in its log. Nodes with --insecure and nodes with certificates cannot talk.
    #[arg(long)]
    pub(crate) insecure: bool,
}

impl TlsArgs {
    /// Where TLS comes from, as the flags say.
    pub(crate) fn source(&self) -> Result<stoker_net::TlsSource, stoker_net::TlsError> {
        stoker_net::TlsSource::from_flags(self.tls_dir.clone(), self.insecure)
    }
}

#[derive(Debug, Args)]
pub(crate) struct CoordinatorArgs {
    /// Address to listen on (UDP, QUIC).
    #[arg(long, default_value = "0.0.0.0:7400")]
    pub(crate) listen: String,
    /// Where datasets, jobs and checkpoints are kept; a restarted coordinator reads them back.
    #[arg(long, default_value = "stoker-data")]
    pub(crate) data_dir: PathBuf,
    /// Milliseconds a worker's lease lives without a heartbeat before its chunk is granted again.
    #[arg(long, default_value_t = 3000)]
    pub(crate) lease_ttl_ms: u64,
    /// Milliseconds a lease may go without any of its batches finished before it is granted
    /// again, even though its worker still lists it (the worker is stuck: a hung dataset open
    /// or decode, a delivery that never completes). Longer than one batch may take.
    #[arg(long, default_value_t = 60_000)]
    pub(crate) lease_stall_ms: u64,
    /// Milliseconds a rank's trainer may stay silent (trainers report every second) before its
    /// work waits for it instead of occupying workers.
    #[arg(long, default_value_t = 5000)]
    pub(crate) trainer_ttl_ms: u64,
    /// Steps per chunk of work granted to a worker.
    #[arg(long, default_value_t = 2)]
    pub(crate) chunk_steps: u32,
    /// Hours a job may go without any trainer before it is removed with its checkpoint (0:
    /// keep jobs until `stoker job rm`). Counted from the coordinator's start for jobs no
    /// trainer attached to since.
    #[arg(long, default_value_t = 168.0)]
    pub(crate) job_ttl_hours: f64,
    /// This coordinator's Raft node id (a positive number, unique in the cluster).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) node_id: u64,
    /// The coordinators of a replicated cluster, ID=HOST:PORT,... including this one (e.g.
    /// 1=c1:7400,2=c2:7400,3=c3:7400). Start every node with the same list: they form the
    /// cluster once, and a restart reads the membership back from --data-dir (a list that
    /// disagrees with it is refused). Without it this coordinator is a cluster of one.
    #[arg(long, value_delimiter = ',')]
    pub(crate) peers: Vec<String>,
    /// Start as a new, empty node that waits to be added with `stoker cluster add-node`
    /// instead of forming a cluster.
    #[arg(long)]
    pub(crate) join: bool,
    /// Address other coordinators and clients reach this one at [default: its --peers entry,
    /// else --listen].
    #[arg(long)]
    pub(crate) advertise: Option<String>,
    /// Serve Prometheus metrics at http://ADDR/metrics, with /healthz (alive) and /readyz
    /// (a Raft leader is known), on this TCP address; `off` serves nothing.
    #[arg(long, env = "STOKER_METRICS_LISTEN", default_value = "0.0.0.0:7401", value_name = "ADDR|off")]
    pub(crate) metrics_listen: MetricsListen,
    /// The largest batch a job may have, in bytes (batch size x one output sample's bytes): a
    /// trainer attaching a job over it is refused, before any worker allocates for it.
    #[arg(long, default_value_t = stoker_coordinator::config::DEFAULT_MAX_BATCH_BYTES, value_name = "BYTES")]
    pub(crate) max_batch_bytes: u64,
    /// The most ranks a job may have: a trainer attaching a new job with a larger world size
    /// is refused.
    #[arg(long, default_value_t = stoker_coordinator::config::DEFAULT_MAX_WORLD_SIZE, value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) max_world_size: u32,
    /// The largest flow window (`prefetch`, in steps) a new job may ask for.
    #[arg(long, default_value_t = stoker_coordinator::config::DEFAULT_MAX_PREFETCH, value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) max_prefetch: u32,
    /// The most jobs kept: a trainer attaching a new job beyond it is refused (`stoker job rm`
    /// removes finished ones; idle ones go after --job-ttl-hours).
    #[arg(long, default_value_t = stoker_coordinator::config::DEFAULT_MAX_JOBS as u64, value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) max_jobs: u64,
    /// The most datasets kept.
    #[arg(long, default_value_t = stoker_coordinator::config::DEFAULT_MAX_DATASETS as u64, value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) max_datasets: u64,
    /// The most connections open at once (handshakes in progress count); more are refused
    /// before their handshake, and their clients retry.
    #[arg(long, default_value_t = stoker_coordinator::config::DEFAULT_MAX_CONNECTIONS as u64, value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) max_connections: u64,
    /// The most connections open at once from one IP address (a NAT or a host of many
    /// trainers may need more).
    #[arg(long, default_value_t = stoker_coordinator::config::DEFAULT_MAX_CONNECTIONS_PER_ADDRESS as u64, value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) max_connections_per_address: u64,
    /// The most requests one connection may have open at once: a client waits for a free
    /// one, a peer that ignores the limit is disconnected.
    #[arg(long, default_value_t = stoker_coordinator::config::DEFAULT_MAX_STREAMS_PER_CONNECTION, value_parser = clap::value_parser!(u32).range(4..))]
    pub(crate) max_streams_per_connection: u32,
    /// Milliseconds one request may take to arrive, from its first byte to its last: a slower
    /// sender (or one that opens requests and sends nothing) is disconnected.
    #[arg(long = "request-timeout-ms", default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(100..))]
    pub(crate) request_timeout_ms: u64,
    /// A folder datasets must be in (repeat for several): `dataset add` of a manifest outside
    /// every one (after symlinks are resolved) is refused [default: anywhere this coordinator
    /// can read], and so is one listing a shard outside them (judged by its path where this
    /// host lacks the file). Manifests must be regular files of at most 256 MiB in any case.
    #[arg(long = "dataset-root", value_name = "DIR")]
    pub(crate) dataset_roots: Vec<PathBuf>,
    #[command(flatten)]
    pub(crate) tls: TlsArgs,
}

#[derive(Debug, Args)]
pub(crate) struct WorkerArgs {
    /// The coordinator's address HOST:PORT, or the addresses of a replicated coordinator's nodes
    /// as HOST:PORT,HOST:PORT,... (the worker follows the leader among them).
    #[arg(long, env = "STOKER_COORDINATOR", default_value = "127.0.0.1:7400")]
    pub(crate) coordinator: String,
    /// Address to listen on for trainers: UDP (QUIC), and with --batch-transport tcp the same
    /// port on TCP too (bulk connections).
    #[arg(long, default_value = "0.0.0.0:7500")]
    pub(crate) listen: String,
    /// How batches go to trainers: `tcp` sends them on each trainer's bulk connection (TLS
    /// 1.3 over TCP at --listen's port, about half QUIC's CPU per GB across hosts) and over
    /// QUIC to trainers without one; `quic` listens on UDP only and sends every batch over
    /// QUIC.
    #[arg(long, env = "STOKER_BATCH_TRANSPORT", default_value = "tcp", value_name = "tcp|quic")]
    pub(crate) batch_transport: BatchTransport,
    /// Address trainers use to reach this worker [default: --listen; required when it is 0.0.0.0].
    #[arg(long)]
    pub(crate) advertise: Option<String>,
    /// Decode threads [default: number of CPUs].
    #[arg(long)]
    pub(crate) threads: Option<usize>,
    /// Batches made or in delivery at once [default: 2 x threads, at least 4].
    #[arg(long)]
    pub(crate) in_flight: Option<usize>,
    /// Milliseconds one batch's delivery may take (until the trainer acknowledged every byte)
    /// before it is failed and made again: a trainer that stopped reading does not hold this
    /// worker's slots.
    #[arg(long, default_value_t = 30_000)]
    pub(crate) delivery_timeout_ms: u64,
    /// Milliseconds a job may go without work here before its pipeline (decode threads, batch
    /// buffers, mapped shards) is released; a job the coordinator no longer lists as live (all
    /// its trainers gone) is released at once.
    #[arg(long, default_value_t = 60_000)]
    pub(crate) job_idle_ms: u64,
    /// Largest UDP payload for batches to trainers on other hosts. MTU discovery probes up to
    /// it, so too high costs only probes. Raise it where every hop carries jumbo frames (9000-byte
    /// MTU: 8952). Trainers on this host always get 65527 (loopback).
    #[arg(long, default_value_t = stoker_net::ETHERNET_UDP_PAYLOAD, value_parser = clap::value_parser!(u16).range(1200..=65527))]
    pub(crate) max_udp_payload: u16,
    /// Serve Prometheus metrics at http://ADDR/metrics, with /healthz (alive) and /readyz
    /// (registered with the coordinator), on this TCP address; `off` serves nothing.
    #[arg(long, env = "STOKER_METRICS_LISTEN", default_value = "0.0.0.0:7501", value_name = "ADDR|off")]
    pub(crate) metrics_listen: MetricsListen,
    /// Bytes of batch buffers one job may hold here (its batches in flight x one batch's
    /// bytes; each job its own): a job with large batches gets fewer buffers, and a job two
    /// batches of which do not fit is left to other workers [default: half the memory of the
    /// machine or of the container's limit, whichever is less].
    #[arg(long, value_name = "BYTES")]
    pub(crate) max_batch_memory: Option<u64>,
    /// A folder datasets must be in (repeat for several): a job whose manifest or shards are
    /// outside every one (after symlinks are resolved) is refused here before anything of it
    /// is read, said in the log and reported stuck (`stoker status`), so that workers whose
    /// roots hold it make it [default: anywhere this worker can read]. Shards and manifests must be regular
    /// files in any case (no devices, no FIFOs).
    #[arg(long = "dataset-root", value_name = "DIR")]
    pub(crate) dataset_roots: Vec<PathBuf>,
    /// The most trainer connections open at once (handshakes in progress count); more are
    /// refused before their handshake.
    #[arg(long, default_value_t = stoker_net::DEFAULT_MAX_CONNECTIONS as u64, value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) max_connections: u64,
    /// The most trainer connections open at once from one IP address.
    #[arg(long, default_value_t = stoker_net::DEFAULT_MAX_CONNECTIONS_PER_ADDRESS as u64, value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) max_connections_per_address: u64,
    #[command(flatten)]
    pub(crate) tls: TlsArgs,
}

#[derive(Debug, Subcommand)]
pub(crate) enum DatasetCommand {
    /// Register a dataset: a manifest.json or the folder `stoker pack` wrote. Workers open the
    /// same path, so it must be on storage they share.
    Add(DatasetAddArgs),
    /// List registered datasets.
    Ls(CoordinatorAddr),
}

#[derive(Debug, Subcommand)]
pub(crate) enum JobCommand {
    /// List jobs: ranks, live trainers, where each stands, how long it has been idle.
    Ls(CoordinatorAddr),
    /// Remove a job and its checkpoint: nothing of it is made any more. A trainer that
    /// attaches with its name afterwards makes a new job (and resumes from its own saved
    /// state_dict, if it loads one).
    Rm(JobRmArgs),
}

#[derive(Debug, Subcommand)]
pub(crate) enum ClusterCommand {
    /// Add a coordinator: start it first with `stoker coordinator --node-id ID --join
    /// --listen ... --data-dir EMPTY_DIR`, then run this; it catches up as a learner, then
    /// votes. Update every node's --peers to the new list before their next restart.
    AddNode(AddNodeArgs),
    /// Remove a coordinator (a dead one before replacing it, or one being retired). Update
    /// every node's --peers before their next restart.
    RemoveNode(RemoveNodeArgs),
}

#[derive(Debug, Args)]
pub(crate) struct AddNodeArgs {
    /// The new node as ID=HOST:PORT (the id it was started with, the address others dial).
    pub(crate) node: String,
    #[command(flatten)]
    pub(crate) coordinator: CoordinatorAddr,
}

#[derive(Debug, Args)]
pub(crate) struct RemoveNodeArgs {
    /// The node id to remove (`stoker status` lists them).
    pub(crate) id: u64,
    #[command(flatten)]
    pub(crate) coordinator: CoordinatorAddr,
}

#[derive(Debug, Args)]
pub(crate) struct JobRmArgs {
    /// The job's name (`stoker job ls` shows it).
    pub(crate) name: String,
    /// Remove it even though trainers of it are live: they fail at their next request.
    #[arg(long)]
    pub(crate) force: bool,
    #[command(flatten)]
    pub(crate) coordinator: CoordinatorAddr,
}

#[derive(Debug, Args)]
pub(crate) struct DatasetAddArgs {
    /// Name trainers use.
    pub(crate) name: String,
    /// manifest.json, or the folder holding it.
    pub(crate) path: PathBuf,
    #[command(flatten)]
    pub(crate) coordinator: CoordinatorAddr,
}

#[derive(Debug, Args)]
pub(crate) struct StatusArgs {
    #[command(flatten)]
    pub(crate) coordinator: CoordinatorAddr,
    /// Print one JSON object.
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Debug, Args)]
pub(crate) struct TransformArgs {
    /// The JPEG to transform. Without it, --source-size gives the source's size and only the
    /// geometry is drawn.
    #[arg(required_unless_present = "source_size")]
    pub(crate) image: Option<PathBuf>,
    /// The TransformSpec, JSON (what `stoker.Loader` sends: {"transforms": [...], "layout":
    /// "NHWC", "dct_scaling": true}).
    #[arg(long, value_name = "JSON")]
    pub(crate) spec: String,
    /// Augmentation seeds: `N`, `A..B` (B excluded) or a comma-separated list of both.
    #[arg(long, default_value = "0", value_name = "SEEDS", value_parser = parse_seeds)]
    pub(crate) seeds: Seeds,
    /// Write each output to DIR/SEED.raw: the sample's bytes as they sit in a batch (the
    /// spec's layout and dtype, little-endian).
    #[arg(long, value_name = "DIR", conflicts_with = "source_size")]
    pub(crate) out: Option<PathBuf>,
    /// Draw only the geometry, for a source of WIDTHxHEIGHT pixels (no image is read).
    #[arg(long, value_name = "WIDTHxHEIGHT", value_parser = parse_source_size)]
    pub(crate) source_size: Option<(u32, u32)>,
}

#[derive(Debug, Args)]
pub(crate) struct ConsumeArgs {
    #[command(flatten)]
    pub(crate) coordinator: CoordinatorAddr,
    /// Dataset name.
    #[arg(long)]
    pub(crate) dataset: String,
    /// This trainer's rank [default: $RANK, else 0].
    #[arg(long)]
    pub(crate) rank: Option<u32>,
    /// Number of ranks [default: $WORLD_SIZE, else 1].
    #[arg(long)]
    pub(crate) world_size: Option<u32>,
    /// Samples per batch per rank.
    #[arg(long, default_value_t = 256)]
    pub(crate) batch_size: u32,
    /// Epochs to consume, starting at --first-epoch.
    #[arg(long, default_value_t = 1)]
    pub(crate) epochs: u64,
    /// First epoch.
    #[arg(long, default_value_t = 0)]
    pub(crate) first_epoch: u64,
    /// RandomResizedCrop output side (ignored with --transforms).
    #[arg(long, default_value_t = 224)]
    pub(crate) size: u32,
    /// A TransformSpec as JSON instead of RandomResizedCrop(size) + RandomHorizontalFlip.
    #[arg(long, value_name = "JSON")]
    pub(crate) transforms: Option<String>,
    /// Seed of shuffling and augmentation.
    #[arg(long, default_value_t = 0)]
    pub(crate) seed: u64,
    /// Shuffle: none, full, window:K (K shards per window), or block:S:N (blocks of S
    /// samples, N blocks per window: mixes class-sorted data without reading it all at once).
    #[arg(long, default_value = "window:8")]
    pub(crate) shuffle: String,
    /// Tail policy: drop, pad or partial.
    #[arg(long, default_value = "drop")]
    pub(crate) tail: String,
    /// Steps workers may run ahead of the slowest rank.
    #[arg(long, default_value_t = 8)]
    pub(crate) prefetch: u32,
    /// Job name [default: derived from the dataset and the spec].
    #[arg(long)]
    pub(crate) job: Option<String>,
    /// Consume at most this many batches per second (simulates a training step).
    #[arg(long)]
    pub(crate) rate: Option<f64>,
    /// Write one line per sample as it is consumed: `epoch step key` (flushed after every
    /// batch, so the file shows the rank's progress while it runs).
    #[arg(long, value_name = "FILE")]
    pub(crate) keys_out: Option<PathBuf>,
    /// Print one JSON object.
    #[arg(long)]
    pub(crate) json: bool,
    /// Serve this rank's own metrics (bytes received, first-batch latency, buffered batches)
    /// at http://ADDR/metrics while it runs; the coordinator exports its steps, batches and
    /// wait without this.
    #[arg(long, default_value = "off", value_name = "ADDR|off")]
    pub(crate) metrics_listen: MetricsListen,
    /// How batches arrive: `tcp` makes a bulk connection (TLS over TCP) to every worker that
    /// takes one and receives over QUIC from the rest; `quic` receives over QUIC only.
    #[arg(long, env = "STOKER_BATCH_TRANSPORT", default_value = "tcp", value_name = "tcp|quic")]
    pub(crate) batch_transport: BatchTransport,
}

#[cfg(feature = "demo")]
#[derive(Debug, Args)]
pub(crate) struct BenchClusterArgs {
    /// The dataset: a manifest.json, or the folder holding one.
    #[arg(long, value_name = "MANIFEST")]
    pub(crate) data: PathBuf,
    /// Workers.
    #[arg(long, default_value_t = 1)]
    pub(crate) workers: usize,
    /// Decode threads per worker.
    #[arg(long, default_value_t = 1)]
    pub(crate) threads: usize,
    /// Trainer ranks.
    #[arg(long, default_value_t = 1)]
    pub(crate) ranks: u32,
    /// Epochs.
    #[arg(long, default_value_t = 1)]
    pub(crate) epochs: u64,
    /// Samples per batch per rank.
    #[arg(long, default_value_t = 256)]
    pub(crate) batch_size: u32,
    /// RandomResizedCrop output side.
    #[arg(long, default_value_t = 224)]
    pub(crate) size: u32,
    /// Shuffle: none, full, window, window:K, block or block:S:N.
    #[arg(long, default_value = "window", value_parser = parse_shuffle)]
    pub(crate) shuffle: Shuffle,
    /// Also run `bench pipeline` with the same threads per worker for this many seconds first,
    /// and report the cluster's rate against workers x that rate.
    #[arg(long)]
    pub(crate) pipeline_seconds: Option<f64>,
    /// `off`: workers do not time each sample and batch into their metrics (as a worker
    /// always does); only to measure what metrics cost, against a run with `on`.
    #[arg(long, default_value = "on", value_parser = ["on", "off"])]
    pub(crate) metrics: String,
    /// Run the cluster with mutual TLS and a fresh cluster CA (`on`, as deployed) or
    /// `--insecure` (`off`; to measure what the certificate checks cost).
    #[arg(long, default_value = "on", value_parser = ["on", "off"])]
    pub(crate) mutual_tls: String,
    /// Print one JSON object.
    #[arg(long)]
    pub(crate) json: bool,
}

#[cfg(feature = "demo")]
#[derive(Debug, Args)]
pub(crate) struct BenchDeliveryArgs {
    /// Samples per batch (the batch is BATCH_SIZE x SIZE x SIZE x 3 bytes).
    #[arg(long, default_value_t = 256)]
    pub(crate) batch_size: u32,
    /// Image side.
    #[arg(long, default_value_t = 224)]
    pub(crate) size: u32,
    /// Seconds to measure each variant, after one second of warm-up.
    #[arg(long, default_value_t = 5.0)]
    pub(crate) seconds: f64,
    /// Also measure Stoker's settings with this largest UDP payload [default: 65527 on
    /// loopback; with --netns, what --mtu carries (MTU - 48: 8952 at 9000) when above 1500].
    #[arg(long, value_parser = clap::value_parser!(u16).range(1200..=65527))]
    pub(crate) max_udp_payload: Option<u16>,
    /// Measure between two hosts instead of on loopback: the sender and the receiver each in a
    /// network namespace of its own, joined by veth links through a router at --mtu (needs
    /// root; the namespaces are removed afterwards).
    #[arg(long)]
    pub(crate) netns: bool,
    /// The links' MTU with --netns (1500; 9000 for jumbo frames, with --max-udp-payload 8952).
    #[arg(long, default_value_t = 1500, value_parser = clap::value_parser!(u32).range(1280..=65000))]
    pub(crate) mtu: u32,
    /// Run only the variants whose name contains this (e.g. `bulk`, `tcp`, `rustls`, `defaults`, `pool`).
    #[arg(long, value_name = "TEXT")]
    pub(crate) only: Option<String>,
    /// Print one JSON object.
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Debug, Args)]
pub(crate) struct BenchPipelineArgs {
    /// The dataset: a manifest.json, or the folder holding one.
    #[arg(long, value_name = "MANIFEST")]
    pub(crate) data: PathBuf,
    /// Decode threads [default: number of CPUs].
    #[arg(long)]
    pub(crate) threads: Option<usize>,
    /// Samples per batch.
    #[arg(long, default_value_t = 256)]
    pub(crate) batch_size: u32,
    /// Output side of RandomResizedCrop (ignored with --transforms).
    #[arg(long, default_value_t = 224)]
    pub(crate) size: u32,
    /// Seconds to run the pipeline; the floor runs as long (and so do the pipeline and the floor
    /// with --baseline-threads).
    #[arg(long, default_value_t = 10.0)]
    pub(crate) seconds: f64,
    /// Turns the pipeline and the floor take, alternating, in those seconds (a slow spell of a
    /// shared machine then falls on both; each turn starts a fresh pipeline where the last
    /// stopped, and its clock starts at its first batch).
    #[arg(long, default_value_t = 4)]
    pub(crate) rounds: u32,
    /// A TransformSpec as JSON instead of RandomResizedCrop(size) + RandomHorizontalFlip, e.g.
    /// '{"transforms": [{"type": "Resize", "shorter_side": 256}, {"type": "CenterCrop", "size": 224}]}'.
    #[arg(long, value_name = "JSON")]
    pub(crate) transforms: Option<String>,
    /// Decode at full scale even when the crop would allow M/8 DCT scaling.
    #[arg(long)]
    pub(crate) no_dct_scaling: bool,
    /// Plan seed.
    #[arg(long, default_value_t = 0)]
    pub(crate) seed: u64,
    /// Skip the full-decode floor (the ratio is then not reported).
    #[arg(long)]
    pub(crate) no_floor: bool,
    /// Take the floor from another dataset of the same images, decoding all of them in turn.
    /// For a dataset `stoker pack` wrote (JPEGs re-encoded with restart markers, ~4% slower to
    /// decode whole), pass the original files, e.g. the same images as WebDataset shards.
    #[arg(long, value_name = "MANIFEST", conflicts_with = "no_floor")]
    pub(crate) floor_data: Option<PathBuf>,
    /// Also run the pipeline and the floor with this many threads, in the same turns, and
    /// report how both scale to --threads (e.g. `--threads 2 --baseline-threads 1`). Measuring
    /// in turns keeps the drift of a shared machine out of the scaling figure.
    #[arg(long, value_name = "N")]
    pub(crate) baseline_threads: Option<usize>,
    /// Also run the pipeline without timing samples into metrics (a worker always times
    /// them), in the same turns, and report what metrics cost.
    #[arg(long)]
    pub(crate) metrics_cost: bool,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Debug, Args)]
pub(crate) struct PackArgs {
    /// ImageFolder root: class folders holding images (jpg, jpeg, png, ppm, bmp, pgm, tif, tiff, webp).
    #[arg(long)]
    pub(crate) input: PathBuf,
    /// Folder for the shards, their indexes and manifest.json (created if missing).
    #[arg(long)]
    pub(crate) output: PathBuf,
    /// Largest shard size, e.g. 256MiB, 1GB, 500000 (bytes). Samples are never split.
    #[arg(long, default_value = "256MiB", value_parser = parse_byte_size)]
    pub(crate) shard_size: u64,
    /// Threads reading image files [default: number of CPUs].
    #[arg(long)]
    pub(crate) threads: Option<usize>,
    /// Shard file names are PREFIX-000000.tar, PREFIX-000001.tar, ...
    #[arg(long, default_value = "shard")]
    pub(crate) prefix: String,
    /// Replace a dataset already in the output folder.
    #[arg(long)]
    pub(crate) force: bool,
    /// Store every image file byte for byte. By default each JPEG is re-encoded losslessly
    /// (same DCT coefficients, so the same pixels) with a restart marker per MCU and optimized
    /// Huffman tables, which lets workers entropy-decode only the part a crop covers; files
    /// that cannot be re-encoded exactly are stored as they are.
    #[arg(long)]
    pub(crate) verbatim: bool,
    /// Write samples in folder order (sorted classes, sorted files). By default they are
    /// shuffled across shards: in folder order each shard holds one or two classes, and the
    /// default `window` shuffle, which reads a few shards at a time, would then give batches
    /// of a handful of classes. Data kept in folder order needs `shuffle=block` or `full`.
    #[arg(long)]
    pub(crate) no_shuffle: bool,
    /// Seed of the order samples are written in (recorded in manifest.json).
    #[arg(long, default_value_t = 0, conflicts_with = "no_shuffle")]
    pub(crate) seed: u64,
}

#[derive(Debug, Args)]
pub(crate) struct IndexArgs {
    /// Shard files; WebDataset brace patterns expand: 'train-{000000..000127}.tar'.
    #[arg(required = true)]
    pub(crate) shards: Vec<String>,
    /// Also write a manifest listing these shards (paths relative to the manifest's folder).
    #[arg(long, value_name = "OUT.json")]
    pub(crate) manifest: Option<PathBuf>,
    /// Rebuild indexes even when a valid one exists.
    #[arg(long)]
    pub(crate) force: bool,
}

#[derive(Debug, Args)]
pub(crate) struct InspectArgs {
    /// A shard (.tar), a manifest (.json), or a folder holding manifest.json.
    pub(crate) path: PathBuf,
    /// Print one JSON object (for scripts); for a shard it lists every member's offset and size.
    #[arg(long)]
    pub(crate) json: bool,
    /// Samples listed in the text output of a shard.
    #[arg(long, default_value_t = 5)]
    pub(crate) show: usize,
    /// Of a dataset: the shuffle whose label mixing is measured (none, full, window,
    /// window:K, block, block:S:N).
    #[arg(long, default_value = "window", value_parser = parse_shuffle)]
    pub(crate) shuffle: Shuffle,
    /// Of a dataset: samples per global batch (all ranks' batches of one step) in the label
    /// mixing measure.
    #[arg(long, default_value_t = NonZeroU32::new(256).unwrap_or(NonZeroU32::MIN))]
    pub(crate) global_batch: NonZeroU32,
}

/// The augmentation seeds of `stoker transform`.
#[derive(Clone, Debug)]
pub(crate) struct Seeds(pub(crate) Vec<u64>);

/// `7`, `0..100` or `1,5,10..20`: the seeds of `stoker transform`, at most a million.
pub(crate) fn parse_seeds(text: &str) -> Result<Seeds, String> {
    const MAX_SEEDS: u64 = 1_000_000;
    let mut seeds = Vec::new();
    for part in text.split(',') {
        let part = part.trim();
        let parse = |number: &str| number.trim().parse::<u64>().map_err(|error| format!("{number:?} is not a seed: {error}"));
        match part.split_once("..") {
            Some((start, end)) => {
                let (start, end) = (parse(start)?, parse(end)?);
                if end.saturating_sub(start) + seeds.len() as u64 > MAX_SEEDS {
                    return Err(format!("{part}: at most {MAX_SEEDS} seeds"));
                }
                seeds.extend(start..end);
            }
            None => seeds.push(parse(part)?),
        }
    }
    if seeds.is_empty() || seeds.len() as u64 > MAX_SEEDS {
        return Err(format!("give between 1 and {MAX_SEEDS} seeds"));
    }
    Ok(Seeds(seeds))
}

/// `640x480` → (640, 480).
pub(crate) fn parse_source_size(text: &str) -> Result<(u32, u32), String> {
    let parsed = text.split_once('x').and_then(|(width, height)| Some((width.parse::<u32>().ok()?, height.parse::<u32>().ok()?)));
    match parsed {
        Some((width, height)) if width > 0 && height > 0 => Ok((width, height)),
        _ => Err(format!("{text:?}: give WIDTHxHEIGHT, both positive, e.g. 640x480")),
    }
}

fn parse_shuffle(text: &str) -> Result<Shuffle, String> {
    text.parse().map_err(|error: stoker_plan::error::PlanError| error.to_string())
}

#[cfg(feature = "demo")]
#[derive(Debug, Args)]
pub(crate) struct DemoArgs {
    /// Epochs to run.
    #[arg(long, default_value_t = 2)]
    pub(crate) epochs: u64,
    /// An ImageFolder to use instead of the generated sample.
    #[arg(long)]
    pub(crate) data: Option<PathBuf>,
    /// Working folder for the generated images and shards.
    #[arg(long, default_value = "demo-data")]
    pub(crate) workdir: PathBuf,
    /// Classes in the generated sample.
    #[arg(long, default_value_t = 10)]
    pub(crate) classes: u32,
    /// Images per class in the generated sample.
    #[arg(long, default_value_t = 60)]
    pub(crate) images_per_class: u32,
}

/// `256MiB`, `1GB`, `4k`, `1000`: a byte count with an optional decimal or binary unit.
pub(crate) fn parse_byte_size(text: &str) -> Result<u64, String> {
    let trimmed = text.trim();
    let split = trimmed.find(|character: char| !character.is_ascii_digit() && character != '.').unwrap_or(trimmed.len());
    let (number, unit) = trimmed.split_at(split);
    let value: f64 = number.parse().map_err(|_| format!("{text:?} is not a size like 256MiB"))?;
    let multiplier: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" => 1000,
        "kib" => 1 << 10,
        "m" | "mb" => 1_000_000,
        "mib" => 1 << 20,
        "g" | "gb" => 1_000_000_000,
        "gib" => 1 << 30,
        other => return Err(format!("unknown size unit {other:?} (use B, KB, KiB, MB, MiB, GB, GiB)")),
    };
    let bytes = value * multiplier as f64;
    if bytes < 4096.0 {
        return Err(format!("{text:?} is too small for a shard (at least 4KiB)"));
    }
    Ok(bytes as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_sizes_parse_with_units() {
        assert_eq!(parse_byte_size("256MiB"), Ok(256 << 20));
        assert_eq!(parse_byte_size("1GB"), Ok(1_000_000_000));
        assert_eq!(parse_byte_size("8192"), Ok(8192));
        assert_eq!(parse_byte_size("1.5 KiB").ok(), None, "below the 4KiB floor");
        assert!(parse_byte_size("12 parsecs").is_err());
        assert!(parse_byte_size("MiB").is_err());
    }

    #[test]
    fn cli_definition_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
