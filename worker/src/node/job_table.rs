//! The worker's jobs: one decode pipeline per job (its transform spec and batch size fix the
//! pipeline's recipe and buffers), the datasets they read, and the jobs refused here.
//!
//! Pipelines and datasets are made on blocking threads and shared through once-cells, so no
//! lock is held while a dataset opens (an NFS hang, a huge manifest) and other jobs go on. A
//! job's pipeline (threads, pre-touched batch buffers) and its mapped dataset are released
//! when the job has had no work for the configured idle time or the coordinator no longer
//! lists it as live ([`JobTable::release_idle`]).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;
use stoker_format::error::ShardError;
use stoker_plan::ids::JobId;
use stoker_proto::{ChunkGrant, StuckJob};
use tokio::sync::{OnceCell, mpsc};
use tracing::{info, warn};

use stoker_format::Manifest;
use stoker_store::{MAX_OBJECT_READ_BYTES, ObjectStores, ObjectUri};

use super::config::WorkerConfig;
use super::job_pipeline::{JobPipeline, Made};
use super::ledger::LeaseLedger;
use crate::cache::ShardCache;
use crate::dataset::Dataset;
use crate::error::PipelineError;
use crate::metrics::PipelineMetrics;

/// A job as this worker makes it: its id and a fingerprint of its spec and dataset, so that a
/// job id reused by a coordinator that lost its state never gets another job's pipeline.
type JobKey = (JobId, u64);

fn job_key(grant: &ChunkGrant) -> JobKey {
    let identity = format!("{:?}|{}|{}", grant.spec, grant.manifest, grant.dataset_version);
    (grant.chunk.job, xxhash_rust::xxh3::xxh3_64(identity.as_bytes()))
}

/// A job's pipeline, made once by whichever chunk needs it first.
#[derive(Debug)]
struct JobSlot {
    pipeline: Arc<OnceCell<Arc<JobPipeline>>>,
    last_used: Instant,
}

/// A dataset, opened once by whichever job needs it first.
type DatasetSlot = Arc<OnceCell<Arc<Dataset>>>;

/// How many batch buffers of `batch_bytes` a job's pipeline gets: `in_flight`, fewer if they
/// would not fit in `budget`, none if a single batch does not.
pub(crate) fn buffers_within(budget: u64, batch_bytes: u64, in_flight: usize) -> usize {
    usize::try_from(budget / batch_bytes.max(1)).unwrap_or(usize::MAX).min(in_flight)
}

/// The bytes of one batch of `grant`'s job (batch size × the bytes of one output sample).
pub(crate) fn batch_bytes(grant: &ChunkGrant) -> Result<u64, PipelineError> {
    let recipe = stoker_plan::transform::Recipe::new(&grant.spec.transforms).map_err(|error| PipelineError::Start(error.to_string()))?;
    Ok(u64::from(grant.spec.plan.batch_size.get()).saturating_mul(recipe.sample_bytes() as u64))
}

/// The pipelines, datasets and refused jobs of one worker.
pub(crate) struct JobTable {
    config: WorkerConfig,
    /// Where every pipeline's finished batches go.
    made_tx: mpsc::Sender<Made>,
    metrics: PipelineMetrics,
    jobs: Mutex<HashMap<JobKey, JobSlot>>,
    /// Datasets by (manifest path, version).
    datasets: Mutex<HashMap<(String, u64), DatasetSlot>>,
    /// Object-store clients (datasets in S3).
    stores: Arc<ObjectStores>,
    /// The shard cache, where this worker has one (`--cache-dir`).
    cache_opt: Option<Arc<ShardCache>>,
    /// Jobs whose batches do not fit this worker's batch memory, or whose data is outside its
    /// `--dataset-root`: reported stuck with every heartbeat, so that the coordinator grants
    /// them to other workers.
    /// Each with the reason, for `stoker status`.
    unmakeable: Mutex<BTreeMap<JobId, String>>,
}

impl JobTable {
    /// No jobs yet; pipelines are made as `config` says, send what they make to `made_tx` and
    /// count into `metrics`.
    pub(crate) fn new(
        config: WorkerConfig,
        made_tx: mpsc::Sender<Made>,
        metrics: PipelineMetrics,
        stores: Arc<ObjectStores>,
        cache_opt: Option<Arc<ShardCache>>,
    ) -> Self {
        Self {
            config,
            stores,
            cache_opt,
            made_tx,
            metrics,
            jobs: Mutex::new(HashMap::new()),
            datasets: Mutex::new(HashMap::new()),
            unmakeable: Mutex::default(),
        }
    }

