//! QUIC endpoints (quinn + rustls) and the request/response call over one bidirectional
//! stream. Knows streams and bytes, not what the requests mean.

mod coordinator_addrs;
mod coordinator_client;
mod delivery;
mod endpoint;
mod error;
mod leader_follow;
mod payload;
mod rpc;
mod tls;

pub use self::coordinator_addrs::{CoordinatorAddrs, CoordinatorAddrsError};
pub use self::coordinator_client::QuicCoordinator;
pub use self::delivery::{DeliveryError, receive_batch, send_batch};
pub use self::endpoint::{
    ETHERNET_UDP_PAYLOAD, LOOPBACK_UDP_PAYLOAD, SOCKET_BUFFER, Tuning, accept_with_tuning, client_endpoint, client_endpoint_for_all,
    connect, server_endpoint,
};
pub use self::error::NetError;
pub use self::payload::{Payload, PayloadPool};
pub use self::rpc::{call, serve_calls};
pub use self::tls::{TlsConfigs, insecure_tls};
