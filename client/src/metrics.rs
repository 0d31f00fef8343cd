//! A trainer's own metrics (DESIGN §9), for a trainer process that serves them
//! ([`crate::Loader::serve_metrics`]): what this rank received and how long it waited. The
//! coordinator exports the same rank's figures from its progress reports, so no scrape target
//! per trainer is needed; these add bytes, first-batch latency and buffer depths.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use stoker_obs::error::ObsError;
use stoker_obs::{Metrics, mirror_counter};

/// Running totals the loader keeps as it yields batches; read at scrape time.
#[derive(Debug)]
pub(crate) struct LoaderCounters {
    created: Instant,
    pub(crate) batches: AtomicU64,
    pub(crate) samples: AtomicU64,
    pub(crate) bytes: AtomicU64,
    pub(crate) wait_nanos: AtomicU64,
    /// Nanoseconds from attaching to the first batch yielded; 0 until then.
    pub(crate) first_batch_nanos: AtomicU64,
    pub(crate) buffered: AtomicU64,
    pub(crate) early: AtomicU64,
}

impl LoaderCounters {
    pub(crate) fn new() -> Self {
        Self {
            created: Instant::now(),
            batches: AtomicU64::new(0),
            samples: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            wait_nanos: AtomicU64::new(0),
            first_batch_nanos: AtomicU64::new(0),
            buffered: AtomicU64::new(0),
            early: AtomicU64::new(0),
        }
    }

    /// A batch of `samples` samples and `bytes` image bytes was yielded.
    pub(crate) fn yielded(&self, samples: usize, bytes: usize) {
        if self.batches.fetch_add(1, Ordering::AcqRel) == 0 {
            let nanos = u64::try_from(self.created.elapsed().as_nanos()).unwrap_or(u64::MAX).max(1);
            self.first_batch_nanos.store(nanos, Ordering::Release);
        }
        self.samples.fetch_add(samples as u64, Ordering::AcqRel);
        self.bytes.fetch_add(bytes as u64, Ordering::AcqRel);
    }
}

/// Register this rank's metrics, labelled with the job's name and the rank, read from
/// `counters` at each scrape.
pub(crate) fn register(metrics: &Metrics, counters: Arc<LoaderCounters>, job_name: &str, rank: u32) -> Result<(), ObsError> {
    let labels = ["stoker_job", "rank"];
    let rank = rank.to_string();
    let values = [job_name, rank.as_str()];
    let batches =
        metrics.counter_vec("stoker_loader_batches_total", "Batches this rank's loader yielded.", &labels)?.with_label_values(&values);
    let samples = metrics.counter_vec("stoker_loader_samples_total", "Samples in them.", &labels)?.with_label_values(&values);
    let bytes = metrics.counter_vec("stoker_loader_bytes_total", "Image bytes in them.", &labels)?.with_label_values(&values);
    let wait = metrics
        .float_counter_vec("stoker_loader_wait_seconds_total", "Seconds the training loop waited for data (the data stall).", &labels)?
        .with_label_values(&values);
    let first = metrics
        .float_gauge_vec("stoker_loader_first_batch_seconds", "Seconds from attaching to the first batch (0 until it came).", &labels)?
        .with_label_values(&values);
    let buffered = metrics
        .gauge_vec("stoker_loader_buffered_batches", "Batches received and not yet yielded (the flow window bounds it).", &labels)?
        .with_label_values(&values);
    let early = metrics
        .gauge_vec("stoker_loader_early_batches", "Of those, batches of a later run (the next epoch, made early).", &labels)?
        .with_label_values(&values);
    metrics.on_scrape(move || {
        batches.reset();
        batches.inc_by(counters.batches.load(Ordering::Acquire));
        samples.reset();
        samples.inc_by(counters.samples.load(Ordering::Acquire));
        bytes.reset();
        bytes.inc_by(counters.bytes.load(Ordering::Acquire));
        mirror_counter(&wait, counters.wait_nanos.load(Ordering::Acquire) as f64 / 1e9);
        first.set(counters.first_batch_nanos.load(Ordering::Acquire) as f64 / 1e9);
        buffered.set(counters.buffered.load(Ordering::Acquire) as i64);
        early.set(counters.early.load(Ordering::Acquire) as i64);
    });
    Ok(())
}
