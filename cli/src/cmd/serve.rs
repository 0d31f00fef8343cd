//! `stoker coordinator` and `stoker worker`: long-running nodes, stopped by Ctrl-C or SIGTERM
//! (a worker then hands its leases back).

use crate::flags::{ObjectStoreArgs, TlsArgs};
use clap::Args;
use std::collections::BTreeMap;
use std::net::UdpSocket;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;
use stoker_net::bulk::BatchTransport;

use anyhow::Context;
use stoker_coordinator::CoordinatorConfig;
use stoker_format::DatasetRoots;
use stoker_net::{QuicCoordinator, Role};
use stoker_obs::{Metrics, MetricsListen, MetricsServer, ScrapeToken};
use stoker_worker::WorkerConfig;

use super::remote::{resolve, resolve_coordinators, runtime};

#[derive(Debug, Args)]
pub(crate) struct CoordinatorArgs {
    /// Address to listen on (UDP, QUIC).
    #[arg(long, default_value = "0.0.0.0:7400")]
    pub(crate) listen: String,
    /// Where datasets, jobs and checkpoints are kept; a restarted coordinator reads them back.
    #[arg(long, default_value = "stoker-data")]
    pub(crate) data_dir: PathBuf,
    /// Milliseconds a worker's lease lives without a heartbeat before its chunk is granted again.
    #[arg(long, default_value_t = millis(coordinator_defaults().lease_ttl))]
    pub(crate) lease_ttl_ms: u64,
    /// Milliseconds a lease may go without any of its batches finished before it is granted
    /// again, even though its worker still lists it (the worker is stuck: a hung dataset open
    /// or decode, a delivery that never completes). Longer than one batch may take.
    #[arg(long, default_value_t = millis(coordinator_defaults().lease_stall))]
    pub(crate) lease_stall_ms: u64,
    /// Milliseconds a rank's trainer may stay silent (trainers report every second) before its
    /// work waits for it instead of occupying workers.
    #[arg(long, default_value_t = millis(coordinator_defaults().trainer_ttl))]
    pub(crate) trainer_ttl_ms: u64,
    /// Steps per chunk of work granted to a worker.
    #[arg(long, default_value_t = coordinator_defaults().chunk_steps)]
    pub(crate) chunk_steps: u32,
    /// Hours a job may go without any trainer before it is removed with its checkpoint (0:
    /// keep jobs until `stoker job rm`). Counted from the coordinator's start for jobs no
    /// trainer attached to since.
    #[arg(long, default_value_t = coordinator_defaults().job_ttl.map_or(0.0, |ttl| ttl.as_secs_f64() / 3600.0))]
    pub(crate) job_ttl_hours: f64,
    /// This coordinator's Raft node id (a positive number, unique in the cluster). Under
    /// mutual TLS its certificate must name the same id (`stoker certs issue --role coordinator
    /// --node-id N`); the local CA makes one per id.
    #[arg(long, default_value_t = coordinator_defaults().node_id, value_parser = clap::value_parser!(u64).range(1..))]
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
    /// A file holding the bearer token scrapers must present for /metrics (`Authorization:
    /// Bearer TOKEN`, Prometheus's `authorization.credentials_file`); /healthz and /readyz stay
    /// open for probes [default: /metrics unauthenticated: bind it to an internal address].
    #[arg(long, env = "STOKER_METRICS_TOKEN_FILE", value_name = "FILE")]
    pub(crate) metrics_token_file: Option<PathBuf>,
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
    /// The most jobs one trainer certificate may have created among those kept: an attach
    /// creating another is refused (`stoker job rm` removes finished ones).
    #[arg(long, default_value_t = stoker_coordinator::config::DEFAULT_MAX_JOBS_PER_CERTIFICATE as u64, value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) max_jobs_per_certificate: u64,
    /// The most bytes the replicated state (and so a snapshot) may hold: each job counts
    /// 48 KiB, its dataset's record and 192 B per rank of its world size; each dataset its
    /// record (about 21 B a shard). A new job or dataset over it is refused. At most 512 MiB,
    /// half the largest snapshot a lagging coordinator takes.
    #[arg(long, default_value_t = stoker_coordinator::config::DEFAULT_MAX_STATE_BYTES, value_parser = clap::value_parser!(u64).range(stoker_coordinator::config::MIN_STATE_BYTES..=stoker_coordinator::config::MAX_STATE_BYTES_LIMIT), value_name = "BYTES")]
    pub(crate) max_state_bytes: u64,
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
    #[arg(long = "request-timeout-ms", default_value_t = millis(coordinator_defaults().request_timeout), value_parser = clap::value_parser!(u64).range(100..))]
    pub(crate) request_timeout_ms: u64,
    /// A folder datasets must be in (repeat for several): `dataset add` of a manifest outside
    /// every one (after symlinks are resolved) is refused [default: anywhere this coordinator
    /// can read], and so is one listing a shard outside them (judged by its path where this
    /// host lacks the file). Manifests must be regular files of at most 256 MiB in any case.
    #[arg(long = "dataset-root", value_name = "DIR")]
    pub(crate) dataset_roots: Vec<PathBuf>,
    /// A bucket or prefix (s3://bucket or s3://bucket/prefix; repeat for several) that
    /// datasets in object stores must be under: `stoker dataset add s3://...` is refused for a
    /// manifest or a shard outside every one [default: any object the credentials can read].
    #[arg(long = "object-root", value_name = "S3_URI")]
    pub(crate) object_roots: Vec<String>,
    #[command(flatten)]
    pub(crate) object_store: ObjectStoreArgs,
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
    #[arg(long, default_value_t = millis(worker_defaults().delivery_timeout))]
    pub(crate) delivery_timeout_ms: u64,
    /// Milliseconds a job may go without work here before its pipeline (decode threads, batch
    /// buffers, mapped shards) is released; a job the coordinator no longer lists as live (all
    /// its trainers gone) is released at once.
    #[arg(long, default_value_t = millis(worker_defaults().job_idle))]
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
    /// A file holding the bearer token scrapers must present for /metrics (`Authorization:
    /// Bearer TOKEN`, Prometheus's `authorization.credentials_file`); /healthz and /readyz stay
    /// open for probes [default: /metrics unauthenticated: bind it to an internal address].
    #[arg(long, env = "STOKER_METRICS_TOKEN_FILE", value_name = "FILE")]
    pub(crate) metrics_token_file: Option<PathBuf>,
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
    /// A bucket or prefix (s3://bucket or s3://bucket/prefix; repeat for several) that
    /// datasets in object stores must be under: a job whose manifest or shards are outside
    /// every one is refused here [default: any object the credentials can read].
    #[arg(long = "object-root", value_name = "S3_URI")]
    pub(crate) object_roots: Vec<String>,
    #[command(flatten)]
    pub(crate) object_store: ObjectStoreArgs,
    /// The folder of the shard cache, for datasets in object stores: shards are downloaded
    /// there and mapped (a local disk; files of an earlier run are reused after checks).
    /// Without it, jobs of datasets in object stores are refused here.
    #[arg(long, env = "STOKER_CACHE_DIR", value_name = "DIR", requires = "cache_size")]
    pub(crate) cache_dir: Option<PathBuf>,
    /// The shard cache's bound (e.g. 500GiB): never exceeded. It must hold the shards one chunk
    /// reads (about the job's shuffle window of shards); a job needing more is refused with the
    /// size it needs.
    #[arg(long, env = "STOKER_CACHE_SIZE", value_name = "BYTES", value_parser = super::pack::parse_byte_size, requires = "cache_dir")]
    pub(crate) cache_size: Option<u64>,
    /// Fetch from the plan: after each chunk it is granted, download the shards that the grant
    /// names for its rank's next chunks, as far as the rank's next N steps read, so that the next
    /// chunks find them there (evicting only shards the plan reads later); 0 turns it off.
    #[arg(long, default_value_t = 8, value_name = "N")]
    pub(crate) fetch_ahead_steps: u32,
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

/// How long a stopping node waits for its blocking tasks: one stuck opening a dataset on a
/// hung file system never returns, and must not keep the process from exiting.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);

pub(crate) fn coordinator(args: CoordinatorArgs) -> anyhow::Result<ExitCode> {
    let listen = resolve(&args.listen)?;
    let socket = UdpSocket::bind(listen).with_context(|| format!("cannot listen on {listen}"))?;
    let config = coordinator_config(&args)?;
    let runtime = runtime()?;
    let _guard = runtime.enter();
    let tls = args.tls.source()?.load_coordinator(args.node_id)?;
    let metrics = Metrics::for_role("coordinator")?;
    let _metrics_server = serve_metrics(&runtime, args.metrics_listen, args.metrics_token_file.as_deref(), &metrics)?;
    let mut handle = runtime.block_on(stoker_coordinator::start(config, socket, &tls, &metrics))?;
    eprintln!("coordinator {} listening on {} (data in {}); Ctrl-C stops it", args.node_id, handle.local_addr(), args.data_dir.display());
    runtime.block_on(stop_signal())?;
    handle.shutdown();
    runtime.shutdown_timeout(SHUTDOWN_GRACE);
    Ok(ExitCode::SUCCESS)
}

/// What a coordinator is told when nothing is said: the arguments' defaults.
fn coordinator_defaults() -> CoordinatorConfig {
    CoordinatorConfig::new(PathBuf::new())
}

/// What a worker is told when nothing is said: the arguments' defaults.
fn worker_defaults() -> WorkerConfig {
    WorkerConfig::new(1)
}

/// Whole milliseconds of `duration`, as the `--*-ms` arguments take them.
fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// The coordinator's config as `args` say.
fn coordinator_config(args: &CoordinatorArgs) -> anyhow::Result<CoordinatorConfig> {
    let mut config = CoordinatorConfig::new(args.data_dir.clone());
    config.lease_ttl = Duration::from_millis(args.lease_ttl_ms);
    config.trainer_ttl = Duration::from_millis(args.trainer_ttl_ms);
    config.lease_stall = Duration::from_millis(args.lease_stall_ms);
    config.heartbeat = (config.lease_ttl / 6).max(Duration::from_millis(10));
    config.chunk_steps = args.chunk_steps;
    config.job_ttl = match args.job_ttl_hours {
        0.0 => None,
        hours => Some(
            Duration::try_from_secs_f64(hours * 3600.0)
                .ok()
                .filter(|_| hours > 0.0)
                .with_context(|| format!("--job-ttl-hours {hours}: give a positive number of hours, or 0 to keep jobs"))?,
        ),
    };
    config.node_id = args.node_id;
    config.peers = parse_peers(&args.peers)?;
    config.join = args.join;
    config.advertise = args.advertise.clone();
    config.max_batch_bytes = args.max_batch_bytes;
    config.max_world_size = args.max_world_size;
    config.max_prefetch = args.max_prefetch;
    config.max_jobs = usize::try_from(args.max_jobs).unwrap_or(usize::MAX);
    config.max_datasets = usize::try_from(args.max_datasets).unwrap_or(usize::MAX);
    config.max_jobs_per_certificate = usize::try_from(args.max_jobs_per_certificate).unwrap_or(usize::MAX);
    config.max_state_bytes = args.max_state_bytes;
    config.dataset_roots = args.dataset_roots.clone();
    config.store = args.object_store.config()?;
    config.object_roots = stoker_store::ObjectRoots::new(&args.object_roots)?;
    config.max_connections = usize::try_from(args.max_connections).unwrap_or(usize::MAX);
    config.max_connections_per_address = usize::try_from(args.max_connections_per_address).unwrap_or(usize::MAX);
    config.max_streams_per_connection = args.max_streams_per_connection;
    config.request_timeout = Duration::from_millis(args.request_timeout_ms);
    Ok(config)
}

/// Wait for Ctrl-C (SIGINT) or SIGTERM (what `docker stop` and Kubernetes send).
async fn stop_signal() -> anyhow::Result<()> {
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).context("cannot wait for SIGTERM")?;
    tokio::select! {
        interrupted = tokio::signal::ctrl_c() => interrupted.context("cannot wait for Ctrl-C"),
        _ = terminate.recv() => Ok(()),
    }
}

