//! The coordinator's request handling, in memory (local mode): removing jobs (issue 16,
//! item 7), limits, totals, fail-over, and the replicated driver's commit and flush pattern.

use std::num::NonZeroU32;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use stoker_coordinator_core::{CountingIds, Event, MAX_BATCH_SIZE, Outcome, RankTotals};
use stoker_format::{Manifest, ManifestShard};
use stoker_plan::ids::{CertKey, Epoch, JobId, Pass, Position, Rank, SessionId};
use stoker_plan::transform::{Transform, TransformSpec};
use stoker_plan::{PlanSpec, Shuffle, Tail};
use stoker_proto::JobSpec;

use super::*;

/// A local coordinator over `state` with counted ids from `id_base`.
fn in_memory(config: CoordinatorConfig, state: ClusterState, id_base: u64) -> LocalCoordinator {
    LocalCoordinator::new(config, state, Box::new(CountingIds::new(id_base)), id_base, Instant::now())
        .unwrap_or_else(|error| panic!("{error}"))
}

struct Fixture {
    core: LocalCoordinator,
    _dir: tempfile::TempDir,
}

/// A folder holding a manifest of two 8-sample shards (no shard is read here), and its path.
fn manifest_of_two_shards() -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap_or_else(|error| panic!("{error}"));
    let shards =
        vec![ManifestShard { uri: "a.tar".into(), samples: 8, bytes: 1 }, ManifestShard { uri: "b.tar".into(), samples: 8, bytes: 1 }];
    let manifest = Manifest { version: stoker_format::manifest::MANIFEST_VERSION, shards, classes: Vec::new(), packed: None };
    let path = dir.path().join("manifest.json");
    manifest.save(&path).unwrap_or_else(|error| panic!("{error}"));
    (dir, path)
}

/// A coordinator with the dataset "train" (a manifest of two shards; no shard is read here).
fn fixture(job_ttl: Option<Duration>) -> Fixture {
    let (dir, path) = manifest_of_two_shards();
    let mut config = CoordinatorConfig::new(dir.path().join("data"));
    config.job_ttl = job_ttl;
    let core = in_memory(config, ClusterState::new(), 1);
    let added =
        core.handle(ControlRequest::AddDataset { name: "train".into(), manifest: path.to_string_lossy().into_owned() }, Instant::now());
    assert!(added.is_ok(), "{added:?}");
    Fixture { core, _dir: dir }
}

fn spec(name: &str) -> JobSpec {
    JobSpec {
        name: name.to_owned(),
        dataset: "train".to_owned(),
        plan: PlanSpec {
            seed: 1,
            world_size: NonZeroU32::MIN.saturating_add(1),
            batch_size: NonZeroU32::MIN.saturating_add(1),
            shuffle: Shuffle::Full,
            tail: Tail::Drop,
        },
        transforms: TransformSpec::imagenet_train(32),
        prefetch: 2,
    }
}

fn attach(core: &LocalCoordinator, name: &str, rank: u32, now: Instant) -> (JobId, SessionId) {
    match core.handle(ControlRequest::Attach { spec: spec(name), rank: Rank(rank), client: u64::from(rank) + 1 }, now) {
        Ok(ControlResponse::Attached { job, session, .. }) => (job, session),
        other => panic!("attach: {other:?}"),
    }
}

/// The first open of epoch 0 by a trainer of `session`.
fn first_open(job: JobId, rank: Rank, session: SessionId) -> ControlRequest {
    ControlRequest::OpenEpoch { job, rank, epoch: Epoch(0), start: Position(0), session, pass: Pass(1), consumed: 0, holding: Vec::new() }
}

/// Remove the job named `name` as `stoker job rm` does: its id resolved first.
fn remove(core: &LocalCoordinator, name: &str, force: bool, now: Instant) -> Result<ControlResponse, RemoteError> {
    let Some((job, _)) = core.state().job_named(name).map(|(job, spec)| (job, spec.clone())) else {
        return Err(RemoteError::new(ErrorCode::NotFound, format!("no job named {name:?}")));
    };
    core.handle(ControlRequest::RemoveJob { name: name.to_owned(), job, force }, now)
}

