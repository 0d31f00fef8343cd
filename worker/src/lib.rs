#![doc = include_str!("../README.md")]

pub mod batch;
pub mod dataset;
mod decode;
pub mod error;
pub mod floor;
pub mod metrics;
/// The worker service: coordinator link, job pipelines, batch delivery to trainers.
pub mod node;
pub mod pipeline;
mod pixel_ops;
mod resize;
pub mod sample;

pub use self::batch::Batch;
pub use self::dataset::Dataset;
pub use self::decode::{make_seekable, make_seekable_for_pack};
pub use self::error::{DecodeError, PipelineError};
pub use self::node::{WorkerConfig, WorkerHandle, start};
pub use self::pipeline::{BatchRequest, Pipeline, PipelineConfig, PipelineStats};
pub use self::sample::{SampleMaker, SampleReport};
