//! Errors of the shard format: each variant says when it happens; the messages name the file
//! and what is wrong so a user can act on them.

use std::path::PathBuf;

/// Reading or writing shards, indexes and manifests failed.
#[derive(Debug, thiserror::Error)]
pub enum ShardError {
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
    /// The tar stream ends inside a header or a member.
    #[error("truncated tar: {what} at byte {offset} needs {needed} bytes but the shard has {available}")]
    Truncated {
        /// What was being read.
        what: &'static str,
        /// Where it starts.
        offset: u64,
        /// Bytes it needs.
        needed: u64,
        /// Bytes the shard has from `offset`.
        available: u64,
    },
    /// A tar header's checksum does not match its bytes (corruption, or not a tar file).
    #[error("bad tar header checksum at byte {offset} (stored {stored}, computed {computed}): the shard is corrupt or not a tar file")]
    BadChecksum {
        /// Header offset.
        offset: u64,
        /// Checksum in the header.
        stored: u64,
        /// Checksum of the bytes.
        computed: u64,
    },
    /// A numeric or text field of a tar header cannot be parsed.
    #[error("bad tar header at byte {offset}: {reason}")]
    BadHeader {
        /// Header offset.
        offset: u64,
        /// What is wrong.
        reason: String,
    },
    /// A member's data would run past the end of the shard.
    #[error("member {name:?} at byte {offset} has size {size}, past the end of the shard ({shard_len} bytes): the shard is truncated")]
    MemberPastEnd {
        /// Member name.
        name: String,
        /// Data offset.
        offset: u64,
        /// Declared size.
        size: u64,
        /// Shard length.
        shard_len: u64,
    },
    /// A PAX or GNU long-name header is larger than any sane one.
    #[error("{kind} header at byte {offset} is {size} bytes, more than the limit of {limit}")]
    ExtendedHeaderTooLarge {
        /// "PAX" or "GNU long name".
        kind: &'static str,
        /// Header offset.
        offset: u64,
        /// Declared size.
        size: u64,
        /// The limit.
        limit: u64,
    },
    /// Two members of one sample have the same extension.
    #[error("sample {key:?} has two members with extension {extension:?} (at bytes {first} and {second})")]
    DuplicateMember {
        /// Sample key.
        key: String,
        /// Repeated extension.
        extension: String,
        /// First member's data offset.
        first: u64,
        /// Second member's data offset.
        second: u64,
    },
    /// The shard holds more samples or members than an index can address.
    #[error("shard has more than {limit} {what}: split it into smaller shards")]
    TooLarge {
        /// "samples" or "members".
        what: &'static str,
        /// The limit.
        limit: u64,
    },
    /// An index file is damaged or not an index.
    #[error("corrupt index {path}: {reason}")]
    CorruptIndex {
        /// The index file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// An index describes another version of the shard (or another shard).
    #[error("stale index {path}: {reason}")]
    StaleIndex {
        /// The index file.
        path: PathBuf,
        /// What differs.
        reason: String,
    },
    /// An index has a format version this build does not read.
    #[error("index {path} has format version {found}; this build reads version {supported}")]
    UnsupportedIndexVersion {
        /// The index file.
        path: PathBuf,
        /// Version in the file.
        found: u32,
        /// Version this build reads.
        supported: u32,
    },
    /// A tar-level error, with the shard it happened in.
    #[error("shard {path}: {source}")]
    InShard {
        /// The shard file.
        path: PathBuf,
        /// What is wrong in it.
        source: Box<Self>,
    },
    /// A manifest cannot be used.
    #[error("manifest {path}: {reason}")]
    BadManifest {
        /// The manifest file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A manifest or shard is outside every `--dataset-root`, or not a regular file.
    #[error("{path}: {reason}")]
    Confined {
        /// The path, symlinks resolved.
        path: PathBuf,
        /// Why it is refused.
        reason: String,
    },
    /// A shard URI names a scheme this build cannot read.
    #[error("shard uri {uri:?}: {reason}")]
    UnsupportedUri {
        /// The URI.
        uri: String,
        /// Why it cannot be read.
        reason: String,
    },
    /// A brace pattern is malformed or expands to too many names.
    #[error("shard pattern {pattern:?}: {reason}")]
    BadPattern {
        /// The pattern.
        pattern: String,
        /// What is wrong.
        reason: String,
    },
    /// The worker threads of a command could not be started.
    #[error("could not start the {what} threads: {message}")]
    Threads {
        /// The command (`pack`, `index`).
        what: &'static str,
        /// The thread pool's error.
        message: String,
    },
    /// The ImageFolder given to `pack` cannot be packed.
    #[error("image folder {path}: {reason}")]
    BadImageFolder {
        /// The folder.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
}

impl ShardError {
    /// An I/O error with the action and path it happened on.
    pub fn io(action: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Self::Io { action, path: path.into(), source }
    }
}
