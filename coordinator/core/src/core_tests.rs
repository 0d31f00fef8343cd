//! The core stepped by hand, with no IO: what it asks the driver to do, and that its ids come
//! from the injected source only (the same seed, the same ids).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use stoker_plan::ids::{CertKey, Epoch, JobId, Pass, Position, Rank, SessionId, Step, WorkerId};
use stoker_plan::transform::TransformSpec;
use stoker_plan::{CHECKPOINT_VERSION, Checkpoint, EpochPlan};
use stoker_proto::{ChunkGrant, ControlRequest, ControlResponse, DatasetInfo, Decoded, WorkerList};

use super::*;
use crate::config::SchedulerConfig;
use crate::event::Then;
use crate::ids::SeededIds;
use crate::state::Applied;

fn config() -> CoreConfig {
    CoreConfig {
        scheduler: SchedulerConfig {
            lease_ttl: Duration::from_secs(3),
            lease_stall: Duration::from_secs(60),
            chunk_steps: 2,
            retry_delay: Duration::from_millis(500),
            trainer_ttl: Duration::from_secs(5),
            missing_grace: Duration::from_secs(1),
        },
        heartbeat: Duration::from_millis(500),
        job_ttl: None,
        max_batch_bytes: 1 << 30,
        max_world_size: 16,
        max_prefetch: 16,
        max_jobs: 10,
        max_datasets: 10,
        max_jobs_per_certificate: 10,
        max_state_bytes: 256 << 20,
    }
}

/// Step `request` to its answer as a driver in local mode does: commits applied at once, the
/// manifest "read" as `dataset`.
fn drive(core: &mut Core, request: ControlRequest, dataset: &DatasetInfo, now: Instant) -> ControlResponse {
    drive_as(core, request, CertKey::UNCHECKED, dataset, now).unwrap_or_else(|error| panic!("{error}"))
}

/// [`drive`] for a peer proving `caller`; the refusal, if it is refused.
fn drive_as(
    core: &mut Core,
    request: ControlRequest,
    caller: CertKey,
    dataset: &DatasetInfo,
    now: Instant,
) -> Result<ControlResponse, stoker_proto::RemoteError> {
    let mut event = Event::Request { request, caller };
    for _ in 0..4 {
        match core.step(event, now) {
            Outcome::Reply { answer, .. } => return answer,
            Outcome::Commit { command, then } => {
                core.apply(command);
                match then {
                    Then::Again(request) => event = Event::Request { request: *request, caller },
                    Then::Reply(answer) => return Ok(answer),
                }
            }
            Outcome::ReadManifest { name, .. } => event = Event::ManifestRead { name, read: Ok(dataset.clone()) },
            other => panic!("unexpected {other:?}"),
        }
    }
    panic!("too many rounds")
}

/// The first open of epoch 0 by rank 0's trainer of `session`.
fn first_open(job: JobId, session: SessionId) -> ControlRequest {
    ControlRequest::OpenEpoch {
        job,
        rank: Rank(0),
        epoch: Epoch(0),
        start: Position(0),
        session,
        pass: Pass(1),
        consumed: 0,
        holding: Vec::new(),
    }
}

/// Attach rank 0 of a one-rank job, open epoch 0, register a worker and pull: the leases.
fn leases_granted(seed: u64) -> Vec<u64> {
    grants(seed).iter().map(|grant| grant.lease.0).collect()
}