#[test]
fn a_job_with_live_trainers_is_removed_only_by_force_and_its_trainers_then_fail() {
    let Fixture { core, _dir } = fixture(None);
    let now = Instant::now();
    let (job, session) = attach(&core, "run", 0, now);
    let refused = remove(&core, "run", false, now).expect_err("a live trainer");
    assert!(refused.message.contains("--force") && refused.message.contains("rank-0"), "{}", refused.message);
    assert!(remove(&core, "nope", false, now).is_err_and(|error| error.code == ErrorCode::NotFound));
    assert_eq!(remove(&core, "run", true, now).ok(), Some(ControlResponse::JobRemoved { job }));
    assert!(!core.state().jobs.contains_key(&job));
    let open = first_open(job, Rank(0), session);
    assert!(core.handle(open, now).is_err_and(|error| error.code == ErrorCode::NotFound), "the removed job's trainer fails");
    let (again, _) = attach(&core, "run", 0, now);
    assert_ne!(again, job, "attaching by the name makes a new job");
}

/// Issue 31, item 7: `stoker job rm --force` sent again (its answer lost in a fail-over)
/// after a trainer made a new job of the same name removes nothing more: the request names the
/// job it resolved, by id. Before, it named the job by name and the retry removed the new job.
#[test]
fn a_removal_sent_again_never_removes_a_newer_job_of_the_same_name() {
    let Fixture { core, _dir } = fixture(None);
    let now = Instant::now();
    let (first, _) = attach(&core, "run", 0, now);
    let removal = ControlRequest::RemoveJob { name: "run".to_owned(), job: first, force: true };
    assert_eq!(core.handle(removal.clone(), now).ok(), Some(ControlResponse::JobRemoved { job: first }));
    let (second, _) = attach(&core, "run", 0, now);
    assert_ne!(second, first);
    assert_eq!(core.handle(removal, now).ok(), Some(ControlResponse::JobRemoved { job: first }), "done already");
    assert!(core.state().jobs.contains_key(&second), "the newer job of the name stays");
    let wrong_name = ControlRequest::RemoveJob { name: "other".to_owned(), job: second, force: true };
    assert!(core.handle(wrong_name, now).is_err_and(|error| error.code == ErrorCode::InvalidArgument));
    let never = ControlRequest::RemoveJob { name: "run".to_owned(), job: JobId(99), force: true };
    assert!(core.handle(never, now).is_err_and(|error| error.code == ErrorCode::NotFound));
}

#[test]
fn a_job_no_trainer_was_heard_from_for_the_ttl_is_removed() {
    let ttl = Duration::from_secs(60);
    let Fixture { core, _dir } = fixture(Some(ttl));
    let start = Instant::now();
    let (idle, idle_session) = attach(&core, "idle", 0, start);
    let (busy, busy_session) = attach(&core, "busy", 0, start);
    // The busy job's trainer reports all along; the idle one's detaches and goes.
    assert!(core.handle(ControlRequest::Detach { job: idle, rank: Rank(0), session: idle_session }, start).is_ok());
    for second in (10..=70).step_by(10) {
        let now = start + Duration::from_secs(second);
        let report = ControlRequest::ReportProgress {
            job: busy,
            rank: Rank(0),
            epoch: Epoch(0),
            start: Position(0),
            consumed: 0,
            wait_seconds: 0.0,
            batches: 0,
            samples: 0,
            session: busy_session,
            pass: Pass(1),
            missing: Vec::new(),
            workers_version: 0,
        };
        let _ = core.handle(report, now);
        core.tick(now);
    }
    let state = core.state();
    assert!(!state.jobs.contains_key(&idle), "idle for the TTL: removed");
    assert!(state.jobs.contains_key(&busy), "a trainer was heard from: kept");
    let status = match core.handle(ControlRequest::Status, start + Duration::from_secs(70)) {
        Ok(ControlResponse::Status { status }) => status,
        other => panic!("status: {other:?}"),
    };
    assert_eq!(status.jobs.len(), 1);
    assert!(status.jobs[0].idle_seconds < 1.0, "{:?}", status.jobs[0]);
}

/// A replicated driver's committer without Raft: applies each commit at once (Raft's part)
/// and counts them.
struct CountingCommitter<'a> {
    coordinator: &'a Coordinator,
    commits: AtomicU64,
}

impl Committer for CountingCommitter<'_> {
    async fn commit(&self, command: Command) -> Result<Applied, RemoteError> {
        self.commits.fetch_add(1, Ordering::Relaxed);
        Ok(Replica::apply(self.coordinator, command))
    }

    async fn blocking<T, F>(&self, work: F) -> Result<T, RemoteError>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        Ok(work())
    }
}

