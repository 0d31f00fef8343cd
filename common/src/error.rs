//! Errors of the shared code. One enum per area, each variant saying when it happens; the
//! messages name the file and what is wrong so a user can act on them.

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

/// The planner was given inputs it cannot plan.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    /// The sample counts of the manifest add up to more than `u64::MAX`.
    #[error("the manifest's sample counts overflow a 64-bit total")]
    TooManySamples,
    /// More shards than a shard id can name.
    #[error("{shards} shards are more than the {} a dataset may have", u32::MAX)]
    TooManyShards {
        /// Shards in the manifest.
        shards: usize,
    },
    /// A checkpoint was taken over another dataset, seed or shuffle mode.
    #[error("checkpoint was taken over another dataset, seed or shuffle (order fingerprint {checkpoint:#x}, this plan {plan:#x})")]
    CheckpointMismatch {
        /// Fingerprint in the checkpoint.
        checkpoint: u64,
        /// Fingerprint of the plan resumed.
        plan: u64,
    },
    /// A shuffle or tail mode given as text is not one of the known ones.
    #[error("{what} {given:?}: use {expected}")]
    UnknownMode {
        /// `shuffle` or `tail`.
        what: &'static str,
        /// The text given.
        given: String,
        /// The accepted forms.
        expected: &'static str,
    },
    /// A checkpoint of a format this build cannot read.
    #[error("checkpoint format version {found} is not supported (this build reads {supported})")]
    UnsupportedCheckpointVersion {
        /// Version in the checkpoint.
        found: u32,
        /// Version this build reads.
        supported: u32,
    },
}

/// A transform list that cannot be turned into a pipeline.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum TransformError {
    /// A parameter is outside its valid range.
    #[error("{transform}: {problem}")]
    BadParameter {
        /// The transform (`RandomResizedCrop`, ...).
        transform: &'static str,
        /// What is wrong and what is allowed.
        problem: String,
    },
    /// The transforms are in an order (or combination) the pipeline does not run.
    #[error("unsupported transform list {found}: {hint}")]
    UnsupportedOrder {
        /// The list as given, e.g. `[CenterCrop, RandomResizedCrop]`.
        found: String,
        /// What to write instead.
        hint: &'static str,
    },
}

/// Errors of metrics and their HTTP endpoint (`obs`).
#[cfg(feature = "obs")]
#[derive(Debug, thiserror::Error)]
pub enum ObsError {
    /// A metric could not be made or registered (a bad name, one registered twice).
    #[error("metric: {0}")]
    Metric(#[from] prometheus::Error),
    /// The metrics address could not be bound.
    #[error("cannot serve metrics on {addr}: {source}")]
    Bind {
        /// The address.
        addr: std::net::SocketAddr,
        /// Why.
        source: std::io::Error,
    },
}
