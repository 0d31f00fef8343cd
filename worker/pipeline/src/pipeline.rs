//! The pipeline: batch requests in, finished batches out, in request order.
//!
//! ```text
//!  requests ──► feeder ──tasks (bounded)──► N decode threads ──done──► consumer (reorders)
//!                 ▲                              │ write each sample into its slot
//!                 └──── storage pool (bounded) ◄─┴── Batch dropped by the consumer
//! ```
//!
//! * The **feeder** takes a free [`BatchStorage`] from the pool (blocking when all are in use:
//!   that is the backpressure), fills labels and keys, and queues one task per slot.
//! * A **decode thread** makes the sample straight into its slot of the batch buffer. The
//!   thread that finishes a batch's last slot computes the checksum and hands the batch on.
//! * The **consumer** (this type's iterator) yields batches in request order.
//!
//! Channels are crossbeam's bounded queues; no lock is taken anywhere on this path. Memory is
//! `in_flight` storages plus each thread's scratch buffers.

use std::cell::UnsafeCell;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::Instant;

use crossbeam_channel::{Receiver, Sender, bounded, select};
use stoker_plan::ids::{Rank, Step};
use stoker_plan::transform::{OnError, Recipe, TransformSpec};
use stoker_plan::{EpochPlan, PlannedSample};

use crate::batch::{Batch, BatchStorage, SLOT_CORRUPT, SLOT_REPLACED};
use crate::dataset::{Dataset, IMAGE_EXTENSIONS_TEXT, image_member, label};
use crate::error::{DecodeError, PipelineError};
use crate::metrics::PipelineMetrics;
use crate::sample::SampleMaker;

/// One batch to make: rank `rank`'s step `step` of `plan`'s epoch.
#[derive(Clone, Debug)]
pub struct BatchRequest {
    /// The epoch's plan (shared by all requests of the epoch).
    pub plan: Arc<EpochPlan>,
    /// Rank.
    pub rank: Rank,
    /// Step.
    pub step: Step,
}

/// How many threads and buffers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PipelineConfig {
    /// Decode threads.
    pub threads: usize,
    /// Batch buffers; at most this many batches are being made or held by the consumer.
    pub in_flight: usize,
    /// Largest batch (B) requested; the buffers are sized for it.
    pub batch_size: usize,
}

/// Counters, updated as samples are made.
#[derive(Debug, Default)]
pub struct PipelineStats {
    /// Samples made (including replaced ones).
    pub samples: AtomicU64,
    /// Samples replaced by a black image.
    pub replaced: AtomicU64,
    /// Samples that decoded only with libjpeg warnings (corrupt data), kept as decoded.
    pub corrupt: AtomicU64,
    /// Pixels decoded (after DCT scaling and cropping).
    pub decoded_pixels: AtomicU64,
    /// Pixels the sources have in total (what a full decode would produce).
    pub source_pixels: AtomicU64,
}

struct Task {
    job: Arc<Job>,
    slot: usize,
}

/// A batch being made. Slots are written by decode threads through `images`, each slot by
/// exactly one task; `storage` is touched again only by the thread that finishes the batch.
struct Job {
    seq: u64,
    request: BatchRequest,
    len: usize,
    slot_bytes: usize,
    images: *mut u8,
    storage: UnsafeCell<Option<BatchStorage>>,
    flags: *const AtomicU8,
    remaining: AtomicUsize,
    /// When the feeder handed it to the decode threads (for `batch_make_seconds`).
    handed_at: Instant,
}

// SAFETY: `images` and `flags` point into `storage`'s buffers, which lives as long as the job; distinct
// tasks write distinct slots, and `storage` is taken only after `remaining` reaches zero (an
// AcqRel countdown, so every slot write happens-before the take).
unsafe impl Send for Job {}
// SAFETY: see `Send`.
unsafe impl Sync for Job {}

impl Job {
    fn planned(&self, slot: usize) -> Option<PlannedSample> {
        let plan = &self.request.plan;
        let position = plan.layout().position(self.request.rank, self.request.step, u32::try_from(slot).ok()?)?;
        Some(plan.sample_at(position))
    }

