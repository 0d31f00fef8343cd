//! Errors of the coordinator, and how they cross the wire.

use std::path::PathBuf;

use stoker_proto::{ErrorCode, RemoteError};

/// What can go wrong in the coordinator.
#[derive(Debug, thiserror::Error)]
pub enum CoordinatorError {
    /// The data directory could not be read or written.
    #[error("{action} {path}: {source}")]
    Storage {
        /// What we were doing.
        action: &'static str,
        /// The file or folder.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The persisted state cannot be read by this build.
    #[error("cannot load coordinator state from {path}: {message}")]
    CorruptState {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// The Raft cluster cannot be formed or joined as configured.
    #[error("{message}")]
    Cluster {
        /// What is wrong and what to do.
        message: String,
    },
    /// The configuration is invalid.
    #[error("invalid coordinator configuration: {message}")]
    Config {
        /// What is wrong.
        message: String,
    },
    /// The QUIC endpoint could not be set up.
    #[error(transparent)]
    Net(#[from] stoker_net::NetError),
    /// A bug.
    #[error("internal error: {message}")]
    Internal {
        /// What happened.
        message: String,
    },
}

impl From<&CoordinatorError> for RemoteError {
    fn from(error: &CoordinatorError) -> Self {
        let code = match error {
            CoordinatorError::Config { .. } | CoordinatorError::Cluster { .. } => ErrorCode::InvalidArgument,
            CoordinatorError::Storage { .. } | CoordinatorError::Net(_) => ErrorCode::Unavailable,
            CoordinatorError::CorruptState { .. } | CoordinatorError::Internal { .. } => ErrorCode::Internal,
        };
        Self::new(code, error.to_string())
    }
}
