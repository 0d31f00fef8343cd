#![doc = include_str!("../README.md")]
//!
//! Wire types (DESIGN §7): plain serde data, no logic beside the derives. Only
//! [`crate::wire`] knows how they are framed.
//!
//! Streams on a connection:
//! * control calls: one bidirectional stream per request, one [`ControlRequest`] frame up and one
//!   `Result<ControlResponse, RemoteError>` frame down;
//! * a trainer's connection to a worker opens with one bidirectional stream carrying a
//!   [`TrainerHello`] and its `Result<(), RemoteError>` answer;
//! * batches: one unidirectional stream per batch from worker to trainer, a [`BatchHeader`]
//!   frame then `payload_len` raw bytes.

/// `CoordinatorApi`: how workers and trainers call the coordinator, whatever the transport.
pub mod api;
/// The frame format: length-prefixed bincode with limits checked before allocation.
pub mod wire;

pub mod batch;
pub mod control;
pub mod error_code;

pub use self::batch::{BatchHeader, BatchReply, TrainerHello};
pub use self::control::{
    Chunk, ChunkGrant, ClusterStatus, ControlRequest, ControlResponse, CoordinatorStatus, DatasetInfo, Decoded, HeldShards, JobDemand,
    JobSpec, JobStatus, LeaseProgress, MAX_HELD_DATASETS, MAX_HELD_SHARDS, MAX_NEXT_SHARDS, NEXT_CHUNKS, RaftKind, RankStatus, StuckJob,
    WorkerInfo, WorkerList, WorkerStatus,
};
pub use self::error_code::{ErrorCode, RemoteError};

/// Version of the wire protocol. Bump it whenever a type in this module changes its encoding
/// (a field added, removed or reordered, a variant added anywhere but at the end): bincode
/// has no field names, so peers of different versions must not talk. The ALPN carries it.
///
/// * 1: the first protocol.
/// * 2: passes and `missing` steps (a trainer asks for lost steps again), lease progress in
///   heartbeats, live jobs in heartbeat answers, dataset versions in grants and batch
///   headers, plan digests and `corrupt` samples in batch headers, `ChunkGrant.session`.
/// * 3: `Heartbeat.stuck_jobs` (a worker reports jobs whose pipeline makes nothing),
///   `WorkerRegistered.lease_stall_millis`, `RegisterWorker.instance` and `attempt`,
///   `Shuffle::Block`, `RemoveJob`/`JobRemoved`, and a job's live ranks, idle time and
///   checkpoint in `JobStatus`.
/// * 4: Raft between coordinators (`Raft`, `NodeStatus`, `AddNode`, `RemoveNode`), every
///   coordinator in `ClusterStatus`.
/// * 5: a trainer's total batches and samples in `ReportProgress` (the coordinator exports
///   them as metrics).
/// * 6: mutual TLS with roles: `WorkerInfo.key` (the worker's certificate), `ChunkGrant.trainer`
///   (the certificate of the session's owner), `ErrorCode::Forbidden`.
/// * 7: bulk connections: batches over TLS 1.3 on TCP at a worker's batch port
///   ([`BULK_ALPN`]: a [`TrainerHello`], its answer, then batches each answered by a
///   [`BatchReply`]).
/// * 8: `RemoveJob.job` (a job is removed by the id the caller resolved, not by its name).
/// * 9: `Heartbeat.stuck_jobs` and `WorkerStatus.stuck_jobs` carry the reason with each job
///   ([`StuckJob`]), so that `stoker status` says why a worker makes nothing of a job.
/// * 10: `ChunkGrant.next_shards` (the shards the rank's steps after the chunk read, so the
///   worker fetches them ahead and evicts them last) and `PullChunks.held` (the shards a
///   worker's cache holds, so the scheduler prefers granting it chunks that read them).
/// * 11: `ReportProgress.workers_version`, and the worker list in `Attached` and
///   `ProgressRecorded` as a [`WorkerList`] with its version: a progress answer carries the
///   list only when it changed; `Heartbeat.decoded` (a worker's decode time),
///   `WorkerStatus.images_per_core_sec` and `JobStatus.demand` (the worker cores a job needs).
pub const PROTOCOL_VERSION: u32 = 11;

/// The TLS ALPN of this protocol version, as text (for messages).
pub const ALPN_TEXT: &str = "stoker/11";

/// The TLS ALPN of this protocol version; a peer offering another is refused in the handshake.
pub const ALPN: &[u8] = ALPN_TEXT.as_bytes();

/// The ALPN of bulk connections (TLS over TCP) that goes with the QUIC ALPN `alpn`: the
/// version is in both, so peers of two versions meet on neither.
pub fn bulk_alpn(alpn: &[u8]) -> Vec<u8> {
    [alpn, b"+bulk"].concat()
}
