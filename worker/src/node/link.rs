//! The worker's side of the coordinator protocol: register, heartbeat (with each lease's
//! progress), pull chunks when there is room, report each lease done or failed; and the
//! dispatch of finished batches to their trainers. What each lease owes lives in the pure
//! [`LeaseLedger`](super::ledger::LeaseLedger); this file only moves events in and reports out.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bytes::Bytes;
use stoker_net::send_batch;
use stoker_plan::ids::{Epoch, LeaseId, ShardId, Step};
use stoker_proto::api::CoordinatorApi;
use stoker_proto::expect_response;
use stoker_proto::{BatchHeader, ChunkGrant, ControlRequest, Decoded, ErrorCode, MAX_NEXT_SHARDS, StuckJob};
use tokio::sync::mpsc;
use tracing::{debug, error, warn};

use super::Node;
use super::bulk_link::Sent;
use super::job_pipeline::{JobPipeline, Made, Meta};
use super::job_table::{batch_bytes, buffers_within};
use super::ledger::{Ending, Failure};
use crate::PipelineError;
use crate::cache::ShardCache;
use crate::metrics::Occupied;

fn failure_of(error: &PipelineError) -> Failure {
    Failure { reason: error.to_string(), fatal: matches!(error, PipelineError::BadSample { .. }) }
}

/// A finished batch's images as the bytes quinn sends: the batch (and its pooled storage)
/// lives until quinn has dropped the last of them.
struct Images(crate::Batch);

impl AsRef<[u8]> for Images {
    fn as_ref(&self) -> &[u8] {
        self.0.images()
    }
}

