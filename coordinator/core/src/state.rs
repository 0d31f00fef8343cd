//! The coordinator's durable state (DESIGN §6): datasets, jobs and checkpoints, changed only by
//! applying [`Command`]s. `apply` is pure and deterministic, so the same command log gives
//! the same state on every replica: this is what Raft will replicate, and what the
//! single-node store replays after a restart.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use stoker_plan::Checkpoint;
use stoker_plan::ids::{CertKey, JobId, Rank, SessionId};
use stoker_proto::{DatasetInfo, JobSpec};

use crate::state_budget;

/// Version of [`Command`] and [`ClusterState`] as persisted; bump when a field changes meaning.
pub const STATE_VERSION: u32 = 1;

/// A change to the durable state (a log entry).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "command", rename_all = "snake_case")]
pub enum Command {
    /// Register a dataset, replacing one of the same name.
    AddDataset {
        /// The dataset.
        dataset: DatasetInfo,
        /// `--max-state-bytes` as it was checked, checked again when the entry is applied (two
        /// adds at once cannot both pass); absent in entries written before.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        max_state_bytes: Option<u64>,
    },
    /// Create a job with the next job id.
    CreateJob {
        /// Its spec.
        spec: JobSpec,
        /// The certificate of the trainer whose attach created it (counted against
        /// `--max-jobs-per-certificate`); absent in entries written before it was recorded,
        /// and under `--insecure`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        creator: Option<CertKey>,
        /// The limits it was checked against, checked again when the entry is applied: two
        /// creations checked against the same state (attaches at once) cannot both pass.
        /// Absent in entries written before, which apply unchecked.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        bounds: Option<JobBounds>,
    },
    /// Record how far every rank of a job has consumed.
    RecordCheckpoint {
        /// The job.
        job: JobId,
        /// Where it stands.
        checkpoint: Checkpoint,
    },
    /// Forget a job: its spec, its dataset binding and its checkpoint (`stoker job rm`, or no
    /// trainer for the coordinator's job TTL). Its id is never given again.
    RemoveJob {
        /// The job.
        job: JobId,
    },
    /// Record where several jobs stand: progress reports coalesced by the leader into one
    /// entry per flush (DESIGN §6: bounded Raft writes however many ranks report).
    RecordCheckpoints {
        /// Job and checkpoint.
        checkpoints: Vec<(JobId, Checkpoint)>,
    },
    /// A job cannot go on (a sample fails and its transforms say `on_error=fail`): its
    /// trainers are refused with `reason` until one attaches again.
    FailJob {
        /// The job.
        job: JobId,
        /// What failed, naming the shard and the key.
        reason: String,
    },
    /// A trainer attached to a failed job: try again.
    ClearFailure {
        /// The job.
        job: JobId,
    },
    /// A coordinator node took part in the cluster (the leader saw its log match): a later
    /// start of that node id on an empty data directory is refused.
    NodeJoined {
        /// Its node id.
        id: u64,
    },
    /// A coordinator node left the cluster (`stoker cluster remove-node`): its id may start
    /// afresh.
    NodeLeft {
        /// Its node id.
        id: u64,
    },
    /// Replace the whole state: the import of a data directory written by the single-node
    /// store of earlier versions (`commands.jsonl`, `state.json`).
    Import {
        /// The state imported.
        state: Box<ClusterState>,
    },
    /// A trainer with certificate `key` attached as `rank` of `job` and got `session`: after a
    /// fail-over, only that session is adopted for the rank, and only from that certificate
    /// (sessions themselves are soft state). Appended last.
    RecordSession {
        /// The job.
        job: JobId,
        /// The rank.
        rank: Rank,
        /// Its newest session.
        session: SessionId,
        /// The certificate that attached.
        key: CertKey,
    },
    /// The trainer of `session` detached: its rank's record goes, if it is still that
    /// session's (a newer one's stays). Appended last.
    ForgetSession {
        /// The job.
        job: JobId,
        /// The rank.
        rank: Rank,
        /// The session that detached.
        session: SessionId,
    },
}

