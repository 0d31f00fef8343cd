//! Where trainers come in: the QUIC endpoint's and the bulk listener's accept loops, within
//! the connection limits, and the sockets they listen on.

use std::net::{SocketAddr, UdpSocket};
use std::sync::Arc;
use std::time::Duration;

use stoker_net::bulk::{self, BatchTransport};
use stoker_net::{Admission, Role, TlsConfigs, Tuning, accept_with_tuning};
use stoker_proto::TrainerHello;
use stoker_proto::api::CoordinatorApi;
use tracing::{debug, info, warn};

use super::Node;
use super::bulk_link::BulkLink;
use crate::error::PipelineError;

/// A batch port's transport: batches go out with `tuning`'s windows; what comes in is one
/// hello per connection, so peers get small windows, a few request streams and no
/// unidirectional ones.
pub(crate) fn batch_port(tuning: Tuning) -> Tuning {
    Tuning { receives_batches: false, max_bidi_streams: 4, ..tuning }
}

/// Accept trainer connections, each with the transport its path allows: batches to a trainer
/// on this host go in the largest datagrams loopback carries.
pub(crate) async fn accept_trainers<A>(endpoint: quinn::Endpoint, tls: TlsConfigs, node: Arc<Node<A>>, admission: Arc<Admission>)
where
    A: CoordinatorApi,
{
    while let Some(incoming) = endpoint.accept().await {
        // Addresses proven first (a Retry round trip), then the limits, before the handshake.
        if !incoming.remote_address_validated() {
            let _ = incoming.retry();
            continue;
        }
        let Ok(admitted) = admission.admit(incoming.remote_address().ip()) else {
            node.metrics.handshakes_refused.inc();
            incoming.refuse();
            continue;
        };
        let connecting = match accept_with_tuning(incoming, &tls, batch_port(node.config.tuning)) {
            Ok(connecting) => connecting,
            Err(error) => {
                debug!(%error, "cannot accept a connection");
                node.metrics.handshakes_refused.inc();
                continue;
            }
        };
        let (node, tls) = (Arc::clone(&node), tls.clone());
        tokio::spawn(async move {
            match connecting.await {
                Ok(connection) => match tls.peer(&connection) {
                    Some(peer) => {
                        node.trainers.accept(connection.clone(), peer).await;
                        // The connection counts against the limits until it closes.
                        connection.closed().await;
                        node.trainers.closed(&connection);
                        drop(admitted);
                    }
                    None => {
                        warn!(remote = %connection.remote_address(), "a peer passed the handshake without a readable certificate: closing");
                        connection.close(1u32.into(), b"no certificate");
                    }
                },
                Err(error) => {
                    debug!(%error, "trainer handshake failed");
                    node.metrics.handshakes_refused.inc();
                }
            }
        });
    }
}

/// The UDP socket a worker serves trainers on, at `listen`. With `port 0` and bulk connections
/// (`BatchTransport::Tcp`), a port whose number is free on TCP too, where the worker will
/// listen for them.
pub fn bind_socket(listen: SocketAddr, transport: BatchTransport) -> std::io::Result<UdpSocket> {
    if listen.port() != 0 || transport == BatchTransport::Quic {
        return UdpSocket::bind(listen);
    }
    for _ in 0..100 {
        let socket = UdpSocket::bind(listen)?;
        let port = socket.local_addr()?.port();
        if std::net::TcpListener::bind(SocketAddr::new(listen.ip(), port)).is_ok() {
            return Ok(socket);
        }
    }
    Err(std::io::Error::new(std::io::ErrorKind::AddrInUse, format!("no port on {} is free on both UDP and TCP", listen.ip())))
}

/// The TCP listener of bulk connections, at the port of the QUIC socket.
pub(crate) fn bulk_listener(addr: SocketAddr) -> Result<tokio::net::TcpListener, PipelineError> {
    let refused = |error: std::io::Error| {
        PipelineError::Start(format!(
            "cannot listen on TCP {addr} for trainers' bulk connections: {error} (free that TCP port, or send batches over QUIC \
             only with --batch-transport quic)"
        ))
    };
    let listener = std::net::TcpListener::bind(addr).map_err(refused)?;
    listener.set_nonblocking(true).map_err(refused)?;
    tokio::net::TcpListener::from_std(listener).map_err(refused)
}

