//! TCP variants: plain TCP (the baseline), rustls's own TLS stream, and bulk connections
//! (`stoker_net::bulk`, what workers and trainers use).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::time::Duration;

use anyhow::{Context, bail};
use bytes::Bytes;
use stoker_net::PayloadPool;
use stoker_net::bulk::{self, REPLY_FRAME_LIMIT, Received};
use stoker_proto::wire::{self, BATCH_HEADER_LIMIT, PREFIX_BYTES};
use stoker_proto::{BatchHeader, BatchReply};
use tokio::sync::Semaphore;

use super::{IN_FLIGHT, Place, Progress, Sides, TidReport, mutual_pair, single_thread_runtime, spawn_side};

pub(super) fn start_plain(
    header: &BatchHeader,
    payload: &Bytes,
    progress: &Arc<Progress>,
    tids: mpsc::Sender<TidReport>,
    place: &Arc<Place>,
) -> anyhow::Result<Sides> {
    let frame = wire::encode(header, BATCH_HEADER_LIMIT)?;
    let (addr_tx, addr_rx) = mpsc::channel::<SocketAddr>();
    let (payload, sender_progress, sender_tids, sender_place) = (payload.clone(), Arc::clone(progress), tids.clone(), Arc::clone(place));
    let sender = spawn_side("bench-send", move || -> anyhow::Result<()> {
        sender_place.enter_sender(&sender_tids)?;
        let listener = TcpListener::bind((sender_place.sender_ip, 0)).context("cannot listen")?;
        let _ = addr_tx.send(listener.local_addr()?);
        let (mut stream, _) = listener.accept()?;
        let result = send_blocking(&mut stream, &frame, &payload, &sender_progress);
        sender_progress.finish(result)
    })?;
    let (receiver_progress, receiver_place) = (Arc::clone(progress), Arc::clone(place));
    let receiver = spawn_side("bench-recv", move || -> anyhow::Result<()> {
        let addr = receiver_place.enter_receiver(&tids, &addr_rx)?;
        let mut stream = TcpStream::connect(addr)?;
        let result = receive_blocking(&mut stream, &receiver_progress);
        receiver_progress.finish(result)
    })?;
    Ok((sender, receiver))
}

pub(super) fn start_rustls(
    header: &BatchHeader,
    payload: &Bytes,
    progress: &Arc<Progress>,
    tids: mpsc::Sender<TidReport>,
    place: &Arc<Place>,
) -> anyhow::Result<Sides> {
    let server = |config, socket| Ok(rustls::StreamOwned::new(rustls::ServerConnection::new(config)?, socket));
    let client = |config, socket, name| Ok(rustls::StreamOwned::new(rustls::ClientConnection::new(config, name)?, socket));
    start_blocking_tls(header, payload, progress, tids, place, server, client)
}

