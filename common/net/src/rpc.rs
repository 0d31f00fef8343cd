//! One request and one response on one bidirectional stream, each a bounded frame.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use quinn::Connection;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tracing::{debug, warn};

use super::NetError;
use super::endpoint::connection_error;
use stoker_proto::wire::{self, WireError};
use stoker_proto::{ErrorCode, RemoteError};

use crate::frame::{self, FrameError};

/// Send `request` on a new stream of `connection` and wait for its answer. A
/// `Result<R, RemoteError>` frame comes back; an `Err` becomes [`NetError::Remote`].
pub async fn call<Q, R>(connection: &Connection, request: &Q, limit: usize) -> Result<R, NetError>
where
    Q: Serialize,
    R: DeserializeOwned,
{
    let addr = connection.remote_address();
    let wire_error = |source: FrameError| NetError::Wire { addr, source };
    let (mut send, mut recv) = connection.open_bi().await.map_err(|source| connection_error(addr, source))?;
    frame::write_frame(&mut send, request, limit).await.map_err(|source| match source {
        // A peer that refused us closes the connection with its reason: say that, not "lost".
        FrameError::Write { source: quinn::WriteError::ConnectionLost(lost) } => connection_error(addr, lost),
        other => wire_error(other),
    })?;
    // The peer reads to the frame's end; finishing only tells it no more requests follow.
    let _ = send.finish();
    let answer: Result<R, RemoteError> = frame::read_frame(&mut recv, limit).await.map_err(|source| match source {
        FrameError::Read { source: quinn::ReadExactError::ReadError(quinn::ReadError::ConnectionLost(lost)) } => {
            connection_error(addr, lost)
        }
        other => wire_error(other),
    })?;
    answer.map_err(|source| NetError::Remote { addr, source })
}

/// The application close code of a connection closed for a slow request.
const SLOW_SENDER: u32 = 4;

/// How long a request may take to arrive by default, from its stream's opening to its
/// frame's last byte (control frames are small; Raft's largest are a few MB). An answer gets as
/// long to leave.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Bytes of requests a node holds at once by default, across all its connections, while they
/// are read and handled.
pub const REQUEST_MEMORY: usize = 256 << 20;

/// What [`serve_calls`] holds a connection's peer to.
#[derive(Clone, Debug)]
pub struct ServeLimits {
    /// The largest request frame.
    pub frame: usize,
    /// How long a request may take to arrive, and its answer to leave.
    pub request_timeout: Duration,
    /// Bytes of requests being read or handled at once, shared by every connection a node
    /// serves: a request waits for room (within its timeout) before its body is read.
    pub memory: Arc<Semaphore>,
}

impl ServeLimits {
    /// Frames up to `frame` bytes, [`REQUEST_TIMEOUT`], a fresh [`REQUEST_MEMORY`] budget.
    pub fn new(frame: usize) -> Self {
        Self { frame, request_timeout: REQUEST_TIMEOUT, memory: Arc::new(Semaphore::new(REQUEST_MEMORY)) }
    }
}

