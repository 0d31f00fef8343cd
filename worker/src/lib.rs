#![doc = include_str!("../README.md")]

/// The shard cache of datasets in object stores: bounded, crash-safe, mapped.
pub mod cache;
pub mod metrics;
/// The worker service: coordinator link, job pipelines, batch delivery to trainers.
pub mod node;

// The decode + transform pipeline is `stoker-pipeline` (no tokio, no quinn); its modules are
// re-exported under their old paths so the service reads them as before.
pub use stoker_pipeline::{
    Batch, BatchRequest, Dataset, DecodeError, Pipeline, PipelineConfig, PipelineError, PipelineStats, SampleMaker, SampleReport, augment,
    batch, dataset, error, floor, make_seekable, make_seekable_for_pack, pipeline, sample,
};

pub use self::node::{CacheConfig, WorkerConfig, WorkerHandle, bind_socket, start};
