//! Control calls: trainers, workers and operators to the coordinator.

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

use stoker_plan::ids::{CertKey, Epoch, JobId, LeaseId, Pass, Position, Rank, SessionId, ShardId, Step, WorkerId};
use stoker_plan::transform::TransformSpec;
use stoker_plan::{Checkpoint, PlanSpec};

/// A dataset registered with the coordinator.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DatasetInfo {
    /// Its name, as trainers ask for it.
    pub name: String,
    /// Absolute path of its manifest.json, as workers open it.
    pub manifest: String,
    /// Samples per shard, in manifest order (what the epoch plan needs).
    pub shard_counts: Vec<u64>,
    /// xxh3-64 of the manifest's bytes when it was added: the dataset's version. A job is bound
    /// to the version it was created with; workers refuse to make its batches from a manifest
    /// with other bytes, and trainers check every batch header against it. 0 for a dataset
    /// registered before versions existed (not checked).
    #[serde(default)]
    pub version: u64,
}

/// What a job is: the trainers of one job attach with the same spec.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobSpec {
    /// Job name; trainers with the same name share one job.
    pub name: String,
    /// Dataset name.
    pub dataset: String,
    /// Seed, world size, per-rank batch size, shuffle and tail.
    pub plan: PlanSpec,
    /// The transforms. On the wire and on disk, their JSON text (a string, as before the field
    /// was typed: see [`stoker_plan::transform::json_text`]).
    #[serde(with = "stoker_plan::transform::json_text")]
    pub transforms: TransformSpec,
    /// Flow window: no batch is made more than this many steps ahead of the slowest rank.
    pub prefetch: u32,
}

/// A unit of work: `steps` consecutive steps of one rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Chunk {
    /// The job.
    pub job: JobId,
    /// The epoch.
    pub epoch: Epoch,
    /// First position of the epoch's plan (0, or a resumed checkpoint's position).
    pub start: Position,
    /// First step.
    pub first_step: Step,
    /// The rank.
    pub rank: Rank,
    /// Number of steps.
    pub steps: u32,
}

/// A chunk granted to a worker under a lease, with what it needs to make it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChunkGrant {
    /// The lease; report it done or failed, renew it with heartbeats.
    pub lease: LeaseId,
    /// The work.
    pub chunk: Chunk,
    /// The job's spec.
    pub spec: JobSpec,
    /// The manifest path of the job's dataset.
    pub manifest: String,
    /// The version (manifest hash) of the dataset the job was created with: the worker makes
    /// nothing from a manifest whose bytes hash otherwise (rewritten in place, or another
    /// file on this host).
    pub dataset_version: u64,
    /// The newest trainer session of the chunk's (job, rank) when it was granted: its batches
    /// go to that session's connection or a newer one, never to an older trainer that is still
    /// connected (the parent of a forked trainer), which would take them and lose the steps.
    /// `SessionId(0)` when the coordinator knows no session yet (it restarted).
    pub session: SessionId,
    /// The certificate of the trainer that owns `session`: the worker serves the chunk's
    /// batches only to a connection made with it ([`CertKey::UNCHECKED`]: any, under
    /// `--insecure` or while the coordinator knows no owner).
    pub trainer: CertKey,
    /// The shards that the steps of the same rank after this chunk read, over the next
    /// [`NEXT_CHUNKS`] chunks' worth of steps, in the order the plan reads them, at most
    /// [`MAX_NEXT_SHARDS`]: the worker fetches them ahead and keeps them cached until then. Empty
    /// for a run's last chunk.
    pub next_shards: Vec<ShardId>,
}

/// Shards of one dataset a worker's cache holds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeldShards {
    /// The dataset's version (its manifest's hash, as in [`ChunkGrant::dataset_version`]).
    pub dataset_version: u64,
    /// Its shards in the cache.
    pub shards: Vec<ShardId>,
}

/// The most shards a pull reports held ([`ControlRequest::PullChunks`]), over all datasets.
pub const MAX_HELD_SHARDS: usize = 4_096;

/// The most datasets a pull reports shards of.
pub const MAX_HELD_DATASETS: usize = 64;

/// How many chunks' worth of steps after a grant's chunk [`ChunkGrant::next_shards`] covers.
pub const NEXT_CHUNKS: u32 = 2;

