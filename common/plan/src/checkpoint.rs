//! Checkpoints (DESIGN §4.6): the epoch and how far into it every rank has consumed.

use serde::{Deserialize, Serialize};

use crate::ids::{Epoch, Position};

/// Version of the checkpoint format; bump when a field's meaning changes.
pub const CHECKPOINT_VERSION: u32 = 1;

/// Where a job stands: every position `< position` of `epoch` has been consumed.
///
/// `order_fingerprint` identifies the sample order (dataset shard counts, seed, shuffle), so a
/// checkpoint is never resumed against a different dataset or shuffle by mistake. World size,
/// batch size and tail policy are not part of it: resuming may change them (the remaining
/// positions are re-partitioned).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Checkpoint {
    /// Format version, [`CHECKPOINT_VERSION`] when written by this code.
    pub version: u32,
    /// The epoch in progress.
    pub epoch: Epoch,
    /// Positions `0..position` are consumed.
    pub position: Position,
    /// Fingerprint of the sample order the positions refer to.
    pub order_fingerprint: u64,
}