/// Attach rank 0 of a one-rank job, open epoch 0, register a worker and pull: the grants.
fn grants(seed: u64) -> Vec<ChunkGrant> {
    let now = Instant::now();
    let mut core = Core::new(config(), "test".into(), ClusterState::new(), Box::new(SeededIds::new(seed)), 1_000, now);
    let dataset = DatasetInfo { name: String::new(), manifest: "/data/manifest.json".into(), shard_counts: vec![8, 8], version: 7 };
    let added = drive(&mut core, ControlRequest::AddDataset { name: "train".into(), manifest: "/data".into() }, &dataset, now);
    assert!(matches!(added, ControlResponse::DatasetAdded { ref dataset } if dataset.name == "train"), "{added:?}");
    let mut spec = crate::state::tests::spec("job");
    spec.transforms = TransformSpec::imagenet_train(8);
    let attach = ControlRequest::Attach { spec, rank: Rank(0), client: 1 };
    let ControlResponse::Attached { job, session, .. } = drive(&mut core, attach, &dataset, now) else { panic!("attach") };
    drive(&mut core, first_open(job, session), &dataset, now);
    let addr: SocketAddr = "127.0.0.1:7500".parse().unwrap_or_else(|error| panic!("{error}"));
    let register = ControlRequest::RegisterWorker { addr, threads: 1, instance: 1, attempt: 1 };
    let ControlResponse::WorkerRegistered { worker, .. } = drive(&mut core, register, &dataset, now) else { panic!("register") };
    let ControlResponse::Chunks { grants } =
        drive(&mut core, ControlRequest::PullChunks { worker, max: 4, held: Vec::new() }, &dataset, now)
    else {
        panic!("pull")
    };
    assert!(!grants.is_empty(), "work to grant");
    grants
}

#[test]
fn a_grant_names_the_shards_of_its_ranks_next_steps() {
    let grants = grants(5);
    let table = stoker_plan::ShardTable::new([8, 8]).unwrap_or_else(|error| panic!("{error}"));
    let spec = crate::state::tests::spec("job").plan;
    let plan = EpochPlan::new(Arc::new(table), spec, Epoch(0));
    for grant in &grants {
        let after = grant.chunk.first_step.0 + u64::from(grant.chunk.steps);
        let expected = crate::shards::shards_read(&plan, grant.chunk.rank, Step(after), 2 * 2, usize::MAX);
        assert_eq!(grant.next_shards, expected, "{:?}", grant.chunk);
    }
    assert!(grants.iter().any(|grant| !grant.next_shards.is_empty()), "{grants:?}");
}

#[test]
fn a_dataset_is_added_after_the_driver_reads_its_manifest() {
    let now = Instant::now();
    let mut core = Core::new(config(), "test".into(), ClusterState::new(), Box::new(SeededIds::new(1)), 1_000, now);
    let asked = core.step(
        Event::Request {
            request: ControlRequest::AddDataset { name: "train".into(), manifest: "/data".into() },
            caller: CertKey::UNCHECKED,
        },
        now,
    );
    assert!(matches!(&asked, Outcome::ReadManifest { name, manifest } if name == "train" && manifest == "/data"), "{asked:?}");
    let refused = core.step(Event::ManifestRead { name: "train".into(), read: Err(crate::errors::invalid("no such file")) }, now);
    assert!(matches!(refused, Outcome::Reply { answer: Err(_), .. }), "a failed read is the answer");
    assert!(core.state().datasets.is_empty(), "nothing committed");
}

#[test]
fn ids_come_from_the_injected_source_only() {
    assert_eq!(leases_granted(5), leases_granted(5), "the same seed, the same leases");
    assert_ne!(leases_granted(5), leases_granted(6), "another seed, other leases");
}

#[test]
fn the_timer_hands_out_checkpoints_once_and_takes_them_back_when_a_commit_fails() {
    let now = Instant::now();
    let mut core = Core::new(config(), "test".into(), ClusterState::new(), Box::new(SeededIds::new(1)), 1_000, now);
    let job = match core.apply(Command::CreateJob { spec: crate::state::tests::spec("job"), creator: None, bounds: None }) {
        Applied::JobCreated(job) => job,
        other => panic!("{other:?}"),
    };
    let checkpoint = Checkpoint { version: CHECKPOINT_VERSION, epoch: Epoch(0), position: Position(4), order_fingerprint: 1 };
    core.pending.insert(job, checkpoint);
    let Outcome::CommitEach(commands) = core.step(Event::Tick { flush: true }, now) else { panic!("commands") };
    assert_eq!(commands, vec![Command::RecordCheckpoints { checkpoints: vec![(job, checkpoint)] }]);
    assert!(matches!(core.step(Event::Flush, now), Outcome::CommitEach(none) if none.is_empty()), "handed out once");
    for command in commands {
        core.step(Event::CommitFailed { command }, now);
    }
    let Outcome::CommitEach(again) = core.step(Event::Flush, now) else { panic!("commands") };
    assert_eq!(again.len(), 1, "taken back, committed at the next flush");
}

