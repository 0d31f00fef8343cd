//! Bad input on the wire: the peer gets a clear error and the server keeps serving others.

use std::time::Duration;

use stoker_net::{NetError, Role, Tuning, call, client_endpoint, connect, insecure_tls};
use stoker_plan::ids::{Epoch, JobId, Pass, Position, Rank, SessionId};
use stoker_proto::wire::CONTROL_FRAME_LIMIT;
use stoker_proto::{ControlRequest, ControlResponse, ErrorCode, RemoteError, TrainerHello};
use stoker_testkit::{ClusterConfig, TestCluster};
use tracing::info;

use crate::common::trainer_hello;

type Answer = Result<ControlResponse, RemoteError>;

/// Send raw bytes as one request stream and read the answer frame.
async fn raw_call(connection: &quinn::Connection, bytes: &[u8]) -> Answer {
    let (mut send, mut recv) = connection.open_bi().await.expect("stream");
    send.write_all(bytes).await.expect("write");
    let _ = send.finish();
    stoker_net::frame::read_frame::<Answer>(&mut recv, CONTROL_FRAME_LIMIT).await.expect("an answer frame")
}

#[test]
fn bad_requests_get_clear_errors_and_the_coordinator_keeps_serving() {
    let cluster = TestCluster::start(ClusterConfig { workers: 1, ..ClusterConfig::default() }).expect("cluster");
    let addr = cluster.coordinator_addr();
    let tls = cluster.tls(Role::Trainer);
    cluster.block_on(async {
        let endpoint = client_endpoint(&tls, addr, Tuning::default()).expect("endpoint");
        let connection = connect(&endpoint, addr, Duration::from_secs(5)).await.expect("connect");
        {
            info!("--- a malformed frame");
            let mut frame = 9u32.to_le_bytes().to_vec();
            frame.extend_from_slice(&[0xff; 9]);
            let error = raw_call(&connection, &frame).await.expect_err("refused");
            assert_eq!(error.code, ErrorCode::InvalidArgument);
            assert!(error.message.contains("malformed"), "{error}");
        }
        {
            info!("--- a length prefix over the limit");
            let error = raw_call(&connection, &u32::MAX.to_le_bytes()).await.expect_err("refused");
            assert_eq!(error.code, ErrorCode::InvalidArgument);
            assert!(error.message.contains("exceeds"), "{error}");
        }
        {
            info!("--- unknown job, unknown dataset, rank outside the world");
            let open = ControlRequest::OpenEpoch {
                job: JobId(999),
                rank: Rank(0),
                epoch: Epoch(0),
                start: Position(0),
                session: SessionId(1),
                pass: Pass(1),
                consumed: 0,
                holding: Vec::new(),
            };
            let error = call::<_, ControlResponse>(&connection, &open, CONTROL_FRAME_LIMIT).await.expect_err("refused");
            assert_eq!(error.remote().map(|e| &e.code), Some(&ErrorCode::NotFound), "{error}");
            let mut spec = stoker_client::LoaderConfig::new(addr, "nonexistent", 4).job_spec().expect("spec");
            let attach = ControlRequest::Attach { spec: spec.clone(), rank: Rank(0), client: 1 };
            let error = call::<_, ControlResponse>(&connection, &attach, CONTROL_FRAME_LIMIT).await.expect_err("refused");
            assert_eq!(error.remote().map(|e| &e.code), Some(&ErrorCode::NotFound));
            assert!(error.to_string().contains("stoker dataset add"), "{error}");
            spec.dataset = "x".to_owned();
            let outside = ControlRequest::Attach { spec, rank: Rank(5), client: 1 };
            let error = call::<_, ControlResponse>(&connection, &outside, CONTROL_FRAME_LIMIT).await.expect_err("refused");
            assert_eq!(error.remote().map(|e| &e.code), Some(&ErrorCode::InvalidArgument));
        }
        {
            info!("--- the same connection and a new one still work");
            let answer: ControlResponse = call(&connection, &ControlRequest::ListDatasets, CONTROL_FRAME_LIMIT).await.expect("served");
            assert!(matches!(answer, ControlResponse::Datasets { .. }));
            let other = connect(&endpoint, addr, Duration::from_secs(5)).await.expect("connect");
            let answer: ControlResponse = call(&other, &ControlRequest::ListDatasets, CONTROL_FRAME_LIMIT).await.expect("served");
            assert!(matches!(answer, ControlResponse::Datasets { .. }));
        }
    });
}