/// The most shards a grant names in [`ChunkGrant::next_shards`] (a receiver ignores the rest).
pub const MAX_NEXT_SHARDS: usize = 512;

/// A lease in a heartbeat: how many of its batches the worker has finished (made and
/// delivered, or failed).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseProgress {
    /// The lease.
    pub lease: LeaseId,
    /// Its batches finished so far.
    pub finished: u32,
}

/// A job a worker makes nothing of, and why (in a heartbeat, and in [`WorkerStatus`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StuckJob {
    /// The job.
    pub job: JobId,
    /// Why, in words for an operator: the job's batches do not fit the worker's memory, its
    /// data is outside the worker's roots, its pipeline made nothing for a while. At most
    /// [`StuckJob::MAX_REASON_BYTES`] bytes.
    pub reason: String,
}

impl StuckJob {
    /// The longest reason a heartbeat may carry; a worker cuts longer ones.
    pub const MAX_REASON_BYTES: usize = 512;

    /// `job` stuck for `reason`, cut to [`Self::MAX_REASON_BYTES`] at a character boundary.
    pub fn new(job: JobId, reason: &str) -> Self {
        let mut end = reason.len().min(Self::MAX_REASON_BYTES);
        while !reason.is_char_boundary(end) {
            end -= 1;
        }
        Self { job, reason: reason[..end].to_owned() }
    }
}

/// A worker as trainers see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerInfo {
    /// Its id.
    pub id: WorkerId,
    /// Where trainers connect to receive batches.
    pub addr: SocketAddr,
    /// The certificate it registered with: a trainer takes batches only from a worker that
    /// proves it ([`CertKey::UNCHECKED`] under `--insecure`).
    pub key: CertKey,
}

/// The workers alive at the coordinator, and the version of that list: a digest of its
/// contents, never 0, the same for the same workers whichever coordinator made it. A trainer
/// names the version it holds in each progress report, and the answer carries the list only
/// when it changed (issue 35: the whole list in every answer cost O(workers) per report).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerList {
    /// The list's version (0: none, as a trainer that holds no list names it).
    pub version: u64,
    /// The workers, by id.
    pub workers: Vec<WorkerInfo>,
}

/// Samples a worker has made, and the CPU time its process has used, since it started
/// ([`ControlRequest::Heartbeat`]). CPU time rather than the decode threads' wall time: a worker
/// serving several jobs runs several pipelines' threads on the same cores, and their wall time
/// per sample would say a core makes less than it does.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Decoded {
    /// Samples decoded and transformed.
    pub samples: u64,
    /// CPU seconds (user and system, every thread: decode, delivery, TLS) its process has used;
    /// 0 where the system does not say.
    pub cpu_seconds: f64,
}

