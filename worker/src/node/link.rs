//! The worker's side of the coordinator protocol: register, heartbeat, pull chunks when there
//! is room, report each lease done or failed; and the dispatch of finished batches to their
//! trainers.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use stoker_common::api::CoordinatorApi;
use stoker_common::expect_response;
use stoker_common::ids::{LeaseId, WorkerId};
use stoker_common::net::send_batch;
use stoker_common::proto::{BatchHeader, ChunkGrant, ControlRequest, ErrorCode};
use tokio::sync::mpsc;
use tracing::{debug, error, info, warn};

use super::Shared;
use super::jobs::{JobPipeline, Made, Meta};
use crate::PipelineError;

/// A lease being worked on: batches not yet delivered, and the first failure.
#[derive(Debug)]
pub(crate) struct LeaseState {
    remaining: u32,
    failure_opt: Option<Failure>,
}

/// Why a batch of a lease was not delivered.
#[derive(Debug)]
struct Failure {
    reason: String,
    /// The chunk can never be made (an `on_error=fail` sample): the job fails, no retry.
    fatal: bool,
}

impl Failure {
    fn retry(reason: impl Into<String>) -> Self {
        Self { reason: reason.into(), fatal: false }
    }

    fn of_pipeline(error: &PipelineError) -> Self {
        Self { reason: error.to_string(), fatal: matches!(error, PipelineError::BadSample { .. }) }
    }
}

fn current_worker<A>(shared: &Shared<A>) -> Option<WorkerId> {
    let id = shared.worker.load(Ordering::Acquire);
    (id != 0).then_some(WorkerId(id))
}

async fn register<A>(shared: &Shared<A>) -> Option<WorkerId>
where
    A: CoordinatorApi,
{
    let request = ControlRequest::RegisterWorker { addr: shared.advertised, threads: shared.config.threads as u32 };
    let answer = shared
        .api
        .call(request)
        .await
        .and_then(|response| expect_response!(response, WorkerRegistered { worker, heartbeat_millis, lease_ttl_millis }));
    match answer {
        Ok((worker, heartbeat_millis, lease_ttl_millis)) => {
            shared.heartbeat_millis.store(heartbeat_millis.max(10), Ordering::Release);
            shared.worker.store(worker.0, Ordering::Release);
            info!(%worker, heartbeat_millis, lease_ttl_millis, "registered with the coordinator");
            Some(worker)
        }
        Err(error) => {
            warn!(%error, "cannot register with the coordinator; retrying");
            None
        }
    }
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
        let outstanding = shared.outstanding.load(Ordering::Acquire);
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
                    start_chunk(&shared, grant).await;
                }
            }
            Err(error) if error.code == ErrorCode::NotFound => {
                warn!(%error, "the coordinator forgot this worker; registering again");
                shared.worker.store(0, Ordering::Release);
            }
            Err(error) => {
                debug!(%error, "pull failed");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}

/// Renew leases; drop those the coordinator has given to someone else.
pub(crate) async fn heartbeat_loop<A>(shared: Arc<Shared<A>>)
where
    A: CoordinatorApi,
{
    loop {
        let period = Duration::from_millis(shared.heartbeat_millis.load(Ordering::Acquire));
        tokio::time::sleep(period).await;
        let Some(worker) = current_worker(&shared) else { continue };
        let leases: Vec<LeaseId> = shared.leases.lock().unwrap_or_else(std::sync::PoisonError::into_inner).keys().copied().collect();
        let images = shared.images.load(Ordering::Acquire);
        let answer = shared.api.call(ControlRequest::Heartbeat { worker, leases, images }).await;
        match answer.and_then(|response| expect_response!(response, HeartbeatAck { revoked })) {
            Ok(revoked) => {
                let mut held = shared.leases.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                for lease in revoked {
                    debug!(%lease, "lease revoked");
                    held.remove(&lease);
                }
            }
            Err(error) if error.code == ErrorCode::NotFound => {
                warn!(%error, "the coordinator forgot this worker; registering again");
                shared.worker.store(0, Ordering::Release);
            }
            Err(error) => debug!(%error, "heartbeat failed"),
        }
    }
}

async fn start_chunk<A>(shared: &Arc<Shared<A>>, grant: ChunkGrant)
where
    A: CoordinatorApi,
{
    let chunk = grant.chunk;
    debug!(lease = %grant.lease, job = %chunk.job, epoch = %chunk.epoch, rank = %chunk.rank, first_step = %chunk.first_step, steps = chunk.steps, "chunk granted");
    shared
        .leases
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .insert(grant.lease, LeaseState { remaining: chunk.steps, failure_opt: None });
    shared.outstanding.fetch_add(chunk.steps as usize, Ordering::AcqRel);
    let meta = Meta { lease: grant.lease, job: chunk.job, start: chunk.start, session: grant.session };
    let queued = match job_pipeline(shared, &grant).await {
        Ok(pipeline) => pipeline.submit(chunk.epoch, chunk.rank, chunk.first_step, chunk.steps, meta),
        Err(error) => {
            warn!(job = %chunk.job, %error, "cannot start the job's pipeline");
            0
        }
    };
    // Each batch ends in exactly one batch_finished: the queued ones through the pipeline,
    // the rest here. (Failing all of them here when some were queued would count those twice
    // and wrap `outstanding`, after which this worker never pulls again.)
    for _ in queued..chunk.steps {
        batch_finished(shared, grant.lease, Err(Failure::retry("the worker could not start the job's pipeline")));
    }
}