fn sample_dataset() -> DatasetInfo {
    DatasetInfo { name: "train".into(), manifest: "/data/manifest.json".into(), shard_counts: vec![8, 8], version: 7 }
}

/// A core with the dataset `train` and the state `state`, leading in `term`.
fn leading(state: ClusterState, term: u64, now: Instant) -> Core {
    let mut core = Core::new(config(), "test".into(), state, Box::new(SeededIds::new(term)), 0, now);
    core.step(Event::Lead { term }, now);
    if core.state().datasets.is_empty() {
        drive(&mut core, ControlRequest::AddDataset { name: "train".into(), manifest: "/data".into() }, &sample_dataset(), now);
    }
    core
}

/// Issue 31, item 7: worker ids and sessions come from the Raft term, not from a clock. A
/// leader of a later term (whose clock may be behind) never hands out an id the earlier one
/// did, and its sessions supersede the earlier one's. Before, both were counted from the
/// leader's wall clock, and a leader whose clock was behind handed out live ids again.
#[test]
fn a_later_leader_never_hands_out_an_id_an_earlier_one_did() {
    let now = Instant::now();
    let dataset = sample_dataset();
    let addr: SocketAddr = "127.0.0.1:7500".parse().unwrap_or_else(|error| panic!("{error}"));
    let mut ids = Vec::new();
    let mut sessions = Vec::new();
    let mut state = ClusterState::new();
    for term in [3, 4, 9] {
        let mut core = leading(state.clone(), term, now);
        for attempt in 1..=3 {
            let register = ControlRequest::RegisterWorker { addr, threads: 1, instance: term, attempt };
            let ControlResponse::WorkerRegistered { worker, .. } = drive(&mut core, register, &dataset, now) else { panic!("register") };
            ids.push(worker);
        }
        for rank in 0..2 {
            let mut spec = crate::state::tests::spec("job");
            spec.transforms = TransformSpec::imagenet_train(8);
            spec.plan.world_size = std::num::NonZeroU32::new(2).unwrap_or(std::num::NonZeroU32::MIN);
            let attach = ControlRequest::Attach { spec, rank: Rank(rank), client: term };
            let ControlResponse::Attached { session, .. } = drive(&mut core, attach, &dataset, now) else { panic!("attach") };
            sessions.push(session);
        }
        state = core.state().clone();
    }
    let mut distinct = ids.clone();
    distinct.sort_unstable();
    distinct.dedup();
    assert_eq!(distinct.len(), ids.len(), "worker ids handed out twice: {ids:?}");
    assert!(sessions.windows(2).all(|pair| pair[0] < pair[1]), "each later session is newer: {sessions:?}");
}

/// A leader that stops leading for a moment (a leadership check that timed out) and leads again
/// in the same term continues its id ranges: it handed out worker ids from the term's base once
/// already, and a worker registered then is still live. Before, leading again restarted the
/// count, and a worker re-registering got a live worker's id (two workers, one entry: the
/// whole-cluster restart test waited for its second worker for ever).
#[test]
fn leading_again_in_the_same_term_never_hands_out_an_id_twice() {
    let now = Instant::now();
    let dataset = sample_dataset();
    let mut core = leading(ClusterState::new(), 3, now);
    let mut ids = Vec::new();
    let mut sessions = Vec::new();
    for round in 0..3u64 {
        for worker in 0..2u64 {
            let addr: SocketAddr = format!("127.0.0.{}:7500", 2 + worker).parse().unwrap_or_else(|error| panic!("{error}"));
            let register = ControlRequest::RegisterWorker { addr, threads: 1, instance: round * 10 + worker, attempt: 1 };
            let ControlResponse::WorkerRegistered { worker, .. } = drive(&mut core, register, &dataset, now) else { panic!("register") };
            ids.push(worker);
        }
        let mut spec = crate::state::tests::spec("job");
        spec.transforms = TransformSpec::imagenet_train(8);
        let attach = ControlRequest::Attach { spec, rank: Rank(0), client: round };
        let ControlResponse::Attached { session, .. } = drive(&mut core, attach, &dataset, now) else { panic!("attach") };
        sessions.push(session);
        core.step(Event::Follow, now);
        core.step(Event::Lead { term: 3 }, now);
    }
    let mut distinct = ids.clone();
    distinct.sort_unstable();
    distinct.dedup();
    assert_eq!(distinct.len(), ids.len(), "worker ids handed out twice in one term: {ids:?}");
    assert!(sessions.windows(2).all(|pair| pair[0] < pair[1]), "each later session is newer: {sessions:?}");
}

