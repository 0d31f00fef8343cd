#![doc = include_str!("../README.md")]

/// How a test cluster runs.
mod cluster_config;
/// Sample datasets packed into shards.
mod dataset;
/// A fault-injecting HTTP proxy in front of a test's S3 server (503s, cut bodies).
pub mod fault_proxy;
/// A randomized model of the delivery protocol: real coordinator, trainer protocol and lease
/// ledger on a simulated clock and network, with faults.
pub mod model;
/// An S3-compatible server for tests: moto, started by the test on a loopback address.
pub mod moto;
pub mod netns;
/// The cluster CA and certificates of a test cluster.
pub mod tls;
/// Bounded waits.
mod wait;

use std::future::Future;
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Once};
use std::time::{Duration, Instant};

use stoker_client::LoaderConfig;
use stoker_coordinator::{Coordinator, CoordinatorConfig, CoordinatorHandle};
use stoker_net::{ClusterCa, CoordinatorAddrs, QuicCoordinator, Role, TlsConfigs, TlsSource};
use stoker_obs::Metrics;
use stoker_proto::api::CoordinatorApi;
use stoker_proto::expect_response;
use stoker_proto::{ControlRequest, DatasetInfo};
use stoker_worker::{WorkerConfig, WorkerHandle};

pub use crate::cluster_config::ClusterConfig;
pub use crate::dataset::{pack_images, sample_dataset, sample_dataset_ordered, unique_temp_dir};
pub use crate::tls::{ClusterTls, issue_configs, issue_node_configs};
pub use crate::wait::{poll_until, wait_until};

/// Errors of the harness, as text (it is for tests and the demo).
pub type TestkitError = String;

/// A coordinator and workers on loopback, in one runtime.
pub struct TestCluster {
    runtime: ClusterRuntime,
    tls: ClusterTls,
    config: ClusterConfig,
    data_dir: PathBuf,
    _temporary: Option<TempDir>,
    /// Coordinator `i` is node `i + 1`.
    coordinators: Vec<Option<CoordinatorHandle>>,
    coordinator_addrs: Vec<SocketAddr>,
    workers: Vec<Option<WorkerHandle<QuicCoordinator>>>,
    /// The metrics of coordinator `i` (its latest start) and of worker `i`.
    coordinator_metrics: Vec<Metrics>,
    worker_metrics: Vec<Metrics>,
    next_worker_ip: u8,
}

impl std::fmt::Debug for TestCluster {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("TestCluster").field("coordinators", &self.coordinator_addrs).finish_non_exhaustive()
    }
}

/// The cluster's runtime, shut down without waiting for blocking tasks that never return (a
/// worker stuck opening a dataset on a hung file system is what some tests make).
struct ClusterRuntime(Option<tokio::runtime::Runtime>);

impl std::ops::Deref for ClusterRuntime {
    type Target = tokio::runtime::Runtime;

    fn deref(&self) -> &tokio::runtime::Runtime {
        // Present until drop.
        self.0.as_ref().unwrap_or_else(|| unreachable!("the runtime is taken only in drop"))
    }
}

impl Drop for ClusterRuntime {
    fn drop(&mut self) {
        if let Some(runtime) = self.0.take() {
            runtime.shutdown_timeout(Duration::from_secs(2));
        }
    }
}

/// A folder removed on drop.
#[derive(Debug)]
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn bind(ip: Ipv4Addr, port: u16) -> Result<UdpSocket, TestkitError> {
    UdpSocket::bind((ip, port)).map_err(|error| format!("cannot bind {ip}:{port}: {error}"))
}

/// Log to stderr once per process, filtered by `RUST_LOG` (default: warnings).
pub fn init_tracing() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| stoker_obs::init_tracing(std::env::var("RUST_LOG").ok().as_deref(), "warn", true));
}

fn metrics_text(metrics: &Metrics) -> Result<String, TestkitError> {
    let text = metrics.render().map_err(|error| error.to_string())?;
    String::from_utf8(text).map_err(|error| error.to_string())
}

fn role_metrics(role: &str) -> Result<Metrics, TestkitError> {
    Metrics::for_role(role).map_err(|error| error.to_string())
}

