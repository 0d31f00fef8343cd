//! Errors of the worker pipeline.

use std::path::PathBuf;

use stoker_format::error::ShardError;
use stoker_plan::error::TransformError;

/// One image could not be turned into pixels.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum DecodeError {
    /// The member is empty.
    #[error("the image member is empty (0 bytes)")]
    Empty,
    /// The sample has no member with an image extension.
    #[error("the sample has no image member (looked for {looked_for})")]
    NoImage {
        /// Extensions tried.
        looked_for: &'static str,
    },
    /// The header announces more pixels than the configured limit; nothing was allocated.
    #[error("image is {width}x{height} = {pixels} pixels, over the limit of {limit} (raise max_image_pixels if this is a real image)")]
    TooLarge {
        /// Width from the header.
        width: u32,
        /// Height from the header.
        height: u32,
        /// Their product.
        pixels: u64,
        /// The limit.
        limit: u64,
    },
    /// libjpeg-turbo refused the data.
    #[error("JPEG decode failed: {0}")]
    Jpeg(String),
    /// Neither JPEG nor a format the fallback decoder knows.
    #[error("not a JPEG and not a format the fallback decoder knows (first bytes {magic})")]
    UnknownFormat {
        /// Hex of the first bytes.
        magic: String,
    },
    /// The fallback decoder (PNG, ...) refused the data.
    #[error("image decode failed: {0}")]
    Other(String),
    /// Resizing failed (a bug: the geometry is validated before).
    #[error("resize failed: {0}")]
    Resize(String),
    /// libjpeg decoded the image only with a warning (corrupt data), and the job's
    /// `on_error=fail` does not accept that.
    #[error("corrupt JPEG data ({warning}); on_error=fail refuses images libjpeg had to repair")]
    Corrupt {
        /// libjpeg's warning.
        warning: String,
    },
}

/// The pipeline stopped.
#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    /// The manifest at the job's path is not the one the job was created with.
    #[error(
        "the manifest {} is not the one its job was created with (version {found:016x} here, {expected:016x} for the job): \
         it was rewritten, or this host has another file at that path; put the original back, or add the new data as a \
         dataset and start a new job",
        .path.display()
    )]
    ManifestChanged {
        /// The manifest.
        path: PathBuf,
        /// The job's version.
        expected: u64,
        /// This file's.
        found: u64,
    },
    /// A shard of the manifest cannot be opened.
    #[error(transparent)]
    Shard(#[from] ShardError),
    /// The transform spec is invalid.
    #[error("invalid transforms: {0}")]
    Transform(#[from] TransformError),
    /// A sample could not be decoded and `on_error` is `fail`.
    #[error("sample {key:?} in shard {shard}: {source} (on_error=fail stops here; use on_error=replace to substitute a black image)")]
    BadSample {
        /// Shard path.
        shard: PathBuf,
        /// Sample key.
        key: String,
        /// Why.
        source: DecodeError,
    },
    /// A requested batch is not in the plan.
    #[error("rank {rank} step {step} is outside the plan ({steps} steps, world size {world_size})")]
    NoSuchBatch {
        /// Rank asked for.
        rank: u32,
        /// Step asked for.
        step: u64,
        /// Steps in the epoch.
        steps: u64,
        /// Ranks.
        world_size: u32,
    },
    /// A plan's batch size exceeds what the pipeline's buffers were sized for.
    #[error(
        "batch size {requested} is larger than the pipeline's buffers ({capacity} samples); start the pipeline with batch_size >= {requested}"
    )]
    BatchTooLarge {
        /// B of the plan.
        requested: u32,
        /// B the buffers hold.
        capacity: usize,
    },
    /// The manifest's shards disagree with the plan's shard table.
    #[error("manifest lists {manifest} samples in shard {shard} but the shard has {actual}: re-run `stoker index` or `stoker pack`")]
    ShardCountMismatch {
        /// Shard path.
        shard: PathBuf,
        /// Count in the manifest.
        manifest: u64,
        /// Count in the shard's index.
        actual: u64,
    },
    /// A manifest on local disk names a shard in an object store: only a manifest in the
    /// object store itself is read that way (the worker's shard cache serves it).
    #[error(
        "shard {uri}: a manifest on local disk may not list s3:// shards: put the manifest in the object store beside its \
         shards (stoker pack --output s3://..., or upload it) and add the dataset by its s3:// URI"
    )]
    ObjectStoreNotSupported {
        /// The shard's URI.
        uri: String,
    },
    /// Could not start a thread or allocate the decoder.
    #[error("could not start the pipeline: {0}")]
    Start(String),
    /// The pipeline's threads are gone (a decode thread panicked).
    #[error("the pipeline stopped unexpectedly: a decode thread exited (see the log above)")]
    Stopped,
}