/// The limits a new job is created under (`--max-jobs`, `--max-jobs-per-certificate`,
/// `--max-state-bytes` of the leader that logged it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobBounds {
    /// Jobs kept at most.
    pub max_jobs: usize,
    /// Jobs one certificate's attaches may have created among those kept.
    pub max_jobs_per_certificate: usize,
    /// What the state's charges may add up to ([`crate::state_budget`]).
    pub max_state_bytes: u64,
}

/// What a command did.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Applied {
    /// Nothing beyond the state change.
    Done,
    /// The job created.
    JobCreated(JobId),
    /// Not applied, and why (an `Import` anywhere but at a single node's first start).
    Refused(String),
}

/// Datasets, jobs and checkpoints.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterState {
    /// Format version.
    pub version: u32,
    /// Datasets by name.
    pub datasets: BTreeMap<String, DatasetInfo>,
    /// Jobs by id.
    pub jobs: BTreeMap<JobId, JobSpec>,
    /// The dataset each job was created with, as it was then (name, manifest, shard counts,
    /// version): a job keeps planning over it when the name is re-added with other data. Jobs
    /// created before this was recorded have no entry and use the dataset of their name.
    #[serde(default)]
    pub job_datasets: BTreeMap<JobId, DatasetInfo>,
    /// Last checkpoint of each job.
    pub checkpoints: BTreeMap<JobId, Checkpoint>,
    /// The id the next job gets.
    pub next_job: u64,
    /// Jobs that cannot go on, with the reason.
    #[serde(default)]
    pub failed: BTreeMap<JobId, String>,
    /// Coordinator node ids that took part in the cluster.
    #[serde(default)]
    pub nodes_joined: BTreeSet<u64>,
    /// Whether the single-node store of an earlier version was imported (it never is twice).
    #[serde(default)]
    pub imported_legacy: bool,
    /// Each rank's newest session and the certificate that attached for it (mutual TLS only).
    #[serde(default)]
    pub sessions: BTreeMap<JobId, BTreeMap<Rank, (SessionId, CertKey)>>,
    /// The certificate whose attach created each job (mutual TLS only; jobs created before
    /// this was recorded have no entry).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub job_creators: BTreeMap<JobId, CertKey>,
}

impl ClusterState {
    /// An empty state.
    pub fn new() -> Self {
        Self { version: STATE_VERSION, next_job: 1, ..Self::default() }
    }

    /// Apply one command. Never fails: commands are validated before they are logged.
    pub fn apply(&mut self, command: Command) -> Applied {
        match command {
            Command::AddDataset { dataset, max_state_bytes } => {
                let replacing = self.datasets.get(&dataset.name);
                if let Some(limit) = max_state_bytes
                    && let Err(reason) = state_budget::dataset_over(self, &dataset, replacing, limit)
                {
                    return Applied::Refused(reason);
                }
                self.datasets.insert(dataset.name.clone(), dataset);
                Applied::Done
            }
            Command::CreateJob { spec, creator, bounds } => {
                // Two trainers may ask for the same new job at once: the first entry creates it.
                if self.job_named(&spec.name).is_some() {
                    return Applied::Done;
                }
                if let Some(bounds) = bounds
                    && let Err(reason) = state_budget::job_over(self, &spec, self.datasets.get(&spec.dataset), creator, &bounds)
                {
                    return Applied::Refused(reason);
                }
                let id = JobId(self.next_job);
                self.next_job += 1;
                // Bound here, deterministically: the dataset of that name as the log has it now.
                if let Some(dataset) = self.datasets.get(&spec.dataset) {
                    self.job_datasets.insert(id, dataset.clone());
                }
                self.jobs.insert(id, spec);
                if let Some(creator) = creator {
                    self.job_creators.insert(id, creator);
                }
                Applied::JobCreated(id)
            }
            Command::RecordCheckpoint { job, checkpoint } => {
                // A checkpoint of a job removed meanwhile is dropped with it.
                if self.jobs.contains_key(&job) {
                    self.checkpoints.insert(job, checkpoint);
                }
                Applied::Done
            }
            Command::RemoveJob { job } => {
                self.jobs.remove(&job);
                self.job_datasets.remove(&job);
                self.checkpoints.remove(&job);
                self.failed.remove(&job);
                self.sessions.remove(&job);
                self.job_creators.remove(&job);
                Applied::Done
            }
            Command::RecordCheckpoints { checkpoints } => {
                for (job, checkpoint) in checkpoints {
                    self.apply(Command::RecordCheckpoint { job, checkpoint });
                }
                Applied::Done
            }
            Command::FailJob { job, reason } => {
                if self.jobs.contains_key(&job) {
                    self.failed.entry(job).or_insert(reason);
                }
                Applied::Done
            }
            Command::ClearFailure { job } => {
                self.failed.remove(&job);
                Applied::Done
            }
            Command::NodeJoined { id } => {
                self.nodes_joined.insert(id);
                Applied::Done
            }
            Command::NodeLeft { id } => {
                self.nodes_joined.remove(&id);
                Applied::Done
            }
            Command::Import { state } => {
                *self = *state;
                self.imported_legacy = true;
                Applied::Done
            }
            Command::RecordSession { job, rank, session, key } => {
                if self.jobs.contains_key(&job) {
                    let ranks = self.sessions.entry(job).or_default();
                    // A late entry never takes the rank back from a newer session.
                    if ranks.get(&rank).is_none_or(|(recorded, _)| *recorded <= session) {
                        ranks.insert(rank, (session, key));
                    }
                }
                Applied::Done
            }
            Command::ForgetSession { job, rank, session } => {
                if let Some(ranks) = self.sessions.get_mut(&job) {
                    if ranks.get(&rank).is_some_and(|(recorded, _)| *recorded == session) {
                        ranks.remove(&rank);
                    }
                    if ranks.is_empty() {
                        self.sessions.remove(&job);
                    }
                }
                Applied::Done
            }
        }
    }

