#![doc = include_str!("../README.md")]
//!
//! QUIC endpoints (quinn + rustls) and the request/response call over one bidirectional
//! stream. Knows streams and bytes, not what the requests mean.

mod admission;
pub mod bulk;
mod coordinator_addrs;
mod coordinator_client;
mod delivery;
mod endpoint;
mod error;
/// Frames on QUIC streams: `stoker_proto::wire`'s codec over quinn.
pub mod frame;
mod leader_follow;
mod payload;
/// The one recipe for random ids.
pub mod random;
mod rpc;
mod tls;

pub use self::admission::{Admission, Admitted, DEFAULT_MAX_CONNECTIONS, DEFAULT_MAX_CONNECTIONS_PER_ADDRESS};
pub use self::coordinator_addrs::{CoordinatorAddrs, CoordinatorAddrsError};
pub use self::coordinator_client::QuicCoordinator;
pub use self::delivery::{DeliveryError, receive_batch, send_batch};
pub use self::endpoint::{
    ETHERNET_UDP_PAYLOAD, LOOPBACK_UDP_PAYLOAD, REQUEST_CONNECTION_WINDOW, REQUEST_STREAM_WINDOW, SOCKET_BUFFER, SUPERSEDED_CLOSE_CODE,
    Tuning, accept_with_tuning, check_peer, client_endpoint, client_endpoint_for_all, connect, connect_to, server_endpoint,
};
pub use self::error::NetError;
pub use self::payload::{Payload, PayloadPool};
pub use self::rpc::{REQUEST_MEMORY, REQUEST_TIMEOUT, ServeLimits, call, serve_calls};
pub use self::tls::{
    CA_CERT, CA_KEY, CA_VALIDITY, CERT_VALIDITY, CertSummary, ClusterCa, DENY_LIST, Issued, NODE_CERT, NODE_ID_URI, NODE_KEY, Peer,
    PeerIdentity, Role, TlsConfigs, TlsError, TlsSource, Validity, cert_key, describe, ensure_local, insecure_tls, local_ca_dir,
    mutual_tls, peer_identity, summarize_pem,
};
