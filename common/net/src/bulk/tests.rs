//! The bulk record layer against rustls's own (both directions, through key updates), against
//! itself with batches, and against peers that tamper, send oversized records or hold the
//! wrong certificate. All on loopback TCP.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener as StdListener};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::*;
use crate::{CERT_VALIDITY, ClusterCa, Role, Validity, mutual_tls};
use stoker_plan::ids::{JobId, Rank, Step};
use stoker_proto::ALPN;
use stoker_proto::wire::CONTROL_FRAME_LIMIT;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime")
}

/// A cluster CA and configs for `roles` under it.
fn cluster(roles: &[Role]) -> Vec<TlsConfigs> {
    let ca = ClusterCa::generate("bulk test CA", Validity::from_now(CERT_VALIDITY)).expect("CA");
    roles
        .iter()
        .map(|&role| {
            let issued = ca
                .issue(role, &format!("bulk-{role}"), (role == Role::Coordinator).then_some(1), &[], Validity::from_now(CERT_VALIDITY))
                .expect("issue");
            mutual_tls(ca.cert_pem(), &issued.cert_pem, &issued.key_pem, None, ALPN).expect("tls")
        })
        .collect()
}

/// Bytes that show where they came from: byte i of stream `seed`.
fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed).wrapping_add((i >> 13) as u8)).collect()
}

/// A rustls `ServerConnection` (rustls's own record layer) on a thread: reads `expect_in`
/// bytes and checks them, refreshing its keys half-way through what it writes.
fn rustls_server(config: Arc<rustls::ServerConfig>, receive: usize, send: Vec<u8>) -> (SocketAddr, std::thread::JoinHandle<Vec<u8>>) {
    let listener = StdListener::bind("127.0.0.1:0").expect("listen");
    let addr = listener.local_addr().expect("address");
    let thread = std::thread::spawn(move || {
        let (socket, _) = listener.accept().expect("accept");
        let mut stream = rustls::StreamOwned::new(rustls::ServerConnection::new(config).expect("server"), socket);
        let mut received = vec![0u8; receive];
        stream.read_exact(&mut received).expect("read what the bulk client sent");
        let half = send.len() / 2;
        stream.write_all(&send[..half]).expect("write");
        stream.conn.refresh_traffic_keys().expect("key update");
        stream.write_all(&send[half..]).expect("write");
        stream.flush().expect("flush");
        // Wait for the client to close, so no byte is cut off by our close.
        let mut rest = Vec::new();
        let _ = stream.read_to_end(&mut rest);
        received
    });
    (addr, thread)
}

#[test]
fn our_records_and_rustls_records_interoperate_both_ways_through_key_updates() {
    let tls = cluster(&[Role::Worker, Role::Trainer]);
    let (to_server, to_client) = (pattern(1, 3 << 20), pattern(2, 5 << 20 | 123));
    let (addr, server) = rustls_server(tls[0].bulk_server(), to_server.len(), to_client.clone());
    runtime().block_on(async {
        let mut bulk = connect(addr, &tls[1], Duration::from_secs(5)).await.expect("handshake with rustls");
        assert!(matches!(&bulk.peer, PeerIdentity::Certified(peer) if peer.role == Role::Worker), "{:?}", bulk.peer);
        // Our key updates every 8 records: rustls must follow them.
        bulk.writer.0.renew_key_every(8);
        bulk.writer.0.write(&to_server).await.expect("write");
        bulk.writer.0.flush().await.expect("flush");
        let mut received = vec![0u8; to_client.len()];
        bulk.reader.0.read_exact(&mut received, None).await.expect("read through rustls's key update");
        assert!(received == to_client, "the bytes rustls sent");
        bulk.writer.close().await.expect("close");
    });
    assert!(server.join().expect("server thread") == to_server, "the bytes rustls received");
}