async fn job_pipeline<A>(shared: &Arc<Shared<A>>, grant: &ChunkGrant) -> Result<Arc<JobPipeline>, String>
where
    A: CoordinatorApi,
{
    let mut jobs = shared.jobs.lock().await;
    if let Some(pipeline) = jobs.get(&grant.chunk.job).filter(|pipeline| !pipeline.is_dead()) {
        return Ok(Arc::clone(pipeline));
    }
    let dataset = {
        let mut datasets = shared.datasets.lock().await;
        match datasets.get(&grant.manifest) {
            Some(dataset) => Arc::clone(dataset),
            None => {
                let path = std::path::PathBuf::from(&grant.manifest);
                let opened = tokio::task::spawn_blocking(move || crate::Dataset::open(&path))
                    .await
                    .map_err(|error| error.to_string())?
                    .map_err(|error| error.to_string())?;
                let dataset = Arc::new(opened);
                datasets.insert(grant.manifest.clone(), Arc::clone(&dataset));
                dataset
            }
        }
    };
    let pipeline = JobPipeline::start(dataset, grant, shared.config.threads, shared.config.in_flight, shared.made_tx.clone())
        .map_err(|error| error.to_string())?;
    let pipeline = Arc::new(pipeline);
    jobs.insert(grant.chunk.job, Arc::clone(&pipeline));
    Ok(pipeline)
}

/// Push finished batches to their trainers, each on its own task.
pub(crate) async fn dispatch_loop<A>(shared: Arc<Shared<A>>, mut made_rx: mpsc::Receiver<Made>)
where
    A: CoordinatorApi,
{
    while let Some((meta, result)) = made_rx.recv().await {
        let batch = match result {
            Ok(batch) => batch,
            Err(error) => {
                shared.jobs.lock().await.retain(|_, pipeline| !pipeline.is_dead());
                batch_finished(&shared, meta.lease, Err(Failure::of_pipeline(&error)));
                continue;
            }
        };
        shared.images.fetch_add(batch.len() as u64, Ordering::AcqRel);
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
    let Some(connection) = shared.trainers.wait_for(meta.job, batch.rank, meta.session, shared.config.trainer_patience).await else {
        return Err(format!(
            "no trainer of {} {} ({} or newer) connected within {:?}",
            meta.job, batch.rank, meta.session, shared.config.trainer_patience
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
        payload_len: batch.images().len() as u64,
        checksum: batch.checksum,
    };
    send_batch(&connection, &header, Bytes::from_owner(Images(batch))).await.map_err(|error| error.to_string())?;
    shared.batches_pushed.fetch_add(1, Ordering::AcqRel);
    Ok(())
}

/// One batch of `lease` is delivered or failed; when it is the lease's last, report the chunk.
fn batch_finished<A>(shared: &Arc<Shared<A>>, lease: LeaseId, result: Result<(), Failure>)
where
    A: CoordinatorApi,
{
    let report_opt = {
        let mut leases = shared.leases.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        match leases.get_mut(&lease) {
            None => None,
            Some(state) => {
                state.remaining = state.remaining.saturating_sub(1);
                // The first failure is reported, unless a fatal one follows: that chunk must not
                // be retried.
                if let Err(failure) = result
                    && state.failure_opt.as_ref().is_none_or(|first| failure.fatal && !first.fatal)
                {
                    state.failure_opt = Some(failure);
                }
                if state.remaining == 0 { leases.remove(&lease).map(|state| state.failure_opt) } else { None }
            }
        }
    };
    shared.outstanding.fetch_sub(1, Ordering::AcqRel);
    shared.room.notify_one();
    let (Some(failure_opt), Some(worker)) = (report_opt, current_worker(shared)) else { return };
    if shared.stopping.load(Ordering::Acquire) {
        return;
    }
    let shared = Arc::clone(shared);
    tokio::spawn(async move {
        let request = match failure_opt {
            None => {
                debug!(%lease, "chunk delivered");
                ControlRequest::ChunkDone { worker, lease }
            }
            Some(Failure { reason, fatal: true }) => {
                error!(%lease, %reason, "chunk cannot be made; the job fails");
                ControlRequest::ChunkFatal { worker, lease, reason }
            }
            Some(Failure { reason, fatal: false }) => {
                warn!(%lease, %reason, "chunk failed");
                ControlRequest::ChunkFailed { worker, lease, reason }
            }
        };
        if let Err(error) = shared.api.call(request).await {
            debug!(%lease, %error, "cannot report the chunk; its lease will expire");
        }
    });
}
