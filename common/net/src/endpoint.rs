//! Endpoints: a server endpoint on a socket the caller bound (so tests can bind `127.0.0.x:0`
//! first), a client-only endpoint, and `connect` with a timeout and clear errors.

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::sync::Arc;
use std::time::Duration;

use quinn::{
    Connection, ConnectionError, Endpoint, EndpointConfig, IdleTimeout, MtuDiscoveryConfig, TransportConfig, TransportErrorCode, VarInt,
};

use tracing::warn;

use super::{NetError, PeerIdentity, Role, TlsConfigs, peer_identity};
use stoker_plan::ids::CertKey;

/// TLS alert `no_application_protocol` (RFC 7301): the ALPNs did not match.
const NO_APPLICATION_PROTOCOL: u8 = 120;

/// The QUIC close code with which a worker closes a trainer's connection when a newer trainer
/// (a newer session) of the same rank connected: the old trainer stops at once, before the
/// new one yields anything, instead of at its next progress report.
pub const SUPERSEDED_CLOSE_CODE: u32 = 5;

/// The largest UDP payload that fits a 1500-byte Ethernet MTU over IPv4 and IPv6 (quinn's
/// default upper bound for MTU discovery).
pub const ETHERNET_UDP_PAYLOAD: u16 = 1452;

/// The socket buffer Stoker asks for. A batch arrives as a burst of datagrams faster than one
/// thread drains them; with Linux's default 208 KiB a share of them is dropped, and every drop
/// costs a retransmission and a congestion-window cut (BENCHMARKS.md, "QUIC delivery").
pub const SOCKET_BUFFER: usize = 8 << 20;

/// The largest UDP payload there is (over IPv6; IPv4 ends at 65507, which MTU discovery finds).
/// Loopback carries it: Linux's `lo` has a 64 KiB MTU.
pub const LOOPBACK_UDP_PAYLOAD: u16 = 65527;

/// The largest datagram for which UDP segmentation offload stays on (see
/// [`Tuning::transport_config`]).
const GSO_MAX_DATAGRAM: u16 = 6000;

/// How an endpoint's QUIC transport is set up. Every Stoker node uses
/// [`Tuning::default`] unless told otherwise; `stoker bench delivery` compares the variants.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tuning {
    /// Largest UDP payload to send and to accept. Connections start at 1200 bytes and MTU
    /// discovery probes up to this, so a value above the path's MTU costs only probes; raise it
    /// where every hop carries jumbo frames (9000-byte MTU: 8952) or on loopback (65527).
    pub max_udp_payload: u16,
    /// Flow-control windows sized for batches (on), or quinn's defaults (off; for comparison).
    pub batch_windows: bool,
    /// Kernel send and receive buffer asked for on the UDP socket (0: the system default).
    /// The kernel caps it at `net.core.rmem_max`/`wmem_max`.
    pub socket_buffer: usize,
    /// Requests (bidirectional streams) a peer may have open at once on one connection.
    pub max_bidi_streams: u32,
    /// Whether peers may send this endpoint batches (one unidirectional stream each, large
    /// windows: a trainer's). Off, a peer may open no unidirectional stream and the windows it
    /// may fill are small ([`REQUEST_STREAM_WINDOW`], [`REQUEST_CONNECTION_WINDOW`]): what a
    /// coordinator or a worker's batch port receives is requests only, and data a peer sends
    /// that the node does not read must not pile up.
    pub receives_batches: bool,
}

/// Bytes a peer may send ahead on one request stream of an endpoint that receives no batches.
pub const REQUEST_STREAM_WINDOW: u32 = 1 << 20;
/// Bytes a peer may send ahead on one connection to an endpoint that receives no batches.
pub const REQUEST_CONNECTION_WINDOW: u32 = 16 << 20;

impl Default for Tuning {
    fn default() -> Self {
        Self {
            max_udp_payload: ETHERNET_UDP_PAYLOAD,
            batch_windows: true,
            socket_buffer: SOCKET_BUFFER,
            max_bidi_streams: 256,
            receives_batches: true,
        }
    }
}

