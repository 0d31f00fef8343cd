#![doc = include_str!("../README.md")]

/// A received, verified batch.
pub mod batch;
/// Loader settings: job spec, rank, timeouts.
pub mod config;
/// Attaching to a job and dialling its workers.
mod connector;
/// Where a rank stands in its epochs, pure.
mod cursor;
/// When a worker's address may be dialled again.
mod dial_backoff;
/// Errors.
pub mod error;
/// The loader: attach, epochs, iteration, checkpoints.
pub mod loader;
/// A trainer's own metrics endpoint.
mod metrics;
/// The trainer's side of the delivery protocol, pure: passes, held batches, missing steps.
pub mod protocol;
/// Receiving batches from workers.
mod receive;
/// The pure reorder/de-duplicate buffer.
pub mod reorder;
/// The trainer's attachment and its ordered calls: opens, progress reports, detach.
mod session;

pub use self::batch::ReceivedBatch;
pub use self::config::LoaderConfig;
pub use self::error::ClientError;
pub use self::loader::{Loader, LoaderState, Next};