/// A request to the coordinator.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum ControlRequest {
    /// Register (or replace) a dataset by its manifest path.
    AddDataset {
        /// Name trainers will use.
        name: String,
        /// Path of a manifest.json, or of the folder holding one.
        manifest: String,
    },
    /// List datasets.
    ListDatasets,
    /// A trainer rank joins a job, creating it if it is the first.
    Attach {
        /// The job.
        spec: JobSpec,
        /// The trainer's rank.
        rank: Rank,
        /// A random id the loader drew when it was made: an attach repeated with the same id
        /// (a retry, or a copy that arrived late) gets the session it already has instead of a
        /// newer one that would supersede the loader itself.
        client: u64,
    },
    /// A rank is about to iterate `epoch` from position `start`: it needs every step of the
    /// run from `consumed` on except the ones it `holding`s, whatever was delivered before
    /// (to it or to an earlier trainer of the rank). A new `pass` starts the rank's progress
    /// in the run afresh; an open of the pass the coordinator already has is a repeat and
    /// changes nothing; an open of an older pass is stale and ignored.
    OpenEpoch {
        /// The job.
        job: JobId,
        /// The rank.
        rank: Rank,
        /// The epoch.
        epoch: Epoch,
        /// First position (0, or the checkpoint's on resume).
        start: Position,
        /// The session `Attached` gave this trainer.
        session: SessionId,
        /// This opening's number in the session (1, 2, ...).
        pass: Pass,
        /// Steps already consumed in this pass (0 for a new pass; more when the trainer opens
        /// its pass again after the coordinator lost the run).
        consumed: u64,
        /// Steps the trainer already holds (batches that arrived early), at most the job's
        /// flow window: they are not made again.
        holding: Vec<Step>,
    },
    /// A rank has consumed steps `0..consumed` of an epoch (coalesced; cheap), and has
    /// waited so long for the `missing` steps that they must have been lost after delivery:
    /// the coordinator makes those again.
    ReportProgress {
        /// The job.
        job: JobId,
        /// The rank.
        rank: Rank,
        /// The epoch.
        epoch: Epoch,
        /// First position of the epoch's plan.
        start: Position,
        /// Steps consumed.
        consumed: u64,
        /// Total seconds this rank has waited for data (the data stall).
        wait_seconds: f64,
        /// Batches this trainer process has yielded in total (every epoch; for metrics).
        batches: u64,
        /// Samples in them.
        samples: u64,
        /// The session `Attached` gave this trainer.
        session: SessionId,
        /// The opening this report belongs to; reports of an older pass are ignored.
        pass: Pass,
        /// Steps the trainer has been waiting for (the next one, and gaps before batches it
        /// already holds), sent once it has waited a while; at most the flow window.
        missing: Vec<Step>,
        /// The [`WorkerList::version`] of the worker list the trainer holds (0: none): the
        /// answer carries the list only if the coordinator's differs.
        workers_version: u64,
    },
    /// A worker joins; trainers will connect to `addr`.
    RegisterWorker {
        /// Address trainers connect to.
        addr: SocketAddr,
        /// Decode threads (for status).
        threads: u32,
        /// Random per worker process: a registration of the same process (an answer was lost
        /// and it asked again) replaces its earlier ones; another process at the same address
        /// is a misconfiguration, logged, and does not evict the first.
        instance: u64,
        /// Counts this process's registrations: a late one never replaces a newer one.
        attempt: u64,
    },
    /// A worker is alive and still holds `leases`. A lease is renewed only while its batches
    /// get finished: one that has made no progress for the coordinator's stall timeout (a
    /// hung dataset open, a hung decode, a delivery that never completes) expires anyway.
    Heartbeat {
        /// The worker.
        worker: WorkerId,
        /// Leases it is working on, with their progress.
        leases: Vec<LeaseProgress>,
        /// Images it has made since it started.
        images: u64,
        /// Jobs this worker makes nothing of, with the reason: it refused the job (its batches
        /// do not fit the worker's memory, its data is outside the worker's roots), or it holds
        /// unfinished work of the job and nothing of the job came out for half the stall
        /// timeout. The coordinator grants it no more of those jobs' work until it reports them
        /// no longer stuck, and shows the reasons in [`WorkerStatus`].
        stuck_jobs: Vec<StuckJob>,
        /// The samples it has made since it started and the CPU time its process has used:
        /// what one of its cores makes a second, from which the coordinator tells jobs how many
        /// worker cores they need.
        decoded: Decoded,
    },
    /// A worker has room for up to `max` more chunks.
    PullChunks {
        /// The worker.
        worker: WorkerId,
        /// Most chunks it wants.
        max: u32,
        /// The shards its cache holds, is downloading or is about to fetch ahead, by dataset, at
        /// most [`MAX_HELD_SHARDS`] in all: the coordinator prefers granting it chunks that read
        /// them, and other workers other chunks (locality). Empty for a worker without a cache.
        held: Vec<HeldShards>,
    },
    /// Every batch of a lease's chunk was delivered and acknowledged.
    ChunkDone {
        /// The worker.
        worker: WorkerId,
        /// The lease.
        lease: LeaseId,
    },
    /// A lease's chunk could not be delivered; the coordinator grants it again.
    ChunkFailed {
        /// The worker.
        worker: WorkerId,
        /// The lease.
        lease: LeaseId,
        /// Why, for the log.
        reason: String,
    },
    /// A worker leaves gracefully and hands back its leases.
    Deregister {
        /// The worker.
        worker: WorkerId,
    },
    /// Everything `stoker status` shows.
    Status,
    /// A trainer stops (its loader is dropped): its rank's work waits until a trainer
    /// attaches again, instead of occupying workers. Appended last: the wire tag of every
    /// earlier request stays the same.
    Detach {
        /// The job.
        job: JobId,
        /// The rank.
        rank: Rank,
        /// The session `Attached` gave this trainer.
        session: SessionId,
    },
    /// A lease's chunk can never be made: a sample fails to decode and the job's transforms say
    /// `on_error=fail`. The coordinator fails the job (its trainers get
    /// [`crate::ErrorCode::JobFailed`] with `reason`) instead of granting the chunk
    /// again. Appended last.
    ChunkFatal {
        /// The worker.
        worker: WorkerId,
        /// The lease.
        lease: LeaseId,
        /// What failed, naming the shard and the key.
        reason: String,
    },
    /// Remove the job `job`, named `name` (`stoker job rm`, which resolves the name to the id
    /// first): its spec and checkpoint are forgotten and nothing of it is made any more.
    /// Refused while a trainer of it is live, unless `force`. By id, so that a request sent
    /// again (across a fail-over) never removes a newer job that took the name meanwhile.
    RemoveJob {
        /// The job's name, as the caller resolved it (checked against the job's).
        name: String,
        /// The job.
        job: JobId,
        /// Remove it even though trainers of it are live (they fail at their next request).
        force: bool,
    },
    /// A Raft message between coordinators (append entries, vote, snapshot chunk). The
    /// payload is the openraft request as JSON; only the coordinator reads it.
    Raft {
        /// Which message.
        kind: RaftKind,
        /// The openraft request, JSON.
        payload: Vec<u8>,
    },
    /// This coordinator's own Raft view (any coordinator answers; no redirect to the leader).
    NodeStatus,
    /// Add a coordinator to the Raft cluster (`stoker cluster add-node`): it joins as a
    /// learner, catches up, then becomes a voter. Leader only.
    AddNode {
        /// Its node id.
        id: u64,
        /// Its address (`host:port`, as other coordinators and clients dial it).
        addr: String,
    },
    /// Remove a coordinator from the Raft cluster (`stoker cluster remove-node`). Leader only.
    RemoveNode {
        /// Its node id.
        id: u64,
    },
}

