#![doc = include_str!("../README.md")]

/// Errors of the shared code.
pub mod error;
/// Identifier newtypes (`ShardId`, `Epoch`, `Step`, `Rank`).
pub mod ids;
/// The epoch planner: pure, deterministic, golden-tested.
pub mod plan;
/// A deterministic sample ImageFolder for the demo and tests (feature `sample-data`).
#[cfg(feature = "sample-data")]
pub mod sample_data;
/// WebDataset tar shards, the `.tar.idx` index, manifests and `pack`.
pub mod shard;
/// Transform specs (serde) and the crop geometry they imply.
pub mod transform;
