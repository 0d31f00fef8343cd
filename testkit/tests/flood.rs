//! Issue 19: under a connection flood and slow senders on the coordinator (with a valid
//! certificate: the worst case), a running job's epochs complete, every sample exactly once. The
//! coordinator refuses connections over its per-address limit before their handshake and closes
//! a connection whose request takes longer than `--request-timeout-ms` to arrive.
//!
//! What the attack costs in throughput is a ratio, and ratios belong in benchmarks, not tests: a
//! loaded CI machine made an earlier "within 10%" assertion fail. The test prints the ratio it
//! saw so a reader can compare runs.

#[allow(dead_code, unreachable_pub)]
#[path = "it/common.rs"]
mod common;

use std::collections::HashSet;
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use stoker_client::Loader;
use stoker_coordinator::CoordinatorConfig;
use stoker_net::{Role, TlsConfigs, Tuning, connect, server_endpoint};
use stoker_plan::ids::Epoch;
use stoker_proto::ControlRequest;
use stoker_proto::wire::{self, CONTROL_FRAME_LIMIT};
use stoker_testkit::{ClusterConfig, TestCluster};
use tracing::info;

use common::{config_for, dataset};

/// Samples in `common::dataset()`: 6 classes of 20 (batches of 4, so no partial step).
const DATASET_SAMPLES: usize = 6 * 20;

/// Connections one address may hold at the coordinator in this test.
const PER_ADDRESS: usize = 16;

fn limits(config: &mut CoordinatorConfig) {
    config.max_connections_per_address = PER_ADDRESS;
    config.request_timeout = Duration::from_secs(2);
}

/// What the attackers achieved.
#[derive(Debug, Default)]
struct Tally {
    /// Connections the flood got (up to the per-address limit, then refused).
    flood_connected: AtomicU64,
    flood_refused: AtomicU64,
    /// Slow requests the coordinator cut off.
    slow_cut: AtomicU64,
}

/// Seconds for one trainer to consume `epochs` epochs of the test dataset, checking that every
/// step of every epoch arrives and no sample arrives twice within an epoch.
fn epochs_seconds(cluster: &TestCluster, epochs: u64) -> f64 {
    let mut config = config_for(&cluster.loader_config("train", 4), 0, 1);
    config.job_name = Some(format!("flood-{}", stoker_net::random::random_u64()));
    let mut loader = Loader::attach(&config).expect("attach");
    let started = Instant::now();
    for epoch in 0..epochs {
        loader.set_epoch(Epoch(epoch));
        let mut steps = 0;
        let mut seen = HashSet::new();
        for batch in &mut loader {
            let batch = batch.expect("batch");
            for key in batch.keys() {
                assert!(seen.insert(key.clone()), "sample {key} twice in epoch {epoch}");
            }
            steps += 1;
        }
        assert_eq!(steps, loader.len().expect("len"), "every step of epoch {epoch}");
        assert_eq!(seen.len(), DATASET_SAMPLES, "every sample of epoch {epoch} once");
    }
    started.elapsed().as_secs_f64()
}

/// An endpoint that dials from `ip` (another loopback address than the trainer's).
fn endpoint_on(ip: Ipv4Addr, tls: &TlsConfigs) -> quinn::Endpoint {
    let socket = UdpSocket::bind((ip, 0)).expect("bind");
    server_endpoint(socket, tls, Tuning::default()).expect("endpoint")
}

