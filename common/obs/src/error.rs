//! Errors of metrics and their HTTP endpoint.

/// Errors of metrics and their HTTP endpoint (`obs`).
#[derive(Debug, thiserror::Error)]
pub enum ObsError {
    /// A metric could not be made or registered (a bad name, one registered twice).
    #[error("metric: {0}")]
    Metric(#[from] prometheus::Error),
    /// The scrape token file cannot be used (`--metrics-token-file`).
    #[error("cannot use the metrics token file {path}: {message}")]
    TokenFile {
        /// The file.
        path: std::path::PathBuf,
        /// Why.
        message: String,
    },
    /// The metrics address could not be bound.
    #[error("cannot serve metrics on {addr}: {source}")]
    Bind {
        /// The address.
        addr: std::net::SocketAddr,
        /// Why.
        source: std::io::Error,
    },
}