/// Issue 31, item 7: an owner that is not known refuses, never admits. Under mutual TLS every
/// session a trainer is given is recorded first, so after a fail-over a session with no record
/// (made up, or from nowhere) is refused instead of adopted by whoever names it first.
#[test]
fn an_unknown_owner_refuses_under_mutual_tls() {
    let now = Instant::now();
    let dataset = sample_dataset();
    let (honest, forger) = (CertKey([1; 32]), CertKey([2; 32]));
    let mut core = leading(ClusterState::new(), 1, now);
    let mut spec = crate::state::tests::spec("job");
    spec.transforms = TransformSpec::imagenet_train(8);
    let attach = ControlRequest::Attach { spec, rank: Rank(0), client: 1 };
    let Ok(ControlResponse::Attached { job, session, .. }) = drive_as(&mut core, attach, honest, &dataset, now) else { panic!("attach") };
    let open = |session| first_open(job, session);
    // A new leader: the soft owners are gone, the record stays.
    let mut core = leading(core.state().clone(), 2, now);
    let stolen = drive_as(&mut core, open(session), forger, &dataset, now).expect_err("another certificate");
    assert_eq!(stolen.code, stoker_proto::ErrorCode::Forbidden, "{stolen}");
    // The record gone (as if never written): nobody adopts the session under mutual TLS.
    let mut state = core.state().clone();
    state.sessions.clear();
    let mut core = leading(state, 3, now);
    let unrecorded = drive_as(&mut core, open(session), honest, &dataset, now).expect_err("no record");
    assert_eq!(unrecorded.code, stoker_proto::ErrorCode::Forbidden, "{unrecorded}");
    // Under --insecure the seats alone decide, as before.
    assert!(drive_as(&mut core, open(session), CertKey::UNCHECKED, &dataset, now).is_ok());
}

/// Issue 31, item 2: one certificate creates at most `max_jobs_per_certificate` of the jobs
/// kept (another still may create its own), and a removed job no longer counts against it.
#[test]
fn one_certificate_creates_at_most_its_share_of_the_jobs() {
    let now = Instant::now();
    let dataset = sample_dataset();
    let (greedy, other) = (CertKey([1; 32]), CertKey([2; 32]));
    let mut config = config();
    config.max_jobs_per_certificate = 2;
    let mut core = Core::new(config, "test".into(), ClusterState::new(), Box::new(SeededIds::new(1)), 0, now);
    core.step(Event::Lead { term: 1 }, now);
    drive(&mut core, ControlRequest::AddDataset { name: "train".into(), manifest: "/data".into() }, &dataset, now);
    let attach = |name: &str| {
        let mut spec = crate::state::tests::spec(name);
        spec.transforms = TransformSpec::imagenet_train(8);
        ControlRequest::Attach { spec, rank: Rank(0), client: 1 }
    };
    for name in ["a", "b"] {
        assert!(drive_as(&mut core, attach(name), greedy, &dataset, now).is_ok(), "{name}");
    }
    let refused = drive_as(&mut core, attach("c"), greedy, &dataset, now).expect_err("over its share");
    assert!(refused.message.contains("--max-jobs-per-certificate 2") && refused.message.contains("stoker job rm"), "{refused}");
    assert!(drive_as(&mut core, attach("c"), other, &dataset, now).is_ok(), "another certificate has its own share");
    core.apply(Command::RemoveJob { job: JobId(1) });
    assert!(drive_as(&mut core, attach("d"), greedy, &dataset, now).is_ok(), "a removed job no longer counts");
    assert_eq!(core.state().jobs_created_by(greedy), 2);
}