/// Answer `request` on a replicated coordinator as its driver does (the same drive loop),
/// committing through `committer`.
fn drive(committer: &CountingCommitter<'_>, request: ControlRequest, now: Instant) -> Result<ControlResponse, RemoteError> {
    ready(committer.coordinator.serve(committer, request, CertKey::UNCHECKED, now)).unwrap_or_else(|| panic!("it waited"))
}

/// Issue 17, item 6: progress reports do not become Raft entries one by one. 1,000 ranks
/// (500 jobs × 2) reporting every second for 10 seconds cost one entry per flush, with every
/// job's newest checkpoint in it.
#[test]
fn a_thousand_ranks_reporting_every_second_cost_one_entry_per_flush() {
    let (dir, path) = manifest_of_two_shards();
    let config = CoordinatorConfig::new(dir.path().join("data")).validate().unwrap_or_else(|error| panic!("{error}"));
    let start = Instant::now();
    let core = Coordinator::new(&config, "test".into(), ClusterState::new(), Box::new(CountingIds::new(1)), 1, start);
    core.lead(1, start);
    let committer = CountingCommitter { coordinator: &core, commits: AtomicU64::new(0) };
    let add = ControlRequest::AddDataset { name: "train".into(), manifest: path.to_string_lossy().into_owned() };
    drive(&committer, add, start).unwrap_or_else(|error| panic!("{error}"));
    let mut sessions = Vec::new();
    for job_index in 0..500 {
        for rank in 0..2 {
            let attach = ControlRequest::Attach { spec: spec(&format!("job-{job_index}")), rank: Rank(rank), client: u64::from(rank) + 1 };
            let Ok(ControlResponse::Attached { job, session, .. }) = drive(&committer, attach, start) else { panic!("attach") };
            let open = first_open(job, Rank(rank), session);
            drive(&committer, open, start).unwrap_or_else(|error| panic!("{error}"));
            sessions.push((job, Rank(rank), session));
        }
    }
    assert_eq!(committer.commits.load(Ordering::Relaxed), 1 + 500, "the dataset, and each job created once");
    let mut flushed = Vec::new();
    for second in 1..=10u64 {
        let now = start + Duration::from_secs(second);
        let mut waiting = 0;
        for (job, rank, session) in &sessions {
            let report = ControlRequest::ReportProgress {
                job: *job,
                rank: *rank,
                epoch: Epoch(0),
                start: Position(0),
                consumed: second.min(4),
                wait_seconds: 0.0,
                batches: second.min(4),
                samples: 8 * second.min(4),
                session: *session,
                pass: Pass(1),
                missing: Vec::new(),
                workers_version: 0,
            };
            // Stepped as the drive loop does: answered without a commit of its own, once the
            // next flush has committed the job's checkpoint (issue 31, item 7).
            match core.step(Event::Request { request: report, caller: CertKey::UNCHECKED }, now) {
                Outcome::Reply { answer: Ok(_), after_flush, .. } => waiting += u64::from(after_flush),
                other => panic!("{other:?}"),
            }
        }
        // The report that moves each job's checkpoint (its slower rank's) waits for the flush.
        assert_eq!(waiting, if second <= 4 { 500 } else { 0 }, "second {second}");
        // The driver's flush, once per second.
        let Outcome::CommitEach(commands) = core.step(Event::Flush, now) else { panic!("a flush commits") };
        for command in commands {
            flushed.push(command.clone());
            Replica::apply(&core, command);
        }
    }
    assert_eq!(committer.commits.load(Ordering::Relaxed), 1 + 500, "10,000 reports committed nothing by themselves");
    // Steps 1..4 move each job's checkpoint; from then on nothing changes and nothing is written.
    assert_eq!(flushed.len(), 4, "one entry per flush while checkpoints move");
    for command in &flushed {
        let Command::RecordCheckpoints { checkpoints } = command else { panic!("{command:?}") };
        assert_eq!(checkpoints.len(), 500, "every job's newest checkpoint, once");
    }
    // The epoch's 4 steps done: every job stands at the start of the next epoch.
    let positions: Vec<(Epoch, Position)> =
        core.state().checkpoints.values().map(|checkpoint| (checkpoint.epoch, checkpoint.position)).collect();
    assert!(positions.len() == 500 && positions.iter().all(|at| *at == (Epoch(1), Position(0))), "{:?}", &positions[..3]);
}

