//! One batch over one stream (`send_batch`/`receive_batch`), on a real QUIC connection.

use std::net::{SocketAddr, UdpSocket};
use std::time::Duration;

use bytes::Bytes;
use stoker_net::{
    DeliveryError, ETHERNET_UDP_PAYLOAD, PayloadPool, TlsConfigs, Tuning, accept_with_tuning, client_endpoint, connect, receive_batch,
    send_batch, server_endpoint,
};
use stoker_plan::ids::{Epoch, JobId, Position, Rank, Step};
use stoker_plan::transform::{OutputDtype, OutputLayout};
use stoker_proto::BatchHeader;

const SIDE: u32 = 512;
const TIMEOUT: Duration = Duration::from_secs(30);

fn header(step: u64, payload: &[u8]) -> BatchHeader {
    BatchHeader {
        job: JobId(1),
        epoch: Epoch(0),
        start: Position(0),
        rank: Rank(0),
        step: Step(step),
        shape: [4, SIDE, SIDE, 3],
        dtype: OutputDtype::U8,
        layout: OutputLayout::Nhwc,
        labels: vec![0, 1, 2, 3],
        keys: (0..4).map(|index| format!("k{index}")).collect(),
        replaced: vec![],
        corrupt: vec![],
        dataset_version: 0,
        plan_digest: 0,
        payload_len: payload.len() as u64,
        checksum: xxhash_rust::xxh3::xxh3_64(payload),
    }
}

/// A worker-side connection (accepted the way a worker accepts trainers) and the trainer's.
async fn pair() -> (quinn::Endpoint, quinn::Connection, quinn::Endpoint, quinn::Connection) {
    let tls = TlsConfigs::insecure().expect("tls");
    let socket = UdpSocket::bind("127.0.0.1:0").expect("socket");
    let addr: SocketAddr = socket.local_addr().expect("address");
    let worker = server_endpoint(socket, &tls, Tuning::default()).expect("worker endpoint");
    let accepting = {
        let (worker, tls) = (worker.clone(), tls.clone());
        tokio::spawn(async move {
            let incoming = worker.accept().await.expect("a connection");
            accept_with_tuning(incoming, &tls, Tuning::default()).expect("accept").await.expect("handshake")
        })
    };
    let trainer = client_endpoint(&tls, addr, Tuning::default()).expect("trainer endpoint");
    let to_worker = connect(&trainer, addr, Duration::from_secs(5)).await.expect("connect");
    let to_trainer = accepting.await.expect("accept task");
    (worker, to_trainer, trainer, to_worker)
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime")
}

#[test]
fn batches_to_a_trainer_on_this_host_arrive_intact_in_datagrams_larger_than_ethernet() {
    runtime().block_on(async {
        let (_worker, to_trainer, _trainer, to_worker) = pair().await;
        let payload =
            Bytes::from((0..4 * SIDE * SIDE * 3).map(|index| (index.wrapping_mul(2_654_435_761) >> 13) as u8).collect::<Vec<_>>());
        let sender = {
            let (to_trainer, payload) = (to_trainer.clone(), payload.clone());
            tokio::spawn(async move {
                for step in 0..4 {
                    send_batch(&to_trainer, &header(step, &payload), payload.clone(), TIMEOUT).await.expect("delivered");
                }
            })
        };
        let pool = PayloadPool::new(2);
        for step in 0..4 {
            let mut recv = tokio::time::timeout(Duration::from_secs(20), to_worker.accept_uni()).await.expect("in time").expect("a stream");
            let (received, bytes) = receive_batch(&mut recv, &pool, |_| Ok(())).await.expect("a batch");
            assert_eq!(received.step, Step(step));
            assert!(bytes[..] == payload[..], "step {step}: the bytes sent");
        }
        sender.await.expect("sender");
        assert!(pool.free_buffers() > 0, "received buffers went back to the pool");
        let mtu = to_trainer.stats().path.current_mtu;
        assert!(mtu > ETHERNET_UDP_PAYLOAD, "a loopback trainer gets large datagrams (path MTU {mtu})");
    });
    let remote: SocketAddr = "10.1.2.3:7500".parse().expect("address");
    assert_eq!(Tuning::default().for_peer(remote).max_udp_payload, ETHERNET_UDP_PAYLOAD, "remote peers keep Ethernet-sized datagrams");
}

#[test]
fn a_bad_checksum_or_a_refused_header_is_an_error_on_the_receiving_side() {
    runtime().block_on(async {
        let (_worker, to_trainer, _trainer, to_worker) = pair().await;
        let payload = Bytes::from(vec![7u8; 4 * (SIDE * SIDE * 3) as usize]);
        let mut corrupt = header(0, &payload);
        corrupt.checksum ^= 1;
        let sends = {
            let (to_trainer, payload) = (to_trainer.clone(), payload.clone());
            tokio::spawn(async move {
                let first = send_batch(&to_trainer, &corrupt, payload.clone(), TIMEOUT).await;
                let second = send_batch(&to_trainer, &header(1, &payload), payload, TIMEOUT).await;
                (first, second)
            })
        };
        let pool = PayloadPool::new(1);
        let mut recv = to_worker.accept_uni().await.expect("first stream");
        let error = receive_batch(&mut recv, &pool, |_| Ok(())).await.expect_err("checksum");
        assert!(matches!(error, DeliveryError::Checksum { step: Step(0), .. }), "{error}");
        recv.stop(1u32.into()).expect("stop");
        let mut recv = to_worker.accept_uni().await.expect("second stream");
        let error = receive_batch(&mut recv, &pool, |_| Err("not for this trainer".to_owned())).await.expect_err("refused");
        assert!(matches!(error, DeliveryError::Unexpected(ref message) if message == "not for this trainer"), "{error}");
        assert_eq!(pool.free_buffers(), 1, "a refused header takes no payload buffer; the corrupt one went back");
        recv.stop(1u32.into()).expect("stop");
        let (first, second) = tokio::time::timeout(Duration::from_secs(20), sends).await.expect("in time").expect("sends");
        // A stop that comes after the last byte was acknowledged does not reach the sender:
        // either outcome is possible here, but never another error.
        for (name, result) in [("corrupt", first), ("refused", second)] {
            assert!(matches!(result, Ok(()) | Err(DeliveryError::Refused(_))), "{name}: {result:?}");
        }
    });
}