    /// The shard cache, where this worker has one.
    pub(crate) fn cache(&self) -> Option<&Arc<ShardCache>> {
        self.cache_opt.as_ref()
    }

    /// Job pipelines held now.
    pub(crate) fn len(&self) -> usize {
        self.jobs.lock().len()
    }

    /// Drop every pipeline (the worker stops).
    pub(crate) fn clear(&self) {
        self.jobs.lock().clear();
    }

    /// Refuse `job` here for `reason` (it cannot be made on this worker), logged the first time.
    pub(crate) fn refuse(&self, job: JobId, reason: &str) {
        if self.unmakeable.lock().insert(job, reason.to_owned()).is_none() {
            warn!(%job, %reason, "job refused");
        }
    }

    /// The jobs refused here with their reasons, to report stuck.
    pub(crate) fn refused(&self) -> Vec<StuckJob> {
        self.unmakeable.lock().iter().map(|(job, reason)| StuckJob::new(*job, reason)).collect()
    }

    /// Forget the refusals of jobs not in `live_jobs` (they ended).
    pub(crate) fn keep_refused(&self, live_jobs: &[JobId]) {
        self.unmakeable.lock().retain(|job, _| live_jobs.contains(job));
    }

    /// The pipeline of `grant`'s job, started (on a blocking thread, after opening its dataset
    /// the same way) if this worker has none, or if its last one stopped. Holds no lock while
    /// it waits.
    pub(crate) async fn pipeline(&self, grant: &ChunkGrant) -> Result<Arc<JobPipeline>, String> {
        let key = job_key(grant);
        let cell = {
            let mut jobs = self.jobs.lock();
            let slot = jobs.entry(key).or_insert_with(|| JobSlot { pipeline: Arc::default(), last_used: Instant::now() });
            if slot.pipeline.get().is_some_and(|pipeline| pipeline.is_dead()) {
                slot.pipeline = Arc::default();
            }
            slot.last_used = Instant::now();
            Arc::clone(&slot.pipeline)
        };
        let pipeline = cell
            .get_or_try_init(|| async {
                let dataset = self.dataset(grant).await?;
                let (grant, config, made_tx) = (grant.clone(), self.config.clone(), self.made_tx.clone());
                let metrics = Some(PipelineMetrics { timed: self.config.time_samples, ..self.metrics.clone() });
                let started = tokio::task::spawn_blocking(move || {
                    // Fewer buffers for large batches, so that the job's stay within the budget.
                    let buffers = buffers_within(config.max_batch_memory, batch_bytes(&grant)?, config.in_flight);
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

    /// The dataset of `grant`, opened on a blocking thread if this worker has not opened it,
    /// and refused if its manifest is not the version the job was created with.
    async fn dataset(&self, grant: &ChunkGrant) -> Result<Arc<Dataset>, String> {
        let cell = {
            let mut datasets = self.datasets.lock();
            Arc::clone(datasets.entry((grant.manifest.clone(), grant.dataset_version)).or_default())
        };
        if ObjectUri::is_object_uri(&grant.manifest) {
            let dataset = cell.get_or_try_init(|| self.open_remote(grant)).await?;
            return Ok(Arc::clone(dataset));
        }
        let dataset = cell
            .get_or_try_init(|| async {
                let (path, version) = (std::path::PathBuf::from(&grant.manifest), grant.dataset_version);
                let (roots, hook) = (self.config.dataset_roots.clone(), self.config.before_dataset_open);
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
                        // Never made here: reported stuck with every heartbeat, so that workers
                        // whose roots hold it make it.
                        if is_outside_roots(&error) {
                            self.refuse(grant.chunk.job, &format!("its data is outside this worker's --dataset-root: {error}"));
                        }
                        Err(error.to_string())
                    }
                }
            })
            .await?;
        Ok(Arc::clone(dataset))
    }

    /// A dataset in an object store: its manifest read once (and checked against the version
    /// the job was created with), its shards mapped later, as chunks need them, by the cache.
    async fn open_remote(&self, grant: &ChunkGrant) -> Result<Arc<Dataset>, String> {
        let refuse = |reason: String| {
            self.refuse(grant.chunk.job, &reason);
            reason
        };
        if self.cache_opt.is_none() {
            return Err(refuse(format!(
                "{} is in an object store and this worker has no shard cache: start it with --cache-dir and --cache-size",
                grant.manifest
            )));
        }
        let uri = ObjectUri::parse(&grant.manifest).map_err(|error| error.to_string())?;
        if let Err(error) = self.stores.roots().check(&uri) {
            return Err(refuse(error.to_string()));
        }
        let bytes = self.stores.read(&uri, MAX_OBJECT_READ_BYTES).await.map_err(|error| error.to_string())?;
        let version = xxhash_rust::xxh3::xxh3_64(&bytes).max(1);
        if grant.dataset_version != 0 && version != grant.dataset_version {
            return Err(format!(
                "{uri}: the manifest changed since the job was created (version {version:016x}, the job's {:016x}): \
                 add the dataset again under a new name",
                grant.dataset_version
            ));
        }
        let text = std::str::from_utf8(&bytes).map_err(|_| format!("{uri}: the manifest is not UTF-8 text"))?;
        let manifest = Manifest::parse(text, std::path::Path::new(&grant.manifest)).map_err(|error| error.to_string())?;
        let mut shard_uris = Vec::with_capacity(manifest.shards.len());
        for shard in &manifest.shards {
            let resolved = uri.resolve_shard(&shard.uri).map_err(|error| error.to_string())?;
            if let Err(error) = self.stores.roots().check(&resolved) {
                return Err(refuse(error.to_string()));
            }
            shard_uris.push(resolved.to_string());
        }
        let dataset = Dataset::remote(manifest, version, &grant.manifest, shard_uris).map_err(|error| error.to_string())?;
        info!(manifest = %uri, shards = dataset.table().shards(), "dataset in an object store opened");
        Ok(Arc::new(dataset))
    }

    /// Release the pipelines of jobs that have nothing in flight here (by `ledger`) and either
    /// have had no work for the idle time or are not in `live_jobs_opt` (the coordinator's
    /// list of jobs that may still need work), and the datasets no pipeline uses any more.
    pub(crate) fn release_idle(&self, ledger: &LeaseLedger, live_jobs_opt: Option<&[JobId]>) {
        let now = Instant::now();
        let mut released = Vec::new();
        self.jobs.lock().retain(|(job, _), slot| {
            let idle = now.saturating_duration_since(slot.last_used) >= self.config.job_idle;
            let ended = live_jobs_opt.is_some_and(|live| !live.contains(job));
            // A chunk task holding the cell is starting the pipeline or about to submit to it.
            let in_use = Arc::strong_count(&slot.pipeline) > 1;
            let keep = ledger.job_busy(*job) || in_use || !(idle || ended);
            if !keep {
                released.extend(slot.pipeline.get().cloned());
            }
            keep
        });
        for pipeline in &released {
            info!(job = %pipeline.job(), "job pipeline released (idle or ended)");
        }
        // Dropping the last reference closes the pipeline's channels; its threads end and free
        // their buffers on their own (no join here, on an async thread).
        drop(released);
        self.datasets.lock().retain(|_, cell| cell.get().is_none_or(|dataset| Arc::strong_count(dataset) > 1));
    }
}

/// Whether `error` says a manifest or shard is outside the worker's `--dataset-root`.
fn is_outside_roots(error: &PipelineError) -> bool {
    matches!(error, PipelineError::Shard(ShardError::Confined { reason, .. }) if reason.contains("--dataset-root"))
}

#[cfg(test)]
mod tests {
    use super::buffers_within;

    #[test]
    fn large_batches_get_fewer_buffers_and_one_over_the_budget_none() {
        assert_eq!(buffers_within(1000, 100, 4), 4, "room for 10: in-flight's 4");
        assert_eq!(buffers_within(250, 100, 4), 2);
        assert_eq!(buffers_within(150, 100, 4), 1);
        assert_eq!(buffers_within(99, 100, 4), 0, "one batch does not fit");
        assert_eq!(buffers_within(u64::MAX, 0, 4), 4);
    }
}