    /// # Safety
    /// Each `slot` must be asked for by one caller only, and not after [`Self::finish`].
    #[allow(clippy::mut_from_ref)]
    unsafe fn slot(&self, slot: usize) -> &mut [u8] {
        debug_assert!(slot < self.len);
        // SAFETY: in bounds (the buffer holds `batch_size >= len` slots); exclusive per the
        // caller's promise.
        unsafe { std::slice::from_raw_parts_mut(self.images.add(slot * self.slot_bytes), self.slot_bytes) }
    }

    fn flag(&self, slot: usize) -> &AtomicU8 {
        assert!(slot < self.len, "slot {slot} of a batch of {}", self.len);
        // SAFETY: in bounds; the flags live in `storage`, which outlives every task's use.
        unsafe { &*self.flags.add(slot) }
    }

    /// # Safety
    /// Only the caller that saw `remaining` drop to zero may call this, once.
    unsafe fn take_storage(&self) -> Option<BatchStorage> {
        // SAFETY: exclusive per the caller's promise.
        unsafe { (*self.storage.get()).take() }
    }
}

/// Shared by the feeder and the decode threads.
struct Shared {
    dataset: Arc<Dataset>,
    recipe: Recipe,
    stats: Arc<PipelineStats>,
    /// The worker's metrics, when it has any.
    metrics: Option<PipelineMetrics>,
    stop: AtomicBool,
    panicked: AtomicBool,
    pool: Sender<BatchStorage>,
}

/// Where finished batches go. Only the threads hold senders (not [`Shared`], which the consumer
/// holds too), so the channel disconnects exactly when every thread has exited.
type Done = Sender<Result<(u64, Batch), PipelineError>>;

/// A running pipeline; iterate it for batches in request order.
///
/// Dropping it stops the threads and waits for them. The feeder stops at its next request or
/// buffer, so a pipeline fed from a channel that stays open and empty must have that channel
/// closed before (or while) it is dropped, or the drop waits for it.
pub struct Pipeline {
    done: Receiver<Result<(u64, Batch), PipelineError>>,
    pending: BTreeMap<u64, Batch>,
    next_seq: u64,
    shared: Arc<Shared>,
    shutdown: Option<Sender<()>>,
    threads: Vec<JoinHandle<()>>,
    finished: bool,
}

impl std::fmt::Debug for Pipeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pipeline").field("next_seq", &self.next_seq).field("threads", &self.threads.len()).finish_non_exhaustive()
    }
}

impl Pipeline {
    /// Start making the batches `requests` asks for, over `dataset`, with `spec`.
    pub fn start<I>(dataset: Arc<Dataset>, spec: &TransformSpec, config: PipelineConfig, requests: I) -> Result<Self, PipelineError>
    where
        I: IntoIterator<Item = BatchRequest>,
        I::IntoIter: Send + 'static,
    {
        Self::start_observed(dataset, spec, config, requests, None)
    }

