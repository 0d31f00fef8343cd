//! What the replicated state may hold (issue 31, item 2): every kept job and dataset is charged
//! the most bytes it can take in a snapshot, and a new one is refused when the charges would go
//! over `--max-state-bytes`. A job is charged its sessions up front (one record per rank of its
//! world size, whether or not the rank ever attaches), so attaches never grow the state past
//! what its creation was charged for. The charges are upper bounds of the JSON a snapshot
//! holds (`charges_cover_what_a_snapshot_holds` checks them), computed in O(1) per job and
//! dataset from fields the state keeps, so a check costs O(jobs + datasets).

use stoker_plan::ids::CertKey;
use stoker_proto::{DatasetInfo, JobSpec, RemoteError};

use crate::config::CoreConfig;
use crate::errors::invalid;
use crate::state::{ClusterState, JobBounds};

/// The most one rank's session record takes: `"16383":[u64,[32 bytes as numbers]]` is at most
/// 163 bytes of JSON.
pub const SESSION_RECORD_BYTES: u64 = 192;

/// The most a job takes besides its dataset binding and its sessions: its spec (a transform
/// spec of at most 16 KiB, escaped once more inside the entry: 32 KiB; names of at most 256
/// bytes), its checkpoint, creator, failure reason (at most 1 KiB, escaped up to 6 KiB) and map keys.
pub const JOB_BYTES: u64 = 48 << 10;

/// What the state holds besides jobs and datasets (version, counters, nodes joined).
const FIXED_BYTES: u64 = 4 << 10;

/// The most a dataset record takes: its name and manifest URI (escaped: up to 6 bytes a
/// byte), its version, and 21 bytes per shard count (a u64 and a comma).
pub fn dataset_bytes(dataset: &DatasetInfo) -> u64 {
    let text = (dataset.name.len() + dataset.manifest.len()) as u64;
    128 + 6 * text + 21 * dataset.shard_counts.len() as u64
}

/// The most a job takes: [`JOB_BYTES`], its copy of its dataset, and a session record for
/// every rank.
pub fn job_bytes(spec: &JobSpec, dataset: Option<&DatasetInfo>) -> u64 {
    JOB_BYTES + dataset.map_or(0, dataset_bytes) + u64::from(spec.plan.world_size.get()) * SESSION_RECORD_BYTES
}

/// The most the state's JSON takes: the charges of everything it keeps.
pub fn state_bytes(state: &ClusterState) -> u64 {
    let datasets: u64 = state.datasets.values().map(dataset_bytes).sum();
    let jobs: u64 = state.jobs.iter().map(|(id, spec)| job_bytes(spec, state.job_datasets.get(id))).sum();
    FIXED_BYTES + datasets + jobs
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / f64::from(1 << 20)
}

/// Refuse a new job (of `spec`, over `dataset`, asked for by `caller`) that would take the
/// state over `--max-state-bytes`, or `caller`'s jobs over `--max-jobs-per-certificate`.
pub(crate) fn check_new_job(
    state: &ClusterState,
    spec: &JobSpec,
    dataset: &DatasetInfo,
    caller: CertKey,
    config: &CoreConfig,
) -> Result<(), RemoteError> {
    job_over(state, spec, Some(dataset), (caller != CertKey::UNCHECKED).then_some(caller), &JobBounds::of(config)).map_err(invalid)
}

impl JobBounds {
    /// The limits `config` sets.
    pub fn of(config: &CoreConfig) -> Self {
        Self {
            max_jobs: config.max_jobs,
            max_jobs_per_certificate: config.max_jobs_per_certificate,
            max_state_bytes: config.max_state_bytes,
        }
    }
}

/// Why a job of `spec` over `dataset`, created by `creator` (none under `--insecure`: there
/// is no certificate to count by, and the total limits alone apply), would go over `bounds`,
/// if it would. Pure: the leader checks it before logging the creation, and every replica
/// again when it applies it.
pub fn job_over(
    state: &ClusterState,
    spec: &JobSpec,
    dataset: Option<&DatasetInfo>,
    creator: Option<CertKey>,
    bounds: &JobBounds,
) -> Result<(), String> {
    let jobs = state.jobs.len();
    if jobs >= bounds.max_jobs {
        return Err(format!(
            "the coordinator keeps {jobs} jobs, its limit (--max-jobs {}): remove finished ones with `stoker job rm`, or raise it",
            bounds.max_jobs
        ));
    }
    if let Some(creator) = creator {
        let created = state.jobs_created_by(creator);
        if created >= bounds.max_jobs_per_certificate {
            return Err(format!(
                "this certificate created {created} of the jobs the coordinator keeps, its limit (--max-jobs-per-certificate {}): \
                 remove finished ones with `stoker job rm`, or raise the limit",
                bounds.max_jobs_per_certificate
            ));
        }
    }
    let held = state_bytes(state);
    let wanted = job_bytes(spec, dataset);
    if held.saturating_add(wanted) > bounds.max_state_bytes {
        return Err(format!(
            "a job of world size {} takes up to {:.1} MiB of the replicated state (its sessions, {SESSION_RECORD_BYTES} B a \
             rank, and its dataset record), and the state holds up to {:.1} MiB of its limit of {:.1} MiB \
             (--max-state-bytes): remove finished jobs with `stoker job rm`, or raise the limit",
            spec.plan.world_size,
            mib(wanted),
            mib(held),
            mib(bounds.max_state_bytes)
        ));
    }
    Ok(())
}