impl Tuning {
    /// The transport parameters of this tuning.
    ///
    /// With batch windows, one stream may carry a whole 256×224×224×3 batch (38.5 MB) without
    /// waiting for window updates, and a connection may have a few of them in flight. Memory
    /// stays bounded because the coordinator's flow window bounds the batches in flight, not
    /// these windows.
    pub fn transport_config(&self) -> Arc<TransportConfig> {
        let mut transport = TransportConfig::default();
        if self.batch_windows {
            transport.stream_receive_window(VarInt::from_u32(64 << 20));
            transport.receive_window(VarInt::from_u32(256 << 20));
            transport.send_window(256 << 20);
        }
        let mut discovery = MtuDiscoveryConfig::default();
        discovery.upper_bound(self.max_udp_payload);
        transport.mtu_discovery_config(Some(discovery));
        // quinn hands the kernel up to 10 datagrams per segmentation-offload send, and Linux
        // refuses a send over 64 KiB: with datagrams above ~6 KB every such send fails and its
        // datagrams count as lost (which also makes MTU discovery fall back to 1200 bytes).
        transport.enable_segmentation_offload(self.max_udp_payload <= GSO_MAX_DATAGRAM);
        if self.receives_batches {
            transport.max_concurrent_uni_streams(VarInt::from_u32(1024));
        } else {
            transport.max_concurrent_uni_streams(VarInt::from_u32(0));
            transport.stream_receive_window(VarInt::from_u32(REQUEST_STREAM_WINDOW));
            transport.receive_window(VarInt::from_u32(REQUEST_CONNECTION_WINDOW));
        }
        transport.max_concurrent_bidi_streams(VarInt::from_u32(self.max_bidi_streams));
        transport.keep_alive_interval(Some(Duration::from_secs(1)));
        transport.max_idle_timeout(IdleTimeout::try_from(Duration::from_secs(10)).ok());
        Arc::new(transport)
    }

    /// Ask for [`Tuning::socket_buffer`] on `socket`; say once per process if the kernel gave
    /// less than a quarter of it.
    fn size_socket_buffers(&self, socket: &UdpSocket) {
        if self.socket_buffer == 0 {
            return;
        }
        let socket = socket2::SockRef::from(socket);
        let _ = socket.set_recv_buffer_size(self.socket_buffer);
        let _ = socket.set_send_buffer_size(self.socket_buffer);
        // Linux reports twice what it grants (the doubling covers its bookkeeping).
        let granted = socket.recv_buffer_size().unwrap_or(0) / 2;
        static WARNED: std::sync::Once = std::sync::Once::new();
        if granted < self.socket_buffer / 4 {
            WARNED.call_once(|| {
                warn!(
                    asked = self.socket_buffer,
                    granted,
                    "the kernel caps UDP socket buffers below what batch delivery needs; datagrams will be dropped \
                     under load. Raise the cap: sysctl -w net.core.rmem_max={} net.core.wmem_max={}",
                    self.socket_buffer,
                    self.socket_buffer
                );
            });
        }
    }

    /// This tuning for sending to `peer`: a loopback peer gets [`LOOPBACK_UDP_PAYLOAD`], the
    /// largest datagrams (on loopback they cut the CPU per byte by two thirds on each side).
    pub fn for_peer(self, peer: SocketAddr) -> Self {
        if peer.ip().is_loopback() { Self { max_udp_payload: self.max_udp_payload.max(LOOPBACK_UDP_PAYLOAD), ..self } } else { self }
    }

    /// Endpoints accept datagrams of any size (a sender's MTU discovery finds what the path
    /// carries), so the sender's setting alone decides. The cost is address space: quinn sizes
    /// its receive buffer by it, and only the pages datagrams land in become resident.
    fn endpoint_config(&self) -> Result<EndpointConfig, NetError> {
        if self.max_udp_payload < 1200 {
            return Err(NetError::Setup { message: format!("--max-udp-payload {} is below QUIC's 1200", self.max_udp_payload) });
        }
        let mut config = EndpointConfig::default();
        config
            .max_udp_payload_size(LOOPBACK_UDP_PAYLOAD)
            .map_err(|error| NetError::Setup { message: format!("cannot accept {LOOPBACK_UDP_PAYLOAD}-byte datagrams: {error}") })?;
        Ok(config)
    }
}

/// Accept `incoming` with `tuning` [`for its peer`](Tuning::for_peer).
pub fn accept_with_tuning(incoming: quinn::Incoming, tls: &TlsConfigs, tuning: Tuning) -> Result<quinn::Connecting, ConnectionError> {
    let tuning = tuning.for_peer(incoming.remote_address());
    incoming.accept_with(Arc::new(server_config(tls, tuning)))
}

