//! Issue 20: batches over bulk connections (TLS over TCP beside QUIC). By default every batch
//! takes one; a trainer or worker set to QUIC takes QUIC; bulk connections broken over and
//! over mid-epoch lose and repeat nothing (batches fall back to QUIC, the trainer dials again);
//! a peer that does not own the rank's QUIC session, or is not a trainer, gets no bulk
//! connection.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use stoker_net::bulk::{self, BatchTransport, BulkError};
use stoker_net::{Role, Tuning, client_endpoint};
use stoker_plan::Tail;
use stoker_plan::ids::{JobId, Rank, SessionId};
use stoker_proto::wire::CONTROL_FRAME_LIMIT;
use stoker_proto::{RemoteError, TrainerHello};
use stoker_testkit::{ClusterConfig, TestCluster};

use crate::common::{assert_in_order, cluster_with, consume, dataset, trainer_hello};

const SAMPLES: usize = 120;

fn pushed(cluster: &TestCluster, workers: usize) -> (u64, u64) {
    (0..workers)
        .filter_map(|index| cluster.worker(index))
        .fold((0, 0), |(all, bulk), worker| (all + worker.batches_pushed(), bulk + worker.bulk_batches_pushed()))
}

/// Every key of every epoch once across the ranks (tail `partial`).
fn assert_every_key_once(seen: &std::collections::BTreeMap<u32, Vec<crate::common::Seen>>, epochs: u64) {
    for epoch in 0..epochs {
        let keys: Vec<&String> = seen.values().flatten().filter(|record| record.epoch == epoch).flat_map(|record| &record.keys).collect();
        let unique: BTreeSet<&String> = keys.iter().copied().collect();
        assert_eq!((keys.len(), unique.len()), (SAMPLES, SAMPLES), "epoch {epoch}: every sample once");
    }
}

#[test]
fn batches_take_bulk_connections_by_default_and_quic_when_either_end_asks() {
    let cluster = cluster_with(2);
    let mut base = cluster.loader_config("train", 4);
    base.tail = Tail::Partial;
    base.job_name = Some("bulk-default".to_owned());
    let seen = consume(&base, 2, 2);
    assert_in_order(&seen, SAMPLES.div_ceil(8) as u64, 2);
    assert_every_key_once(&seen, 2);
    let (all, bulk) = pushed(&cluster, 2);
    eprintln!("{bulk} of {all} batches over bulk connections");
    assert!(all > 0, "batches were delivered");
    // A trainer's first batches wait up to 2 s for its bulk connection; only a machine too
    // busy to make it in that time sends some over QUIC.
    assert!(bulk * 10 >= all * 9, "{bulk} of {all} batches over bulk connections");

    base.batch_transport = BatchTransport::Quic;
    base.job_name = Some("quic-trainer".to_owned());
    let seen = consume(&base, 2, 1);
    assert_every_key_once(&seen, 1);
    let (all_after, bulk_after) = pushed(&cluster, 2);
    assert!(all_after > all, "batches were delivered");
    assert_eq!(bulk_after, bulk, "a trainer set to QUIC takes no batch over TCP");

    let quic_workers = TestCluster::start(ClusterConfig { workers: 1, batch_transport: BatchTransport::Quic, ..ClusterConfig::default() })
        .expect("cluster");
    quic_workers.add_dataset("train", &dataset()).expect("dataset");
    quic_workers.wait_for_workers().expect("workers");
    let mut base = quic_workers.loader_config("train", 4);
    base.tail = Tail::Partial;
    let seen = consume(&base, 2, 1);
    assert_every_key_once(&seen, 1);
    let (all, bulk) = pushed(&quic_workers, 1);
    assert!(all > 0 && bulk == 0, "a QUIC-only worker: {bulk} of {all} over TCP");
}

#[test]
fn bulk_connections_broken_again_and_again_mid_epoch_lose_and_repeat_nothing() {
    let cluster = cluster_with(2);
    let mut base = cluster.loader_config("train", 4);
    base.tail = Tail::Partial;
    base.prefetch = 2;
    let breaker = {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = std::sync::Arc::clone(&stop);
        let cluster = &cluster;
        std::thread::scope(|scope| {
            let breaking = scope.spawn(move || {
                let mut broken = 0;
                let deadline = Instant::now() + Duration::from_secs(120);
                while !flag.load(std::sync::atomic::Ordering::Acquire) && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(150));
                    for index in 0..2 {
                        if let Some(worker) = cluster.worker(index) {
                            broken += worker.bulk_connections();
                            worker.break_bulk_connections();
                        }
                    }
                }
                broken
            });
            let seen = consume(&base, 2, 3);
            stop.store(true, std::sync::atomic::Ordering::Release);
            (seen, breaking.join().expect("breaker"))
        })
    };
    let (seen, broken) = breaker;
    assert_in_order(&seen, SAMPLES.div_ceil(8) as u64, 3);
    assert_every_key_once(&seen, 3);
    let (all, bulk) = pushed(&cluster, 2);
    eprintln!("{broken} bulk connections broken; {bulk} of {all} batches over them");
    assert!(broken >= 2, "the test broke {broken} bulk connections");
    // Each batch went over a bulk connection or, while none was there, over QUIC: how many took
    // which depends on how soon each trainer dialed again (usually within the worker's 2 s of
    // patience, so often all of them).
    assert!(bulk > 0 && bulk <= all, "batches over bulk connections: {bulk} of {all}");
}