/// Serve calls on `connection` until it closes: each stream's request goes to `handler`, its
/// answer goes back on the same stream. A request that cannot be read (too large, malformed)
/// gets an `InvalidArgument` answer and the connection keeps serving. A request that takes
/// longer than the request timeout to arrive, or whose answer takes longer to leave, closes
/// the connection: a peer that sends slowly (or opens streams and sends nothing), or never
/// reads, holds no stream and no memory longer than that.
pub async fn serve_calls<Q, R, H, F>(connection: Connection, limits: ServeLimits, handler: H)
where
    Q: DeserializeOwned + Send + 'static,
    R: Serialize + Send + 'static,
    H: Fn(Q) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Result<R, RemoteError>> + Send + 'static,
{
    let addr = connection.remote_address();
    loop {
        let (mut send, mut recv) = match connection.accept_bi().await {
            Ok(streams) => streams,
            Err(error) => {
                debug!(%addr, %error, "connection closed");
                return;
            }
        };
        let (handler, open, limits) = (handler.clone(), connection.clone(), limits.clone());
        tokio::spawn(async move {
            let timeout = limits.request_timeout;
            let slow = |what: &str| {
                warn!(%addr, ?timeout, "{what} took too long: closing the connection (a slow or stalled peer)");
                let reason = format!("{what} took longer than {timeout:?} (--request-timeout-ms)");
                open.close(SLOW_SENDER.into(), reason.as_bytes());
            };
            let Ok(read) = tokio::time::timeout(timeout, read_within(&mut recv, &limits)).await else {
                return slow("a request to arrive");
            };
            let (answer, _held): (Result<R, RemoteError>, _) = match read {
                Ok((request, held)) => (handler(request).await, Some(held)),
                Err(error) => {
                    debug!(%addr, %error, "unreadable request");
                    let _ = recv.stop(0u32.into());
                    (Err(RemoteError::new(ErrorCode::InvalidArgument, format!("unreadable request: {error}"))), None)
                }
            };
            let frame = wire::encode(&answer, limits.frame).or_else(|error| {
                let refusal: Result<R, RemoteError> =
                    Err(RemoteError::new(ErrorCode::Internal, format!("cannot encode the answer: {error}")));
                wire::encode(&refusal, limits.frame)
            });
            match frame {
                Ok(frame) => match tokio::time::timeout(timeout, send.write_all(&frame)).await {
                    Ok(Ok(())) => {}
                    Ok(Err(error)) => debug!(%addr, %error, "cannot answer"),
                    Err(_) => return slow("an answer to be read"),
                },
                Err(error) => debug!(%addr, %error, "cannot encode an answer"),
            }
            let _ = send.finish();
        });
    }
}

/// Read one request frame once the memory budget has room for its body; the permit is held
/// until the request has been handled.
async fn read_within<Q>(recv: &mut quinn::RecvStream, limits: &ServeLimits) -> Result<(Q, OwnedSemaphorePermit), FrameError>
where
    Q: DeserializeOwned,
{
    let mut prefix = [0u8; wire::PREFIX_BYTES];
    recv.read_exact(&mut prefix).await?;
    let len = wire::body_len(prefix, limits.frame)?;
    let permits = u32::try_from(len.max(1)).unwrap_or(u32::MAX);
    let held = Arc::clone(&limits.memory)
        .acquire_many_owned(permits)
        .await
        .map_err(|_| WireError::Malformed { message: "the node is stopping".to_owned() })?;
    let mut body = vec![0u8; len];
    recv.read_exact(&mut body).await?;
    Ok((wire::decode_body(&body)?, held))
}

#[cfg(test)]
mod tests {
    use std::net::UdpSocket;

    use super::*;
    use crate::{TlsConfigs, Tuning, client_endpoint, connect, server_endpoint};
    use stoker_proto::ControlRequest;

    /// Found by review: up to 64 requests of 8 MiB on every connection were read into memory
    /// at once. A request now waits for room in the node's budget, and one that cannot get it
    /// within the request timeout closes its connection; small ones are served meanwhile.
    #[test]
    fn requests_wait_for_room_in_the_memory_budget() {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        runtime.block_on(async {
            let tls = TlsConfigs::insecure().expect("tls");
            let endpoint = server_endpoint(UdpSocket::bind("127.0.0.1:0").expect("socket"), &tls, Tuning::default()).expect("endpoint");
            let addr = endpoint.local_addr().expect("address");
            let limits = ServeLimits { frame: 1 << 20, request_timeout: Duration::from_millis(500), memory: Arc::new(Semaphore::new(64)) };
            tokio::spawn(async move {
                while let Some(incoming) = endpoint.accept().await {
                    let Ok(connection) = incoming.await else { continue };
                    tokio::spawn(serve_calls(connection, limits.clone(), |_request: ControlRequest| async { Ok::<_, RemoteError>(()) }));
                }
            });
            let client = client_endpoint(&tls, addr, Tuning::default()).expect("client");
            let connection = connect(&client, addr, Duration::from_secs(5)).await.expect("connect");
            call::<_, ()>(&connection, &ControlRequest::ListDatasets, 1 << 20).await.expect("a small request fits the budget");
            let large = ControlRequest::AddDataset { name: "x".repeat(1000), manifest: "m".to_owned() };
            let error = call::<_, ()>(&connection, &large, 1 << 20).await.expect_err("a request larger than the budget");
            assert!(error.to_string().contains("took longer than"), "{error}");
        });
    }
}