/// Open connections as fast as 200 a second and hold every one the coordinator takes.
async fn flood(coordinator: SocketAddr, tls: TlsConfigs, stop: Arc<AtomicBool>, tally: Arc<Tally>) {
    let endpoint = endpoint_on(Ipv4Addr::new(127, 0, 0, 77), &tls);
    let mut held = Vec::new();
    while !stop.load(Ordering::Acquire) {
        match connect(&endpoint, coordinator, Duration::from_secs(2)).await {
            Ok(connection) => {
                tally.flood_connected.fetch_add(1, Ordering::AcqRel);
                held.push(connection);
            }
            Err(_) => {
                tally.flood_refused.fetch_add(1, Ordering::AcqRel);
            }
        }
        held.retain(|connection: &quinn::Connection| connection.close_reason().is_none());
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    endpoint.close(0u32.into(), b"done");
}

/// Connections that open requests and send them a byte every 300 ms.
async fn slow_senders(coordinator: SocketAddr, tls: TlsConfigs, stop: Arc<AtomicBool>, tally: Arc<Tally>) {
    let endpoint = endpoint_on(Ipv4Addr::new(127, 0, 0, 78), &tls);
    let request = ControlRequest::AddDataset { name: "s".repeat(200), manifest: "/x".to_owned() };
    let frame = wire::encode(&request, CONTROL_FRAME_LIMIT).expect("encode");
    let mut tasks = Vec::new();
    for _ in 0..PER_ADDRESS {
        let (endpoint, frame, stop, tally) = (endpoint.clone(), frame.clone(), Arc::clone(&stop), Arc::clone(&tally));
        tasks.push(tokio::spawn(async move {
            while !stop.load(Ordering::Acquire) {
                let Ok(connection) = connect(&endpoint, coordinator, Duration::from_secs(2)).await else {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                };
                let Ok((mut send, _recv)) = connection.open_bi().await else { continue };
                for byte in frame.iter() {
                    if stop.load(Ordering::Acquire) {
                        return;
                    }
                    if send.write_all(std::slice::from_ref(byte)).await.is_err() || connection.close_reason().is_some() {
                        tally.slow_cut.fetch_add(1, Ordering::AcqRel);
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(300)).await;
                }
            }
        }));
    }
    for task in tasks {
        let _ = task.await;
    }
    endpoint.close(0u32.into(), b"done");
}

#[test]
fn under_a_connection_flood_and_slow_senders_every_epoch_completes_exactly_once() {
    let config = ClusterConfig { workers: 2, configure_coordinator: Some(limits), ..ClusterConfig::default() };
    let cluster = TestCluster::start(config).expect("cluster");
    cluster.add_dataset("train", &dataset()).expect("dataset");
    cluster.wait_for_workers().expect("workers");
    let coordinator = cluster.coordinator_addr();
    let epochs = 10;
    epochs_seconds(&cluster, 1); // warm up: first connections, page cache
    let quiet = epochs_seconds(&cluster, epochs);

    let (stop, tally) = (Arc::new(AtomicBool::new(false)), Arc::new(Tally::default()));
    let attack = {
        let (tls, stop, tally) = (cluster.tls(Role::Trainer), Arc::clone(&stop), Arc::clone(&tally));
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
            runtime.block_on(async {
                let flooding = tokio::spawn(flood(coordinator, tls.clone(), Arc::clone(&stop), Arc::clone(&tally)));
                slow_senders(coordinator, tls, stop, tally).await;
                let _ = flooding.await;
            });
        })
    };
    // Let the flood reach its limit and the first slow requests time out (2 s request timeout).
    std::thread::sleep(Duration::from_secs(3));
    let attacked = epochs_seconds(&cluster, epochs);
    stop.store(true, Ordering::Release);
    attack.join().expect("attack thread");
    let (connected, refused, cut) = (
        tally.flood_connected.load(Ordering::Acquire),
        tally.flood_refused.load(Ordering::Acquire),
        tally.slow_cut.load(Ordering::Acquire),
    );
    info!(quiet, attacked, connected, refused, cut, "flood");
    eprintln!(
        "{epochs} epochs in {quiet:.2} s quiet, {attacked:.2} s under attack ({:+.1}%, not asserted); flood: {connected} \
         connections taken, {refused} refused; slow requests cut off: {cut}",
        (attacked / quiet - 1.0) * 100.0
    );
    assert!(connected <= PER_ADDRESS as u64, "the flood held {connected} connections");
    assert!(refused > 0, "the flood was never refused: the per-address limit did not act");
    assert!(cut > 0, "no slow request was cut off: the request timeout did not act");
}

/// A peer that connects to a worker's batch port and sends no hello is cut off after the
/// request timeout instead of holding its connection for as long as it keeps it alive.
#[test]
fn a_worker_closes_a_connection_that_sends_no_hello() {
    let cluster = common::cluster_with(1);
    let worker = cluster.worker(0).expect("worker").local_addr();
    let tls = cluster.tls(Role::Trainer);
    let reason = cluster.block_on(async {
        let endpoint = endpoint_on(Ipv4Addr::new(127, 0, 0, 79), &tls);
        let connection = connect(&endpoint, worker, Duration::from_secs(5)).await.expect("connect");
        let limit = stoker_net::REQUEST_TIMEOUT + Duration::from_secs(5);
        tokio::time::timeout(limit, connection.closed()).await.map(|reason| reason.to_string())
    });
    let reason = reason.expect("closed within the request timeout");
    assert!(reason.contains("no hello within the request timeout"), "{reason}");
}
