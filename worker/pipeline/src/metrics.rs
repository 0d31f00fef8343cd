//! The figures the pipeline itself updates. The worker registers them on its registry
//! (`stoker_worker::metrics`); the pipeline only counts and times into them.

use prometheus::{Histogram, IntCounter};

/// Figures the pipeline itself updates (shared by every job's pipeline on the worker).
#[derive(Clone, Debug)]
pub struct PipelineMetrics {
    /// Whether samples and batches are timed (`decode_seconds`, `batch_make_seconds`); the
    /// bad-sample counters count either way.
    pub timed: bool,
    /// Decode and augment time of one sample.
    pub decode_seconds: Histogram,
    /// One batch: from its buffer handed to the decode threads to its last sample done.
    pub batch_make_seconds: Histogram,
    /// Samples sent as a black image (undecodable).
    pub replaced: IntCounter,
    /// Samples decoded with warnings (corrupt data), kept as decoded.
    pub corrupt: IntCounter,
}