fn server_config(tls: &TlsConfigs, tuning: Tuning) -> quinn::ServerConfig {
    let mut server = quinn::ServerConfig::with_crypto(tls.server.clone());
    server.transport_config(tuning.transport_config());
    server
}

/// A QUIC endpoint that accepts connections on `socket` and can also dial out.
pub fn server_endpoint(socket: UdpSocket, tls: &TlsConfigs, tuning: Tuning) -> Result<Endpoint, NetError> {
    open_endpoint(socket, Some(server_config(tls, tuning)), tls, tuning)
}

/// A QUIC endpoint that only dials out, bound to an ephemeral port of `peer`'s address family
/// (loopback when the peer is on loopback).
pub fn client_endpoint(tls: &TlsConfigs, peer: SocketAddr, tuning: Tuning) -> Result<Endpoint, NetError> {
    client_endpoint_for_all(tls, &[peer], tuning)
}

/// A QUIC endpoint that only dials out and can reach every one of `peers` (the nodes of a
/// replicated coordinator): see [`client_bind_addr`].
pub fn client_endpoint_for_all(tls: &TlsConfigs, peers: &[SocketAddr], tuning: Tuning) -> Result<Endpoint, NetError> {
    let bind = client_bind_addr(peers);
    let socket =
        UdpSocket::bind(bind).map_err(|error| NetError::Setup { message: format!("cannot bind a UDP socket on {bind}: {error}") })?;
    open_endpoint(socket, None, tls, tuning)
}

/// Where a client endpoint binds (an ephemeral port) to reach all of `peers`: loopback when they
/// all are on loopback of one family, else the unspecified address of their family, and IPv6's
/// (dual-stack: IPv4 peers are dialled as v4-mapped addresses) when the families are mixed.
fn client_bind_addr(peers: &[SocketAddr]) -> SocketAddr {
    let all_v4 = peers.iter().all(SocketAddr::is_ipv4);
    let all_v6 = peers.iter().all(SocketAddr::is_ipv6);
    let all_loopback = peers.iter().all(|peer| peer.ip().is_loopback());
    match (all_v4, all_v6, all_loopback) {
        (true, _, true) => (Ipv4Addr::LOCALHOST, 0).into(),
        (true, _, false) => (Ipv4Addr::UNSPECIFIED, 0).into(),
        (false, true, true) => (Ipv6Addr::LOCALHOST, 0).into(),
        (false, _, _) => (Ipv6Addr::UNSPECIFIED, 0).into(),
    }
}

/// An endpoint on `socket` with `tuning`'s socket buffers and transport, dialling out with
/// `tls`, and accepting connections if given a server config.
fn open_endpoint(
    socket: UdpSocket,
    server_opt: Option<quinn::ServerConfig>,
    tls: &TlsConfigs,
    tuning: Tuning,
) -> Result<Endpoint, NetError> {
    tuning.size_socket_buffers(&socket);
    let addr = socket.local_addr().map_err(|error| NetError::Setup { message: format!("the UDP socket has no address: {error}") })?;
    let runtime = quinn::default_runtime().ok_or_else(|| NetError::Setup { message: "no async runtime is running".to_owned() })?;
    let mut endpoint = Endpoint::new(tuning.endpoint_config()?, server_opt, socket, runtime)
        .map_err(|error| NetError::Setup { message: format!("cannot open QUIC endpoint on {addr}: {error}") })?;
    endpoint.set_default_client_config(client_config(tls, tuning));
    Ok(endpoint)
}

fn client_config(tls: &TlsConfigs, tuning: Tuning) -> quinn::ClientConfig {
    let mut client = quinn::ClientConfig::new(tls.client.clone());
    client.transport_config(tuning.transport_config());
    client
}

/// Connect to `addr`, giving up after `timeout`.
pub async fn connect(endpoint: &Endpoint, addr: SocketAddr, timeout: Duration) -> Result<Connection, NetError> {
    let connecting = endpoint.connect(addr, "stoker").map_err(|source| NetError::Connect { addr, source })?;
    match tokio::time::timeout(timeout, connecting).await {
        Err(_) => Err(NetError::Timeout { addr, seconds: timeout.as_secs_f64() }),
        Ok(Ok(connection)) => Ok(connection),
        Ok(Err(source)) => Err(connection_error(addr, source)),
    }
}

