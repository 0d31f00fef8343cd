//! The worker's metrics (DESIGN §9): what it made and sent, how long decoding, batches and
//! deliveries take, and how full each stage is. Counters live in the registry the caller
//! passes to [`crate::start`]; stage depths are read from the worker's state at scrape time.

use stoker_obs::error::ObsError;
use stoker_obs::prometheus::{Counter, Histogram, IntCounter, IntCounterVec, IntGauge, IntGaugeVec};
use stoker_obs::{Metrics, latency_buckets};
pub use stoker_pipeline::metrics::PipelineMetrics;

/// Register the pipeline's metrics in `metrics`.
pub fn register_pipeline_metrics(metrics: &Metrics) -> Result<PipelineMetrics, ObsError> {
    let bad = metrics.counter_vec(
        "stoker_worker_bad_samples_total",
        "Samples that did not decode cleanly, by reason: replaced (undecodable, sent as a black image and flagged) or \
         corrupt (decoded with warnings, kept and flagged).",
        &["reason"],
    )?;
    Ok(PipelineMetrics {
        timed: true,
        decode_seconds: metrics.histogram("stoker_worker_decode_seconds", "Decode and augment time of one sample.", latency_buckets())?,
        batch_make_seconds: metrics.histogram(
            "stoker_worker_batch_make_seconds",
            "Time to make one batch, from its buffer handed to the decode threads to its last sample done.",
            latency_buckets(),
        )?,
        replaced: bad.with_label_values(&["replaced"]),
        corrupt: bad.with_label_values(&["corrupt"]),
    })
}

/// The shard cache's and the object-store client's figures (datasets in S3, issue 30).
#[derive(Clone, Debug)]
pub struct CacheMetrics {
    /// Shards a chunk needed that the cache held.
    pub hits: IntCounter,
    /// Shards a chunk needed that had to be downloaded.
    pub misses: IntCounter,
    /// Files evicted (or dropped as stale) to make room.
    pub evictions: IntCounter,
    /// Bytes of files held and downloads reserved.
    pub bytes: IntGauge,
    /// Bytes of shards downloaded into the cache.
    pub fetched_bytes: IntCounter,
    /// Seconds chunks waited for their shards (claims, downloads, mapping) before their
    /// batches were queued.
    pub wait_seconds: Counter,
    /// Object-store requests by outcome: ok, retried (a transient failure, tried again),
    /// failed (for good).
    pub requests: IntCounterVec,
}

impl CacheMetrics {
    /// Register the cache's metrics in `metrics`.
    pub fn register(metrics: &Metrics) -> Result<Self, ObsError> {
        let cache = Self {
            hits: metrics.counter("stoker_worker_cache_hits_total", "Shards a chunk needed that the worker's shard cache held.")?,
            misses: metrics.counter("stoker_worker_cache_misses_total", "Shards a chunk needed that were downloaded into the cache.")?,
            evictions: metrics.counter("stoker_worker_cache_evictions_total", "Shard files evicted from the cache to make room.")?,
            bytes: metrics.gauge("stoker_worker_cache_bytes", "Bytes the shard cache holds (files and downloads in progress).")?,
            fetched_bytes: metrics.counter("stoker_worker_fetched_bytes_total", "Bytes of shards downloaded from the object store.")?,
            wait_seconds: metrics
                .float_counter_vec(
                    "stoker_worker_chunk_data_wait_seconds_total",
                    "Seconds chunks waited for their shards to be in the cache before their batches were queued.",
                    &[],
                )?
                .with_label_values::<&str>(&[]),
            requests: metrics.counter_vec(
                "stoker_worker_object_requests_total",
                "Object-store requests by outcome: ok, retried (failed transiently and tried again), failed (for good).",
                &["outcome"],
            )?,
        };
        // Every outcome has a series from the start (at 0), for dashboards and rate().
        for outcome in ["ok", "retried", "failed"] {
            cache.requests.with_label_values(&[outcome]);
        }
        Ok(cache)
    }
}