    /// The dataset `job` plans over: the one it was created with.
    pub fn job_dataset(&self, job: JobId) -> Option<&DatasetInfo> {
        let spec = self.jobs.get(&job)?;
        self.job_datasets.get(&job).or_else(|| self.datasets.get(&spec.dataset))
    }

    /// How many kept jobs `key`'s attaches created.
    pub fn jobs_created_by(&self, key: CertKey) -> usize {
        self.job_creators.values().filter(|creator| **creator == key).count()
    }

    /// The job named `name`, if any.
    pub fn job_named(&self, name: &str) -> Option<(JobId, &JobSpec)> {
        self.jobs.iter().find(|(_, spec)| spec.name == name).map(|(id, spec)| (*id, spec))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::num::NonZeroU32;

    use stoker_plan::ids::{Epoch, Position};
    use stoker_plan::transform::TransformSpec;
    use stoker_plan::{PlanSpec, Shuffle, Tail};

    use super::*;

    pub(crate) fn spec(name: &str) -> JobSpec {
        JobSpec {
            name: name.to_owned(),
            dataset: "train".to_owned(),
            plan: PlanSpec {
                seed: 1,
                world_size: NonZeroU32::MIN,
                batch_size: NonZeroU32::MIN,
                shuffle: Shuffle::Full,
                tail: Tail::Partial,
            },
            transforms: TransformSpec::new(Vec::new()),
            prefetch: 4,
        }
    }

    #[test]
    fn replaying_the_same_commands_gives_the_same_state() {
        let commands = vec![
            Command::AddDataset {
                dataset: DatasetInfo { name: "train".into(), manifest: "/m.json".into(), shard_counts: vec![3, 4], version: 11 },
                max_state_bytes: None,
            },
            Command::CreateJob { spec: spec("a"), creator: None, bounds: None },
            Command::CreateJob { spec: spec("b"), creator: None, bounds: None },
            Command::RecordCheckpoint {
                job: JobId(2),
                checkpoint: Checkpoint { version: 1, epoch: Epoch(3), position: Position(9), order_fingerprint: 7 },
            },
        ];
        let mut first = ClusterState::new();
        let mut second = ClusterState::new();
        let applied: Vec<_> = commands.iter().cloned().map(|command| first.apply(command)).collect();
        commands.into_iter().for_each(|command| {
            second.apply(command);
        });
        assert_eq!(first, second);
        assert_eq!(applied[1], Applied::JobCreated(JobId(1)));
        assert_eq!(applied[2], Applied::JobCreated(JobId(2)));
        assert_eq!(first.job_named("b").map(|(id, _)| id), Some(JobId(2)));
        assert_eq!(first.checkpoints[&JobId(2)].position, Position(9));
        assert_eq!(first.job_dataset(JobId(1)).map(|dataset| dataset.version), Some(11));
    }

    /// Issue 16, item 7: a removed job is gone with its checkpoint and dataset binding; a
    /// checkpoint logged after the removal (a report in flight) does not bring it back, and
    /// its id is never given again.
    #[test]
    fn a_removed_job_takes_its_checkpoint_along_and_its_id_is_not_reused() {
        let mut state = ClusterState::new();
        state.apply(Command::AddDataset {
            dataset: DatasetInfo { name: "train".into(), manifest: "/m.json".into(), shard_counts: vec![3], version: 1 },
            max_state_bytes: None,
        });
        state.apply(Command::CreateJob { spec: spec("a"), creator: None, bounds: None });
        let checkpoint = Checkpoint { version: 1, epoch: Epoch(0), position: Position(2), order_fingerprint: 7 };
        state.apply(Command::RecordCheckpoint { job: JobId(1), checkpoint });
        state.apply(Command::RemoveJob { job: JobId(1) });
        state.apply(Command::RecordCheckpoint { job: JobId(1), checkpoint });
        assert!(state.jobs.is_empty() && state.checkpoints.is_empty() && state.job_datasets.is_empty(), "{state:?}");
        assert_eq!(state.apply(Command::CreateJob { spec: spec("a"), creator: None, bounds: None }), Applied::JobCreated(JobId(2)));
    }

    /// A job keeps the dataset it was created with when the name is registered again with
    /// other data (issue 15, item 8): its checkpoints and its trainers' plans refer to it.
    #[test]
    fn a_job_stays_bound_to_the_dataset_version_it_was_created_with() {
        let info = |manifest: &str, counts: Vec<u64>, version: u64| DatasetInfo {
            name: "train".into(),
            manifest: manifest.into(),
            shard_counts: counts,
            version,
        };
        let mut state = ClusterState::new();
        state.apply(Command::AddDataset { dataset: info("/a.json", vec![3], 1), max_state_bytes: None });
        state.apply(Command::CreateJob { spec: spec("a"), creator: None, bounds: None });
        state.apply(Command::AddDataset { dataset: info("/b.json", vec![5, 5], 2), max_state_bytes: None });
        state.apply(Command::CreateJob { spec: spec("b"), creator: None, bounds: None });
        assert_eq!(state.job_dataset(JobId(1)), Some(&info("/a.json", vec![3], 1)));
        assert_eq!(state.job_dataset(JobId(2)), Some(&info("/b.json", vec![5, 5], 2)));
        let old_snapshot = r#"{"version":1,"datasets":{},"jobs":{},"checkpoints":{},"next_job":1}"#;
        assert!(serde_json::from_str::<ClusterState>(old_snapshot).is_ok(), "snapshots from before the binding still load");
    }

    #[test]
    fn the_persisted_form_is_pinned() {
        let command = Command::CreateJob { spec: spec("a"), creator: None, bounds: None };
        let json = serde_json::to_string(&command).expect("serialises");
        assert_eq!(
            json,
            r#"{"command":"create_job","spec":{"name":"a","dataset":"train","plan":{"seed":1,"world_size":1,"batch_size":1,"shuffle":"full","tail":"partial"},"transforms":"{\"transforms\":[],\"layout\":\"NHWC\",\"dct_scaling\":true,\"on_error\":\"replace\",\"max_image_pixels\":89478485}","prefetch":4}}"#
        );
        assert_eq!(serde_json::from_str::<Command>(&json).expect("parses"), command);
        // The transform spec is the JSON text a trainer sent (defaults left out) in entries
        // written before the field was typed: they read the same.
        let written_before = r#"{"command":"create_job","spec":{"name":"a","dataset":"train","plan":{"seed":1,"world_size":1,"batch_size":1,"shuffle":"full","tail":"partial"},"transforms":"{\"transforms\": []}","prefetch":4}}"#;
        assert_eq!(serde_json::from_str::<Command>(written_before).expect("parses"), command);
    }

    /// Issue 31, item 2: the commands added for bounded state keep their form, and an entry
    /// written before a job's creator was recorded reads as created by nobody.
    #[test]
    fn the_bounded_state_commands_are_pinned() {
        let forget = Command::ForgetSession { job: JobId(2), rank: Rank(3), session: SessionId(4) };
        let json = serde_json::to_string(&forget).expect("serialises");
        assert_eq!(json, r#"{"command":"forget_session","job":2,"rank":3,"session":4}"#);
        assert_eq!(serde_json::from_str::<Command>(&json).expect("parses"), forget);
        let created = Command::CreateJob { spec: spec("a"), creator: Some(CertKey([7; 32])), bounds: None };
        let json = serde_json::to_string(&created).expect("serialises");
        assert!(json.ends_with(r#""creator":[7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7]}"#), "{json}");
        assert_eq!(serde_json::from_str::<Command>(&json).expect("parses"), created);
        let mut state = ClusterState::new();
        state.apply(created);
        assert_eq!(state.jobs_created_by(CertKey([7; 32])), 1);
        let snapshot = serde_json::to_string(&state).expect("serialises");
        assert_eq!(serde_json::from_str::<ClusterState>(&snapshot).expect("parses"), state);
    }

    /// Issue 31, item 2 (a review finding): attaches that arrive at once are all checked against
    /// the same state before any creation applies; the limits travel in the entries, so every
    /// replica refuses the creations past them, in log order.
    #[test]
    fn creations_checked_against_the_same_state_cannot_all_pass() {
        let mut state = ClusterState::new();
        let dataset = DatasetInfo { name: "train".into(), manifest: "/m.json".into(), shard_counts: vec![3], version: 1 };
        state.apply(Command::AddDataset { dataset: dataset.clone(), max_state_bytes: None });
        let key = CertKey([9; 32]);
        let bounds = JobBounds { max_jobs: 100, max_jobs_per_certificate: 2, max_state_bytes: 1 << 30 };
        let create = |name: &str| Command::CreateJob { spec: spec(name), creator: Some(key), bounds: Some(bounds) };
        let applied: Vec<Applied> = ["a", "b", "c"].into_iter().map(|name| state.apply(create(name))).collect();
        assert_eq!(applied[..2], [Applied::JobCreated(JobId(1)), Applied::JobCreated(JobId(2))]);
        assert!(matches!(&applied[2], Applied::Refused(reason) if reason.contains("--max-jobs-per-certificate 2")), "{applied:?}");
        assert_eq!(state.jobs.len(), 2);
        // The state limit: the third job's charge does not fit.
        let charged = state_budget::state_bytes(&state);
        let tight = JobBounds { max_jobs: 100, max_jobs_per_certificate: 100, max_state_bytes: charged + 1 };
        let refused = state.apply(Command::CreateJob { spec: spec("d"), creator: None, bounds: Some(tight) });
        assert!(matches!(&refused, Applied::Refused(reason) if reason.contains("--max-state-bytes")), "{refused:?}");
        let total = JobBounds { max_jobs: 2, ..tight };
        assert!(matches!(state.apply(Command::CreateJob { spec: spec("e"), creator: None, bounds: Some(total) }), Applied::Refused(_)));
        // A dataset add over the limit, too; one that replaces a record of its size fits.
        let larger = DatasetInfo { name: "other".into(), shard_counts: vec![1; 1000], ..dataset.clone() };
        let limit = state_budget::state_bytes(&state) + 100;
        assert!(matches!(state.apply(Command::AddDataset { dataset: larger, max_state_bytes: Some(limit) }), Applied::Refused(_)));
        let again = Command::AddDataset { dataset: DatasetInfo { version: 2, ..dataset }, max_state_bytes: Some(limit) };
        assert_eq!(state.apply(again), Applied::Done);
        assert!(!state.datasets.contains_key("other"));
        // Entries written before the limits travelled in them apply as they always did.
        let old = r#"{"command":"create_job","spec":{"name":"f","dataset":"train","plan":{"seed":1,"world_size":1,"batch_size":1,"shuffle":"full","tail":"partial"},"transforms":"{\"transforms\": []}","prefetch":4}}"#;
        assert_eq!(state.apply(serde_json::from_str(old).expect("parses")), Applied::JobCreated(JobId(3)));
    }
}