impl TestCluster {
    /// Start a coordinator and `config.workers` workers.
    pub fn start(config: ClusterConfig) -> Result<Self, TestkitError> {
        init_tracing();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("stoker-cluster")
            .enable_all()
            .build()
            .map_err(|error| error.to_string())?;
        let tls = ClusterTls::new(config.insecure)?;
        let (data_dir, temporary) = match &config.data_dir {
            Some(dir) => (dir.clone(), None),
            None => {
                let dir = unique_temp_dir("stoker-cluster")?;
                (dir.clone(), Some(TempDir(dir)))
            }
        };
        let mut cluster = Self {
            runtime: ClusterRuntime(Some(runtime)),
            tls,
            config,
            data_dir,
            _temporary: temporary,
            coordinators: Vec::new(),
            coordinator_addrs: Vec::new(),
            workers: Vec::new(),
            coordinator_metrics: Vec::new(),
            worker_metrics: Vec::new(),
            next_worker_ip: 2,
        };
        let count = cluster.config.coordinators.max(1);
        for _ in 0..count {
            // Ports are picked now (the peers of each node must be known at its start).
            let socket = bind(Ipv4Addr::LOCALHOST, 0)?;
            cluster.coordinator_addrs.push(socket.local_addr().map_err(|error| error.to_string())?);
            cluster.coordinators.push(None);
            cluster.coordinator_metrics.push(Metrics::new());
        }
        for index in 0..count {
            cluster.start_coordinator_node(index)?;
        }
        if count > 1 {
            cluster.wait_for_leader(Duration::from_secs(20))?;
        }
        for _ in 0..cluster.config.workers {
            cluster.add_worker()?;
        }
        Ok(cluster)
    }

    fn start_coordinator(&mut self, port: u16) -> Result<(), TestkitError> {
        self.coordinator_addrs[0].set_port(port);
        self.start_coordinator_node(0)
    }

    /// Start coordinator `index` (node `index + 1`) on its address and data directory.
    pub fn start_coordinator_node(&mut self, index: usize) -> Result<(), TestkitError> {
        let port = self.coordinator_addrs.get(index).ok_or("no such coordinator")?.port();
        let count = self.coordinator_addrs.len();
        let mut config = CoordinatorConfig::new(self.coordinator_data_dir(index));
        config.node_id = index as u64 + 1;
        if count > 1 {
            config.peers = self.coordinator_addrs.iter().enumerate().map(|(i, addr)| (i as u64 + 1, addr.to_string())).collect();
        }
        config.lease_ttl = self.config.lease_ttl;
        config.heartbeat = self.config.heartbeat;
        config.chunk_steps = self.config.chunk_steps;
        config.lease_stall = self.config.lease_stall;
        config.max_batch_bytes = self.config.max_batch_bytes;
        if let Some(store) = &self.config.object_store {
            config.store = store.clone();
        }
        if let Some(configure) = self.config.configure_coordinator {
            configure(&mut config);
        }
        // After a restart the old endpoint's driver may hold the port for a moment.
        let mut socket_opt = None;
        wait_until(Duration::from_secs(10), "the coordinator's port is free", || {
            socket_opt = bind(Ipv4Addr::LOCALHOST, port).ok();
            socket_opt.is_some()
        })?;
        let socket = socket_opt.ok_or("no socket")?;
        let _guard = self.runtime.enter();
        let metrics = role_metrics("coordinator")?;
        let tls = self.tls.coordinator(config.node_id)?;
        let handle = self.runtime.block_on(stoker_coordinator::start(config, socket, &tls, &metrics)).map_err(|error| error.to_string())?;
        self.coordinator_metrics[index] = metrics;
        self.coordinator_addrs[index] = handle.local_addr();
        self.coordinators[index] = Some(handle);
        Ok(())
    }