#[test]
fn a_bulk_connection_needs_a_trainer_certificate_that_owns_the_quic_session() {
    let cluster = cluster_with(1);
    let worker = cluster.worker(0).expect("worker").local_addr();
    let trainer = cluster.tls(Role::Trainer);
    let hello = TrainerHello { job: JobId(77), rank: Rank(0), session: SessionId(5), bulk: true };
    let answer = |tls: stoker_net::TlsConfigs, hello: TrainerHello| {
        cluster.block_on(async move {
            let mut connection = bulk::connect(worker, &tls, Duration::from_secs(5)).await?;
            connection.writer.write_frame(&hello, CONTROL_FRAME_LIMIT).await?;
            connection.reader.read_frame::<Result<(), RemoteError>>(CONTROL_FRAME_LIMIT).await
        })
    };
    // No QUIC connection of that session: refused, saying why.
    let refused = answer(trainer.clone(), hello.clone()).expect("an answer").expect_err("no QUIC session");
    assert!(refused.message.contains("joins one"), "{}", refused.message);
    // A worker certificate is not a trainer: the connection is closed without an answer, with
    // the alert that says so (or a reset, when the hello the worker never read was still in
    // its socket at the close).
    let error = answer(cluster.tls(Role::Worker), hello.clone()).expect_err("a worker certificate");
    assert!(matches!(&error, BulkError::Alert(alert) if alert.contains("access_denied")) || matches!(error, BulkError::Io(_)), "{error}");
    // With its QUIC connection open (hello answered), the same trainer gets its bulk connection.
    let owned = cluster.block_on(async {
        let endpoint = client_endpoint(&trainer, worker, Tuning::default()).expect("endpoint");
        let (quic, answer) = trainer_hello(&endpoint, worker, hello.clone()).await;
        answer.expect("QUIC hello");
        let mut connection = bulk::connect(worker, &trainer, Duration::from_secs(5)).await.expect("bulk");
        connection.writer.write_frame(&hello, CONTROL_FRAME_LIMIT).await.expect("hello");
        let answer = connection.reader.read_frame::<Result<(), RemoteError>>(CONTROL_FRAME_LIMIT).await.expect("answer");
        // Another session of the same rank, same certificate: not the QUIC connection's.
        let other = TrainerHello { session: SessionId(6), ..hello.clone() };
        let mut second = bulk::connect(worker, &trainer, Duration::from_secs(5)).await.expect("bulk");
        second.writer.write_frame(&other, CONTROL_FRAME_LIMIT).await.expect("hello");
        let other_answer = second.reader.read_frame::<Result<(), RemoteError>>(CONTROL_FRAME_LIMIT).await.expect("answer");
        drop(quic);
        (answer, other_answer)
    });
    assert_eq!(owned.0, Ok(()), "the owner of the QUIC session");
    assert!(owned.1.is_err(), "another session: {:?}", owned.1);
}

/// Issue 31, item 6: one address holding silent TCP connections to a worker's bulk port (more
/// than every handshake place there is) leaves the other trainers their bulk connections:
/// handshake places per address are fewer than the total. Before, the flood took all 256 and
/// pushed every trainer onto QUIC.
#[test]
fn a_handshake_flood_from_one_address_leaves_other_trainers_on_bulk() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    let cluster = cluster_with(1);
    let bulk_port = cluster.worker(0).expect("worker").local_addr();
    let stop = Arc::new(AtomicBool::new(false));
    let opened = Arc::new(AtomicUsize::new(0));
    let flood = {
        let (stop, opened) = (Arc::clone(&stop), Arc::clone(&opened));
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
            runtime.block_on(async {
                let connect = || async {
                    let socket = tokio::net::TcpSocket::new_v4().ok()?;
                    socket.bind(std::net::SocketAddr::from(([127, 0, 0, 77], 0))).ok()?;
                    tokio::time::timeout(Duration::from_secs(1), socket.connect(bulk_port)).await.ok()?.ok()
                };
                // 300 silent connections, each opened again once the worker closed it (it
                // closes silent ones after 5 s); at most 60 s.
                let started = Instant::now();
                let mut open = Vec::new();
                while !stop.load(Ordering::Relaxed) && started.elapsed() < Duration::from_secs(60) {
                    let mut byte = [0u8; 1];
                    open.retain(|stream: &tokio::net::TcpStream| {
                        matches!(stream.try_read(&mut byte), Err(error) if error.kind() == std::io::ErrorKind::WouldBlock)
                    });
                    while open.len() < 300 {
                        let Some(stream) = connect().await else { break };
                        open.push(stream);
                    }
                    opened.store(open.len(), Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            });
        })
    };
    stoker_testkit::wait_until(Duration::from_secs(30), "the flood holds more connections than there are handshake places", || {
        opened.load(Ordering::Relaxed) >= 280
    })
    .expect("flood");
    let mut base = cluster.loader_config("train", 4);
    base.tail = Tail::Partial;
    base.job_name = Some("bulk-under-flood".to_owned());
    let seen = consume(&base, 2, 1);
    stop.store(true, Ordering::Relaxed);
    flood.join().expect("flood thread");
    assert_every_key_once(&seen, 1);
    let (all, bulk) = pushed(&cluster, 1);
    eprintln!("{bulk} of {all} batches over bulk connections during the flood");
    assert!(all > 0 && bulk * 10 >= all * 9, "{bulk} of {all} batches over bulk connections");
}
