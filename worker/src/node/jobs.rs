//! One decode pipeline per job (its transform spec and batch size fix the pipeline's recipe
//! and buffers). Chunks become batch requests; a thread per pipeline hands finished batches,
//! with the lease they belong to, to the node's async side.
//!
//! Pipelines and datasets are made on blocking threads and shared through once-cells, so no
//! lock is held while a dataset opens (an NFS hang, a huge manifest) and other jobs go on. A
//! job's pipeline (threads, pre-touched batch buffers) and its mapped dataset are released
//! when the job has had no work for the configured idle time or the coordinator no longer
//! lists it as live ([`release_idle`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use crossbeam_channel::{Receiver, Sender, unbounded};
use stoker_format::error::ShardError;
use stoker_plan::EpochPlan;
use stoker_plan::ids::{CertKey, Epoch, JobId, LeaseId, Position, Rank, SessionId, Step};
use stoker_plan::transform::TransformSpec;
use stoker_proto::ChunkGrant;
use stoker_proto::api::CoordinatorApi;
use tokio::sync::{OnceCell, mpsc};
use tracing::{info, warn};

use super::Shared;
use super::link::ledger;
use crate::batch::Batch;
use crate::dataset::Dataset;
use crate::error::PipelineError;
use crate::metrics::PipelineMetrics;
use crate::pipeline::{BatchRequest, Pipeline, PipelineConfig};

/// Which lease a requested batch belongs to, and what its header must say.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Meta {
    pub(crate) lease: LeaseId,
    pub(crate) job: JobId,
    pub(crate) start: Position,
    /// The oldest trainer session its batches may go to (the grant's).
    pub(crate) session: SessionId,
    /// The certificate of the trainer that owns the session (the grant's).
    pub(crate) trainer: CertKey,
    /// The version of the dataset the batch is made from.
    pub(crate) dataset_version: u64,
    /// The plan digest of the batch's step (set per step by [`JobPipeline::submit`]).
    pub(crate) plan_digest: u64,
}

/// A finished (or failed) batch and its lease.
pub(crate) type Made = (Meta, Result<Batch, PipelineError>);

/// A job as this worker makes it: its id and a fingerprint of its spec and dataset, so that a
/// job id reused by a coordinator that lost its state never gets another job's pipeline.
pub(crate) type JobKey = (JobId, u64);

fn job_key(grant: &ChunkGrant) -> JobKey {
    let identity = format!("{:?}|{}|{}", grant.spec, grant.manifest, grant.dataset_version);
    (grant.chunk.job, xxhash_rust::xxh3::xxh3_64(identity.as_bytes()))
}

/// A job's pipeline, made once by whichever chunk needs it first.
#[derive(Debug)]
pub(crate) struct JobSlot {
    pipeline: Arc<OnceCell<Arc<JobPipeline>>>,
    last_used: Instant,
}

/// A dataset, opened once by whichever job needs it first.
pub(crate) type DatasetSlot = Arc<OnceCell<Arc<Dataset>>>;

/// The pipeline of `grant`'s job, started (on a blocking thread, after opening its dataset
/// the same way) if this worker has none, or if its last one stopped. Holds no lock while
/// it waits.
pub(crate) async fn job_pipeline<A>(shared: &Arc<Shared<A>>, grant: &ChunkGrant) -> Result<Arc<JobPipeline>, String>
where
    A: CoordinatorApi,
{
    let key = job_key(grant);
    let cell = {
        let mut jobs = shared.jobs.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let slot = jobs.entry(key).or_insert_with(|| JobSlot { pipeline: Arc::default(), last_used: Instant::now() });
        if slot.pipeline.get().is_some_and(|pipeline| pipeline.is_dead()) {
            slot.pipeline = Arc::default();
        }
        slot.last_used = Instant::now();
        Arc::clone(&slot.pipeline)
    };
    let pipeline = cell
        .get_or_try_init(|| async {
            let dataset = dataset(shared, grant).await?;
            let (grant, config, made_tx) = (grant.clone(), shared.config.clone(), shared.made_tx.clone());
            let metrics = Some(PipelineMetrics { timed: shared.config.time_samples, ..shared.metrics.pipeline.clone() });
            let started = tokio::task::spawn_blocking(move || {
                // Fewer buffers for large batches, so that the job's stay within the budget.
                let buffers = super::buffers_within(config.max_batch_memory, batch_bytes(&grant)?, config.in_flight);
                JobPipeline::start(dataset, &grant, config.threads, buffers.max(1), made_tx, metrics)
            })
            .await
            .map_err(|error| error.to_string())?
            .map_err(|error| error.to_string())?;
            info!(job = %key.0, "job pipeline started");
            Ok::<_, String>(Arc::new(started))
        })
        .await?;
    Ok(Arc::clone(pipeline))
}