/// A progress report of rank 0 of `job` carrying the trainer's totals.
fn totals_report(job: JobId, session: SessionId, batches: u64, wait_seconds: f64) -> ControlRequest {
    ControlRequest::ReportProgress {
        job,
        rank: Rank(0),
        epoch: Epoch(0),
        start: Position(0),
        consumed: 0,
        wait_seconds,
        batches,
        samples: 2 * batches,
        session,
        pass: Pass(1),
        missing: Vec::new(),
        workers_version: 0,
    }
}

fn rank0_totals(core: &LocalCoordinator, now: Instant) -> Option<RankTotals> {
    core.figures(now)
        .jobs
        .iter()
        .flat_map(|job| job.ranks.iter())
        .find(|(status, _)| status.rank == Rank(0))
        .and_then(|(_, totals)| *totals)
}

#[test]
fn a_trainers_totals_grow_within_its_session_and_restart_with_a_new_one() {
    let Fixture { core, _dir } = fixture(None);
    let now = Instant::now();
    let (job, first) = attach(&core, "metrics", 0, now);
    assert!(core.handle(first_open(job, Rank(0), first), now).is_ok());
    assert!(core.handle(totals_report(job, first, 10, 1.5), now).is_ok());
    // A report that arrives late, after a newer one, changes nothing.
    assert!(core.handle(totals_report(job, first, 4, 0.5), now).is_ok());
    let totals = rank0_totals(&core, now).expect("totals");
    assert_eq!((totals.batches, totals.samples, totals.wait_seconds), (10, 20, 1.5));
    // A new trainer of the rank counts from 0 (to Prometheus: a counter reset).
    let (_, second) = match core.handle(ControlRequest::Attach { spec: spec("metrics"), rank: Rank(0), client: 99 }, now) {
        Ok(ControlResponse::Attached { job, session, .. }) => (job, session),
        other => panic!("attach: {other:?}"),
    };
    assert!(second > first);
    assert!(core.handle(first_open(job, Rank(0), second), now).is_ok());
    assert!(core.handle(totals_report(job, second, 3, 0.25), now).is_ok());
    let totals = rank0_totals(&core, now).expect("totals");
    assert_eq!((totals.session, totals.batches, totals.wait_seconds), (second, 3, 0.25));
    // The superseded trainer's reports are refused and change nothing.
    assert!(core.handle(totals_report(job, first, 50, 9.0), now).is_err());
    assert_eq!(rank0_totals(&core, now).map(|totals| totals.batches), Some(3));
    // A removed job's figures go with it.
    assert!(remove(&core, "metrics", true, now).is_ok());
    assert!(core.figures(now).jobs.is_empty());
}

#[test]
fn a_job_whose_batch_is_over_the_limit_is_refused_at_attach_with_the_flag_named() {
    let Fixture { core, _dir } = fixture(None);
    let mut huge = spec("typo");
    // 16,384 crops of 32 x 32 x 3 bytes: 48 MiB, over a limit of 16 MiB.
    huge.plan.batch_size = NonZeroU32::new(16_384).unwrap_or(NonZeroU32::MIN);
    let limited =
        in_memory(CoordinatorConfig { max_batch_bytes: 16 << 20, ..CoordinatorConfig::new(_dir.path().join("limited")) }, core.state(), 2);
    let refused = limited.handle(ControlRequest::Attach { spec: huge.clone(), rank: Rank(0), client: 1 }, Instant::now());
    let error = refused.expect_err("over the limit");
    assert_eq!(error.code, ErrorCode::InvalidArgument);
    assert!(error.message.contains("48.0 MiB") && error.message.contains("--max-batch-bytes"), "{}", error.message);
    assert!(limited.state().jobs.is_empty(), "nothing was created");
    // The default limit (1 GiB) takes it; a coordinator with the lower limit (after a restart
    // with it, or a failover) still serves the job that exists.
    assert!(core.handle(ControlRequest::Attach { spec: huge.clone(), rank: Rank(0), client: 1 }, Instant::now()).is_ok());
    let limited =
        in_memory(CoordinatorConfig { max_batch_bytes: 16 << 20, ..CoordinatorConfig::new(_dir.path().join("limited")) }, core.state(), 3);
    assert!(limited.handle(ControlRequest::Attach { spec: huge.clone(), rank: Rank(1), client: 2 }, Instant::now()).is_ok());
    // More samples than a batch header can name are refused whatever their bytes.
    huge.name = "too-many".into();
    huge.plan.batch_size = NonZeroU32::new(MAX_BATCH_SIZE + 1).unwrap_or(NonZeroU32::MIN);
    let error = core.handle(ControlRequest::Attach { spec: huge, rank: Rank(0), client: 3 }, Instant::now()).expect_err("too many");
    assert!(error.message.contains("16384"), "{}", error.message);
    let zero = CoordinatorConfig { max_batch_bytes: 0, ..CoordinatorConfig::new(_dir.path().join("zero")) };
    assert!(zero.validate().is_err());
}

