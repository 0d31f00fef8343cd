//! One job's decode pipeline: chunks become batch requests; a thread per pipeline hands
//! finished batches, with the lease they belong to, to the node's async side.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use crossbeam_channel::{Receiver, Sender, unbounded};
use parking_lot::Mutex;
use stoker_plan::EpochPlan;
use stoker_plan::ids::{CertKey, Epoch, JobId, LeaseId, Position, Rank, SessionId, ShardId, Step};
use stoker_proto::ChunkGrant;
use tokio::sync::mpsc;

use crate::batch::Batch;
use crate::dataset::Dataset;
use crate::error::PipelineError;
use crate::metrics::PipelineMetrics;
use crate::pipeline::{BatchRequest, Pipeline, PipelineConfig};

/// The most shards [`JobPipeline::first_reads`] names.
pub(crate) const MAX_FIRST_READS: usize = 4_096;

/// An epoch, a byte budget, and the shards that epoch reads first within it.
type FirstReads = (Epoch, u64, Arc<Vec<ShardId>>);

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

/// The pipeline of one job.
pub(crate) struct JobPipeline {
    job: JobId,
    submit: Mutex<(Sender<BatchRequest>, Sender<Meta>)>,
    plans: Mutex<HashMap<(Epoch, Position), Arc<EpochPlan>>>,
    /// The last [`JobPipeline::first_reads`] answer, by its epoch and byte budget.
    first_reads: Mutex<Option<FirstReads>>,
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
        let (request_tx, request_rx) = unbounded::<BatchRequest>();
        let (meta_tx, meta_rx) = unbounded::<Meta>();
        let config = PipelineConfig { threads, in_flight, batch_size: grant.spec.plan.batch_size.get() as usize };
        let pipeline = Pipeline::start_observed(Arc::clone(&dataset), &grant.spec.transforms, config, request_rx, metrics)?;
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
            first_reads: Mutex::new(None),
            dataset,
            spec: grant.spec.plan,
            dead,
        })
    }

    /// The job it makes.
    pub(crate) fn job(&self) -> JobId {
        self.job
    }

    /// Whether the pipeline stopped (an `on_error=fail` sample, or a bug): make a new one.
    pub(crate) fn is_dead(&self) -> bool {
        self.dead.load(Ordering::Acquire)
    }

    /// The dataset it reads.
    pub(crate) fn dataset(&self) -> &Arc<Dataset> {
        &self.dataset
    }

    /// The plan of `epoch` from `start` (cached: chunks of one pass share it).
    fn plan(&self, epoch: Epoch, start: Position) -> Arc<EpochPlan> {
        let mut plans = self.plans.lock();
        if plans.len() > 8 {
            plans.clear();
        }
        Arc::clone(
            plans.entry((epoch, start)).or_insert_with(|| Arc::new(EpochPlan::starting_at(self.dataset.table(), self.spec, epoch, start))),
        )
    }

    /// The shards the batches of steps `first..first+steps` of `rank` read.
    pub(crate) fn shards_of(&self, epoch: Epoch, start: Position, rank: Rank, first: Step, steps: u32) -> BTreeSet<ShardId> {
        let plan = self.plan(epoch, start);
        if rank.0 >= plan.spec().world_size.get() {
            return BTreeSet::new();
        }
        (0..steps)
            .map(|offset| Step(first.0 + u64::from(offset)))
            .filter(|step| step.0 < plan.steps())
            .flat_map(|step| plan.batch(rank, step).map(|planned| planned.sample.shard).collect::<Vec<_>>())
            .collect()
    }

    /// The shards that `epoch` (from its start) reads first, every rank's steps in the order
    /// chunks are granted ((step, rank)), each once, until they add up to `budget` bytes (or
    /// [`MAX_FIRST_READS`] shards): what a cache of `budget` bytes should hold when the epoch
    /// begins. Remembered for the last epoch asked (one computation per epoch, not per grant).
    pub(crate) fn first_reads(&self, epoch: Epoch, budget: u64) -> Arc<Vec<ShardId>> {
        if let Some((known, known_budget, reads)) = self.first_reads.lock().as_ref()
            && (*known, *known_budget) == (epoch, budget)
        {
            return Arc::clone(reads);
        }
        let plan = self.plan(epoch, Position(0));
        let ranks = plan.spec().world_size.get();
        let mut seen = BTreeSet::new();
        let mut reads = Vec::new();
        let mut bytes = 0_u64;
        'steps: for step in (0..plan.steps()).map(Step) {
            for rank in (0..ranks).map(Rank) {
                for planned in plan.batch(rank, step) {
                    let shard = planned.sample.shard;
                    if seen.insert(shard) {
                        bytes = bytes.saturating_add(self.dataset.shard_bytes(shard));
                        if bytes > budget || reads.len() >= MAX_FIRST_READS {
                            break 'steps;
                        }
                        reads.push(shard);
                    }
                }
            }
        }
        let reads = Arc::new(reads);
        *self.first_reads.lock() = Some((epoch, budget, Arc::clone(&reads)));
        reads
    }

    /// Queue the batches of steps `first..first+steps` of `rank` under `meta`'s lease. Returns
    /// how many were queued: each of those comes out of the pipeline (made or failed), the
    /// rest never will (the pipeline stopped meanwhile) and are the caller's to fail.
    pub(crate) fn submit(&self, epoch: Epoch, rank: Rank, first: Step, steps: u32, meta: Meta) -> u32 {
        let plan = self.plan(epoch, meta.start);
        let submit = self.submit.lock();
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
        let spec = JobSpec { name: "job".to_owned(), dataset: "bad".to_owned(), plan, transforms, prefetch: 8 };
        let grant = ChunkGrant {
            lease: LeaseId(7),
            chunk,
            spec,
            manifest: String::new(),
            dataset_version: 0,
            session: SessionId(1),
            trainer: CertKey::UNCHECKED,
            next_shards: Vec::new(),
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
