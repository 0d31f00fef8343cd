//! Errors of reading token datasets: each names the file, the byte offset where it applies,
//! what is wrong, and what to do about it.

use std::path::PathBuf;

/// A token dataset cannot be read as given.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// The operating system refused a file operation.
    #[error("{action} {path}: {source}")]
    Io {
        /// What we were doing ("failed to open", ...).
        action: &'static str,
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The file ends before a part its header promises.
    #[error(
        "{path}: truncated: {what} needs {needed} bytes from byte {offset}, but the file has {file_len} bytes: the file is cut short \
         or is not a {format} file"
    )]
    Truncated {
        /// The file.
        path: PathBuf,
        /// The format it was read as.
        format: &'static str,
        /// The part being read.
        what: String,
        /// Where the part starts.
        offset: u64,
        /// Bytes the part needs (saturated at `u64::MAX` when the header's counts overflow).
        needed: u64,
        /// The file's length.
        file_len: u64,
    },
    /// The file's header or index holds a value that no valid file has.
    #[error("{path}: at byte {offset}: {reason}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// Where the value is.
        offset: u64,
        /// What is wrong and what to do.
        reason: String,
    },
    /// A token manifest cannot be read or written (the error names it).
    #[error(transparent)]
    Manifest(#[from] crate::error::ShardError),
    /// The file's format cannot be told, or the options given do not fit it.
    #[error("{path}: {reason}")]
    Usage {
        /// The file.
        path: PathBuf,
        /// What is missing or contradictory, and what to give.
        reason: String,
    },
}

impl TokenError {
    /// An I/O error with the action and path it happened on.
    pub fn io(action: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Self::Io { action, path: path.into(), source }
    }

    /// `path`, read as `format`, has `file_len` bytes, fewer than `what` needs: `span` is
    /// (where it starts, the bytes it needs).
    pub fn truncated(path: &std::path::Path, format: &'static str, what: &str, span: (usize, u64), file_len: u64) -> Self {
        Self::Truncated { path: path.to_path_buf(), format, what: what.to_owned(), offset: span.0 as u64, needed: span.1, file_len }
    }
}