#[test]
fn a_peer_with_another_protocol_version_is_refused_in_the_handshake() {
    let cluster = TestCluster::start(ClusterConfig { workers: 1, ..ClusterConfig::default() }).expect("cluster");
    let addr = cluster.coordinator_addr();
    cluster.block_on(async {
        let old = insecure_tls(b"stoker/0").expect("tls");
        let endpoint = client_endpoint(&old, addr, Tuning::default()).expect("endpoint");
        let error = connect(&endpoint, addr, Duration::from_secs(5)).await.expect_err("refused");
        assert!(matches!(error, NetError::VersionMismatch { .. }), "{error:?}");
        assert!(error.to_string().contains(&format!("does not speak {}", stoker_proto::ALPN_TEXT)), "{error}");
        let current = cluster.tls(Role::Admin);
        let endpoint = client_endpoint(&current, addr, Tuning::default()).expect("endpoint");
        let connection = connect(&endpoint, addr, Duration::from_secs(5)).await.expect("a current peer connects");
        let answer: ControlResponse = call(&connection, &ControlRequest::ListDatasets, CONTROL_FRAME_LIMIT).await.expect("served");
        assert!(matches!(answer, ControlResponse::Datasets { .. }));
    });
}

#[test]
fn a_worker_refuses_a_malformed_trainer_hello() {
    let cluster = TestCluster::start(ClusterConfig { workers: 1, ..ClusterConfig::default() }).expect("cluster");
    let worker = cluster.worker(0).expect("worker").local_addr();
    let tls = cluster.tls(Role::Trainer);
    cluster.block_on(async {
        let endpoint = client_endpoint(&tls, worker, Tuning::default()).expect("endpoint");
        let connection = connect(&endpoint, worker, Duration::from_secs(5)).await.expect("connect");
        let (mut send, mut recv) = connection.open_bi().await.expect("stream");
        send.write_all(&[3, 0, 0, 0, 0xff, 0xff, 0xff]).await.expect("write");
        let _ = send.finish();
        let answer = stoker_net::frame::read_frame::<Result<(), RemoteError>>(&mut recv, CONTROL_FRAME_LIMIT).await.expect("answer");
        let error = answer.expect_err("refused");
        assert_eq!(error.code, ErrorCode::InvalidArgument);
        assert!(error.message.contains("trainer hello"), "{error}");
    });
}

/// Say hello to `worker` as rank 0 of job 1 in `session`.
async fn hello(endpoint: &quinn::Endpoint, worker: std::net::SocketAddr, session: u64) -> (quinn::Connection, Result<(), RemoteError>) {
    trainer_hello(endpoint, worker, TrainerHello { job: JobId(1), rank: Rank(0), session: SessionId(session), bulk: false }).await
}

#[test]
fn a_worker_serves_the_newest_trainer_session_of_a_rank() {
    let cluster = TestCluster::start(ClusterConfig { workers: 1, ..ClusterConfig::default() }).expect("cluster");
    let worker = cluster.worker(0).expect("worker").local_addr();
    let tls = cluster.tls(Role::Trainer);
    cluster.block_on(async {
        let endpoint = client_endpoint(&tls, worker, Tuning::default()).expect("endpoint");
        let (_first, answer) = hello(&endpoint, worker, 5).await;
        assert_eq!(answer, Ok(()), "the first trainer of the rank");
        let (_older, answer) = hello(&endpoint, worker, 3).await;
        let error = answer.expect_err("an older session is refused while the newer one is connected");
        assert_eq!(error.code, ErrorCode::Superseded, "{error}");
        assert!(error.message.contains("session-5"), "{error}");
        let (_again, answer) = hello(&endpoint, worker, 5).await;
        assert_eq!(answer, Ok(()), "the served session may connect again");
        let (_newer, answer) = hello(&endpoint, worker, 7).await;
        assert_eq!(answer, Ok(()), "a newer session takes over");
        let (_stale, answer) = hello(&endpoint, worker, 5).await;
        assert_eq!(answer.map_err(|error| error.code), Err(ErrorCode::Superseded));
    });
}
