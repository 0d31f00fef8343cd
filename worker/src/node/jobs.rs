//! One decode pipeline per job (its transform spec and batch size fix the pipeline's recipe
//! and buffers). Chunks become batch requests; a thread per pipeline hands finished batches,
//! with the lease they belong to, to the node's async side.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use crossbeam_channel::{Receiver, Sender, unbounded};
use stoker_common::ids::{Epoch, JobId, LeaseId, Step};
use stoker_common::plan::EpochPlan;
use stoker_common::proto::ChunkGrant;
use stoker_common::transform::TransformSpec;
use tokio::sync::mpsc;

use crate::batch::Batch;
use crate::dataset::Dataset;
use crate::error::PipelineError;
use crate::pipeline::{BatchRequest, Pipeline, PipelineConfig};

/// Which lease a requested batch belongs to.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Meta {
    pub(crate) lease: LeaseId,
    pub(crate) job: JobId,
    pub(crate) start: u64,
}

/// A finished (or failed) batch and its lease.
pub(crate) type Made = (Meta, Result<Batch, PipelineError>);

/// The pipeline of one job.
pub(crate) struct JobPipeline {
    submit: Mutex<(Sender<BatchRequest>, Sender<Meta>)>,
    plans: Mutex<HashMap<(Epoch, u64), Arc<EpochPlan>>>,
    dataset: Arc<Dataset>,
    spec: stoker_common::plan::PlanSpec,
    dead: Arc<AtomicBool>,
}

impl std::fmt::Debug for JobPipeline {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("JobPipeline").field("dead", &self.dead.load(Ordering::Relaxed)).finish_non_exhaustive()
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
    ) -> Result<Self, PipelineError> {
        let transforms: TransformSpec = serde_json::from_str(&grant.spec.transforms)
            .map_err(|error| PipelineError::Start(format!("the job's transform spec is not valid: {error}")))?;
        let (request_tx, request_rx) = unbounded::<BatchRequest>();
        let (meta_tx, meta_rx) = unbounded::<Meta>();
        let config = PipelineConfig { threads, in_flight, batch_size: grant.spec.plan.batch_size.get() as usize };
        let pipeline = Pipeline::start(Arc::clone(&dataset), &transforms, config, request_rx)?;
        let dead = Arc::new(AtomicBool::new(false));
        let thread_dead = Arc::clone(&dead);
        std::thread::Builder::new()
            .name(format!("stoker-out-{}", grant.chunk.job))
            .spawn(move || hand_over(pipeline, &meta_rx, &out, &thread_dead))
            .map_err(|error| PipelineError::Start(error.to_string()))?;
        Ok(Self { submit: Mutex::new((request_tx, meta_tx)), plans: Mutex::new(HashMap::new()), dataset, spec: grant.spec.plan, dead })
    }

    /// Whether the pipeline stopped (an `on_error=fail` sample, or a bug): make a new one.
    pub(crate) fn is_dead(&self) -> bool {
        self.dead.load(Ordering::Acquire)
    }

    /// Queue the batches of steps `first..first+steps` of `rank` under `meta`'s lease.
    pub(crate) fn submit(&self, epoch: Epoch, rank: stoker_common::ids::Rank, first: Step, steps: u32, meta: Meta) -> bool {
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
        for step in first.0..first.0 + u64::from(steps) {
            let request = BatchRequest { plan: Arc::clone(&plan), rank, step: Step(step) };
            if submit.0.send(request).is_err() || submit.1.send(meta).is_err() {
                return false;
            }
        }
        true
    }
}

/// Pair each finished batch with its lease, in request order, and pass it on. After the
/// pipeline ends, every lease still waiting gets the failure.
fn hand_over(pipeline: Pipeline, metas: &Receiver<Meta>, out: &mpsc::Sender<Made>, dead: &AtomicBool) {
    let mut failure_opt = None;
    for result in pipeline {
        let Ok(meta) = metas.recv() else { return };
        if let Err(error) = &result {
            failure_opt = Some(error.to_string());
        }
        if out.blocking_send((meta, result)).is_err() {
            return;
        }
    }
    dead.store(true, Ordering::Release);
    let message = failure_opt.unwrap_or_else(|| "the pipeline stopped".to_owned());
    for meta in metas.iter() {
        if out.blocking_send((meta, Err(PipelineError::Start(message.clone())))).is_err() {
            return;
        }
    }
}
