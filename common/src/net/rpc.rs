//! One request and one response on one bidirectional stream, each a bounded frame.

use std::future::Future;
use std::time::Duration;

use quinn::Connection;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tracing::{debug, warn};

use super::NetError;
use super::endpoint::connection_error;
use crate::proto::{ErrorCode, RemoteError};
use crate::wire::{self, WireError};

/// Send `request` on a new stream of `connection` and wait for its answer. A
/// `Result<R, RemoteError>` frame comes back; an `Err` becomes [`NetError::Remote`].
pub async fn call<Q, R>(connection: &Connection, request: &Q, limit: usize) -> Result<R, NetError>
where
    Q: Serialize,
    R: DeserializeOwned,
{
    let addr = connection.remote_address();
    let wire_error = |source: WireError| NetError::Wire { addr, source };
    let (mut send, mut recv) = connection.open_bi().await.map_err(|source| connection_error(addr, source))?;
    wire::write_frame(&mut send, request, limit).await.map_err(|source| match source {
        // A peer that refused us closes the connection with its reason: say that, not "lost".
        WireError::Write { source: quinn::WriteError::ConnectionLost(lost) } => connection_error(addr, lost),
        other => wire_error(other),
    })?;
    // The peer reads to the frame's end; finishing only tells it no more requests follow.
    let _ = send.finish();
    let answer: Result<R, RemoteError> = wire::read_frame(&mut recv, limit).await.map_err(|source| match source {
        WireError::Read { source: quinn::ReadExactError::ReadError(quinn::ReadError::ConnectionLost(lost)) } => {
            connection_error(addr, lost)
        }
        other => wire_error(other),
    })?;
    answer.map_err(|source| NetError::Remote { addr, source })
}

/// The application close code of a connection closed for a slow request.
const SLOW_SENDER: u32 = 4;

/// How long a request may take to arrive by default, from its stream's opening to its
/// frame's last byte (control frames are small; Raft's largest are a few MB).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Serve calls on `connection` until it closes: each stream's request goes to `handler`, its
/// answer goes back on the same stream. A request that cannot be read (too large, malformed)
/// gets an `InvalidArgument` answer and the connection keeps serving. A request that takes
/// longer than `request_timeout` to arrive closes the connection: a peer that sends slowly
/// (or opens streams and sends nothing) holds no stream longer than that.
pub async fn serve_calls<Q, R, H, F>(connection: Connection, limit: usize, request_timeout: Duration, handler: H)
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
        let (handler, open) = (handler.clone(), connection.clone());
        tokio::spawn(async move {
            let Ok(read) = tokio::time::timeout(request_timeout, wire::read_frame::<Q>(&mut recv, limit)).await else {
                warn!(%addr, ?request_timeout, "a request took too long to arrive: closing the connection (a slow or stalled sender)");
                let reason = format!("a request took longer than {request_timeout:?} to arrive (--request-timeout-ms)");
                open.close(SLOW_SENDER.into(), reason.as_bytes());
                return;
            };
            let answer: Result<R, RemoteError> = match read {
                Ok(request) => handler(request).await,
                Err(error) => {
                    debug!(%addr, %error, "unreadable request");
                    let _ = recv.stop(0u32.into());
                    Err(RemoteError::new(ErrorCode::InvalidArgument, format!("unreadable request: {error}")))
                }
            };
            let frame = wire::encode(&answer, limit).or_else(|error| {
                let refusal: Result<R, RemoteError> =
                    Err(RemoteError::new(ErrorCode::Internal, format!("cannot encode the answer: {error}")));
                wire::encode(&refusal, limit)
            });
            match frame {
                Ok(frame) => {
                    if let Err(error) = send.write_all(&frame).await {
                        debug!(%addr, %error, "cannot answer");
                    }
                }
                Err(error) => debug!(%addr, %error, "cannot encode an answer"),
            }
            let _ = send.finish();
        });
    }
}