/// The bytes of one batch of `grant`'s job (batch size × the bytes of one output sample).
pub(crate) fn batch_bytes(grant: &ChunkGrant) -> Result<u64, PipelineError> {
    let transforms: TransformSpec = serde_json::from_str(&grant.spec.transforms)
        .map_err(|error| PipelineError::Start(format!("the job's transform spec is not valid: {error}")))?;
    let recipe = stoker_plan::transform::Recipe::new(&transforms).map_err(|error| PipelineError::Start(error.to_string()))?;
    Ok(u64::from(grant.spec.plan.batch_size.get()).saturating_mul(recipe.sample_bytes() as u64))
}

/// The dataset of `grant`, opened on a blocking thread if this worker has not opened it, and
/// refused if its manifest is not the version the job was created with.
async fn dataset<A>(shared: &Shared<A>, grant: &ChunkGrant) -> Result<Arc<Dataset>, String> {
    let cell = {
        let mut datasets = shared.datasets.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        Arc::clone(datasets.entry((grant.manifest.clone(), grant.dataset_version)).or_default())
    };
    let dataset = cell
        .get_or_try_init(|| async {
            let (path, version) = (std::path::PathBuf::from(&grant.manifest), grant.dataset_version);
            let (roots, hook) = (shared.config.dataset_roots.clone(), shared.config.before_dataset_open);
            let opened = tokio::task::spawn_blocking(move || {
                if let Some(hook) = hook {
                    hook(&path);
                }
                Dataset::open_confined(&path, version, &roots)
            })
            .await
            .map_err(|error| error.to_string())?;
            match opened {
                Ok(opened) => Ok::<_, String>(Arc::new(opened)),
                Err(error) => {
                    if is_outside_roots(&error) {
                        // Never made here: reported stuck with every heartbeat, so that workers
                        // whose roots hold it make it.
                        let refused = shared.unmakeable.lock().unwrap_or_else(std::sync::PoisonError::into_inner).insert(grant.chunk.job);
                        if refused {
                            warn!(job = %grant.chunk.job, %error, "job refused: its data is outside this worker's --dataset-root");
                        }
                    }
                    Err(error.to_string())
                }
            }
        })
        .await?;
    Ok(Arc::clone(dataset))
}

/// Whether `error` says a manifest or shard is outside the worker's `--dataset-root`.
fn is_outside_roots(error: &PipelineError) -> bool {
    matches!(error, PipelineError::Shard(ShardError::Confined { reason, .. }) if reason.contains("--dataset-root"))
}

/// Release the pipelines of jobs that have nothing in flight here and either have had no work
/// for the idle time or are not in `live_jobs_opt` (the coordinator's list of jobs that may
/// still need work), and the datasets no pipeline uses any more.
pub(crate) fn release_idle<A>(shared: &Shared<A>, live_jobs_opt: Option<&[JobId]>) {
    let now = Instant::now();
    let mut released = Vec::new();
    {
        let ledger = ledger(shared);
        let mut jobs = shared.jobs.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        jobs.retain(|(job, _), slot| {
            let idle = now.saturating_duration_since(slot.last_used) >= shared.config.job_idle;
            let ended = live_jobs_opt.is_some_and(|live| !live.contains(job));
            // A chunk task holding the cell is starting the pipeline or about to submit to it.
            let in_use = Arc::strong_count(&slot.pipeline) > 1;
            let keep = ledger.job_busy(*job) || in_use || !(idle || ended);
            if !keep {
                released.extend(slot.pipeline.get().cloned());
            }
            keep
        });
    }
    for pipeline in &released {
        info!(job = %pipeline.job, "job pipeline released (idle or ended)");
    }
    // Dropping the last reference closes the pipeline's channels; its threads end and free
    // their buffers on their own (no join here, on an async thread).
    drop(released);
    let mut datasets = shared.datasets.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    datasets.retain(|_, cell| cell.get().is_none_or(|dataset| Arc::strong_count(dataset) > 1));
}

/// The pipeline of one job.
pub(crate) struct JobPipeline {
    job: JobId,
    submit: Mutex<(Sender<BatchRequest>, Sender<Meta>)>,
    plans: Mutex<HashMap<(Epoch, Position), Arc<EpochPlan>>>,
    dataset: Arc<Dataset>,
    spec: stoker_plan::PlanSpec,
    dead: Arc<AtomicBool>,
}