    /// Start one more coordinator (node `index + 1`, returned as `index`) with `--join`: empty,
    /// waiting for `AddNode`. Clients learn of it from the leader's redirects only.
    pub fn start_joining_coordinator(&mut self) -> Result<usize, TestkitError> {
        let socket = bind(Ipv4Addr::LOCALHOST, 0)?;
        let index = self.coordinator_addrs.len();
        self.coordinator_addrs.push(socket.local_addr().map_err(|error| error.to_string())?);
        self.coordinators.push(None);
        self.coordinator_metrics.push(Metrics::new());
        let mut config = CoordinatorConfig::new(self.coordinator_data_dir(index));
        config.node_id = index as u64 + 1;
        config.max_batch_bytes = self.config.max_batch_bytes;
        config.join = true;
        let _guard = self.runtime.enter();
        let metrics = role_metrics("coordinator")?;
        let tls = self.tls.coordinator(config.node_id)?;
        let handle = self.runtime.block_on(stoker_coordinator::start(config, socket, &tls, &metrics)).map_err(|error| error.to_string())?;
        self.coordinator_metrics[index] = metrics;
        self.coordinators[index] = Some(handle);
        Ok(index)
    }

    /// Stop coordinator `index` as a crash would: its endpoint closes, Raft stops, nothing is
    /// handed over. Its data directory stays for [`Self::start_coordinator_node`].
    pub fn kill_coordinator_node(&mut self, index: usize) {
        if let Some(mut handle) = self.coordinators.get_mut(index).and_then(Option::take) {
            let _guard = self.runtime.enter();
            handle.shutdown();
            let _ = self.runtime.block_on(async { tokio::time::timeout(Duration::from_secs(2), handle.join()).await });
        }
    }

    /// Coordinator `index`'s data directory.
    pub fn coordinator_data_dir(&self, index: usize) -> PathBuf {
        if self.coordinator_addrs.len() == 1 { self.data_dir.clone() } else { self.data_dir.join(format!("node-{}", index + 1)) }
    }

    /// The index of the coordinator that leads now, if one does.
    pub fn leader_index(&self) -> Option<usize> {
        self.coordinators.iter().position(|handle| handle.as_ref().is_some_and(CoordinatorHandle::is_leader))
    }

    /// Wait until one running coordinator leads; returns its index.
    pub fn wait_for_leader(&self, timeout: Duration) -> Result<usize, TestkitError> {
        let mut leader = None;
        wait_until(timeout, "a coordinator leads", || {
            leader = self.leader_index();
            leader.is_some()
        })?;
        leader.ok_or_else(|| "no leader".to_owned())
    }

    /// Every coordinator's address, as clients are given them.
    pub fn coordinator_list(&self) -> CoordinatorAddrs {
        CoordinatorAddrs::from_addrs(self.coordinator_addrs.iter().copied())
            .unwrap_or_else(|| CoordinatorAddrs::one(self.coordinator_addr()))
    }

    /// Stop the coordinator and start it again on the same address and data directory.
    pub fn restart_coordinator(&mut self) -> Result<(), TestkitError> {
        self.stop_coordinator();
        self.start_coordinator_again()
    }

    /// Stop the coordinator (its address stays reserved for [`Self::start_coordinator_again`]).
    pub fn stop_coordinator(&mut self) {
        if let Some(mut handle) = self.coordinators.first_mut().and_then(Option::take) {
            handle.shutdown();
            let _ = self.runtime.block_on(async { tokio::time::timeout(Duration::from_secs(2), handle.join()).await });
        }
    }

    /// Start the coordinator stopped by [`Self::stop_coordinator`], on the same address and
    /// data directory.
    pub fn start_coordinator_again(&mut self) -> Result<(), TestkitError> {
        self.start_coordinator_node(0)
    }

    /// Stop the coordinator, lose its data directory (as a machine replaced without its disk
    /// would), and start an empty one on the same address: job ids start again from 1.
    pub fn restart_coordinator_with_empty_state(&mut self) -> Result<(), TestkitError> {
        self.stop_coordinator();
        std::fs::remove_dir_all(&self.data_dir).map_err(|error| format!("cannot remove {}: {error}", self.data_dir.display()))?;
        self.start_coordinator(self.coordinator_addr().port())
    }

    /// Start one more worker on the next loopback address; returns its index.
    pub fn add_worker(&mut self) -> Result<usize, TestkitError> {
        self.add_worker_with(self.tls.configs(Role::Worker))
    }