    /// As [`Self::start`], timing every sample and batch into `metrics`.
    pub fn start_observed<I>(
        dataset: Arc<Dataset>,
        spec: &TransformSpec,
        config: PipelineConfig,
        requests: I,
        metrics: Option<PipelineMetrics>,
    ) -> Result<Self, PipelineError>
    where
        I: IntoIterator<Item = BatchRequest>,
        I::IntoIter: Send + 'static,
    {
        let recipe = Recipe::new(spec)?;
        let threads = config.threads.max(1);
        let in_flight = config.in_flight.max(1);
        let (pool_tx, pool_rx) = bounded(in_flight);
        for _ in 0..in_flight {
            let storage = BatchStorage::new(config.batch_size.max(1), recipe.sample_bytes())
                .map_err(|error| PipelineError::Start(format!("cannot allocate batch buffers: {error}")))?;
            let _ = pool_tx.try_send(storage);
        }
        // Room for every slot of every batch buffer: the feeder then waits for a free buffer,
        // not for queue space, and decode threads do not wake it once per sample (a futex
        // wake per image was ~4% of a decode thread's time).
        let (task_tx, task_rx) = bounded::<Task>(in_flight * config.batch_size.max(1));
        let (done_tx, done_rx) = bounded(in_flight + 1);
        let (shutdown_tx, shutdown_rx) = bounded::<()>(0);
        let shared = Arc::new(Shared {
            dataset,
            recipe,
            stats: Arc::default(),
            metrics,
            stop: AtomicBool::new(false),
            panicked: AtomicBool::new(false),
            pool: pool_tx,
        });
        let mut handles = Vec::with_capacity(threads + 1);
        for index in 0..threads {
            let maker = SampleMaker::new(recipe).map_err(|e| PipelineError::Start(e.to_string()))?;
            let (shared, tasks, done) = (Arc::clone(&shared), task_rx.clone(), done_tx.clone());
            let handle = std::thread::Builder::new()
                .name(format!("stoker-decode-{index}"))
                .spawn(move || decode_loop(&shared, maker, &tasks, &done))
                .map_err(|e| PipelineError::Start(e.to_string()))?;
            handles.push(handle);
        }
        drop(task_rx);
        let feeder_shared = Arc::clone(&shared);
        let requests = requests.into_iter();
        let batch_size = config.batch_size.max(1);
        let handle = std::thread::Builder::new()
            .name("stoker-feeder".to_owned())
            .spawn(move || feed(&feeder_shared, requests, batch_size, &pool_rx, &task_tx, &shutdown_rx, &done_tx))
            .map_err(|e| PipelineError::Start(e.to_string()))?;
        handles.push(handle);
        Ok(Self {
            done: done_rx,
            pending: BTreeMap::new(),
            next_seq: 0,
            shared,
            shutdown: Some(shutdown_tx),
            threads: handles,
            finished: false,
        })
    }

    /// Counters of samples made so far.
    pub fn stats(&self) -> Arc<PipelineStats> {
        Arc::clone(&self.shared.stats)
    }

    /// The validated recipe.
    pub fn recipe(&self) -> &Recipe {
        &self.shared.recipe
    }
}

impl Iterator for Pipeline {
    type Item = Result<Batch, PipelineError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.finished {
            return None;
        }
        loop {
            if let Some(batch) = self.pending.remove(&self.next_seq) {
                self.next_seq += 1;
                return Some(Ok(batch));
            }
            match self.done.recv() {
                Ok(Ok((seq, batch))) => {
                    self.pending.insert(seq, batch);
                }
                Ok(Err(error)) => {
                    self.finished = true;
                    return Some(Err(error));
                }
                Err(_) => {
                    self.finished = true;
                    let lost = !self.pending.is_empty() || self.shared.panicked.load(Ordering::Acquire);
                    return lost.then_some(Err(PipelineError::Stopped));
                }
            }
        }
    }
}

impl Drop for Pipeline {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        // Disconnecting the shutdown channel wakes a feeder waiting for a free buffer.
        self.shutdown.take();
        // Drain so that no decode thread waits on a full `done` queue.
        while self.done.try_recv().is_ok() {}
        self.pending.clear();
        for handle in self.threads.drain(..) {
            while !handle.is_finished() {
                while self.done.try_recv().is_ok() {}
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            let _ = handle.join();
        }
    }
}

