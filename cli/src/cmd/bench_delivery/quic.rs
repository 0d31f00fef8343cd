//! QUIC variants: one connection, a unidirectional stream per batch (`send_batch`,
//! `receive_batch`), from quinn's defaults to what Stoker ships.

use std::net::{SocketAddr, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::time::Duration;

use anyhow::Context;
use bytes::Bytes;
use stoker_net::{PayloadPool, TlsConfigs, Tuning, client_endpoint, connect, receive_batch, send_batch, server_endpoint};
use stoker_proto::BatchHeader;

use super::{IN_FLIGHT, Place, Progress, SEND_TIMEOUT, Sides, TidReport, single_thread_runtime, spawn_side};

/// One QUIC variant's settings.
pub(super) struct Quic {
    pub(super) tuning: Tuning,
    pub(super) copy_send: bool,
    pub(super) pool_keep: usize,
    pub(super) sender_tls: TlsConfigs,
    pub(super) receiver_tls: TlsConfigs,
}

pub(super) fn start(
    quic: Quic,
    header: &BatchHeader,
    payload: &Bytes,
    progress: &Arc<Progress>,
    tids: mpsc::Sender<TidReport>,
    place: &Arc<Place>,
) -> anyhow::Result<Sides> {
    let Quic { tuning, copy_send, pool_keep, sender_tls, receiver_tls: tls } = quic;
    let (addr_tx, addr_rx) = mpsc::channel::<SocketAddr>();
    let (header, payload, sender_progress, sender_tids, sender_tls, sender_place) =
        (header.clone(), payload.clone(), Arc::clone(progress), tids.clone(), sender_tls, Arc::clone(place));
    let sender = spawn_side("bench-send", move || -> anyhow::Result<()> {
        sender_place.enter_sender(&sender_tids)?;
        let socket = UdpSocket::bind((sender_place.sender_ip, 0)).context("cannot bind a UDP socket")?;
        let _ = addr_tx.send(socket.local_addr()?);
        single_thread_runtime()?.block_on(async move {
            let endpoint = server_endpoint(socket, &sender_tls, tuning)?;
            let incoming = endpoint.accept().await.context("endpoint closed")?;
            let connection = incoming.await?;
            let mut pushes = tokio::task::JoinSet::new();
            let result = async {
                while !sender_progress.stop.load(Ordering::Acquire) {
                    while pushes.len() < IN_FLIGHT {
                        let (connection, header) = (connection.clone(), header.clone());
                        let payload = if copy_send { Bytes::copy_from_slice(&payload) } else { payload.clone() };
                        pushes.spawn(async move { send_batch(&connection, &header, payload, SEND_TIMEOUT).await });
                    }
                    if let Some(result) = pushes.join_next().await {
                        result??;
                    }
                }
                Ok(())
            }
            .await;
            pushes.abort_all();
            connection.close(0u32.into(), b"done");
            // Let the close reach the receiver, which otherwise waits for the idle timeout.
            let _ = tokio::time::timeout(Duration::from_secs(2), endpoint.wait_idle()).await;
            sender_progress.finish(result)
        })
    })?;
    let (receiver_progress, receiver_place) = (Arc::clone(progress), Arc::clone(place));
    let receiver = spawn_side("bench-recv", move || -> anyhow::Result<()> {
        let addr = receiver_place.enter_receiver(&tids, &addr_rx)?;
        single_thread_runtime()?.block_on(async move {
            let endpoint = client_endpoint(&tls, addr, tuning)?;
            let connection = connect(&endpoint, addr, Duration::from_secs(5)).await?;
            let pool = PayloadPool::new(pool_keep);
            while let Ok(mut recv) = connection.accept_uni().await {
                let (progress, pool) = (Arc::clone(&receiver_progress), pool.clone());
                tokio::spawn(async move {
                    match receive_batch(&mut recv, &pool, |_| Ok(())).await {
                        Ok((_, payload)) => progress.arrived(payload.len()),
                        Err(_) if progress.stop.load(Ordering::Acquire) => {}
                        Err(_) => {
                            progress.failed.fetch_add(1, Ordering::AcqRel);
                        }
                    }
                });
            }
            Ok(())
        })
    })?;
    Ok((sender, receiver))
}
