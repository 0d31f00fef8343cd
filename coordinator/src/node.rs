//! Composition root of a coordinator (STYLE G6): the QUIC endpoint on a socket the caller
//! bound, the request service, and a timer that expires leases. Returns a handle to stop it.

use std::net::{SocketAddr, UdpSocket};
use std::sync::Arc;
use std::time::{Duration, Instant};

use stoker_common::net::{TlsConfigs, Tuning, serve_calls, server_endpoint};
use stoker_common::proto::ControlRequest;
use stoker_common::wire::CONTROL_FRAME_LIMIT;
use tokio::task::JoinHandle;
use tracing::{debug, info};

use crate::config::CoordinatorConfig;
use crate::error::CoordinatorError;
use crate::service::Coordinator;

/// A running coordinator.
#[derive(Debug)]
pub struct CoordinatorHandle {
    addr: SocketAddr,
    endpoint: quinn::Endpoint,
    core: Arc<Coordinator>,
    tasks: Vec<JoinHandle<()>>,
}

/// Start a coordinator serving on `socket` (already bound). Must run inside a tokio runtime.
pub fn start(config: CoordinatorConfig, socket: UdpSocket, tls: &TlsConfigs) -> Result<CoordinatorHandle, CoordinatorError> {
    let addr = socket.local_addr().map_err(|error| CoordinatorError::Internal { message: format!("socket has no address: {error}") })?;
    let core = Arc::new(Coordinator::open(config, addr.to_string())?);
    let endpoint = server_endpoint(socket, tls, Tuning::default())?;
    let accept = tokio::spawn(accept_loop(endpoint.clone(), Arc::clone(&core)));
    let timer_core = Arc::clone(&core);
    let timer = tokio::spawn(async move {
        let mut interval = tokio::time::interval(Duration::from_millis(200));
        loop {
            interval.tick().await;
            timer_core.tick(Instant::now());
        }
    });
    info!(%addr, "coordinator listening");
    Ok(CoordinatorHandle { addr, endpoint, core, tasks: vec![accept, timer] })
}

async fn accept_loop(endpoint: quinn::Endpoint, core: Arc<Coordinator>) {
    while let Some(incoming) = endpoint.accept().await {
        let core = Arc::clone(&core);
        tokio::spawn(async move {
            let connection = match incoming.await {
                Ok(connection) => connection,
                Err(error) => {
                    debug!(%error, "handshake failed");
                    return;
                }
            };
            serve_calls(connection, CONTROL_FRAME_LIMIT, move |request: ControlRequest| {
                let core = Arc::clone(&core);
                async move { core.handle(request, Instant::now()) }
            })
            .await;
        });
    }
}

impl CoordinatorHandle {
    /// Where it listens.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The service behind the endpoint (for in-process callers and tests).
    pub fn core(&self) -> Arc<Coordinator> {
        Arc::clone(&self.core)
    }

    /// Stop serving: close every connection and the endpoint.
    pub fn shutdown(&mut self) {
        self.endpoint.close(0u32.into(), b"coordinator shutting down");
        for task in self.tasks.drain(..) {
            task.abort();
        }
    }

    /// Wait until the endpoint is closed.
    pub async fn join(&self) {
        self.endpoint.wait_idle().await;
    }
}

impl Drop for CoordinatorHandle {
    fn drop(&mut self) {
        self.shutdown();
    }
}
