//! Errors of the trainer client.

use stoker_proto::RemoteError;

/// What can go wrong for a trainer.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The loader's settings are invalid.
    #[error("invalid loader configuration: {message}")]
    Config {
        /// What is wrong and what to do.
        message: String,
    },
    /// The coordinator refused a request, or could not be reached.
    #[error("coordinator: {source}")]
    Coordinator {
        /// Its error (`Unavailable` when it could not be reached).
        #[from]
        source: RemoteError,
    },
    /// No batch arrived in time.
    #[error("no batch for step {step} of epoch {epoch} within {seconds:.0} s: are workers running? (`stoker status` shows them)")]
    Timeout {
        /// The epoch.
        epoch: u64,
        /// The step waited for.
        step: u64,
        /// How long.
        seconds: f64,
    },
    /// A checkpoint does not fit this job.
    #[error("cannot resume: {message}")]
    Resume {
        /// Why.
        message: String,
    },
    /// Another trainer attached as this rank of the job; the newest one is served.
    #[error("another trainer attached as rank {rank} of job-{job}; this loader is no longer served (make one loader per rank)")]
    Superseded {
        /// The job.
        job: u64,
        /// The rank.
        rank: u32,
    },
    /// The QUIC endpoint could not be set up.
    #[error(transparent)]
    Net(#[from] stoker_net::NetError),
    /// The background runtime could not start or has stopped.
    #[error("the loader's background runtime failed: {message}")]
    Runtime {
        /// Why.
        message: String,
    },
}

impl ClientError {
    /// Whether trying again later may succeed.
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Coordinator { source } => source.is_retryable(),
            Self::Timeout { .. } => true,
            // A refused or wrong certificate stays refused; the network itself may come back.
            Self::Net(error) => !matches!(
                error,
                stoker_net::NetError::Refused { .. } | stoker_net::NetError::WrongPeer { .. } | stoker_net::NetError::Tls(_)
            ),
            Self::Config { .. } | Self::Resume { .. } | Self::Runtime { .. } | Self::Superseded { .. } => false,
        }
    }
}