/// Serve `metrics` on `listen` (unless `off`), and say where. Bound before the node starts, so
/// that a taken port stops it before it joins the cluster; the node's metrics and readiness
/// are registered into the same `metrics` as it starts.
fn serve_metrics(
    runtime: &tokio::runtime::Runtime,
    listen: MetricsListen,
    token_file_opt: Option<&Path>,
    metrics: &Metrics,
) -> anyhow::Result<Option<MetricsServer>> {
    let MetricsListen::On(addr) = listen else { return Ok(None) };
    if let Some(file) = token_file_opt {
        metrics.require_token(ScrapeToken::from_file(file).context("give --metrics-token-file a file holding one token")?);
    }
    // Not ready until the node has started (its start sets the real check).
    metrics.set_readiness(|| Err("starting".to_owned()));
    let server = runtime
        .block_on(stoker_obs::serve(addr, metrics.clone()))
        .context("pass --metrics-listen with a free HOST:PORT (or STOKER_METRICS_LISTEN), or `off`")?;
    eprintln!("metrics on http://{}/metrics (and /healthz, /readyz)", server.local_addr());
    Ok(Some(server))
}

/// `--peers 1=h:7400,2=h:7400`: node id → address, each id once.
fn parse_peers(entries: &[String]) -> anyhow::Result<BTreeMap<u64, String>> {
    let mut peers = BTreeMap::new();
    for entry in entries.iter().map(|entry| entry.trim()).filter(|entry| !entry.is_empty()) {
        let (id, addr) = entry.split_once('=').with_context(|| format!("--peers entry {entry:?}: give ID=HOST:PORT, e.g. 1=c1:7400"))?;
        let id: u64 = id
            .trim()
            .parse()
            .ok()
            .filter(|id| *id > 0)
            .with_context(|| format!("--peers entry {entry:?}: the id must be a positive number"))?;
        let addr = addr.trim();
        if !addr.rsplit_once(':').is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok()) {
            anyhow::bail!("--peers entry {entry:?}: the address must be HOST:PORT");
        }
        if peers.insert(id, addr.to_owned()).is_some() {
            anyhow::bail!("--peers names node {id} twice");
        }
    }
    Ok(peers)
}