/// An attach of rank 0 of a one-rank job, by the loader numbered `client`.
fn rank_zero_attach() -> impl Fn(u64) -> ControlRequest {
    let mut spec = crate::state::tests::spec("job");
    spec.transforms = TransformSpec::imagenet_train(8);
    move |client| ControlRequest::Attach { spec: spec.clone(), rank: Rank(0), client }
}

/// Issue 31, item 2: the same loader attaching again keeps its session and commits nothing;
/// an attach that gives a new session commits one entry and replaces the rank's record.
#[test]
fn an_attach_commits_only_when_its_session_is_new() {
    let now = Instant::now();
    let (dataset, caller, mut core) = (sample_dataset(), CertKey([1; 32]), leading(ClusterState::new(), 1, now));
    let attach = rank_zero_attach();
    let Ok(ControlResponse::Attached { session, .. }) = drive_as(&mut core, attach(1), caller, &dataset, now) else { panic!("attach") };
    let again = core.step(Event::Request { request: attach(1), caller }, now);
    assert!(
        matches!(&again, Outcome::Reply { answer: Ok(ControlResponse::Attached { session: same, .. }), .. } if *same == session),
        "{again:?}"
    );
    let other = core.step(Event::Request { request: attach(2), caller }, now);
    assert!(matches!(other, Outcome::Commit { command: Command::RecordSession { .. }, .. }), "{other:?}");
}

/// Issue 31, item 2: a trainer that detaches takes its rank's session record along; a detach
/// of a session superseded since leaves the newer record.
#[test]
fn a_detached_session_leaves_no_record() {
    let now = Instant::now();
    let (dataset, caller, mut core) = (sample_dataset(), CertKey([1; 32]), leading(ClusterState::new(), 1, now));
    let attach = rank_zero_attach();
    let Ok(ControlResponse::Attached { job, session, .. }) = drive_as(&mut core, attach(1), caller, &dataset, now) else {
        panic!("attach")
    };
    assert_eq!(core.state().sessions[&job].len(), 1);
    let detach = ControlRequest::Detach { job, rank: Rank(0), session };
    assert_eq!(drive_as(&mut core, detach, caller, &dataset, now), Ok(ControlResponse::Ack));
    assert!(core.state().sessions.is_empty(), "{:?}", core.state().sessions);
    // A late entry of that detach changes nothing once a newer session holds the rank.
    let Ok(ControlResponse::Attached { session: newer, .. }) = drive_as(&mut core, attach(2), caller, &dataset, now) else {
        panic!("attach")
    };
    core.apply(Command::ForgetSession { job, rank: Rank(0), session });
    assert_eq!(core.state().sessions[&job].get(&Rank(0)), Some(&(newer, caller)));
}

/// A core with dataset "train", one worker registered (1 thread) and rank 0 of a one-rank job
/// attached with epoch 0 open.
struct Attached {
    core: Core,
    dataset: DatasetInfo,
    job: JobId,
    session: SessionId,
    worker: WorkerId,
    workers: WorkerList,
}

fn attached_with_a_worker(now: Instant) -> Attached {
    let mut core = Core::new(config(), "test".into(), ClusterState::new(), Box::new(SeededIds::new(3)), 1_000, now);
    let dataset = DatasetInfo { name: String::new(), manifest: "/data/manifest.json".into(), shard_counts: vec![8, 8], version: 7 };
    drive(&mut core, ControlRequest::AddDataset { name: "train".into(), manifest: "/data".into() }, &dataset, now);
    let addr: SocketAddr = "127.0.0.1:7500".parse().unwrap_or_else(|error| panic!("{error}"));
    let register = ControlRequest::RegisterWorker { addr, threads: 1, instance: 1, attempt: 1 };
    let ControlResponse::WorkerRegistered { worker, .. } = drive(&mut core, register, &dataset, now) else { panic!("register") };
    let mut spec = crate::state::tests::spec("job");
    spec.transforms = TransformSpec::imagenet_train(8);
    let attach = ControlRequest::Attach { spec, rank: Rank(0), client: 1 };
    let ControlResponse::Attached { job, session, workers, .. } = drive(&mut core, attach, &dataset, now) else { panic!("attach") };
    drive(&mut core, first_open(job, session), &dataset, now);
    Attached { core, dataset, job, session, worker, workers }
}