#[test]
fn our_server_takes_data_a_rustls_client_sends_with_its_last_handshake_flight() {
    let tls = cluster(&[Role::Worker, Role::Trainer]);
    let listener = StdListener::bind("127.0.0.1:0").expect("listen");
    let addr = listener.local_addr().expect("address");
    let message = pattern(3, 200_000);
    let client = {
        let (config, message) = (tls[1].bulk_client(), message.clone());
        std::thread::spawn(move || {
            let socket = std::net::TcpStream::connect(addr).expect("connect");
            let name = rustls::pki_types::ServerName::try_from("stoker").expect("name");
            let mut stream = rustls::StreamOwned::new(rustls::ClientConnection::new(config, name).expect("client"), socket);
            // Written before the handshake is over on the server's side: it arrives with the
            // client's Finished, and part of it is decrypted by rustls during the handshake.
            stream.write_all(&message).expect("write");
            stream.flush().expect("flush");
            let mut answer = [0u8; 5];
            stream.read_exact(&mut answer).expect("answer");
            answer
        })
    };
    runtime().block_on(async {
        let listener = TcpListener::from_std({
            listener.set_nonblocking(true).expect("nonblocking");
            listener
        })
        .expect("listener");
        let (socket, _) = listener.accept().await.expect("accept");
        let mut bulk = accept(socket, &tls[0]).await.expect("handshake");
        assert!(matches!(&bulk.peer, PeerIdentity::Certified(peer) if peer.role == Role::Trainer));
        let mut received = vec![0u8; message.len()];
        bulk.reader.0.read_exact(&mut received, None).await.expect("read");
        assert!(received == message);
        bulk.writer.0.write(b"hello").await.expect("write");
        bulk.writer.0.flush().await.expect("flush");
    });
    assert_eq!(&client.join().expect("client"), b"hello");
}

fn header(step: u64, payload: &[u8]) -> BatchHeader {
    BatchHeader::opaque(Step(step), payload)
}

/// A connected pair of our own ends (worker, trainer) over loopback TCP.
async fn pair(worker: &TlsConfigs, trainer: &TlsConfigs) -> (BulkConnection, BulkConnection) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("listen");
    let addr = listener.local_addr().expect("address");
    let worker = worker.clone();
    let accepted = tokio::spawn(async move {
        let (socket, _) = listener.accept().await.expect("accept");
        accept(socket, &worker).await
    });
    let trainer = connect(addr, trainer, Duration::from_secs(5)).await.expect("connect");
    (accepted.await.expect("task").expect("accept"), trainer)
}

#[test]
fn batches_are_checked_before_their_payload_and_a_refused_one_leaves_the_stream_in_step() {
    let tls = cluster(&[Role::Worker, Role::Trainer]);
    runtime().block_on(async {
        let (mut worker, mut trainer) = pair(&tls[0], &tls[1]).await;
        let hello = stoker_proto::TrainerHello { job: JobId(1), rank: Rank(0), session: stoker_plan::ids::SessionId(9), bulk: true };
        trainer.writer.write_frame(&hello, CONTROL_FRAME_LIMIT).await.expect("hello");
        assert_eq!(worker.reader.read_frame::<stoker_proto::TrainerHello>(CONTROL_FRAME_LIMIT).await.expect("hello"), hello);
        // Over 256 KiB: read straight into the payload buffer, one message after another.
        let payloads: Vec<Vec<u8>> = (0..3).map(|step| pattern(step as u8, 300_000 + step * 77_777)).collect();
        let sender = tokio::spawn(async move {
            for (step, payload) in payloads.iter().enumerate() {
                let mut header = header(step as u64, payload);
                if step == 2 {
                    header.checksum ^= 1;
                }
                worker.writer.send_batch(&header, payload).await.expect("send");
            }
            let mut replies = Vec::new();
            for _ in 0..3 {
                replies.push(worker.reader.read_frame::<BatchReply>(REPLY_FRAME_LIMIT).await.expect("reply"));
            }
            // A header the trainer refuses, announcing more than it would read to skip it.
            let large = pattern(9, (1 << 20) + 1);
            let _ = worker.writer.send_batch(&header(3, &large), &large).await;
            // A payload that does not match its header is not sent at all.
            let short = worker.writer.send_batch(&header(4, &large), &large[1..]).await.expect_err("a short payload");
            assert!(short.to_string().contains("under a header of"), "{short}");
            (payloads, replies)
        });
        let pool = PayloadPool::new(2);
        let mut outcomes = Vec::new();
        for step in 0..3u64 {
            let received = trainer
                .reader
                .receive_batch(
                    &pool,
                    |header| if header.step == Step(0) { Err("refused for the test".to_owned()) } else { Ok(()) },
                    1 << 20,
                    Duration::from_secs(10),
                )
                .await
                .expect("receive");
            let reply = match &received {
                Received::Batch(..) => BatchReply::Received,
                Received::Refused(reason) => BatchReply::Refused { reason: reason.clone() },
            };
            trainer.writer.reply(&reply).await.expect("reply");
            outcomes.push((step, received));
        }
        let refused = trainer.reader.receive_batch(&pool, |_| Err("refused".to_owned()), 1 << 20, Duration::from_secs(10)).await;
        assert!(matches!(&refused, Err(BulkError::Protocol(message)) if message.contains("announcing 1048577 bytes")), "{refused:?}");
        let (payloads, replies) = sender.await.expect("sender");
        assert!(matches!(&outcomes[0].1, Received::Refused(reason) if reason == "refused for the test"));
        assert!(matches!(&outcomes[1].1, Received::Batch(header, payload) if header.step == Step(1) && **payload == *payloads[1]));
        assert!(matches!(&outcomes[2].1, Received::Refused(reason) if reason.contains("checksum mismatch")), "{:?}", outcomes[2].1);
        assert_eq!(replies[1], BatchReply::Received);
        assert!(matches!(&replies[0], BatchReply::Refused { .. }) && matches!(&replies[2], BatchReply::Refused { .. }));
    });
}