/// The kind of a [`ControlRequest::Raft`] message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum RaftKind {
    /// Log replication and heartbeats.
    AppendEntries,
    /// A candidate asks for a vote.
    Vote,
    /// One chunk of a snapshot.
    InstallSnapshot,
}

/// The answer to a [`ControlRequest`] of the same name.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum ControlResponse {
    /// The dataset as registered.
    DatasetAdded {
        /// It.
        dataset: DatasetInfo,
    },
    /// All datasets.
    Datasets {
        /// Them.
        datasets: Vec<DatasetInfo>,
    },
    /// The trainer is attached.
    Attached {
        /// The job's id.
        job: JobId,
        /// Its dataset.
        dataset: DatasetInfo,
        /// Workers to connect to.
        workers: WorkerList,
        /// The job's last recorded checkpoint, if any.
        checkpoint: Option<Checkpoint>,
        /// This trainer's session: the newest attachment of a rank is the one served.
        session: SessionId,
    },
    /// The epoch is queued.
    EpochOpened {
        /// Steps in it from `start`.
        steps: u64,
    },
    /// Progress recorded.
    ProgressRecorded {
        /// Workers alive now (trainers connect to new ones), when their list is not the
        /// version the report named; `None` when it is.
        workers: Option<WorkerList>,
        /// Whether the coordinator knows the run; after a coordinator restart it does not,
        /// and a rank still inside it opens it again.
        run_known: bool,
    },
    /// The worker is registered.
    WorkerRegistered {
        /// Its id.
        worker: WorkerId,
        /// How often to heartbeat.
        heartbeat_millis: u64,
        /// Leases expire this long after the last heartbeat.
        lease_ttl_millis: u64,
        /// A lease that makes no progress for this long is taken back; a worker reports a job
        /// stuck after half of it.
        lease_stall_millis: u64,
    },
    /// Heartbeat taken.
    HeartbeatAck {
        /// Leases of the heartbeat the coordinator no longer holds for this worker (expired,
        /// stalled, granted again): stop working on them.
        revoked: Vec<LeaseId>,
        /// Jobs that may still need work (a run open, or a trainer attached): a worker releases
        /// the pipelines of other jobs (threads, batch buffers, mapped shards).
        live_jobs: Vec<JobId>,
    },
    /// Granted chunks (possibly none).
    Chunks {
        /// Them.
        grants: Vec<ChunkGrant>,
    },
    /// Done.
    Ack,
    /// The cluster's state.
    Status {
        /// It.
        status: ClusterStatus,
    },
    /// The job removed. Appended last.
    JobRemoved {
        /// Its id.
        job: JobId,
    },
    /// The answer to a [`ControlRequest::Raft`]: openraft's response as JSON.
    Raft {
        /// It.
        payload: Vec<u8>,
    },
    /// One coordinator's Raft view.
    NodeStatus {
        /// It.
        node: CoordinatorStatus,
    },
    /// Membership changed: the voters now.
    MembershipChanged {
        /// Node ids and addresses of the voters.
        voters: Vec<(u64, String)>,
    },
}