/// Rank 0's progress report: `samples` consumed and `wait_seconds` waited in all, holding the
/// worker list of `workers_version`.
fn rank_report(attached: &Attached, samples: u64, wait_seconds: f64, workers_version: u64) -> ControlRequest {
    ControlRequest::ReportProgress {
        job: attached.job,
        rank: Rank(0),
        epoch: Epoch(0),
        start: Position(0),
        consumed: 0,
        wait_seconds,
        batches: samples,
        samples,
        session: attached.session,
        pass: Pass(1),
        missing: Vec::new(),
        workers_version,
    }
}

/// The worker list in the answer to a report holding the list of `workers_version`.
fn listed(attached: &mut Attached, workers_version: u64) -> Option<WorkerList> {
    let report = rank_report(attached, 0, 0.0, workers_version);
    match drive(&mut attached.core, report, &attached.dataset, Instant::now()) {
        ControlResponse::ProgressRecorded { workers, .. } => workers,
        other => panic!("{other:?}"),
    }
}

/// A progress answer carries the worker list only when it is not the one the report names:
/// after attaching (the list then), after a worker joins (the new list), never twice the same.
#[test]
fn a_progress_answer_lists_the_workers_only_when_the_trainer_holds_another_list() {
    let now = Instant::now();
    let mut attached = attached_with_a_worker(now);
    let (worker, workers) = (attached.worker, attached.workers.clone());
    assert_eq!(workers.workers.iter().map(|info| info.id).collect::<Vec<_>>(), vec![worker]);
    assert_eq!(listed(&mut attached, workers.version), None, "the trainer holds the list");
    assert_eq!(listed(&mut attached, 0).as_ref(), Some(&workers), "a trainer that holds none");
    let other: SocketAddr = "127.0.0.1:7501".parse().unwrap_or_else(|error| panic!("{error}"));
    let register = ControlRequest::RegisterWorker { addr: other, threads: 1, instance: 2, attempt: 1 };
    let ControlResponse::WorkerRegistered { worker: joined, .. } = drive(&mut attached.core, register, &attached.dataset, now) else {
        panic!("register")
    };
    let Some(grown) = listed(&mut attached, workers.version) else { panic!("a worker joined: the new list") };
    assert_eq!(grown.workers.iter().map(|info| info.id).collect::<Vec<_>>(), vec![worker, joined]);
    assert_eq!(listed(&mut attached, grown.version), None);
}

/// A job whose rank consumes 100 samples a second waiting half the time, served by a worker
/// that makes 200 images per busy core-second, wants one worker core (200 a second unstalled):
/// in status, and in the figures the metrics export.
#[test]
fn status_and_figures_show_the_worker_cores_a_stalling_job_wants() {
    let start = Instant::now();
    let mut attached = attached_with_a_worker(start);
    assert_eq!(attached.core.status(start).jobs[0].demand, None, "no reports yet");
    for second in 0..=20u64 {
        let now = start + Duration::from_secs(second);
        let beat = ControlRequest::Heartbeat {
            worker: attached.worker,
            leases: Vec::new(),
            images: 200 * second,
            stuck_jobs: Vec::new(),
            decoded: Decoded { samples: 200 * second, cpu_seconds: second as f64 },
        };
        drive(&mut attached.core, beat, &attached.dataset, now);
        let report = rank_report(&attached, 100 * second, 0.5 * second as f64, attached.workers.version);
        drive(&mut attached.core, report, &attached.dataset, now);
    }
    let now = start + Duration::from_secs(20);
    let status = attached.core.status(now);
    let demand = status.jobs[0].demand.unwrap_or_else(|| panic!("twenty seconds of reports"));
    assert!((demand.samples_per_sec - 100.0).abs() < 1e-6 && (demand.stall - 0.5).abs() < 1e-9, "{demand:?}");
    assert!(demand.worker_cores.is_some_and(|cores| (cores - 1.0).abs() < 1e-6), "{demand:?}");
    assert_eq!(status.workers[0].images_per_core_sec, 200.0);
    let figures = attached.core.figures(now);
    assert_eq!((figures.worker_cores, figures.jobs[0].demand), (1, Some(demand)));
}
