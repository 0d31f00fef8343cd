//! A batch as the trainer receives it: the verified header and the image bytes.

use stoker_net::Payload;
use stoker_plan::ids::{Epoch, Position, Rank, Step};
use stoker_plan::transform::{OutputDtype, OutputLayout};
use stoker_proto::BatchHeader;

/// One received, verified batch.
#[derive(Debug)]
pub struct ReceivedBatch {
    pub(crate) header: BatchHeader,
    pub(crate) payload: Payload,
    /// Steps of the epoch before the run the batch belongs to (a resumed run starts inside
    /// the epoch; the wire numbers steps from the run's start).
    pub(crate) step_offset: u64,
    /// Counts the batch against the trainer's limit until it is dropped.
    pub(crate) _held: Option<crate::receive::Held>,
}

impl ReceivedBatch {
    /// The epoch.
    pub fn epoch(&self) -> Epoch {
        self.header.epoch
    }

    /// The step's number in the epoch, counted from the epoch's start also after a resume
    /// (as a DataLoader's batch index; LR schedules count on it). After a resume with another
    /// world size or batch size, the steps before it are counted in the new layout (the
    /// epoch's steps in it, less those left).
    pub fn step(&self) -> Step {
        Step(self.step_offset + self.header.step.0)
    }

    /// The rank it was made for.
    pub fn rank(&self) -> Rank {
        self.header.rank
    }

    /// Samples in the batch.
    pub fn len(&self) -> usize {
        self.header.keys.len()
    }

    /// Whether the batch is empty (never, in practice).
    pub fn is_empty(&self) -> bool {
        self.header.keys.is_empty()
    }

    /// Image tensor shape in [`ReceivedBatch::layout`] order.
    pub fn shape(&self) -> [u32; 4] {
        self.header.shape
    }

    /// Element type.
    pub fn dtype(&self) -> OutputDtype {
        self.header.dtype
    }

    /// Layout.
    pub fn layout(&self) -> OutputLayout {
        self.header.layout
    }

    /// The image tensor's bytes.
    pub fn images(&self) -> &[u8] {
        &self.payload
    }

    /// Take the image bytes (for zero-copy hand-over, e.g. to numpy). The buffer goes back to
    /// the loader's pool when the [`Payload`] is dropped. The header's step is numbered within
    /// the epoch, as [`Self::step`].
    pub fn into_parts(self) -> (BatchHeader, Payload) {
        let step = self.step();
        (BatchHeader { step, ..self.header }, self.payload)
    }

    /// Labels (-1 where a sample has none).
    pub fn labels(&self) -> &[i64] {
        &self.header.labels
    }

    /// Sample keys.
    pub fn keys(&self) -> &[String] {
        &self.header.keys
    }

    /// Indices of samples replaced by black images.
    pub fn replaced(&self) -> &[u32] {
        &self.header.replaced
    }

    /// Indices of samples that decoded only with warnings (corrupt JPEG data, kept as decoded).
    pub fn corrupt(&self) -> &[u32] {
        &self.header.corrupt
    }

    /// The first position of the run the batch belongs to (0, or a resumed checkpoint's).
    pub fn start(&self) -> Position {
        self.header.start
    }

    /// xxh3-64 of the images, as verified on arrival.
    pub fn checksum(&self) -> u64 {
        self.header.checksum
    }
}

impl crate::protocol::Delivered for ReceivedBatch {
    fn run(&self) -> crate::reorder::RunId {
        (self.header.epoch, self.header.start)
    }

    fn step(&self) -> Step {
        self.header.step
    }
}