pub(crate) fn worker(args: WorkerArgs) -> anyhow::Result<ExitCode> {
    let listen = resolve(&args.listen)?;
    let coordinator = resolve_coordinators(&args.coordinator)?;
    let advertise = args.advertise.as_deref().map(resolve).transpose()?;
    if advertise.is_none() && listen.ip().is_unspecified() {
        anyhow::bail!("--listen {listen} is not an address trainers can dial: give --advertise HOST:PORT");
    }
    let socket = stoker_worker::bind_socket(listen, args.batch_transport).with_context(|| format!("cannot listen on {listen}"))?;
    let threads = args.threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, usize::from));
    let mut config = worker_config(&args, threads)?;
    config.advertise = advertise;
    let runtime = runtime()?;
    let _guard = runtime.enter();
    let tls = args.tls.source()?.load(Role::Worker)?;
    let api = QuicCoordinator::with_addrs(coordinator.clone(), &tls)?;
    let metrics = Metrics::for_role("worker")?;
    let _metrics_server = serve_metrics(&runtime, args.metrics_listen, args.metrics_token_file.as_deref(), &metrics)?;
    let handle = stoker_worker::start(config, socket, &tls, api, &metrics)?;
    eprintln!("worker listening on {} with {threads} decode threads, coordinator {coordinator}; Ctrl-C stops it", handle.local_addr());
    runtime.block_on(stop_signal())?;
    runtime.block_on(handle.shutdown());
    runtime.shutdown_timeout(SHUTDOWN_GRACE);
    Ok(ExitCode::SUCCESS)
}