fn feed(
    shared: &Shared,
    requests: impl Iterator<Item = BatchRequest>,
    batch_size: usize,
    pool: &Receiver<BatchStorage>,
    tasks: &Sender<Task>,
    shutdown: &Receiver<()>,
    done: &Done,
) {
    for (seq, request) in (0u64..).zip(requests) {
        if shared.stop.load(Ordering::Acquire) {
            return;
        }
        let plan = &request.plan;
        let world_size = plan.spec().world_size.get();
        if plan.spec().batch_size.get() as usize > batch_size {
            let _ = done.send(Err(PipelineError::BatchTooLarge { requested: plan.spec().batch_size.get(), capacity: batch_size }));
            return;
        }
        if request.rank.0 >= world_size || request.step.0 >= plan.steps() {
            let _ =
                done.send(Err(PipelineError::NoSuchBatch { rank: request.rank.0, step: request.step.0, steps: plan.steps(), world_size }));
            return;
        }
        let mut storage = select! {
            recv(pool) -> storage => match storage { Ok(storage) => storage, Err(_) => return },
            recv(shutdown) -> _ => return,
        };
        storage.clear();
        let len = plan.layout().batch_len(request.rank, request.step) as usize;
        for planned in plan.batch(request.rank, request.step) {
            shared.dataset.with_sample(planned.sample, |sample| {
                storage.labels.push(sample.map_or(crate::dataset::NO_LABEL, label));
                storage.key_text.push_str(sample.map_or("", |s| s.key()));
            });
            storage.key_ends.push(u32::try_from(storage.key_text.len()).unwrap_or(u32::MAX));
        }
        storage.slot_flags.iter_mut().for_each(|f| *f.get_mut() = 0);
        let flags = storage.slot_flags.as_ptr();
        let images = storage.images.as_mut_ptr();
        let job = Arc::new(Job {
            seq,
            request,
            len,
            slot_bytes: shared.recipe.sample_bytes(),
            images,
            storage: UnsafeCell::new(Some(storage)),
            flags,
            remaining: AtomicUsize::new(len),
            handed_at: Instant::now(),
        });
        if len == 0 {
            finish(shared, &job, done);
            continue;
        }
        for slot in 0..len {
            if tasks.send(Task { job: Arc::clone(&job), slot }).is_err() {
                return;
            }
        }
    }
}

fn decode_loop(shared: &Shared, mut maker: SampleMaker, tasks: &Receiver<Task>, done: &Done) {
    struct PanicFlag<'a>(&'a AtomicBool);
    impl Drop for PanicFlag<'_> {
        fn drop(&mut self) {
            if std::thread::panicking() {
                self.0.store(true, Ordering::Release);
            }
        }
    }
    let _flag = PanicFlag(&shared.panicked);
    while let Ok(Task { job, slot }) = tasks.recv() {
        if shared.stop.load(Ordering::Acquire) {
            continue;
        }
        // SAFETY: the feeder queues each slot of a job exactly once.
        let out = unsafe { job.slot(slot) };
        let timed = shared.metrics.as_ref().filter(|metrics| metrics.timed);
        let started = timed.map(|_| Instant::now());
        make_one(shared, &mut maker, &job, slot, out, done);
        if let (Some(metrics), Some(started)) = (timed, started) {
            metrics.decode_seconds.observe(started.elapsed().as_secs_f64());
        }
        if job.remaining.fetch_sub(1, Ordering::AcqRel) == 1 {
            finish(shared, &job, done);
        }
    }
}