impl std::fmt::Debug for JobPipeline {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("JobPipeline")
            .field("job", &self.job)
            .field("dead", &self.dead.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl JobPipeline {
    /// Start the pipeline for `grant`'s job over `dataset`; finished batches go to `out`.
    pub(crate) fn start(
        dataset: Arc<Dataset>,
        grant: &ChunkGrant,
        threads: usize,
        in_flight: usize,
        out: mpsc::Sender<Made>,
        metrics: Option<PipelineMetrics>,
    ) -> Result<Self, PipelineError> {
        let transforms: TransformSpec = serde_json::from_str(&grant.spec.transforms)
            .map_err(|error| PipelineError::Start(format!("the job's transform spec is not valid: {error}")))?;
        let (request_tx, request_rx) = unbounded::<BatchRequest>();
        let (meta_tx, meta_rx) = unbounded::<Meta>();
        let config = PipelineConfig { threads, in_flight, batch_size: grant.spec.plan.batch_size.get() as usize };
        let pipeline = Pipeline::start_observed(Arc::clone(&dataset), &transforms, config, request_rx, metrics)?;
        let dead = Arc::new(AtomicBool::new(false));
        let thread_dead = Arc::clone(&dead);
        std::thread::Builder::new()
            .name(format!("stoker-out-{}", grant.chunk.job))
            .spawn(move || {
                hand_over(pipeline, &meta_rx, &out, &thread_dead);
                // The pipeline (its threads and batch buffers) is gone: give the memory back.
                crate::batch::return_freed_memory();
            })
            .map_err(|error| PipelineError::Start(error.to_string()))?;
        Ok(Self {
            job: grant.chunk.job,
            submit: Mutex::new((request_tx, meta_tx)),
            plans: Mutex::new(HashMap::new()),
            dataset,
            spec: grant.spec.plan,
            dead,
        })
    }

    /// Whether the pipeline stopped (an `on_error=fail` sample, or a bug): make a new one.
    pub(crate) fn is_dead(&self) -> bool {
        self.dead.load(Ordering::Acquire)
    }

    /// Queue the batches of steps `first..first+steps` of `rank` under `meta`'s lease. Returns
    /// how many were queued: each of those comes out of the pipeline (made or failed), the
    /// rest never will (the pipeline stopped meanwhile) and are the caller's to fail.
    pub(crate) fn submit(&self, epoch: Epoch, rank: Rank, first: Step, steps: u32, meta: Meta) -> u32 {
        let plan = {
            let mut plans = self.plans.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            if plans.len() > 8 {
                plans.clear();
            }
            Arc::clone(
                plans
                    .entry((epoch, meta.start))
                    .or_insert_with(|| Arc::new(EpochPlan::starting_at(self.dataset.table(), self.spec, epoch, meta.start))),
            )
        };
        let submit = self.submit.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        for queued in 0..steps {
            let step = Step(first.0 + u64::from(queued));
            let meta = Meta { plan_digest: plan.batch_digest(self.dataset.version(), rank, step), ..meta };
            let request = BatchRequest { plan: Arc::clone(&plan), rank, step };
            // The meta first: once it is queued, hand_over answers for it even if the request
            // never reaches the (stopped) pipeline.
            if submit.1.send(meta).is_err() {
                return queued;
            }
            if submit.0.send(request).is_err() {
                return queued + 1;
            }
        }
        steps
    }
}

/// Pair each finished batch with its lease, in request order, and pass it on. After the
/// pipeline ends, every lease still waiting gets the failure.
///
/// The pipeline is dropped last, on purpose: dropping it joins its feeder, which may be waiting
/// for the next request on a channel that only closes when the node drops this job's
/// [`JobPipeline`]. Failing the queued leases first is what lets their chunks be reported.
fn hand_over(mut pipeline: Pipeline, metas: &Receiver<Meta>, out: &mpsc::Sender<Made>, dead: &AtomicBool) {
    let mut failure_opt = None;
    for result in pipeline.by_ref() {
        let Ok(meta) = metas.recv() else { return };
        if let Err(error) = &result {
            failure_opt = Some(error.to_string());
            // Before the error goes out: the dispatcher, on seeing it, drops dead pipelines.
            dead.store(true, Ordering::Release);
        }
        if out.blocking_send((meta, result)).is_err() {
            return;
        }
    }
    dead.store(true, Ordering::Release);
    let message = failure_opt.unwrap_or_else(|| "the pipeline stopped".to_owned());
    // Ends when the node drops the JobPipeline (and with it the senders).
    for meta in metas.iter() {
        if out.blocking_send((meta, Err(PipelineError::Start(message.clone())))).is_err() {
            return;
        }
    }
    drop(pipeline);
}

#[cfg(test)]
mod tests {
    use std::num::{NonZeroU32, NonZeroUsize};
    use std::time::{Duration, Instant};

    use stoker_format::pack::{PackOptions, pack};
    use stoker_plan::ids::{CertKey, Epoch, JobId, LeaseId, Position, Rank, SessionId, Step};
    use stoker_plan::transform::{OnError, TransformSpec};
    use stoker_plan::{PlanSpec, Shuffle, Tail};
    use stoker_proto::{Chunk, ChunkGrant, JobSpec};
    use tokio::sync::mpsc;

    use super::{JobPipeline, Made, Meta};
    use crate::Dataset;
    use crate::error::PipelineError;

    /// A dataset of `count` members that are not images.
    fn undecodable_dataset(dir: &std::path::Path, count: usize) -> Dataset {
        let class = dir.join("images").join("class0");
        std::fs::create_dir_all(&class).expect("class folder");
        for index in 0..count {
            std::fs::write(class.join(format!("img{index:03}.jpg")), b"this is not a JPEG").expect("member");
        }
        let options = PackOptions {
            input: dir.join("images"),
            output: dir.join("shards"),
            shard_size: 1 << 20,
            threads: NonZeroUsize::MIN,
            prefix: "shard".to_owned(),
            overwrite: true,
            rewrite_jpeg: None,
            shuffle_seed: None,
        };
        pack(&options, &mut |_| {}).expect("pack");
        Dataset::open(&dir.join("shards").join("manifest.json")).expect("open")
    }

    /// Up to `count` results from `made` (their leases), waiting at most 20 s.
    fn take_made(made: &mut mpsc::Receiver<Made>, count: usize) -> Vec<(LeaseId, Result<crate::Batch, PipelineError>)> {
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut results = Vec::new();
        while results.len() < count && Instant::now() < deadline {
            match made.try_recv() {
                Ok((meta, result)) => results.push((meta.lease, result)),
                Err(_) => std::thread::sleep(Duration::from_millis(5)),
            }
        }
        results
    }

    /// Regression: the pipeline's feeder had taken every request and waited for more when the
    /// bad sample stopped it; hand_over then dropped the pipeline (joining the feeder, which
    /// waited on a channel this JobPipeline keeps open) before failing the lease's other
    /// batches. The lease never completed, so the job never failed.
    #[test]
    fn an_on_error_fail_sample_fails_every_queued_batch_while_the_job_pipeline_lives() {
        let dir = tempfile::tempdir().expect("temp dir");
        let dataset = std::sync::Arc::new(undecodable_dataset(dir.path(), 16));
        let mut transforms = TransformSpec::imagenet_train(16);
        transforms.on_error = OnError::Fail;
        let plan = PlanSpec {
            seed: 3,
            world_size: NonZeroU32::MIN,
            batch_size: NonZeroU32::new(4).expect("4"),
            shuffle: Shuffle::None,
            tail: Tail::Drop,
        };
        let chunk = Chunk { job: JobId(1), epoch: Epoch(0), start: Position(0), first_step: Step(0), rank: Rank(0), steps: 4 };
        let spec = JobSpec {
            name: "job".to_owned(),
            dataset: "bad".to_owned(),
            plan,
            transforms: serde_json::to_string(&transforms).expect("json"),
            prefetch: 8,
        };
        let grant = ChunkGrant {
            lease: LeaseId(7),
            chunk,
            spec,
            manifest: String::new(),
            dataset_version: 0,
            session: SessionId(1),
            trainer: CertKey::UNCHECKED,
        };
        let (out, mut made) = mpsc::channel(16);
        // Buffers for every step: the feeder takes all four requests and waits for a fifth.
        let pipeline = JobPipeline::start(dataset, &grant, 1, 8, out, None).expect("start");
        let meta = Meta {
            lease: grant.lease,
            job: chunk.job,
            start: Position(0),
            session: grant.session,
            trainer: grant.trainer,
            dataset_version: 0,
            plan_digest: 0,
        };
        assert_eq!(pipeline.submit(chunk.epoch, chunk.rank, chunk.first_step, chunk.steps, meta), 4);
        let results = take_made(&mut made, 4);
        assert_eq!(results.len(), 4, "only {} of the lease's 4 batches came back: {results:?}", results.len());
        assert!(results.iter().all(|(lease, result)| *lease == LeaseId(7) && result.is_err()), "{results:?}");
        assert!(matches!(&results[0].1, Err(PipelineError::BadSample { .. })), "{:?}", results[0].1);
        assert!(pipeline.is_dead());
        // A chunk submitted to the stopped pipeline: what submit says it queued comes back
        // failed, once each (the node fails the rest itself; a batch counted twice would wrap
        // its outstanding count).
        let late = Meta { lease: LeaseId(8), ..meta };
        let queued = pipeline.submit(chunk.epoch, chunk.rank, Step(4), 3, late) as usize;
        let mut late_results = take_made(&mut made, queued);
        std::thread::sleep(Duration::from_millis(100));
        while let Ok((meta, result)) = made.try_recv() {
            late_results.push((meta.lease, result));
        }
        assert_eq!(late_results.len(), queued, "{late_results:?}");
        assert!(late_results.iter().all(|(lease, result)| *lease == LeaseId(8) && result.is_err()), "{late_results:?}");
        // Dropping the JobPipeline closes its channels, so the pipeline's threads end.
        drop(pipeline);
    }
}