#[test]
fn records_of_every_size_and_key_updates_read_alike_into_frames_and_large_buffers() {
    let tls = cluster(&[Role::Worker, Role::Trainer]);
    runtime().block_on(async {
        let (mut worker, mut trainer) = pair(&tls[0], &tls[1]).await;
        // Messages of a length prefix and a body, written in pieces of ever other sizes (so
        // records of 1 byte to 16 KiB), a key update every 5 records.
        let bodies: Vec<Vec<u8>> =
            [10, 1 << 20, 3, 700_001, 262_144, 1].iter().enumerate().map(|(i, &len)| pattern(i as u8, len)).collect();
        let sent = bodies.clone();
        let writer = tokio::spawn(async move {
            worker.writer.0.renew_key_every(5);
            let mut piece = 1usize;
            for body in &sent {
                worker.writer.0.write(&(body.len() as u32).to_le_bytes()).await.expect("write");
                let mut rest = &body[..];
                while !rest.is_empty() {
                    let take = piece.min(rest.len());
                    worker.writer.0.write(&rest[..take]).await.expect("write");
                    rest = &rest[take..];
                    piece = piece * 7 % 40_009 + 1;
                }
            }
            worker.writer.0.flush().await.expect("flush");
            worker
        });
        for body in &bodies {
            let mut prefix = [0u8; 4];
            trainer.reader.0.read_exact(&mut prefix, None).await.expect("prefix");
            let mut received = vec![0u8; u32::from_le_bytes(prefix) as usize];
            let mut hash = Xxh3::new();
            trainer.reader.0.read_exact(&mut received, Some(&mut hash)).await.expect("body");
            assert!(received == *body, "a body of {} bytes", body.len());
            assert_eq!(hash.digest(), xxhash_rust::xxh3::xxh3_64(body), "its hash taken on the way");
        }
        drop(writer.await.expect("writer"));
    });
}

/// What a man in the middle does to the worker's 10th record (the handshake's are fewer).
#[derive(Clone, Copy, Debug)]
enum Meddle {
    /// Flip a bit inside it.
    Flip,
    /// Announce a record longer than TLS allows in its place.
    Oversize,
    /// Put a record of random bytes in its place.
    Forge,
}