/// Refuse a dataset that would take the state over `--max-state-bytes` (`replacing`: the
/// record of that name it replaces, if any).
pub(crate) fn check_new_dataset(
    state: &ClusterState,
    dataset: &DatasetInfo,
    replacing: Option<&DatasetInfo>,
    config: &CoreConfig,
) -> Result<(), RemoteError> {
    dataset_over(state, dataset, replacing, config.max_state_bytes).map_err(invalid)
}

/// Why `dataset` (replacing `replacing`) would take the state over `max_state_bytes`, if it
/// would. Pure, as [`job_over`].
pub fn dataset_over(
    state: &ClusterState,
    dataset: &DatasetInfo,
    replacing: Option<&DatasetInfo>,
    max_state_bytes: u64,
) -> Result<(), String> {
    let held = state_bytes(state).saturating_sub(replacing.map_or(0, dataset_bytes));
    let wanted = dataset_bytes(dataset);
    if held.saturating_add(wanted) > max_state_bytes {
        return Err(format!(
            "dataset {:?} ({} shards) takes up to {:.1} MiB of the replicated state, and the state holds up to {:.1} MiB of \
             its limit of {:.1} MiB (--max-state-bytes): remove finished jobs with `stoker job rm`, or raise the limit",
            dataset.name,
            dataset.shard_counts.len(),
            mib(wanted),
            mib(held),
            mib(max_state_bytes)
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::num::NonZeroU32;

    use stoker_plan::Checkpoint;
    use stoker_plan::ids::{Epoch, JobId, Position, Rank, SessionId};
    use stoker_plan::transform::{Transform, TransformSpec};

    use super::*;
    use crate::state::Command;

    /// Every kind of record at its largest: the charges are at least the JSON a snapshot
    /// writes.
    #[test]
    fn charges_cover_what_a_snapshot_holds() {
        let long = |what: &str| format!("{what}\"\\{}", "é\u{1}".repeat(80));
        let dataset = DatasetInfo { name: long("d"), manifest: long("/m"), shard_counts: vec![u64::MAX; 300], version: u64::MAX };
        let mut state = ClusterState::new();
        state.apply(Command::AddDataset { dataset: dataset.clone(), max_state_bytes: None });
        let world_size = 300;
        for index in 0..3u32 {
            let mut spec = crate::state::tests::spec(&format!("{}{index}", long("j")));
            spec.dataset = dataset.name.clone();
            spec.plan.world_size = NonZeroU32::new(world_size).expect("nonzero");
            spec.plan.seed = u64::MAX;
            spec.plan.batch_size = NonZeroU32::MAX;
            spec.prefetch = u32::MAX;
            spec.transforms =
                TransformSpec::new(vec![Transform::Resize { shorter_side: u32::MAX, interpolation: Default::default() }; 200]);
            let transforms = serde_json::to_string(&spec.transforms).expect("json").len();
            assert!(transforms <= 16 << 10, "{transforms} bytes of transforms: a spec validation would refuse");
            state.apply(Command::CreateJob { spec, creator: Some(CertKey([255; 32])), bounds: None });
            let job = JobId(u64::from(index) + 1);
            let checkpoint =
                Checkpoint { version: u32::MAX, epoch: Epoch(u64::MAX), position: Position(u64::MAX), order_fingerprint: u64::MAX };
            state.apply(Command::RecordCheckpoint { job, checkpoint });
            state.apply(Command::FailJob { job, reason: "\u{1}".repeat(1024) });
            for rank in 0..world_size {
                state.apply(Command::RecordSession { job, rank: Rank(rank), session: SessionId(u64::MAX), key: CertKey([255; 32]) });
            }
        }
        let written = serde_json::to_vec(&state).expect("json").len() as u64;
        let charged = state_bytes(&state);
        assert!(written <= charged, "a snapshot of {written} bytes, charged {charged}");
        assert!(charged < 4 * written, "charged {charged} for {written} bytes: the bound is far too loose");
    }
}