/// One coordinator as `stoker status` shows it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CoordinatorStatus {
    /// Its Raft node id.
    pub id: u64,
    /// Its address.
    pub addr: String,
    /// `leader`, `follower`, `candidate`, `learner`, or `unreachable` (the leader could not ask it).
    pub role: String,
    /// Its current term.
    pub term: u64,
    /// Index of its last log entry.
    pub last_log: u64,
    /// Index of the last entry applied to its state.
    pub applied: u64,
    /// The leader's node id as this coordinator knows it.
    pub leader: Option<u64>,
    /// Node ids that took part in the cluster, as this coordinator's state has them.
    pub joined: Vec<u64>,
}

/// What `stoker status` shows.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ClusterStatus {
    /// The coordinator's address (the leader, which answered).
    pub coordinator: String,
    /// Every coordinator of the Raft cluster, as the leader sees them.
    pub coordinators: Vec<CoordinatorStatus>,
    /// Datasets registered.
    pub datasets: u32,
    /// Workers known.
    pub workers: Vec<WorkerStatus>,
    /// Jobs.
    pub jobs: Vec<JobStatus>,
}

/// One worker in [`ClusterStatus`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WorkerStatus {
    /// Id and address.
    pub info: WorkerInfo,
    /// Whether its heartbeats arrive.
    pub alive: bool,
    /// Decode threads.
    pub threads: u32,
    /// Chunks it holds leases on.
    pub chunks_in_flight: u32,
    /// Images per second over the last heartbeats.
    pub images_per_sec: f64,
    /// Images per second of one busy decode thread (0: not measured yet).
    pub images_per_core_sec: f64,
    /// Jobs it reports stuck or refuses, with the reason: it gets none of their work.
    pub stuck_jobs: Vec<StuckJob>,
}

/// One job in [`ClusterStatus`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JobStatus {
    /// Id.
    pub id: JobId,
    /// Spec.
    pub spec: JobSpec,
    /// Steps (of all ranks) waiting for a worker.
    pub steps_queued: u32,
    /// Chunks leased.
    pub chunks_leased: u32,
    /// Ranks that have reported.
    pub ranks: Vec<RankStatus>,
    /// Ranks whose trainer is live (heard from within the trainer TTL, not detached).
    pub live_ranks: Vec<Rank>,
    /// Seconds since a trainer of the job was last heard from (or since the coordinator
    /// started, if none was since).
    pub idle_seconds: f64,
    /// Where the job stands: its last checkpoint, if any.
    pub checkpoint: Option<Checkpoint>,
    /// What it asks of the workers, once its ranks have reported for a few seconds.
    pub demand: Option<JobDemand>,
}

/// What a job asks of the workers, from its ranks' progress reports over the last half minute
/// or so ([`JobStatus::demand`]).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct JobDemand {
    /// Samples its ranks consume per second, all together.
    pub samples_per_sec: f64,
    /// Share of its ranks' time spent waiting for data (0 to 1).
    pub stall: f64,
    /// Worker cores (decode threads) that would serve it without stalls, at what a worker core
    /// makes now; `None` until the workers have measured that.
    pub worker_cores: Option<f64>,
}

/// One rank of a job in [`ClusterStatus`].
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct RankStatus {
    /// The rank.
    pub rank: Rank,
    /// Its epoch.
    pub epoch: Epoch,
    /// Steps of the epoch consumed.
    pub consumed: Step,
    /// Steps in the epoch.
    pub steps: u64,
    /// Seconds it waited for data in total.
    pub wait_seconds: f64,
}

/// The wire encoding of a `JobSpec` (its transforms as JSON text) is pinned.
#[cfg(test)]
#[path = "control_tests.rs"]
mod tests;