impl<A> Node<A>
where
    A: CoordinatorApi,
{
    /// Pull chunks whenever fewer than `in_flight` batches are outstanding.
    pub(crate) async fn pull_loop(self: Arc<Self>) {
        let idle = Duration::from_millis(20);
        while !self.stopping.load(Ordering::Acquire) {
            let Some(worker) = (match self.registration.current() {
                Some(worker) => Some(worker),
                None => self.registration.register(&self.api, self.advertised, self.config.threads).await,
            }) else {
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            };
            let outstanding = self.ledger.lock().outstanding();
            let free = self.config.in_flight.saturating_sub(outstanding);
            if free == 0 {
                let _ = tokio::time::timeout(Duration::from_millis(100), self.room.notified()).await;
                continue;
            }
            let max = (free / 2).max(1) as u32;
            let held = self.jobs.cache().map(|cache| cache.held_shards()).unwrap_or_default();
            let answer = self.api.call(ControlRequest::PullChunks { worker, max, held }).await;
            match answer.and_then(|response| expect_response!(response, Chunks { grants })) {
                Ok(grants) if grants.is_empty() => tokio::time::sleep(idle).await,
                Ok(grants) => {
                    for grant in grants {
                        self.start_chunk(grant);
                    }
                }
                Err(error) if error.code == ErrorCode::NotFound => self.registration.forgotten(worker, &error),
                Err(error) => {
                    debug!(%error, "pull failed");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
    }

    /// Renew leases with their progress (and report the jobs stuck here); drop those the
    /// coordinator took back; release the pipelines of jobs that ended or have been idle.
    pub(crate) async fn heartbeat_loop(self: Arc<Self>) {
        loop {
            let period = self.registration.heartbeat_period();
            tokio::time::sleep(period).await;
            let Some(worker) = self.registration.current() else { continue };
            let after = self.registration.stuck_after();
            let (leases, quiet) = {
                let ledger = self.ledger.lock();
                (ledger.progress(), ledger.stuck_jobs(Instant::now(), after))
            };
            let mut stuck_jobs = self.jobs.refused();
            for job in quiet {
                if !stuck_jobs.iter().any(|refused| refused.job == job) {
                    let reason =
                        format!("its pipeline here made nothing for {:.0} s (a hung dataset open or decode?)", after.as_secs_f64());
                    stuck_jobs.push(StuckJob::new(job, &reason));
                }
            }
            let images = self.metrics.samples.get();
            // Samples made (the pipeline counts each it times) over the process's CPU time: what
            // one of this worker's cores makes.
            let samples = self.metrics.pipeline.decode_seconds.get_sample_count();
            let decoded = Decoded { samples, cpu_seconds: stoker_obs::process::cpu_seconds().unwrap_or(0.0) };
            let answer = self.api.call(ControlRequest::Heartbeat { worker, leases, images, stuck_jobs, decoded }).await;
            match answer.and_then(|response| expect_response!(response, HeartbeatAck { revoked, live_jobs })) {
                Ok((revoked, live_jobs)) => {
                    self.registration.heard();
                    {
                        let mut ledger = self.ledger.lock();
                        for lease in revoked {
                            debug!(%lease, "lease revoked");
                            ledger.revoke(lease);
                        }
                    }
                    self.room.notify_one();
                    self.jobs.keep_refused(&live_jobs);
                    self.jobs.release_idle(&self.ledger.lock(), Some(&live_jobs));
                }
                Err(error) if error.code == ErrorCode::NotFound => self.registration.forgotten(worker, &error),
                Err(error) => {
                    debug!(%error, "heartbeat failed");
                    self.jobs.release_idle(&self.ledger.lock(), None);
                }
            }
        }
    }

    /// Take on a granted chunk: count its batches now, and make them on a task of their own, so
    /// that a job whose dataset or pipeline is slow to open never holds up the pull loop (and
    /// with it every other job).
    fn start_chunk(self: &Arc<Self>, grant: ChunkGrant) {
        let chunk = grant.chunk;
        debug!(lease = %grant.lease, job = %chunk.job, epoch = %chunk.epoch, rank = %chunk.rank, first_step = %chunk.first_step, steps = chunk.steps, "chunk granted");
        let stuck = {
            let mut ledger = self.ledger.lock();
            let now = Instant::now();
            let stuck = ledger.job_stuck(chunk.job, now, self.registration.stuck_after());
            if !ledger.grant(grant.lease, chunk.job, chunk.steps, now) {
                return;
            }
            stuck
        };
        let budget = self.config.max_batch_memory;
        let too_large = match batch_bytes(&grant) {
            // Two buffers at least: one being made while the other is delivered.
            Ok(bytes) if buffers_within(budget, bytes, 2) < 2 => Some(format!(
                "two batches of {} ({bytes} bytes each, {:.1} MiB) do not fit this worker's batch memory of {budget} bytes \
                 ({:.1} MiB): other workers make it; raise it (stoker worker --max-batch-memory) or lower the job's batch size",
                chunk.job,
                bytes as f64 / f64::from(1 << 20),
                budget as f64 / f64::from(1 << 20)
            )),
            _ => None,
        };
        if let Some(reason) = too_large {
            // Nothing is allocated. The chunk goes back, and the job is reported stuck here with
            // every heartbeat, so that the coordinator grants it to workers with room for it.
            self.jobs.refuse(chunk.job, &reason);
            for _ in 0..chunk.steps {
                self.batch_unmade(grant.lease, Failure::retry(reason.clone()));
            }
            return;
        }
        if stuck {
            // Refused at once, so another worker makes it (the coordinator retries it after its
            // retry delay) instead of it waiting behind the stuck batches here. (The coordinator
            // stops granting the job here once a heartbeat reports it stuck.)
            let reason = format!("this worker's pipeline for {} is stuck: nothing of the work it holds has come out of it", chunk.job);
            for _ in 0..chunk.steps {
                self.batch_unmade(grant.lease, Failure::retry(reason.clone()));
            }
            return;
        }
        // Chunks are needed in the order they are granted: the cache keeps the shards of the
        // sooner ones.
        let turn = self.jobs.cache().map_or(0, |cache| cache.next_turn());
        let node = Arc::clone(self);
        tokio::spawn(async move {
            let lease = grant.lease;
            let meta = Meta {
                lease,
                job: chunk.job,
                start: chunk.start,
                session: grant.session,
                trainer: grant.trainer,
                dataset_version: grant.dataset_version,
                plan_digest: 0,
            };
            let (queued, failure) = match node.jobs.pipeline(&grant).await {
                Ok(_) if node.ledger.lock().is_revoked(lease) => {
                    (0, Failure::retry("the lease was revoked while the job's pipeline started"))
                }
                Ok(pipeline) => match node.pin_shards(&pipeline, &grant, turn).await {
                    Ok(()) => {
                        let queued = pipeline.submit(chunk.epoch, chunk.rank, chunk.first_step, chunk.steps, meta);
                        node.batches_out(lease, chunk.steps - queued);
                        (queued, Failure::retry("the pipeline stopped"))
                    }
                    Err(failure) => (0, failure),
                },
                Err(error) => {
                    warn!(job = %chunk.job, %error, "cannot start the job's pipeline");
                    (0, Failure::retry(format!("the worker could not start the job's pipeline: {error}")))
                }
            };
            // Each batch ends in exactly one finish: the queued ones through the pipeline, the rest
            // here.
            for _ in queued..chunk.steps {
                node.batch_unmade(lease, failure.clone());
            }
        });
    }

    /// For a dataset in an object store: make the shards the chunk's batches read ready in the
    /// cache, mapped and pinned until those batches are made. A failure says whether the job
    /// can be made at all: a cache too small for it, or data that is missing, refused or not
    /// what the manifest says, fails the job with a message naming the size or the URI. `turn`
    /// orders the chunk among those granted (for eviction by the plan).
    async fn pin_shards(&self, pipeline: &JobPipeline, grant: &ChunkGrant, turn: u64) -> Result<(), Failure> {
        let dataset = pipeline.dataset();
        if !dataset.is_remote() {
            return Ok(());
        }
        let Some(cache) = self.jobs.cache() else {
            return Err(Failure::retry("this worker has no shard cache (--cache-dir) for datasets in object stores"));
        };
        let chunk = grant.chunk;
        let shards = pipeline.shards_of(chunk.epoch, chunk.start, chunk.rank, chunk.first_step, chunk.steps);
        match cache.acquire(dataset, &shards, turn).await {
            Ok(pins) => {
                self.pins.lock().insert(grant.lease, (chunk.steps, pins));
                self.fetch_ahead(cache, pipeline, grant, &shards, turn);
                Ok(())
            }
            Err(error) => {
                let fatal = error.is_too_small() || error.is_permanent();
                if error.is_too_small() {
                    let estimate = working_set_bytes(dataset, grant.spec.plan.shuffle);
                    let reason =
                        format!("{error}; with its shuffle ({}) the job reads up to {estimate} bytes at a time", grant.spec.plan.shuffle);
                    warn!(job = %chunk.job, %reason, "job refused: the shard cache is too small");
                    return Err(Failure { reason, fatal });
                }
                warn!(job = %chunk.job, %error, fatal, "the chunk's shards could not be made ready");
                Err(Failure { reason: error.to_string(), fatal })
            }
        }
    }

    /// Fetch from the plan: download in the background the shards that the rank's next chunks
    /// read (the grant names them; the coordinator counts them as this worker's and grants it
    /// those chunks first), as far as the rank's next `fetch_ahead_steps` steps after this chunk
    /// (of `turn`) go (0: nothing is fetched ahead). And tell the cache when it will read them,
    /// and, after all of them, what the next epoch reads first, so that eviction keeps what is
    /// read soonest, across the epoch's end too.
    fn fetch_ahead(&self, cache: &Arc<ShardCache>, pipeline: &JobPipeline, grant: &ChunkGrant, current: &BTreeSet<ShardId>, turn: u64) {
        let chunk = grant.chunk;
        let dataset = Arc::clone(pipeline.dataset());
        let shard_count = dataset.table().shards();
        let mut seen = current.clone();
        // From the wire: shards the dataset has, each once, a bounded number.
        let next: Vec<ShardId> =
            grant.next_shards.iter().take(MAX_NEXT_SHARDS).copied().filter(|&shard| shard.0 < shard_count && seen.insert(shard)).collect();
        let next_epoch = pipeline.first_reads(Epoch(chunk.epoch.0.saturating_add(1)), cache.capacity());
        cache.expect_ahead(&dataset, &next, &next_epoch, turn);
        let ahead = self.config.fetch_ahead_steps;
        if ahead == 0 || next.is_empty() {
            return;
        }
        let after = Step(chunk.first_step.0 + u64::from(chunk.steps));
        let own = pipeline.shards_of(chunk.epoch, chunk.start, chunk.rank, after, ahead);
        let fetch: Vec<ShardId> = next.into_iter().filter(|shard| own.contains(shard)).collect();
        if fetch.is_empty() {
            return;
        }
        let cache = Arc::clone(cache);
        tokio::spawn(async move { cache.prefetch(&dataset, &fetch).await });
    }

    /// `count` batches of `lease` came out of the pipeline (or never will): once none is left,
    /// the chunk's shards are unpinned.
    fn batches_out(&self, lease: LeaseId, count: u32) {
        let mut pins = self.pins.lock();
        if let Some((left, _)) = pins.get_mut(&lease) {
            *left = left.saturating_sub(count);
            if *left == 0 {
                pins.remove(&lease);
            }
        }
    }

    /// Push finished batches to their trainers, each on its own task.
    pub(crate) async fn dispatch_loop(self: Arc<Self>, mut made_rx: mpsc::Receiver<Made>) {
        while let Some((meta, result)) = made_rx.recv().await {
            let revoked = {
                let mut ledger = self.ledger.lock();
                ledger.made(meta.lease, Instant::now());
                ledger.is_revoked(meta.lease)
            };
            self.batches_out(meta.lease, 1);
            let batch = match result {
                Ok(batch) => batch,
                Err(error) => {
                    self.batch_finished(meta.lease, Err(failure_of(&error)));
                    continue;
                }
            };
            self.metrics.samples.inc_by(batch.len() as u64);
            if revoked {
                // Its steps are being made elsewhere: do not push a copy.
                self.batch_finished(meta.lease, Ok(()));
                continue;
            }
            let node = Arc::clone(&self);
            tokio::spawn(async move {
                let result = node.deliver(meta, batch).await;
                node.batch_finished(meta.lease, result.map_err(Failure::retry));
            });
        }
    }

    async fn deliver(&self, meta: Meta, batch: crate::Batch) -> Result<(), String> {
        let awaiting = Occupied::new(&self.metrics.awaiting_trainer);
        let trainer = self.trainers.wait_for(meta.job, batch.rank, meta.session, meta.trainer, self.config.trainer_patience).await;
        drop(awaiting);
        let Some(trainer) = trainer else {
            return Err(format!(
                "no trainer of {} {} ({} or newer, certificate {}) connected within {:?}",
                meta.job, batch.rank, meta.session, meta.trainer, self.config.trainer_patience
            ));
        };
        let header = BatchHeader {
            job: meta.job,
            epoch: batch.epoch,
            start: meta.start,
            rank: batch.rank,
            step: batch.step,
            shape: batch.shape,
            dtype: batch.dtype,
            layout: batch.layout,
            labels: batch.labels().to_vec(),
            keys: batch.keys().map(str::to_owned).collect(),
            replaced: batch.replaced().to_vec(),
            corrupt: batch.corrupt().to_vec(),
            dataset_version: meta.dataset_version,
            plan_digest: meta.plan_digest,
            payload_len: batch.images().len() as u64,
            checksum: batch.checksum,
        };
        let bytes = batch.images().len() as u64;
        let delivering = Occupied::new(&self.metrics.delivering);
        let started = Instant::now();
        let payload = Bytes::from_owner(Images(batch));
        let timeout = self.config.delivery_timeout;
        let deadline = Instant::now() + timeout;
        let sent = match &trainer.bulk {
            Some(bulk) => bulk.send(header.clone(), payload.clone(), timeout).await,
            None => Sent::Unsent,
        };
        match sent {
            Sent::Delivered => self.metrics.bulk_batches.inc(),
            Sent::Failed(error) => return Err(error.to_string()),
            // No bulk connection (yet, or any more): QUIC carries it, within what is left of the
            // batch's time.
            Sent::Unsent => {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(format!("not delivered within {timeout:?}"));
                }
                send_batch(&trainer.connection, &header, payload, left).await.map_err(|error| error.to_string())?;
            }
        }
        drop(delivering);
        self.metrics.delivery_seconds.observe(started.elapsed().as_secs_f64());
        self.metrics.batches.inc();
        self.metrics.bytes_sent.inc_by(bytes);
        Ok(())
    }

    /// One batch of `lease` is delivered or failed; when it is the lease's last, report the chunk.
    fn batch_finished(self: &Arc<Self>, lease: LeaseId, result: Result<(), Failure>) {
        let ending_opt = self.ledger.lock().finish(lease, result);
        self.report_ending(lease, ending_opt);
    }

    /// One batch of `lease` failed without entering the job's pipeline (refused, or the pipeline
    /// could not take it): as [`batch_finished`], and not the pipeline's progress.
    fn batch_unmade(self: &Arc<Self>, lease: LeaseId, failure: Failure) {
        let ending_opt = self.ledger.lock().finish_unmade(lease, failure);
        self.report_ending(lease, ending_opt);
    }

    /// A batch of `lease` finished, freeing room to pull; `ending_opt`, the lease's end, goes to
    /// the coordinator.
    fn report_ending(self: &Arc<Self>, lease: LeaseId, ending_opt: Option<Ending>) {
        self.room.notify_one();
        let (Some(ending), Some(worker)) = (ending_opt, self.registration.current()) else { return };
        if self.stopping.load(Ordering::Acquire) {
            return;
        }
        match &ending {
            Ending::Done => self.metrics.chunks_done.inc(),
            Ending::Failed(_) => self.metrics.chunks_failed.inc(),
        }
        let node = Arc::clone(self);
        tokio::spawn(async move {
            let request = match ending {
                Ending::Done => {
                    debug!(%lease, "chunk delivered");
                    ControlRequest::ChunkDone { worker, lease }
                }
                Ending::Failed(Failure { reason, fatal: true }) => {
                    error!(%lease, %reason, "chunk cannot be made; the job fails");
                    ControlRequest::ChunkFatal { worker, lease, reason }
                }
                Ending::Failed(Failure { reason, fatal: false }) => {
                    warn!(%lease, %reason, "chunk failed");
                    ControlRequest::ChunkFailed { worker, lease, reason }
                }
            };
            if let Err(error) = node.api.call(request).await {
                debug!(%lease, %error, "cannot report the chunk; its lease will expire");
            }
        });
    }
}

/// What the shards one chunk of a job may read can add up to, by its shuffle: a window of k
/// shards reads the k largest (twice that where a chunk straddles two windows), `full` and
/// `block` anything, `none` two neighbouring shards.
fn working_set_bytes(dataset: &crate::Dataset, shuffle: stoker_plan::Shuffle) -> u64 {
    let table = dataset.table();
    let mut sizes: Vec<u64> = (0..table.shards()).map(|shard| dataset.shard_bytes(ShardId(shard))).collect();
    sizes.sort_unstable_by(|a, b| b.cmp(a));
    let shards = match shuffle {
        stoker_plan::Shuffle::None => 2,
        stoker_plan::Shuffle::Window { shards } => 2 * shards.get() as usize,
        _ => sizes.len(),
    };
    sizes.iter().take(shards).sum()
}
