//! The worker's side of the coordinator protocol: register, heartbeat (with each lease's
//! progress), pull chunks when there is room, report each lease done or failed; and the
//! dispatch of finished batches to their trainers. What each lease owes lives in the pure
//! [`LeaseLedger`]; this file only moves events in and reports out.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bytes::Bytes;
use stoker_net::send_batch;
use stoker_plan::ids::{LeaseId, WorkerId};
use stoker_proto::api::CoordinatorApi;
use stoker_proto::expect_response;
use stoker_proto::{BatchHeader, ChunkGrant, ControlRequest, ErrorCode, RemoteError};
use tokio::sync::mpsc;
use tracing::{debug, error, info, warn};

use super::Shared;
use super::bulk_link::Sent;
use super::jobs::{Made, Meta, job_pipeline, release_idle};
use super::ledger::{Ending, Failure, LeaseLedger};
use crate::PipelineError;
use crate::metrics::Occupied;

fn current_worker<A>(shared: &Shared<A>) -> Option<WorkerId> {
    let id = shared.worker.load(Ordering::Acquire);
    (id != 0).then_some(WorkerId(id))
}

/// The ledger, locked (briefly: no call inside waits).
pub(crate) fn ledger<A>(shared: &Shared<A>) -> std::sync::MutexGuard<'_, LeaseLedger> {
    shared.ledger.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn failure_of(error: &PipelineError) -> Failure {
    Failure { reason: error.to_string(), fatal: matches!(error, PipelineError::BadSample { .. }) }
}

async fn register<A>(shared: &Shared<A>) -> Option<WorkerId>
where
    A: CoordinatorApi,
{
    let attempt = shared.register_attempts.fetch_add(1, Ordering::AcqRel) + 1;
    let request = ControlRequest::RegisterWorker {
        addr: shared.advertised,
        threads: shared.config.threads as u32,
        instance: shared.instance,
        attempt,
    };
    let answer = shared.api.call(request).await.and_then(|response| {
        expect_response!(response, WorkerRegistered { worker, heartbeat_millis, lease_ttl_millis, lease_stall_millis })
    });
    match answer {
        Ok((worker, heartbeat_millis, lease_ttl_millis, lease_stall_millis)) => {
            shared.heartbeat_millis.store(heartbeat_millis.max(10), Ordering::Release);
            shared.stuck_after_millis.store((lease_stall_millis / 2).max(10), Ordering::Release);
            shared.worker.store(worker.0, Ordering::Release);
            heard(shared);
            info!(%worker, heartbeat_millis, lease_ttl_millis, "registered with the coordinator");
            Some(worker)
        }
        Err(error) => {
            warn!(%error, "cannot register with the coordinator; retrying");
            None
        }
    }
}

/// The coordinator does not know `worker`: register again, unless the id was already replaced
/// (an answer to a request sent under an earlier id must not drop the current one).
fn forgotten<A>(shared: &Shared<A>, worker: WorkerId, error: &RemoteError) {
    if shared.worker.compare_exchange(worker.0, 0, Ordering::AcqRel, Ordering::Acquire).is_ok() {
        warn!(%error, "the coordinator forgot this worker; registering again");
    }
}

/// How long a job's pipeline may make nothing of the work it holds before it counts as stuck.
fn stuck_after<A>(shared: &Shared<A>) -> Duration {
    Duration::from_millis(shared.stuck_after_millis.load(Ordering::Acquire))
}

