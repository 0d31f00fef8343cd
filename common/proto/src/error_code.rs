//! Errors that cross the wire: a small code the caller acts on, and a message for people.

use std::fmt;
use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

/// What kind of failure a remote call met; the caller's choice to retry, redirect or give up
/// depends only on this.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ErrorCode {
    /// This coordinator is not the Raft leader; ask `leader_hint` if known.
    NotLeader {
        /// The leader's client address, if this node knows it.
        leader_hint: Option<SocketAddr>,
    },
    /// The server cannot serve now (starting, shutting down, overloaded): retry later.
    Unavailable,
    /// The request took too long.
    Timeout,
    /// The request is malformed or its arguments are invalid: retrying will not help.
    InvalidArgument,
    /// A named thing (dataset, job, worker, lease) does not exist.
    NotFound,
    /// The peer speaks another protocol version.
    VersionMismatch,
    /// A bug or an unexpected failure on the server.
    Internal,
    /// Another trainer has attached as this rank since: this one is no longer served.
    Superseded,
    /// The job cannot go on: a sample fails to decode and its transforms say `on_error=fail`.
    /// The message names the shard and the key. Appended last: earlier codes keep their tags.
    JobFailed,
    /// The request belongs to an earlier pass of this trainer than one the coordinator has
    /// already seen (it arrived late, or twice): it was ignored.
    Stale,
    /// The caller's certificate does not allow the request (another role, or another
    /// trainer's session, another worker's id).
    Forbidden,
}

/// An error returned by a remote peer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoteError {
    /// What kind of failure.
    pub code: ErrorCode,
    /// What happened and what to do, for people.
    pub message: String,
}

impl RemoteError {
    /// An error with `code` and `message`.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self { code, message: message.into() }
    }

    /// Whether calling again (after a pause, or at the leader) may succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(self.code, ErrorCode::NotLeader { .. } | ErrorCode::Unavailable | ErrorCode::Timeout)
    }
}

impl fmt::Display for RemoteError {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match &self.code {
            ErrorCode::NotLeader { .. } => "not the leader",
            ErrorCode::Unavailable => "unavailable",
            ErrorCode::Timeout => "timed out",
            ErrorCode::InvalidArgument => "invalid argument",
            ErrorCode::NotFound => "not found",
            ErrorCode::VersionMismatch => "protocol version mismatch",
            ErrorCode::Internal => "internal error",
            ErrorCode::Superseded => "superseded",
            ErrorCode::JobFailed => "job failed",
            ErrorCode::Stale => "stale",
            ErrorCode::Forbidden => "forbidden",
        };
        write!(formatter, "{kind}: {}", self.message)
    }
}

impl std::error::Error for RemoteError {}