/// Everything a worker counts.
#[derive(Clone, Debug)]
pub struct WorkerMetrics {
    pub(crate) pipeline: PipelineMetrics,
    pub(crate) samples: IntCounter,
    pub(crate) batches: IntCounter,
    pub(crate) bytes_sent: IntCounter,
    pub(crate) delivery_seconds: Histogram,
    pub(crate) chunks_done: IntCounter,
    pub(crate) chunks_failed: IntCounter,
    pub(crate) handshakes_refused: IntCounter,
    pub(crate) queue_depth: IntGaugeVec,
    pub(crate) awaiting_trainer: IntGauge,
    pub(crate) delivering: IntGauge,
    pub(crate) threads: IntGauge,
    pub(crate) trainer_connections: IntGauge,
    pub(crate) bulk_connections: IntGauge,
    pub(crate) bulk_batches: IntCounter,
    pub(crate) registered: IntGauge,
    pub(crate) cache: CacheMetrics,
}

impl WorkerMetrics {
    /// Register the worker's metrics in `metrics`.
    pub fn register(metrics: &Metrics) -> Result<Self, ObsError> {
        Ok(Self {
            cache: CacheMetrics::register(metrics)?,
            pipeline: register_pipeline_metrics(metrics)?,
            samples: metrics.counter("stoker_worker_samples_total", "Samples made (replaced ones included).")?,
            batches: metrics.counter("stoker_worker_batches_total", "Batches delivered: sent and acknowledged by their trainer.")?,
            bytes_sent: metrics.counter("stoker_worker_bytes_sent_total", "Image bytes of the batches delivered.")?,
            delivery_seconds: metrics.histogram(
                "stoker_worker_delivery_seconds",
                "Time to deliver one batch, from its first byte sent to the trainer's acknowledgement.",
                latency_buckets(),
            )?,
            chunks_done: metrics.counter("stoker_worker_chunks_done_total", "Chunks whose every batch was delivered.")?,
            chunks_failed: metrics
                .counter("stoker_worker_chunks_failed_total", "Chunks reported failed (the coordinator grants them again).")?,
            handshakes_refused: metrics.counter(
                "stoker_handshakes_refused_total",
                "Connections refused or failed at the handshake, QUIC or bulk (over a limit, wrong protocol version, bad TLS).",
            )?,
            queue_depth: metrics.gauge_vec(
                "stoker_worker_queue_depth",
                "How full each stage is: chunks (leases held), making (batches being made), awaiting_trainer (made, their \
                 trainer not connected yet), delivering (being sent), free_slots (room for more batches).",
                &["stage"],
            )?,
            awaiting_trainer: IntGauge::new("stoker_worker_awaiting_trainer", "unregistered")?,
            delivering: IntGauge::new("stoker_worker_delivering", "unregistered")?,
            threads: metrics.gauge("stoker_worker_threads", "Decode threads per job pipeline.")?,
            trainer_connections: metrics.gauge("stoker_worker_trainer_connections", "Trainer connections open.")?,
            bulk_connections: metrics
                .gauge("stoker_worker_bulk_connections", "Trainers' bulk connections (batches over TLS on TCP) open.")?,
            bulk_batches: metrics.counter(
                "stoker_worker_bulk_batches_total",
                "Batches delivered on bulk connections (TLS over TCP); the rest of stoker_worker_batches_total went over QUIC.",
            )?,
            registered: metrics.gauge(
                "stoker_worker_registered",
                "1 while the worker is registered with the coordinator and the coordinator answered it within three heartbeats.",
            )?,
        })
    }

    /// Metrics in a registry of their own, which nobody reads (tests, tools).
    pub fn unobserved() -> Self {
        Self::register(&Metrics::new()).expect("a fresh registry takes every metric once")
    }
}

/// Adds one to a gauge for as long as it lives.
pub(crate) struct Occupied(IntGauge);

impl Occupied {
    pub(crate) fn new(gauge: &IntGauge) -> Self {
        gauge.inc();
        Self(gauge.clone())
    }
}

impl Drop for Occupied {
    fn drop(&mut self) {
        self.0.dec();
    }
}
