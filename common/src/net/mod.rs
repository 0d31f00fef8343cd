//! QUIC endpoints (quinn + rustls) and the request/response call over one bidirectional
//! stream. Knows streams and bytes, not what the requests mean.

mod coordinator_client;
mod endpoint;
mod error;
mod rpc;
mod tls;

pub use self::coordinator_client::QuicCoordinator;
pub use self::endpoint::{client_endpoint, connect, server_endpoint, transport_config};
pub use self::error::NetError;
pub use self::rpc::{call, serve_calls};
pub use self::tls::{TlsConfigs, insecure_tls};
