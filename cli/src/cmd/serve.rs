//! `stoker coordinator` and `stoker worker`: long-running nodes, stopped by Ctrl-C or SIGTERM
//! (a worker then hands its leases back).

use std::collections::BTreeMap;
use std::net::UdpSocket;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use stoker_coordinator::CoordinatorConfig;
use stoker_format::DatasetRoots;
use stoker_net::{QuicCoordinator, Role};
use stoker_obs::{Metrics, MetricsListen, MetricsServer};
use stoker_worker::WorkerConfig;

use super::remote::{resolve, resolve_coordinators, runtime};
use crate::args::{CoordinatorArgs, WorkerArgs};

/// How long a stopping node waits for its blocking tasks: one stuck opening a dataset on a
/// hung file system never returns, and must not keep the process from exiting.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);

pub(crate) fn coordinator(args: CoordinatorArgs) -> anyhow::Result<ExitCode> {
    let listen = resolve(&args.listen)?;
    let socket = UdpSocket::bind(listen).with_context(|| format!("cannot listen on {listen}"))?;
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
    config.dataset_roots = args.dataset_roots.clone();
    config.max_connections = usize::try_from(args.max_connections).unwrap_or(usize::MAX);
    config.max_connections_per_address = usize::try_from(args.max_connections_per_address).unwrap_or(usize::MAX);
    config.max_streams_per_connection = args.max_streams_per_connection;
    config.request_timeout = Duration::from_millis(args.request_timeout_ms);
    let runtime = runtime()?;
    let _guard = runtime.enter();
    let tls = args.tls.source()?.load(Role::Coordinator)?;
    let metrics = Metrics::for_role("coordinator")?;
    let _metrics_server = serve_metrics(&runtime, args.metrics_listen, &metrics)?;
    let mut handle = runtime.block_on(stoker_coordinator::start(config, socket, &tls, &metrics))?;
    eprintln!("coordinator {} listening on {} (data in {}); Ctrl-C stops it", args.node_id, handle.local_addr(), args.data_dir.display());
    runtime.block_on(stop_signal())?;
    handle.shutdown();
    runtime.shutdown_timeout(SHUTDOWN_GRACE);
    Ok(ExitCode::SUCCESS)
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
fn serve_metrics(runtime: &tokio::runtime::Runtime, listen: MetricsListen, metrics: &Metrics) -> anyhow::Result<Option<MetricsServer>> {
    let MetricsListen::On(addr) = listen else { return Ok(None) };
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
    let mut config = WorkerConfig::new(threads);
    config.advertise = advertise;
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
    config.max_connections = usize::try_from(args.max_connections).unwrap_or(usize::MAX);
    config.max_connections_per_address = usize::try_from(args.max_connections_per_address).unwrap_or(usize::MAX);
    let runtime = runtime()?;
    let _guard = runtime.enter();
    let tls = args.tls.source()?.load(Role::Worker)?;
    let api = QuicCoordinator::with_addrs(coordinator.clone(), &tls)?;
    let metrics = Metrics::for_role("worker")?;
    let _metrics_server = serve_metrics(&runtime, args.metrics_listen, &metrics)?;
    let handle = stoker_worker::start(config, socket, &tls, api, &metrics)?;
    eprintln!("worker listening on {} with {threads} decode threads, coordinator {coordinator}; Ctrl-C stops it", handle.local_addr());
    runtime.block_on(stop_signal())?;
    runtime.block_on(handle.shutdown());
    runtime.shutdown_timeout(SHUTDOWN_GRACE);
    Ok(ExitCode::SUCCESS)
}
