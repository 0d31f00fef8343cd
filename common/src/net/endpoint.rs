//! Endpoints: a server endpoint on a socket the caller bound (so tests can bind `127.0.0.x:0`
//! first), a client-only endpoint, and `connect` with a timeout and clear errors.

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::sync::Arc;
use std::time::Duration;

use quinn::{Connection, ConnectionError, Endpoint, EndpointConfig, IdleTimeout, TransportConfig, TransportErrorCode, VarInt};

use super::{NetError, TlsConfigs};

/// TLS alert `no_application_protocol` (RFC 7301): the ALPNs did not match.
const NO_APPLICATION_PROTOCOL: u8 = 120;

/// Flow-control windows sized for batches of tens of megabytes: one stream may carry a whole
/// 256×224×224×3 batch (38.5 MB) without waiting for window updates, and a connection may have
/// a few of them in flight. Memory stays bounded because the coordinator's flow window bounds
/// the batches in flight, not these windows.
pub fn transport_config() -> Arc<TransportConfig> {
    let mut transport = TransportConfig::default();
    transport.stream_receive_window(VarInt::from_u32(64 << 20));
    transport.receive_window(VarInt::from_u32(256 << 20));
    transport.send_window(256 << 20);
    transport.max_concurrent_uni_streams(VarInt::from_u32(1024));
    transport.max_concurrent_bidi_streams(VarInt::from_u32(256));
    transport.keep_alive_interval(Some(Duration::from_secs(1)));
    transport.max_idle_timeout(IdleTimeout::try_from(Duration::from_secs(10)).ok());
    Arc::new(transport)
}

/// A QUIC endpoint that accepts connections on `socket` and can also dial out.
pub fn server_endpoint(socket: UdpSocket, tls: &TlsConfigs) -> Result<Endpoint, NetError> {
    let mut server = quinn::ServerConfig::with_crypto(tls.server.clone());
    server.transport_config(transport_config());
    let runtime = quinn::default_runtime().ok_or_else(|| NetError::Setup { message: "no async runtime is running".to_owned() })?;
    let mut endpoint = Endpoint::new(EndpointConfig::default(), Some(server), socket, runtime)
        .map_err(|error| NetError::Setup { message: format!("cannot open QUIC endpoint: {error}") })?;
    endpoint.set_default_client_config(client_config(tls));
    Ok(endpoint)
}

/// A QUIC endpoint that only dials out, bound to an ephemeral port of `peer`'s address family
/// (loopback when the peer is on loopback).
pub fn client_endpoint(tls: &TlsConfigs, peer: SocketAddr) -> Result<Endpoint, NetError> {
    let bind: SocketAddr = match peer {
        SocketAddr::V4(v4) if v4.ip().is_loopback() => (Ipv4Addr::LOCALHOST, 0).into(),
        SocketAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
        SocketAddr::V6(v6) if v6.ip().is_loopback() => (Ipv6Addr::LOCALHOST, 0).into(),
        SocketAddr::V6(_) => (Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    let mut endpoint =
        Endpoint::client(bind).map_err(|error| NetError::Setup { message: format!("cannot open QUIC endpoint on {bind}: {error}") })?;
    endpoint.set_default_client_config(client_config(tls));
    Ok(endpoint)
}

fn client_config(tls: &TlsConfigs) -> quinn::ClientConfig {
    let mut client = quinn::ClientConfig::new(tls.client.clone());
    client.transport_config(transport_config());
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

/// Classify a connection error, recognising an ALPN mismatch from either side.
pub(crate) fn connection_error(addr: SocketAddr, source: ConnectionError) -> NetError {
    let alpn_refused = TransportErrorCode::crypto(NO_APPLICATION_PROTOCOL);
    let code_opt = match &source {
        ConnectionError::ConnectionClosed(close) => Some(close.error_code),
        ConnectionError::TransportError(error) => Some(error.code),
        _ => None,
    };
    if code_opt == Some(alpn_refused) {
        return NetError::VersionMismatch { addr, protocol: "stoker/1" };
    }
    NetError::Connection { addr, source }
}
