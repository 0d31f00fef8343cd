//! The batch stream: a bounded header, then the raw image tensor.

use serde::{Deserialize, Serialize};

use stoker_plan::ids::{Epoch, JobId, Position, Rank, SessionId, Step};
use stoker_plan::transform::{OutputDtype, OutputLayout};

/// First frame of a trainer's connection to a worker: which (job, rank) it wants batches for,
/// and its session, so a worker serves the newest trainer of a rank when an older one is
/// still connected (a forked or restarted trainer).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TrainerHello {
    /// The job the trainer attached to.
    pub job: JobId,
    /// Its rank.
    pub rank: Rank,
    /// The session its `Attach` got.
    pub session: SessionId,
    /// It will make a bulk connection next (its first batches wait a moment for it).
    pub bulk: bool,
}

/// A trainer's answer to each batch on a bulk connection, in the order the batches came.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum BatchReply {
    /// Received whole, verified and queued: delivered.
    Received,
    /// Not taken (its payload was read and dropped); the step is made again.
    Refused {
        /// Why, for the worker's log.
        reason: String,
    },
}

/// Header of one batch stream. `payload_len` raw bytes follow it: the image tensor of
/// `shape` in `layout`, elements of `dtype`, little-endian.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchHeader {
    /// The job.
    pub job: JobId,
    /// The epoch.
    pub epoch: Epoch,
    /// First position of the epoch's plan (0, or a resumed checkpoint's position).
    pub start: Position,
    /// The rank the batch is for.
    pub rank: Rank,
    /// The step.
    pub step: Step,
    /// Image tensor shape in `layout` order.
    pub shape: [u32; 4],
    /// Element type.
    pub dtype: OutputDtype,
    /// Layout.
    pub layout: OutputLayout,
    /// One label per sample (-1 where the sample has none).
    pub labels: Vec<i64>,
    /// One key per sample.
    pub keys: Vec<String>,
    /// Indices of samples replaced by black images because they failed to decode.
    pub replaced: Vec<u32>,
    /// Indices of samples that decoded only with libjpeg warnings (corrupt data: parts of the
    /// image may be gray); kept as decoded.
    pub corrupt: Vec<u32>,
    /// The version of the dataset the batch was made from (its manifest's hash).
    pub dataset_version: u64,
    /// [`stoker_plan::EpochPlan::batch_digest`] of the plan the worker made the batch from.
    pub plan_digest: u64,
    /// Bytes of payload after the header.
    pub payload_len: u64,
    /// xxh3-64 of the payload.
    pub checksum: u64,
}

impl BatchHeader {
    /// The header of `payload` as one sample of opaque bytes (shape `[1, 1, len, 1]`, `u8`, key
    /// `k{step}`) for step `step` of rank 0 of job 1: for tools and tests that move bytes, not
    /// images.
    pub fn opaque(step: Step, payload: &[u8]) -> Self {
        Self {
            job: JobId(1),
            epoch: Epoch(0),
            start: Position(0),
            rank: Rank(0),
            step,
            shape: [1, 1, u32::try_from(payload.len()).unwrap_or(u32::MAX), 1],
            dtype: OutputDtype::U8,
            layout: OutputLayout::Nhwc,
            labels: vec![0],
            keys: vec![format!("k{}", step.0)],
            replaced: Vec::new(),
            corrupt: Vec::new(),
            dataset_version: 0,
            plan_digest: 0,
            payload_len: payload.len() as u64,
            checksum: xxhash_rust::xxh3::xxh3_64(payload),
        }
    }
}
