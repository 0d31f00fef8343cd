#![doc = include_str!("../README.md")]

/// `CoordinatorApi`: how workers and trainers call the coordinator, whatever the transport.
pub mod api;
/// Errors of the shared code.
pub mod error;
/// Identifier newtypes (`ShardId`, `Epoch`, `Step`, `Rank`, `JobId`, `WorkerId`, `LeaseId`).
pub mod ids;
/// QUIC endpoints and request/response calls (quinn + rustls; feature `net`).
#[cfg(feature = "net")]
pub mod net;
/// Metrics, their HTTP endpoint, process metrics and the tracing set-up (feature `obs`).
#[cfg(feature = "obs")]
pub mod obs;
/// The epoch planner: pure, deterministic, golden-tested.
pub mod plan;
/// Wire types: control requests and responses, batch headers, error codes.
pub mod proto;
/// A deterministic sample ImageFolder for the demo and tests (feature `sample-data`).
#[cfg(feature = "sample-data")]
pub mod sample_data;
/// WebDataset tar shards, the `.tar.idx` index, manifests and `pack`.
pub mod shard;
/// Transform specs (serde) and the crop geometry they imply.
pub mod transform;
/// Frame format: length-prefixed bincode with limits checked before allocation (feature `net`).
#[cfg(feature = "net")]
pub mod wire;