/// Found by review: after a fail-over the new leader knows no sessions and used to adopt any
/// newer one named, so any trainer certificate could take a rank over with `u64::MAX`.
#[test]
fn after_a_fail_over_only_the_recorded_session_is_adopted_and_only_from_its_certificate() {
    let Fixture { core, _dir } = fixture(None);
    let (honest, mallory) = (CertKey([1; 32]), CertKey([2; 32]));
    let now = Instant::now();
    core.lead(1, now);
    let attach = ControlRequest::Attach { spec: spec("run"), rank: Rank(0), client: 7 };
    let Ok(ControlResponse::Attached { job, session, .. }) = core.handle_as(attach, honest, now) else { panic!("attach") };
    core.handle_as(first_open(job, Rank(0), session), honest, now).expect("the honest trainer opens");

    fail_over(&core, now);
    for claimed in [session, SessionId(session.0 + 1), SessionId(u64::MAX)] {
        let refused = core.handle_as(first_open(job, Rank(0), claimed), mallory, now).expect_err("mallory adopts");
        assert_eq!(refused.code, ErrorCode::Forbidden, "{claimed}: {refused}");
        let detach = ControlRequest::Detach { job, rank: Rank(0), session: claimed };
        assert_eq!(core.handle_as(detach, mallory, now).map_err(|error| error.code), Err(ErrorCode::Forbidden), "{claimed}");
    }
    let older = core.handle_as(first_open(job, Rank(0), SessionId(session.0 - 1)), honest, now).expect_err("an older session");
    assert_eq!(older.code, ErrorCode::Superseded);
    core.handle_as(first_open(job, Rank(0), session), honest, now).expect("the honest trainer's session is adopted");
    // Under --insecure nothing is recorded: the seats alone decide, as before.
    let Ok(ControlResponse::Attached { job: plain_job, session: plain, .. }) =
        core.handle(ControlRequest::Attach { spec: spec("plain"), rank: Rank(1), client: 9 }, now)
    else {
        panic!("attach")
    };
    fail_over(&core, now);
    core.handle(first_open(plain_job, Rank(1), SessionId(plain.0 + 5)), now).expect("an unknown newer session is adopted");
}

/// The soft state a new leader starts from: nothing of the old leader's sessions.
fn fail_over(core: &LocalCoordinator, now: Instant) {
    static TERM: AtomicU64 = AtomicU64::new(10);
    core.lead(TERM.fetch_add(1, Ordering::Relaxed), now);
}

/// A coordinator over `fixture`'s state with `limits` applied to a default config.
fn limited(fixture: &Fixture, limits: impl FnOnce(&mut CoordinatorConfig)) -> LocalCoordinator {
    let mut config = CoordinatorConfig::new(fixture._dir.path().join("limited"));
    limits(&mut config);
    in_memory(config, fixture.core.state(), 5)
}

fn attach_spec(core: &LocalCoordinator, spec: JobSpec) -> Result<ControlResponse, RemoteError> {
    core.handle(ControlRequest::Attach { spec, rank: Rank(0), client: 1 }, Instant::now())
}

