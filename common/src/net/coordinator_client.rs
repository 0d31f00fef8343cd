//! [`CoordinatorApi`] over QUIC: one cached connection, re-dialled when it breaks.

use std::net::SocketAddr;
use std::time::Duration;

use quinn::{Connection, Endpoint};
use tokio::sync::Mutex;

use super::{NetError, TlsConfigs, call, client_endpoint, connect};
use crate::api::CoordinatorApi;
use crate::proto::{ControlRequest, ControlResponse, ErrorCode, RemoteError};
use crate::wire::CONTROL_FRAME_LIMIT;

/// How long to wait for the coordinator to accept a connection or answer a call.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// A coordinator at `addr`, called over QUIC.
#[derive(Debug)]
pub struct QuicCoordinator {
    addr: SocketAddr,
    endpoint: Endpoint,
    connection: Mutex<Option<Connection>>,
}

impl QuicCoordinator {
    /// A client for the coordinator at `addr`; nothing is dialled until the first call.
    pub fn new(addr: SocketAddr, tls: &TlsConfigs) -> Result<Self, NetError> {
        Ok(Self { addr, endpoint: client_endpoint(tls, addr, super::Tuning::default())?, connection: Mutex::new(None) })
    }

    /// The coordinator's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    async fn connection(&self) -> Result<Connection, NetError> {
        let mut cached = self.connection.lock().await;
        if let Some(connection) = cached.as_ref().filter(|connection| connection.close_reason().is_none()) {
            return Ok(connection.clone());
        }
        let connection = connect(&self.endpoint, self.addr, CALL_TIMEOUT).await?;
        *cached = Some(connection.clone());
        Ok(connection)
    }

    async fn call_once(&self, request: &ControlRequest) -> Result<ControlResponse, NetError> {
        let connection = self.connection().await?;
        match tokio::time::timeout(CALL_TIMEOUT, call(&connection, request, CONTROL_FRAME_LIMIT)).await {
            Ok(answer) => answer,
            Err(_) => Err(NetError::Timeout { addr: self.addr, seconds: CALL_TIMEOUT.as_secs_f64() }),
        }
    }
}

impl CoordinatorApi for QuicCoordinator {
    async fn call(&self, request: ControlRequest) -> Result<ControlResponse, RemoteError> {
        self.call_once(&request).await.map_err(|error| match error {
            NetError::Remote { source, .. } => source,
            NetError::VersionMismatch { .. } => RemoteError::new(ErrorCode::VersionMismatch, error.to_string()),
            other => RemoteError::new(ErrorCode::Unavailable, format!("coordinator {}: {other}", self.addr)),
        })
    }

    /// Close the connection and the endpoint.
    fn close(&self) {
        self.endpoint.close(0u32.into(), b"bye");
    }
}
