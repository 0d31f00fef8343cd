//! How workers, trainers and the CLI call the coordinator (STYLE G5). One method, so that an
//! in-process coordinator, the QUIC client and test doubles are equally easy to write; the
//! typed calls on top are [`expect_response`] matches at the call sites.

use std::future::Future;

use crate::{ControlRequest, ControlResponse, ErrorCode, RemoteError};

/// A coordinator that answers control requests.
pub trait CoordinatorApi: Send + Sync + 'static {
    /// Send `request`, wait for its answer. Transport failures come back as
    /// [`ErrorCode::Unavailable`] errors, so callers decide on retry from the code alone.
    fn call(&self, request: ControlRequest) -> impl Future<Output = Result<ControlResponse, RemoteError>> + Send;

    /// Let go of connections (a trainer or worker stopping); calls after it may fail.
    fn close(&self) {}
}

/// Take the fields of the response variant `$variant` or fail with an internal error naming
/// what came instead (a peer of another version, or a bug).
#[macro_export]
macro_rules! expect_response {
    ($response:expr, $variant:ident { $($field:ident),* }) => {
        match $response {
            $crate::ControlResponse::$variant { $($field),* } => Ok(($($field),*)),
            other => Err($crate::api::unexpected(stringify!($variant), &other)),
        }
    };
    ($response:expr, $variant:ident) => {
        match $response {
            $crate::ControlResponse::$variant => Ok(()),
            other => Err($crate::api::unexpected(stringify!($variant), &other)),
        }
    };
}

/// The error for a response of the wrong kind.
pub fn unexpected(wanted: &str, got: &ControlResponse) -> RemoteError {
    let got_text = format!("{got:?}");
    let got_name = got_text.split([' ', '{', '(']).next().unwrap_or("?");
    RemoteError::new(ErrorCode::Internal, format!("expected a {wanted} answer, got {got_name}"))
}
