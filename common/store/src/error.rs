//! [`StoreError`]: what went wrong reaching an object, naming the object and saying what to do.
//! No variant carries a credential: server answers are kept only where they cannot hold one,
//! and what is kept passes through the redaction of the client's secrets.

use std::path::PathBuf;

/// An object-store operation that failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// A URI that is not `s3://bucket/key`, or one a manifest may not list.
    #[error("{uri}: {reason}")]
    BadUri {
        /// The URI as given.
        uri: String,
        /// Why it is refused.
        reason: String,
    },
    /// The client could not be set up (a bad endpoint or region).
    #[error("object store: {reason}")]
    Config {
        /// What is wrong.
        reason: String,
    },
    /// Outside every `--object-root`.
    #[error("{uri}: outside every --object-root ({roots}): datasets in object stores must be under those prefixes")]
    Confined {
        /// The object refused.
        uri: String,
        /// The allowed prefixes.
        roots: String,
    },
    /// The object, or its bucket, does not exist.
    #[error("{uri}: not found (no such object, or no such bucket): check the URI and the store's endpoint")]
    NotFound {
        /// The object.
        uri: String,
    },
    /// The store refused the credentials or the access.
    #[error(
        "{uri}: access denied by the object store: check the credentials (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, \
         or the instance/pod role) and the bucket's policy"
    )]
    Denied {
        /// The object.
        uri: String,
    },
    /// The object is larger than this read allows.
    #[error("{uri}: {size} bytes, over the {limit} bytes this read allows")]
    TooLarge {
        /// The object.
        uri: String,
        /// Its size.
        size: u64,
        /// The limit.
        limit: u64,
    },
    /// The object's size is not what the manifest says.
    #[error(
        "{uri}: the object has {found} bytes, the manifest says {expected}: the dataset changed since it was packed; pack or index it again"
    )]
    SizeMismatch {
        /// The object.
        uri: String,
        /// What the manifest says.
        expected: u64,
        /// What the store has.
        found: u64,
    },
    /// The object was replaced while it was being read (its ETag changed).
    #[error("{uri}: the object changed while it was read (its ETag changed): the dataset is being rewritten")]
    Changed {
        /// The object.
        uri: String,
    },
    /// Still failing after every retry (timeouts, 5xx, cut bodies).
    #[error("{uri}: the object store did not answer after {attempts} attempts: {detail}")]
    Unavailable {
        /// The object.
        uri: String,
        /// Attempts made.
        attempts: u32,
        /// The last failure, redacted.
        detail: String,
    },
    /// A local file of a download or upload.
    #[error("{what} {path}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The local file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
}

impl StoreError {
    /// Whether trying again later may succeed (the store was unavailable), as opposed to a
    /// mistake to fix (a missing object, wrong credentials, a changed dataset).
    pub fn is_transient(&self) -> bool {
        matches!(self, Self::Unavailable { .. } | Self::Changed { .. } | Self::Io { .. })
    }

    pub(crate) fn io(what: &'static str, path: &std::path::Path, source: std::io::Error) -> Self {
        Self::Io { what, path: path.to_path_buf(), source }
    }
}