/// The worker's config as `args` say, with `threads` decode threads (its address aside).
fn worker_config(args: &WorkerArgs, threads: usize) -> anyhow::Result<WorkerConfig> {
    let mut config = WorkerConfig::new(threads);
    config.batch_transport = args.batch_transport;
    config.tuning.max_udp_payload = args.max_udp_payload;
    if let Some(in_flight) = args.in_flight {
        config.in_flight = in_flight.max(1);
    }
    config.delivery_timeout = Duration::from_millis(args.delivery_timeout_ms.max(1));
    config.job_idle = Duration::from_millis(args.job_idle_ms);
    if let Some(bytes) = args.max_batch_memory {
        config.max_batch_memory = bytes;
    }
    config.dataset_roots = DatasetRoots::new(args.dataset_roots.iter().cloned())?;
    config.store = args.object_store.config()?;
    config.object_roots = stoker_store::ObjectRoots::new(&args.object_roots)?;
    if let (Some(dir), Some(capacity)) = (&args.cache_dir, args.cache_size) {
        config.cache_opt = Some(stoker_worker::CacheConfig { dir: dir.clone(), capacity });
    }
    config.fetch_ahead_steps = args.fetch_ahead_steps;
    config.max_connections = usize::try_from(args.max_connections).unwrap_or(usize::MAX);
    config.max_connections_per_address = usize::try_from(args.max_connections_per_address).unwrap_or(usize::MAX);
    Ok(config)
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::{coordinator_config, coordinator_defaults, worker_config, worker_defaults};
    use crate::args::{Cli, Command};

    /// `stoker coordinator` and `stoker worker` with no flags run as the libraries' configs do
    /// by default: a default restated in the CLI cannot drift from the real one.
    #[test]
    fn the_clap_defaults_are_the_config_defaults() {
        let Command::Coordinator(args) = Cli::parse_from(["stoker", "coordinator"]).command else { panic!("a coordinator command") };
        let parsed = coordinator_config(&args).expect("config");
        let defaults = coordinator_defaults();
        assert_eq!(parsed.lease_ttl, defaults.lease_ttl);
        assert_eq!(parsed.lease_stall, defaults.lease_stall);
        assert_eq!(parsed.heartbeat, defaults.heartbeat);
        assert_eq!(parsed.trainer_ttl, defaults.trainer_ttl);
        assert_eq!(parsed.chunk_steps, defaults.chunk_steps);
        assert_eq!(parsed.job_ttl, defaults.job_ttl);
        assert_eq!(parsed.node_id, defaults.node_id);
        assert_eq!(parsed.max_batch_bytes, defaults.max_batch_bytes);
        assert_eq!(parsed.max_world_size, defaults.max_world_size);
        assert_eq!(parsed.max_prefetch, defaults.max_prefetch);
        assert_eq!(parsed.max_jobs, defaults.max_jobs);
        assert_eq!(parsed.max_datasets, defaults.max_datasets);
        assert_eq!(parsed.max_jobs_per_certificate, defaults.max_jobs_per_certificate);
        assert_eq!(parsed.max_state_bytes, defaults.max_state_bytes);
        assert_eq!(parsed.max_connections, defaults.max_connections);
        assert_eq!(parsed.max_connections_per_address, defaults.max_connections_per_address);
        assert_eq!(parsed.max_streams_per_connection, defaults.max_streams_per_connection);
        assert_eq!(parsed.request_timeout, defaults.request_timeout);
        assert_eq!(parsed.dataset_roots, defaults.dataset_roots);

        let Command::Worker(args) = Cli::parse_from(["stoker", "worker"]).command else { panic!("a worker command") };
        let parsed = worker_config(&args, 1).expect("config");
        let defaults = worker_defaults();
        assert_eq!(parsed.in_flight, defaults.in_flight);
        assert_eq!(parsed.delivery_timeout, defaults.delivery_timeout);
        assert_eq!(parsed.job_idle, defaults.job_idle);
        assert_eq!(parsed.tuning.max_udp_payload, defaults.tuning.max_udp_payload);
        assert_eq!(parsed.max_batch_memory, defaults.max_batch_memory);
        assert_eq!(parsed.max_connections, defaults.max_connections);
        assert_eq!(parsed.max_connections_per_address, defaults.max_connections_per_address);
        assert_eq!(parsed.batch_transport, defaults.batch_transport);
    }
}
