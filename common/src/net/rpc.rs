//! One request and one response on one bidirectional stream, each a bounded frame.

use std::future::Future;

use quinn::Connection;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tracing::debug;

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
    wire::write_frame(&mut send, request, limit).await.map_err(wire_error)?;
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

/// Serve calls on `connection` until it closes: each stream's request goes to `handler`, its
/// answer goes back on the same stream. A request that cannot be read (too large, malformed)
/// gets an `InvalidArgument` answer and the connection keeps serving.
pub async fn serve_calls<Q, R, H, F>(connection: Connection, limit: usize, handler: H)
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
        let handler = handler.clone();
        tokio::spawn(async move {
            let answer: Result<R, RemoteError> = match wire::read_frame::<Q>(&mut recv, limit).await {
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