fn make_one(shared: &Shared, maker: &mut SampleMaker, job: &Job, slot: usize, out: &mut [u8], done: &Done) {
    let stats = &shared.stats;
    stats.samples.fetch_add(1, Ordering::Relaxed);
    let planned = job.planned(slot);
    let mapped = planned.and_then(|p| shared.dataset.shard(p.sample.shard));
    if let (Some(planned), None) = (planned, &mapped) {
        // A remote dataset's shard that is not in the cache: the worker maps every shard a
        // batch reads before queueing it, so this is a bug; never a black image in its place.
        if !shared.stop.swap(true, Ordering::AcqRel) {
            let shard = shared.dataset.shard_uri(planned.sample.shard).to_owned();
            let _ = done.send(Err(PipelineError::Start(format!("shard {shard} was not mapped when its batch was made"))));
        }
        return;
    }
    let sample = planned.zip(mapped.as_deref()).and_then(|(p, shard)| shard.sample(usize::try_from(p.sample.index).ok()?));
    let result = match (&planned, &sample) {
        (Some(planned), Some(sample)) => match image_member(sample) {
            Some(data) => maker.make(data, planned.augment_seed, out),
            None => Err(DecodeError::NoImage { looked_for: IMAGE_EXTENSIONS_TEXT }),
        },
        _ => Err(DecodeError::NoImage { looked_for: IMAGE_EXTENSIONS_TEXT }),
    };
    let shard = || planned.map(|p| shared.dataset.shard_path(p.sample.shard).to_path_buf()).unwrap_or_default();
    let key = || sample.as_ref().map(|s| s.key().to_owned()).unwrap_or_default();
    let error = match result {
        Ok(report) if report.warned => {
            stats.decoded_pixels.fetch_add(report.decoded_pixels, Ordering::Relaxed);
            stats.corrupt.fetch_add(1, Ordering::Relaxed);
            job.flag(slot).fetch_or(SLOT_CORRUPT, Ordering::Relaxed);
            let warning = maker.last_warning().to_owned();
            match shared.recipe.on_error {
                OnError::Replace => {
                    // Kept as decoded; under `on_error=fail` it is replaced (and counted so) below.
                    if let Some(metrics) = &shared.metrics {
                        metrics.corrupt.inc();
                    }
                    tracing::warn!(shard = %shard().display(), key = key(), %warning, "corrupt JPEG data: sample kept as decoded and flagged");
                    return;
                }
                OnError::Fail => DecodeError::Corrupt { warning },
            }
        }
        Ok(report) => {
            stats.decoded_pixels.fetch_add(report.decoded_pixels, Ordering::Relaxed);
            stats.source_pixels.fetch_add(u64::from(report.source_size.0) * u64::from(report.source_size.1), Ordering::Relaxed);
            return;
        }
        Err(error) => error,
    };
    maker.black(out);
    job.flag(slot).fetch_or(SLOT_REPLACED, Ordering::Relaxed);
    stats.replaced.fetch_add(1, Ordering::Relaxed);
    if let Some(metrics) = &shared.metrics {
        metrics.replaced.inc();
    }
    let (shard, key) = (shard(), key());
    match shared.recipe.on_error {
        OnError::Replace => {
            tracing::warn!(shard = %shard.display(), key, %error, "undecodable sample replaced by a black image");
        }
        OnError::Fail => {
            // The thread that stops the pipeline reports, waiting for room if it must: batches
            // already in `done` would otherwise make the error vanish (and, the pipeline being
            // stopped, nothing else would ever arrive). Later errors are not sent; dropping the
            // pipeline drains `done`, so this send cannot outlive it.
            if !shared.stop.swap(true, Ordering::AcqRel) {
                let _ = done.send(Err(PipelineError::BadSample { shard, key, source: error }));
            }
        }
    }
}

/// Checksum and hand on a batch whose slots are all written.
fn finish(shared: &Shared, job: &Job, done: &Done) {
    // SAFETY: called once per job, by the feeder for an empty batch or by the thread whose
    // countdown reached zero.
    let Some(mut storage) = (unsafe { job.take_storage() }) else { return };
    if let Some(metrics) = shared.metrics.as_ref().filter(|metrics| metrics.timed) {
        metrics.batch_make_seconds.observe(job.handed_at.elapsed().as_secs_f64());
    }
    let image_bytes = job.len * job.slot_bytes;
    for slot in 0..job.len {
        let flags = *storage.slot_flags[slot].get_mut();
        if flags & SLOT_REPLACED != 0 {
            storage.replaced.push(slot as u32);
        } else if flags & SLOT_CORRUPT != 0 {
            storage.corrupt.push(slot as u32);
        }
    }
    let checksum = xxhash_rust::xxh3::xxh3_64(&storage.images[..image_bytes]);
    let recipe = &shared.recipe;
    let batch = Batch {
        epoch: job.request.plan.epoch(),
        rank: job.request.rank,
        step: job.request.step,
        shape: recipe.batch_shape(job.len as u32),
        dtype: recipe.dtype(),
        layout: recipe.layout,
        checksum,
        len: job.len,
        image_bytes,
        storage: Some(storage),
        pool: shared.pool.clone(),
    };
    let _ = done.send(Ok((job.seq, batch)));
}