#[test]
fn world_size_prefetch_and_the_number_of_jobs_are_limited_with_the_flag_named() {
    let fixture = fixture(None);
    let core = limited(&fixture, |config| {
        config.max_world_size = 4;
        config.max_prefetch = 16;
        config.max_jobs = 1;
    });
    let mut wide = spec("wide");
    wide.plan.world_size = NonZeroU32::new(5).unwrap_or(NonZeroU32::MIN);
    let error = attach_spec(&core, wide).expect_err("5 ranks");
    assert!(error.message.contains("world size 5") && error.message.contains("--max-world-size"), "{}", error.message);
    let mut eager = spec("eager");
    eager.prefetch = 17;
    let error = attach_spec(&core, eager).expect_err("prefetch 17");
    assert!(error.message.contains("prefetch 17") && error.message.contains("--max-prefetch"), "{}", error.message);
    let mut padded = spec("padded");
    padded.transforms.transforms = vec![Transform::RandomHorizontalFlip { p: 0.5 }; 1 << 10];
    let error = attach_spec(&core, padded).expect_err("a transform spec of over 16 KiB");
    assert!(error.message.contains("transform spec has"), "{}", error.message);
    assert!(attach_spec(&core, spec("first")).is_ok(), "one job fits");
    let error = attach_spec(&core, spec("second")).expect_err("a second job");
    assert!(error.message.contains("--max-jobs 1") && error.message.contains("stoker job rm"), "{}", error.message);
    assert!(attach_spec(&core, spec("first")).is_ok(), "the job that exists is still served");
    assert!(CoordinatorConfig { max_jobs: 0, ..CoordinatorConfig::new(fixture._dir.path().join("zero")) }.validate().is_err());
}

#[test]
fn datasets_are_limited_in_number_and_confined_to_the_dataset_roots() {
    let fixture = fixture(None);
    let manifest = fixture.core.state().datasets.get("train").map(|dataset| dataset.manifest.clone()).unwrap_or_default();
    let add = |core: &LocalCoordinator, name: &str, path: &str| {
        core.handle(ControlRequest::AddDataset { name: name.into(), manifest: path.into() }, Instant::now())
    };
    let one = limited(&fixture, |config| config.max_datasets = 1);
    assert!(add(&one, "train", &manifest).is_ok(), "replacing the one dataset");
    let error = add(&one, "second", &manifest).expect_err("a second dataset");
    assert!(error.message.contains("--max-datasets 1"), "{}", error.message);

    let root = tempfile::tempdir().unwrap_or_else(|error| panic!("{error}"));
    let confined = limited(&fixture, |config| config.dataset_roots = vec![root.path().to_path_buf()]);
    let error = add(&confined, "outside", &manifest).expect_err("outside the root");
    assert_eq!(error.code, ErrorCode::Forbidden);
    assert!(error.message.contains("--dataset-root"), "{}", error.message);
    // A symlink inside the root to the manifest outside it is still outside.
    std::os::unix::fs::symlink(&manifest, root.path().join("manifest.json")).unwrap_or_else(|error| panic!("{error}"));
    let escape = root.path().to_string_lossy().into_owned();
    assert_eq!(add(&confined, "escape", &escape).map_err(|error| error.code), Err(ErrorCode::Forbidden));
    // A copy inside it is inside.
    let inside = tempfile::tempdir_in(root.path()).unwrap_or_else(|error| panic!("{error}"));
    std::fs::copy(&manifest, inside.path().join("manifest.json")).unwrap_or_else(|error| panic!("{error}"));
    assert!(add(&confined, "inside", &inside.path().to_string_lossy()).is_ok());
    // A manifest inside it whose shards are outside is outside.
    let manifest_path = Path::new(&manifest);
    let mut listing = Manifest::load(manifest_path).unwrap_or_else(|error| panic!("{error}"));
    let shards_dir = manifest_path.parent().unwrap_or_else(|| panic!("a folder"));
    for shard in &mut listing.shards {
        shard.uri = shards_dir.join(&shard.uri).to_string_lossy().into_owned();
    }
    let pointing_out = tempfile::tempdir_in(root.path()).unwrap_or_else(|error| panic!("{error}"));
    listing.save(&pointing_out.path().join("manifest.json")).unwrap_or_else(|error| panic!("{error}"));
    let error = add(&confined, "shards-outside", &pointing_out.path().to_string_lossy()).expect_err("shards outside the root");
    assert_eq!(error.code, ErrorCode::Forbidden, "{}", error.message);
    assert!(error.message.contains("outside every --dataset-root"), "{}", error.message);

    for device in ["/dev/zero", "/dev/null"] {
        let error = add(&fixture.core, "device", device).expect_err(device);
        assert!(error.message.contains("not a regular file"), "{device}: {}", error.message);
    }
}
