//! Errors of the network layer.

use std::net::SocketAddr;

use crate::frame::FrameError;
use stoker_proto::RemoteError;

/// A connection or call failed.
#[derive(Debug, thiserror::Error)]
pub enum NetError {
    /// The address could not be dialled at all (bad address, no route).
    #[error("cannot connect to {addr}: {source}")]
    Connect {
        /// The peer.
        addr: SocketAddr,
        /// quinn's reason.
        source: quinn::ConnectError,
    },
    /// The connection failed or was closed.
    #[error("connection to {addr} failed: {source}")]
    Connection {
        /// The peer.
        addr: SocketAddr,
        /// quinn's reason.
        source: quinn::ConnectionError,
    },
    /// The peer does not speak this protocol version (ALPN [`stoker_proto::ALPN_TEXT`]).
    #[error("{addr} does not speak {protocol}: is it a Stoker node of the same version?")]
    VersionMismatch {
        /// The peer.
        addr: SocketAddr,
        /// Our ALPN.
        protocol: &'static str,
    },
    /// Nothing answered in time.
    #[error("no answer from {addr} within {seconds:.1} s: is a Stoker node listening there?")]
    Timeout {
        /// The peer.
        addr: SocketAddr,
        /// How long we waited.
        seconds: f64,
    },
    /// A frame could not be written, read or understood.
    #[error("bad exchange with {addr}: {source}")]
    Wire {
        /// The peer.
        addr: SocketAddr,
        /// What went wrong.
        source: FrameError,
    },
    /// The peer answered with an error.
    #[error("{addr} answered: {source}")]
    Remote {
        /// The peer.
        addr: SocketAddr,
        /// Its error.
        source: RemoteError,
    },
    /// The TLS handshake failed over a certificate: ours was refused by the peer, or the
    /// peer's by us.
    #[error("{addr}: {message}")]
    Refused {
        /// The peer.
        addr: SocketAddr,
        /// Which side refused which certificate, and why.
        message: String,
    },
    /// The peer's certificate is valid but not the one expected here (another role, or
    /// another worker than the coordinator named).
    #[error("{addr} is not who it should be: {message}")]
    WrongPeer {
        /// The peer.
        addr: SocketAddr,
        /// What was expected and found.
        message: String,
    },
    /// TLS material could not be read or made.
    #[error(transparent)]
    Tls(#[from] super::TlsError),
    /// Local setup failed (socket, TLS configuration).
    #[error("cannot set up QUIC: {message}")]
    Setup {
        /// What failed.
        message: String,
    },
}

impl NetError {
    /// The peer's own error, if the call reached it and it refused.
    pub fn remote(&self) -> Option<&RemoteError> {
        match self {
            Self::Remote { source, .. } => Some(source),
            _ => None,
        }
    }

    /// Whether calling again later may succeed.
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Remote { source, .. } => source.is_retryable(),
            Self::Connection { .. } | Self::Timeout { .. } | Self::Wire { .. } => true,
            Self::Connect { .. }
            | Self::VersionMismatch { .. }
            | Self::Setup { .. }
            | Self::Refused { .. }
            | Self::WrongPeer { .. }
            | Self::Tls(_) => false,
        }
    }
}