/// Forwards the worker's records to the trainer (and all the trainer sends back), meddling
/// with the 10th.
async fn meddler(worker: SocketAddr, meddle: Meddle) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("listen");
    let addr = listener.local_addr().expect("address");
    tokio::spawn(async move {
        let (trainer_side, _) = listener.accept().await.expect("accept");
        let worker_side = TcpStream::connect(worker).await.expect("connect");
        let (mut trainer_read, mut trainer_write) = trainer_side.into_split();
        let (mut worker_read, mut worker_write) = worker_side.into_split();
        tokio::spawn(async move { tokio::io::copy(&mut trainer_read, &mut worker_write).await });
        for index in 0.. {
            let mut header = [0u8; 5];
            if worker_read.read_exact(&mut header).await.is_err() {
                return;
            }
            let mut body = vec![0u8; usize::from(u16::from_be_bytes([header[3], header[4]]))];
            if worker_read.read_exact(&mut body).await.is_err() {
                return;
            }
            if index == 10 {
                match meddle {
                    Meddle::Flip => {
                        let middle = body.len() / 2;
                        body[middle] ^= 0x40;
                    }
                    Meddle::Oversize => header[3..].copy_from_slice(&((records::MAX_PLAINTEXT + 257) as u16).to_be_bytes()),
                    Meddle::Forge => body.iter_mut().enumerate().for_each(|(i, byte)| *byte = (i * 7 + 3) as u8),
                }
            }
            if trainer_write.write_all(&header).await.is_err() || trainer_write.write_all(&body).await.is_err() {
                return;
            }
        }
    });
    addr
}

/// The trainer's error reading 1 MB the worker sends through a meddler, and what the worker
/// reads after the trainer answered that error with its alert.
fn error_through_meddler(meddle: Meddle) -> (BulkError, BulkError) {
    let tls = cluster(&[Role::Worker, Role::Trainer]);
    runtime().block_on(async {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("listen");
        let worker_addr = listener.local_addr().expect("address");
        let worker_tls = tls[0].clone();
        let worker = tokio::spawn(async move {
            let (socket, _) = listener.accept().await.expect("accept");
            let mut worker = accept(socket, &worker_tls).await.expect("handshake");
            let _ = worker.writer.0.write(&pattern(5, 1 << 20)).await;
            let _ = worker.writer.0.flush().await;
            let mut answer = [0u8; 1];
            tokio::time::timeout(Duration::from_secs(10), worker.reader.0.read_exact(&mut answer, None))
                .await
                .expect("the trainer's answer within 10 s")
                .expect_err("an alert, not data")
        });
        let addr = meddler(worker_addr, meddle).await;
        let mut trainer = connect(addr, &tls[1], Duration::from_secs(5)).await.expect("handshake");
        let mut received = vec![0u8; 1 << 20];
        let read = tokio::time::timeout(Duration::from_secs(10), trainer.reader.0.read_exact(&mut received, None));
        let error = read.await.expect("an answer within 10 s").expect_err("a meddled stream");
        trainer.writer.end(error.alert(), Duration::from_secs(5)).await;
        (error, worker.await.expect("worker task"))
    })
}

/// A meddled record ends the connection, and the reader's end tells the sender why with the
/// alert RFC 8446 names for it (issue 31, item 8).
#[test]
fn a_flipped_bit_an_oversized_record_or_a_forged_one_ends_the_connection_with_an_alert() {
    for (meddle, expected, alert) in [
        (Meddle::Flip, "failed authentication", "20 bad_record_mac"),
        (Meddle::Oversize, "a record of 16641 bytes", "22 record_overflow"),
        (Meddle::Forge, "failed authentication", "20 bad_record_mac"),
    ] {
        let (error, at_worker) = error_through_meddler(meddle);
        assert!(matches!(&error, BulkError::BadRecord { reason, .. } if reason.contains(expected)), "{meddle:?}: {error}");
        assert!(matches!(&at_worker, BulkError::Alert(name) if name.starts_with(alert)), "{meddle:?}: the worker read {at_worker}");
    }
}

/// `close_notify` is an orderly close; a stream that just ends (the peer died, or someone cut
/// it) is told apart from it.
#[test]
fn close_notify_is_told_apart_from_a_stream_that_just_ends() {
    let tls = cluster(&[Role::Worker, Role::Trainer]);
    for orderly in [true, false] {
        let error = runtime().block_on(async {
            let (mut worker, mut trainer) = pair(&tls[0], &tls[1]).await;
            worker.writer.write_frame(&7u32, CONTROL_FRAME_LIMIT).await.expect("frame");
            if orderly {
                worker.writer.close().await.expect("close");
            } else {
                drop(worker);
            }
            assert_eq!(trainer.reader.read_frame::<u32>(CONTROL_FRAME_LIMIT).await.expect("the frame sent before"), 7);
            trainer.reader.read_frame::<u32>(CONTROL_FRAME_LIMIT).await.expect_err("nothing after it")
        });
        match orderly {
            true => assert!(matches!(error, BulkError::Closed), "{error}"),
            false => assert!(matches!(error, BulkError::Truncated), "{error}"),
        }
    }
}