/// A blocking TLS variant: the sender is the server that `server` makes of the accepted
/// socket, the receiver the client that `client` makes of its socket, both mutual TLS.
pub(super) fn start_blocking_tls<S, C>(
    header: &BatchHeader,
    payload: &Bytes,
    progress: &Arc<Progress>,
    tids: mpsc::Sender<TidReport>,
    place: &Arc<Place>,
    server: impl FnOnce(Arc<rustls::ServerConfig>, TcpStream) -> anyhow::Result<S> + Send + 'static,
    client: impl FnOnce(Arc<rustls::ClientConfig>, TcpStream, rustls::pki_types::ServerName<'static>) -> anyhow::Result<C> + Send + 'static,
) -> anyhow::Result<Sides>
where
    S: Write,
    C: Read,
{
    let (worker, trainer) = mutual_pair()?;
    let (server_config, client_config) = (worker.bulk_server(), trainer.bulk_client());
    let frame = wire::encode(header, BATCH_HEADER_LIMIT)?;
    let (addr_tx, addr_rx) = mpsc::channel::<SocketAddr>();
    let (payload, sender_progress, sender_tids, sender_place) = (payload.clone(), Arc::clone(progress), tids.clone(), Arc::clone(place));
    let sender = spawn_side("bench-send", move || -> anyhow::Result<()> {
        sender_place.enter_sender(&sender_tids)?;
        let listener = TcpListener::bind((sender_place.sender_ip, 0)).context("cannot listen")?;
        let _ = addr_tx.send(listener.local_addr()?);
        let (socket, _) = listener.accept()?;
        let mut stream = server(server_config, socket)?;
        let result = send_blocking(&mut stream, &frame, &payload, &sender_progress);
        sender_progress.finish(result)
    })?;
    let (receiver_progress, receiver_place) = (Arc::clone(progress), Arc::clone(place));
    let receiver = spawn_side("bench-recv", move || -> anyhow::Result<()> {
        let addr = receiver_place.enter_receiver(&tids, &addr_rx)?;
        let socket = TcpStream::connect(addr)?;
        let mut stream = client(client_config, socket, rustls::pki_types::ServerName::try_from("stoker")?)?;
        let result = receive_blocking(&mut stream, &receiver_progress);
        receiver_progress.finish(result)
    })?;
    Ok((sender, receiver))
}

/// The sender of the blocking variants: header and payload back to back until told to stop.
fn send_blocking(stream: &mut impl Write, frame: &[u8], payload: &[u8], progress: &Progress) -> anyhow::Result<()> {
    while !progress.stop.load(Ordering::Acquire) {
        stream.write_all(frame)?;
        stream.write_all(payload)?;
    }
    Ok(())
}

/// The receiver of the blocking variants: each header, then its payload into a pooled buffer,
/// checked against the header's checksum as a trainer checks it.
fn receive_blocking(stream: &mut impl Read, progress: &Progress) -> anyhow::Result<()> {
    let pool = PayloadPool::new(IN_FLIGHT);
    while !progress.stop.load(Ordering::Acquire) {
        let mut prefix = [0u8; PREFIX_BYTES];
        stream.read_exact(&mut prefix)?;
        let mut body = vec![0u8; wire::body_len(prefix, BATCH_HEADER_LIMIT)?];
        stream.read_exact(&mut body)?;
        let header: BatchHeader = wire::decode_body(&body)?;
        let mut payload = pool.take(header.payload_len as usize);
        stream.read_exact(&mut payload)?;
        if xxhash_rust::xxh3::xxh3_64(&payload) != header.checksum {
            bail!("checksum mismatch");
        }
        progress.arrived(payload.len());
    }
    Ok(())
}

/// A bulk connection as a worker and a trainer use it: the sender keeps [`IN_FLIGHT`] batches
/// unanswered at most (a task reads the answers), the receiver checks, verifies and answers
/// each.
pub(super) fn start_bulk(
    header: &BatchHeader,
    payload: &Bytes,
    progress: &Arc<Progress>,
    tids: mpsc::Sender<TidReport>,
    place: &Arc<Place>,
) -> anyhow::Result<Sides> {
    let (worker_tls, trainer_tls) = mutual_pair()?;
    let (addr_tx, addr_rx) = mpsc::channel::<SocketAddr>();
    let (header, payload, sender_progress, sender_tids, sender_place) =
        (header.clone(), payload.clone(), Arc::clone(progress), tids.clone(), Arc::clone(place));
    let sender = spawn_side("bench-send", move || -> anyhow::Result<()> {
        sender_place.enter_sender(&sender_tids)?;
        let listener = TcpListener::bind((sender_place.sender_ip, 0)).context("cannot listen")?;
        let _ = addr_tx.send(listener.local_addr()?);
        single_thread_runtime()?.block_on(async move {
            listener.set_nonblocking(true)?;
            let listener = tokio::net::TcpListener::from_std(listener)?;
            let (socket, _) = listener.accept().await?;
            let connection = bulk::accept(socket, &worker_tls).await?;
            let (mut reader, mut writer) = (connection.reader, connection.writer);
            let room = Arc::new(Semaphore::new(IN_FLIGHT));
            let answers = {
                let room = Arc::clone(&room);
                tokio::spawn(async move {
                    let ended = loop {
                        match reader.read_frame::<BatchReply>(REPLY_FRAME_LIMIT).await {
                            Ok(BatchReply::Received) => room.add_permits(1),
                            Ok(BatchReply::Refused { reason }) => break anyhow::anyhow!("refused: {reason}"),
                            Err(error) => break error.into(),
                        }
                    };
                    // The sender may be waiting for room: it is told the answers ended.
                    room.close();
                    Err::<(), anyhow::Error>(ended)
                })
            };
            let result = async {
                while !sender_progress.stop.load(Ordering::Acquire) {
                    room.acquire().await?.forget();
                    writer.send_batch(&header, &payload).await?;
                }
                anyhow::Ok(())
            }
            .await;
            answers.abort();
            sender_progress.finish(result)
        })
    })?;
    let (receiver_progress, receiver_place) = (Arc::clone(progress), Arc::clone(place));
    let receiver = spawn_side("bench-recv", move || -> anyhow::Result<()> {
        let addr = receiver_place.enter_receiver(&tids, &addr_rx)?;
        single_thread_runtime()?.block_on(async move {
            let mut connection = bulk::connect(addr, &trainer_tls, Duration::from_secs(5)).await?;
            let pool = PayloadPool::new(IN_FLIGHT);
            let result = async {
                while !receiver_progress.stop.load(Ordering::Acquire) {
                    match connection.reader.receive_batch(&pool, |_| Ok(()), 0, Duration::from_secs(60)).await? {
                        Received::Batch(_, payload) => receiver_progress.arrived(payload.len()),
                        Received::Refused(reason) => bail!("{reason}"),
                    }
                    connection.writer.reply(&BatchReply::Received).await?;
                }
                Ok(())
            }
            .await;
            receiver_progress.finish(result)
        })
    })?;
    Ok((sender, receiver))
}