    /// [`TestCluster::add_worker`] with a certificate of its own (`tls`), to revoke it alone.
    pub fn add_worker_with(&mut self, tls: TlsConfigs) -> Result<usize, TestkitError> {
        let ip = Ipv4Addr::new(127, 0, 0, self.next_worker_ip);
        self.next_worker_ip = self.next_worker_ip.checked_add(1).ok_or("too many workers")?;
        let socket =
            stoker_worker::bind_socket(SocketAddr::from((ip, 0)), self.config.batch_transport).map_err(|error| error.to_string())?;
        let _guard = self.runtime.enter();
        let api = QuicCoordinator::with_addrs(self.coordinator_list(), &tls).map_err(|error| error.to_string())?;
        let mut config = WorkerConfig::new(self.config.threads_per_worker);
        config.delivery_timeout = self.config.delivery_timeout;
        config.job_idle = self.config.job_idle;
        config.time_samples = self.config.time_samples;
        config.before_dataset_open = self.config.before_dataset_open;
        config.batch_transport = self.config.batch_transport;
        if let Some(bytes) = self.config.max_batch_memory {
            config.max_batch_memory = bytes;
        }
        if let Some(store) = &self.config.object_store {
            config.store = store.clone();
        }
        if let Some(steps) = self.config.fetch_ahead_steps {
            config.fetch_ahead_steps = steps;
        }
        if let Some((dir, capacity)) = &self.config.worker_cache {
            let index = self.workers.len();
            config.cache_opt = Some(stoker_worker::CacheConfig { dir: dir.join(format!("worker-{index}")), capacity: *capacity });
        }
        let metrics = role_metrics("worker")?;
        let handle = stoker_worker::start(config, socket, &tls, api, &metrics).map_err(|error| error.to_string())?;
        self.workers.push(Some(handle));
        self.worker_metrics.push(metrics);
        Ok(self.workers.len() - 1)
    }

    /// The batch memory of workers added from now on (`None`: the worker's default).
    pub fn set_worker_batch_memory(&mut self, bytes: Option<u64>) {
        self.config.max_batch_memory = bytes;
    }

    /// Kill worker `index` as a crash would: no goodbye, leases left to expire.
    pub fn kill_worker(&mut self, index: usize) {
        if let Some(handle) = self.workers.get_mut(index).and_then(Option::take) {
            let _guard = self.runtime.enter();
            handle.kill();
        }
    }

    /// Stop worker `index` gracefully: it hands its leases back.
    pub fn shutdown_worker(&mut self, index: usize) {
        if let Some(handle) = self.workers.get_mut(index).and_then(Option::take) {
            self.runtime.block_on(handle.shutdown());
        }
    }

    /// Coordinator `index`'s metrics in Prometheus' text format (of its latest start).
    pub fn coordinator_metrics_text(&self, index: usize) -> Result<String, TestkitError> {
        metrics_text(self.coordinator_metrics.get(index).ok_or("no such coordinator")?)
    }

    /// What coordinator `index`'s `/readyz` answers: `Err(reason)` for a 503.
    pub fn coordinator_ready(&self, index: usize) -> Result<(), String> {
        self.coordinator_metrics.get(index).ok_or("no such coordinator")?.ready()
    }

    /// What worker `index`'s `/readyz` answers: `Err(reason)` for a 503.
    pub fn worker_ready(&self, index: usize) -> Result<(), String> {
        self.worker_metrics.get(index).ok_or("no such worker")?.ready()
    }

    /// Worker `index`'s metrics in Prometheus' text format.
    pub fn worker_metrics_text(&self, index: usize) -> Result<String, TestkitError> {
        metrics_text(self.worker_metrics.get(index).ok_or("no such worker")?)
    }

    /// Worker `index`, if running.
    pub fn worker(&self, index: usize) -> Option<&WorkerHandle<QuicCoordinator>> {
        self.workers.get(index).and_then(Option::as_ref)
    }