/// Bulk connections in their TLS handshake and hello at once: before its certificate is
/// checked, a TCP connection costs only this many places, not the node's connection slots.
const BULK_HANDSHAKES: usize = 256;
/// Of those, from one address (IPv6: one /64): fewer than the total, so one address flooding
/// the port with silent connections leaves the other trainers places (issue 31, item 6).
const BULK_HANDSHAKES_PER_ADDRESS: usize = 16;
/// How long a bulk connection may take to finish its handshake and hello.
const BULK_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// Accept trainers' bulk connections: within the connection limits and [`BULK_HANDSHAKES`], a
/// TLS handshake and a hello within [`BULK_HANDSHAKE_TIMEOUT`], from a trainer certificate that
/// holds a QUIC connection of the same (job, rank) and session here.
pub(crate) async fn accept_bulk<A>(listener: tokio::net::TcpListener, tls: TlsConfigs, node: Arc<Node<A>>, admission: Arc<Admission>)
where
    A: CoordinatorApi,
{
    let handshakes = Admission::named(BULK_HANDSHAKES, BULK_HANDSHAKES_PER_ADDRESS, ("bulk handshakes", "bulk handshakes per address"));
    loop {
        let (stream, remote) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(error) => {
                // Out of file descriptors, say: wait instead of spinning.
                warn!(%error, "cannot accept a bulk connection");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(handshake) = handshakes.admit(remote.ip()) else {
            node.metrics.handshakes_refused.inc();
            continue;
        };
        let Ok(admitted) = admission.admit(remote.ip()) else {
            node.metrics.handshakes_refused.inc();
            continue;
        };
        let (node, tls) = (Arc::clone(&node), tls.clone());
        tokio::spawn(async move {
            let attached = tokio::time::timeout(BULK_HANDSHAKE_TIMEOUT, attach_bulk(stream, &tls, &node)).await;
            drop(handshake);
            let link = match attached {
                Ok(Ok(link)) => link,
                Ok(Err(error)) => {
                    debug!(%remote, %error, "bulk connection refused");
                    node.metrics.handshakes_refused.inc();
                    return;
                }
                Err(_) => {
                    warn!(%remote, "no bulk handshake and hello within {BULK_HANDSHAKE_TIMEOUT:?}: closing (a slow or stalled peer)");
                    node.metrics.handshakes_refused.inc();
                    return;
                }
            };
            // Counts against the limits until it closes.
            link.closed().await;
            drop(admitted);
        });
    }
}

/// Handshake, hello, answer: the link, joined to its trainer's QUIC connection.
async fn attach_bulk<A>(stream: tokio::net::TcpStream, tls: &TlsConfigs, node: &Node<A>) -> Result<Arc<BulkLink>, String>
where
    A: CoordinatorApi,
{
    let mut connection = bulk::accept(stream, tls).await.map_err(|error| error.to_string())?;
    if !connection.peer.is(Role::Trainer) {
        connection.writer.end(bulk::alert::ACCESS_DENIED, Duration::from_secs(1)).await;
        return Err(format!("{} is not a trainer: only trainer certificates may receive batches", connection.peer));
    }
    let hello: TrainerHello = connection.reader.read_frame(bulk::HELLO_FRAME_LIMIT).await.map_err(|error| error.to_string())?;
    let (key, peer) = (connection.peer.key(), connection.peer.to_string());
    // The link starts only once the hello is answered: nothing else may precede the answer.
    let (answer, link_result) = match node.trainers.can_attach_bulk(&hello, key) {
        Ok(()) => (Ok(()), Ok(())),
        Err(error) => (Err(error.clone()), Err(error.to_string())),
    };
    connection.writer.write_frame(&answer, bulk::HELLO_FRAME_LIMIT).await.map_err(|error| error.to_string())?;
    link_result?;
    let link = BulkLink::start(connection);
    node.trainers.attach_bulk(&hello, key, &link).map_err(|error| error.to_string())?;
    info!(job = %hello.job, rank = %hello.rank, session = %hello.session, %peer, "trainer bulk connection");
    Ok(link)
}