/// Connect to `addr` and check that it proves `role` (see [`check_peer`]).
pub async fn connect_to(endpoint: &Endpoint, addr: SocketAddr, timeout: Duration, role: Role) -> Result<Connection, NetError> {
    let connection = connect(endpoint, addr, timeout).await?;
    check_peer(&connection, role, None)?;
    Ok(connection)
}

/// Refuse (and close) `connection` unless its peer's certificate names `role` and, where
/// `key_opt` names one, is that certificate (`None`: any certificate of the role). A peer
/// without a Stoker certificate passed the handshake only because this node runs
/// `--insecure`, which checks nothing.
pub fn check_peer(connection: &Connection, role: Role, key_opt: Option<CertKey>) -> Result<(), NetError> {
    let Some(PeerIdentity::Certified(peer)) = peer_identity(connection, true) else { return Ok(()) };
    let problem = if peer.role != role {
        format!("it presents {peer}, where the {role} role was expected")
    } else if let Some(key) = key_opt.filter(|key| *key != peer.key) {
        format!("it presents {peer}, not the certificate {key} the coordinator named for it")
    } else {
        return Ok(());
    };
    connection.close(1u32.into(), b"wrong peer");
    Err(NetError::WrongPeer { addr: connection.remote_address(), message: problem })
}

/// Classify a connection error, recognising an ALPN mismatch from either side.
pub(crate) fn connection_error(addr: SocketAddr, source: ConnectionError) -> NetError {
    let alpn_refused = TransportErrorCode::crypto(NO_APPLICATION_PROTOCOL);
    let code_opt = match &source {
        ConnectionError::ConnectionClosed(close) => Some(close.error_code),
        ConnectionError::TransportError(error) => Some(error.code),
        _ => None,
    };
    if code_opt == Some(alpn_refused) {
        return NetError::VersionMismatch { addr, protocol: stoker_proto::ALPN_TEXT };
    }
    let by_peer = matches!(source, ConnectionError::ConnectionClosed(_));
    if let Some(message) = code_opt.and_then(|code| certificate_refusal(code, by_peer)) {
        return NetError::Refused { addr, message };
    }
    NetError::Connection { addr, source }
}

/// What a TLS alert about a certificate means, from the side that received it (`by_peer`:
/// the peer refused ours) or sent it (we refused the peer's).
fn certificate_refusal(code: TransportErrorCode, by_peer: bool) -> Option<String> {
    let alert = (0..=255u8).find(|alert| TransportErrorCode::crypto(*alert) == code)?;
    let reason = match alert {
        116 => "no certificate was presented (the peer runs --insecure, or was given no --tls-dir)",
        42 | 46 => "the certificate is malformed, or not one a node may present (a CA certificate?)",
        43 => "the certificate is not for this use (issue it with `stoker certs issue`)",
        44 => "the certificate is revoked (on the deny list)",
        45 => "the certificate has expired or is not valid yet (issue a new one with `stoker certs issue`; check the clocks)",
        48 => "the certificate is not signed by a trusted cluster CA (another CA, or the other side runs --insecure)",
        49 => "the certificate names no Stoker role",
        51 => "a signature does not verify (a certificate signed by another CA of the same name, or a forged handshake)",
        _ => return None,
    };
    Some(if by_peer {
        format!("the peer refused this node's certificate: {reason}")
    } else {
        format!("this node refused the peer's certificate: {reason}")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addrs(texts: &[&str]) -> Vec<SocketAddr> {
        texts.iter().map(|text| text.parse().expect("a socket address")).collect()
    }

    #[test]
    fn a_client_binds_where_it_reaches_every_peer() {
        let cases = [
            (&["127.0.0.1:7400"][..], "127.0.0.1:0"),
            (&["127.0.0.1:7400", "127.0.0.3:7400"][..], "127.0.0.1:0"),
            (&["127.0.0.1:7400", "10.0.0.2:7400"][..], "0.0.0.0:0"),
            (&["10.0.0.2:7400"][..], "0.0.0.0:0"),
            (&["[::1]:7400"][..], "[::1]:0"),
            (&["[::1]:7400", "[2001:db8::1]:7400"][..], "[::]:0"),
            (&["127.0.0.1:7400", "[::1]:7400"][..], "[::]:0"),
            (&["10.0.0.2:7400", "[2001:db8::1]:7400"][..], "[::]:0"),
        ];
        for (peers, bind) in cases {
            assert_eq!(client_bind_addr(&addrs(peers)), bind.parse::<SocketAddr>().expect("an address"), "{peers:?}");
        }
    }
}