/// Pull chunks whenever fewer than `in_flight` batches are outstanding.
pub(crate) async fn pull_loop<A>(shared: Arc<Shared<A>>)
where
    A: CoordinatorApi,
{
    let idle = Duration::from_millis(20);
    while !shared.stopping.load(Ordering::Acquire) {
        let Some(worker) = (match current_worker(&shared) {
            Some(worker) => Some(worker),
            None => register(&shared).await,
        }) else {
            tokio::time::sleep(Duration::from_millis(500)).await;
            continue;
        };
        let outstanding = ledger(&shared).outstanding();
        let free = shared.config.in_flight.saturating_sub(outstanding);
        if free == 0 {
            let _ = tokio::time::timeout(Duration::from_millis(100), shared.room.notified()).await;
            continue;
        }
        let max = (free / 2).max(1) as u32;
        let answer = shared.api.call(ControlRequest::PullChunks { worker, max }).await;
        match answer.and_then(|response| expect_response!(response, Chunks { grants })) {
            Ok(grants) if grants.is_empty() => tokio::time::sleep(idle).await,
            Ok(grants) => {
                for grant in grants {
                    start_chunk(&shared, grant);
                }
            }
            Err(error) if error.code == ErrorCode::NotFound => forgotten(&shared, worker, &error),
            Err(error) => {
                debug!(%error, "pull failed");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}

/// The coordinator answered this worker now.
fn heard<A>(shared: &Shared<A>) {
    *shared.heard_at.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(Instant::now());
}

/// Renew leases with their progress (and report the jobs stuck here); drop those the
/// coordinator took back; release the pipelines of jobs that ended or have been idle.
pub(crate) async fn heartbeat_loop<A>(shared: Arc<Shared<A>>)
where
    A: CoordinatorApi,
{
    loop {
        let period = Duration::from_millis(shared.heartbeat_millis.load(Ordering::Acquire));
        tokio::time::sleep(period).await;
        let Some(worker) = current_worker(&shared) else { continue };
        let (leases, mut stuck_jobs) = {
            let ledger = ledger(&shared);
            (ledger.progress(), ledger.stuck_jobs(Instant::now(), stuck_after(&shared)))
        };
        stuck_jobs.extend(shared.unmakeable.lock().unwrap_or_else(std::sync::PoisonError::into_inner).iter().copied());
        stuck_jobs.sort_unstable();
        stuck_jobs.dedup();
        let images = shared.metrics.samples.get();
        let answer = shared.api.call(ControlRequest::Heartbeat { worker, leases, images, stuck_jobs }).await;
        match answer.and_then(|response| expect_response!(response, HeartbeatAck { revoked, live_jobs })) {
            Ok((revoked, live_jobs)) => {
                heard(&shared);
                {
                    let mut ledger = ledger(&shared);
                    for lease in revoked {
                        debug!(%lease, "lease revoked");
                        ledger.revoke(lease);
                    }
                }
                shared.room.notify_one();
                shared.unmakeable.lock().unwrap_or_else(std::sync::PoisonError::into_inner).retain(|job| live_jobs.contains(job));
                release_idle(&shared, Some(&live_jobs));
            }
            Err(error) if error.code == ErrorCode::NotFound => forgotten(&shared, worker, &error),
            Err(error) => {
                debug!(%error, "heartbeat failed");
                release_idle(&shared, None);
            }
        }
    }
}

/// Take on a granted chunk: count its batches now, and make them on a task of their own, so
/// that a job whose dataset or pipeline is slow to open never holds up the pull loop (and
/// with it every other job).
fn start_chunk<A>(shared: &Arc<Shared<A>>, grant: ChunkGrant)
where
    A: CoordinatorApi,
{
    let chunk = grant.chunk;
    debug!(lease = %grant.lease, job = %chunk.job, epoch = %chunk.epoch, rank = %chunk.rank, first_step = %chunk.first_step, steps = chunk.steps, "chunk granted");
    let stuck = {
        let mut ledger = ledger(shared);
        let now = Instant::now();
        let stuck = ledger.job_stuck(chunk.job, now, stuck_after(shared));
        if !ledger.grant(grant.lease, chunk.job, chunk.steps, now) {
            return;
        }
        stuck
    };
    let budget = shared.config.max_batch_memory;
    let too_large = match super::jobs::batch_bytes(&grant) {
        // Two buffers at least: one being made while the other is delivered.
        Ok(bytes) if super::buffers_within(budget, bytes, 2) < 2 => Some(format!(
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
        if shared.unmakeable.lock().unwrap_or_else(std::sync::PoisonError::into_inner).insert(chunk.job) {
            warn!(job = %chunk.job, %reason, "job refused");
        }
        for _ in 0..chunk.steps {
            batch_unmade(shared, grant.lease, Failure::retry(reason.clone()));
        }
        return;
    }
    if stuck {
        // Refused at once, so another worker makes it (the coordinator retries it after its
        // retry delay) instead of it waiting behind the stuck batches here. (The coordinator
        // stops granting the job here once a heartbeat reports it stuck.)
        let reason = format!("this worker's pipeline for {} is stuck: nothing of the work it holds has come out of it", chunk.job);
        for _ in 0..chunk.steps {
            batch_unmade(shared, grant.lease, Failure::retry(reason.clone()));
        }
        return;
    }
    let shared = Arc::clone(shared);
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
        let (queued, reason) = match job_pipeline(&shared, &grant).await {
            Ok(_) if ledger(&shared).is_revoked(lease) => (0, "the lease was revoked while the job's pipeline started".to_owned()),
            Ok(pipeline) => {
                (pipeline.submit(chunk.epoch, chunk.rank, chunk.first_step, chunk.steps, meta), "the pipeline stopped".to_owned())
            }
            Err(error) => {
                warn!(job = %chunk.job, %error, "cannot start the job's pipeline");
                (0, format!("the worker could not start the job's pipeline: {error}"))
            }
        };
        // Each batch ends in exactly one finish: the queued ones through the pipeline, the rest
        // here.
        for _ in queued..chunk.steps {
            batch_unmade(&shared, lease, Failure::retry(reason.clone()));
        }
    });
}

/// Push finished batches to their trainers, each on its own task.
pub(crate) async fn dispatch_loop<A>(shared: Arc<Shared<A>>, mut made_rx: mpsc::Receiver<Made>)
where
    A: CoordinatorApi,
{
    while let Some((meta, result)) = made_rx.recv().await {
        let revoked = {
            let mut ledger = ledger(&shared);
            ledger.made(meta.lease, Instant::now());
            ledger.is_revoked(meta.lease)
        };
        let batch = match result {
            Ok(batch) => batch,
            Err(error) => {
                batch_finished(&shared, meta.lease, Err(failure_of(&error)));
                continue;
            }
        };
        shared.metrics.samples.inc_by(batch.len() as u64);
        if revoked {
            // Its steps are being made elsewhere: do not push a copy.
            batch_finished(&shared, meta.lease, Ok(()));
            continue;
        }
        let shared = Arc::clone(&shared);
        tokio::spawn(async move {
            let result = deliver(&shared, meta, batch).await;
            batch_finished(&shared, meta.lease, result.map_err(Failure::retry));
        });
    }
}

/// A finished batch's images as the bytes quinn sends: the batch (and its pooled storage)
/// lives until quinn has dropped the last of them.
struct Images(crate::Batch);

impl AsRef<[u8]> for Images {
    fn as_ref(&self) -> &[u8] {
        self.0.images()
    }
}

async fn deliver<A>(shared: &Shared<A>, meta: Meta, batch: crate::Batch) -> Result<(), String>
where
    A: CoordinatorApi,
{
    let awaiting = Occupied::new(&shared.metrics.awaiting_trainer);
    let trainer = shared.trainers.wait_for(meta.job, batch.rank, meta.session, meta.trainer, shared.config.trainer_patience).await;
    drop(awaiting);
    let Some(trainer) = trainer else {
        return Err(format!(
            "no trainer of {} {} ({} or newer, certificate {}) connected within {:?}",
            meta.job, batch.rank, meta.session, meta.trainer, shared.config.trainer_patience
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
    let delivering = Occupied::new(&shared.metrics.delivering);
    let started = Instant::now();
    let payload = Bytes::from_owner(Images(batch));
    let timeout = shared.config.delivery_timeout;
    let deadline = Instant::now() + timeout;
    let sent = match &trainer.bulk {
        Some(bulk) => bulk.send(header.clone(), payload.clone(), timeout).await,
        None => Sent::Unsent,
    };
    match sent {
        Sent::Delivered => shared.metrics.bulk_batches.inc(),
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
    shared.metrics.delivery_seconds.observe(started.elapsed().as_secs_f64());
    shared.metrics.batches.inc();
    shared.metrics.bytes_sent.inc_by(bytes);
    Ok(())
}

/// One batch of `lease` is delivered or failed; when it is the lease's last, report the chunk.
fn batch_finished<A>(shared: &Arc<Shared<A>>, lease: LeaseId, result: Result<(), Failure>)
where
    A: CoordinatorApi,
{
    let ending_opt = ledger(shared).finish(lease, result);
    report_ending(shared, lease, ending_opt);
}

/// One batch of `lease` failed without entering the job's pipeline (refused, or the pipeline
/// could not take it): as [`batch_finished`], and not the pipeline's progress.
fn batch_unmade<A>(shared: &Arc<Shared<A>>, lease: LeaseId, failure: Failure)
where
    A: CoordinatorApi,
{
    let ending_opt = ledger(shared).finish_unmade(lease, failure);
    report_ending(shared, lease, ending_opt);
}

/// A batch of `lease` finished, freeing room to pull; `ending_opt`, the lease's end, goes to
/// the coordinator.
fn report_ending<A>(shared: &Arc<Shared<A>>, lease: LeaseId, ending_opt: Option<Ending>)
where
    A: CoordinatorApi,
{
    shared.room.notify_one();
    let (Some(ending), Some(worker)) = (ending_opt, current_worker(shared)) else { return };
    if shared.stopping.load(Ordering::Acquire) {
        return;
    }
    match &ending {
        Ending::Done => shared.metrics.chunks_done.inc(),
        Ending::Failed(_) => shared.metrics.chunks_failed.inc(),
    }
    let shared = Arc::clone(shared);
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
        if let Err(error) = shared.api.call(request).await {
            debug!(%lease, %error, "cannot report the chunk; its lease will expire");
        }
    });
}