    /// The (first) coordinator's address.
    pub fn coordinator_addr(&self) -> SocketAddr {
        self.coordinator_addrs.first().copied().unwrap_or_else(|| SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))
    }

    /// The service of the coordinator that leads (of the only one, in a cluster of one), to
    /// inspect its state.
    pub fn coordinator(&self) -> Option<Arc<Coordinator>> {
        let index = if self.coordinators.len() == 1 { 0 } else { self.leader_index()? };
        self.coordinators.get(index)?.as_ref().map(CoordinatorHandle::core)
    }

    /// Coordinator `index`'s handle, if running.
    pub fn coordinator_node(&self, index: usize) -> Option<&CoordinatorHandle> {
        self.coordinators.get(index).and_then(Option::as_ref)
    }

    /// Call the coordinator over QUIC, as an operator's CLI would, with a certificate of the
    /// role the request needs (admin for read-only ones).
    pub fn call(&self, request: ControlRequest) -> Result<stoker_proto::ControlResponse, stoker_proto::RemoteError> {
        let role = Role::required_for(&request).unwrap_or(Role::Admin);
        self.call_with(&self.tls.configs(role), request)
    }

    /// Remove the job named `name` as `stoker job rm` does: resolve its id, then remove by id.
    pub fn remove_job(&self, name: &str, force: bool) -> Result<stoker_proto::ControlResponse, stoker_proto::RemoteError> {
        let not_found = || stoker_proto::RemoteError::new(stoker_proto::ErrorCode::NotFound, format!("no job named {name:?}"));
        let status = expect_response!(self.call(ControlRequest::Status)?, Status { status })?;
        let job = status.jobs.iter().find(|job| job.spec.name == name).ok_or_else(not_found)?.id;
        self.call(ControlRequest::RemoveJob { name: name.to_owned(), job, force })
    }

    /// [`TestCluster::call`] with `tls` (a certificate of another role, another CA, expired).
    pub fn call_with(&self, tls: &TlsConfigs, request: ControlRequest) -> Result<stoker_proto::ControlResponse, stoker_proto::RemoteError> {
        let _guard = self.runtime.enter();
        let api = QuicCoordinator::with_addrs(self.coordinator_list(), tls)
            .map_err(|error| stoker_proto::RemoteError::new(stoker_proto::ErrorCode::Unavailable, error.to_string()))?;
        let answer = self.runtime.block_on(api.call(request));
        api.close();
        answer
    }

    /// The TLS configs of a peer of `role` in this cluster.
    pub fn tls(&self, role: Role) -> TlsConfigs {
        self.tls.configs(role)
    }

    /// The cluster CA (none when insecure), to issue more certificates.
    pub fn ca(&self) -> Option<&ClusterCa> {
        self.tls.ca()
    }

    /// Deny a certificate: every node of the cluster refuses it from its next handshake.
    pub fn deny(&self, key: stoker_plan::ids::CertKey) -> Result<(), TestkitError> {
        self.tls.deny(key)
    }

    /// Register a dataset.
    pub fn add_dataset(&self, name: &str, manifest: &Path) -> Result<DatasetInfo, TestkitError> {
        let request = ControlRequest::AddDataset { name: name.to_owned(), manifest: manifest.to_string_lossy().into_owned() };
        let answer = self.call(request).map_err(|error| error.to_string())?;
        expect_response!(answer, DatasetAdded { dataset }).map_err(|error| error.to_string())
    }

    /// A loader configuration for this cluster (rank and world size still to set).
    pub fn loader_config(&self, dataset: &str, batch_size: u32) -> LoaderConfig {
        let mut config = LoaderConfig::new(self.coordinator_list(), dataset, batch_size);
        config.batch_timeout = Duration::from_secs(60);
        config.tls = TlsSource::Loaded(self.tls.configs(Role::Trainer));
        config
    }

    /// Wait until every running worker is registered and alive at the coordinator.
    pub fn wait_for_workers(&self) -> Result<(), TestkitError> {
        let expected = self.workers.iter().filter(|worker| worker.is_some()).count();
        wait_until(Duration::from_secs(20), "every worker registered", || {
            let Some(core) = self.coordinator() else { return false };
            core.status(Instant::now()).workers.iter().filter(|worker| worker.alive).count() >= expected
        })
    }

    /// Run a future on the cluster's runtime.
    pub fn block_on<F>(&self, future: F) -> F::Output
    where
        F: Future,
    {
        self.runtime.block_on(future)
    }
}