#[test]
fn a_certificate_of_another_ca_or_another_protocol_version_is_refused() {
    let ours = cluster(&[Role::Worker, Role::Trainer]);
    let theirs = cluster(&[Role::Trainer]);
    let old_version = {
        let ca = ClusterCa::generate("old CA", Validity::from_now(CERT_VALIDITY)).expect("CA");
        let issued = ca.issue(Role::Trainer, "old", None, &[], Validity::from_now(CERT_VALIDITY)).expect("issue");
        // Trusted by our worker's CA? No matter: the ALPN is refused first.
        mutual_tls(ca.cert_pem(), &issued.cert_pem, &issued.key_pem, None, b"stoker/6").expect("tls")
    };
    runtime().block_on(async {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("listen");
        let addr = listener.local_addr().expect("address");
        let worker = ours[0].clone();
        let server = tokio::spawn(async move {
            let mut errors = Vec::new();
            for _ in 0..2 {
                let (socket, _) = listener.accept().await.expect("accept");
                errors.push(accept(socket, &worker).await.expect_err("refused"));
            }
            errors
        });
        let stranger = connect(addr, &theirs[0], Duration::from_secs(5)).await.expect_err("another CA");
        let old = connect(addr, &old_version, Duration::from_secs(5)).await.expect_err("another version");
        let errors = server.await.expect("server");
        eprintln!("another CA: {stranger} / {}; another version: {old} / {}", errors[0], errors[1]);
        // The side that refused says why, and its alert tells the other side.
        assert!(stranger.to_string().contains("UnknownIssuer"), "{stranger}");
        assert!(errors[0].to_string().contains("UnknownCA"), "{}", errors[0]);
        assert!(errors[1].to_string().contains("known protocol"), "{}", errors[1]);
        // rustls refuses the ALPN after its ServerHello, under keys the client has not got
        // yet: the client sees the connection close (a peer of another version fails at QUIC,
        // with the versions named, before it ever dials here).
        assert!(matches!(old, BulkError::Closed | BulkError::Truncated | BulkError::Tls(_)), "{old}");
    });
}

/// Both ends of a bulk connection probe an idle peer (a flow dropped by a NAT would otherwise
/// go unnoticed by a trainer that waits for batches without a timeout).
#[test]
fn both_ends_of_a_bulk_connection_send_keepalive_probes() {
    let tls = cluster(&[Role::Worker, Role::Trainer]);
    runtime().block_on(async {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("listen");
        let addr = listener.local_addr().expect("address");
        let worker_tls = tls[0].clone();
        let worker = tokio::spawn(async move {
            let (socket, _) = listener.accept().await.expect("accept");
            accept(socket, &worker_tls).await.expect("handshake")
        });
        let trainer = connect(addr, &tls[1], Duration::from_secs(5)).await.expect("handshake");
        let worker = worker.await.expect("worker");
        for connection in [&trainer, &worker] {
            let stream: &TcpStream = connection.reader.0.get_ref().as_ref();
            let socket = socket2::SockRef::from(stream);
            assert!(socket.keepalive().expect("SO_KEEPALIVE"), "keepalive is off");
            assert_eq!(socket.tcp_keepalive_time().expect("TCP_KEEPIDLE"), KEEPALIVE_IDLE);
            assert_eq!(socket.tcp_keepalive_interval().expect("TCP_KEEPINTVL"), KEEPALIVE_INTERVAL);
            assert_eq!(socket.tcp_keepalive_retries().expect("TCP_KEEPCNT"), KEEPALIVE_PROBES);
            assert!(stream.nodelay().expect("TCP_NODELAY"));
        }
    });
}
