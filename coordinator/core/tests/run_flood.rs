//! Issue 31, item 1: one trainer certificate opening a different epoch as every rank of a
//! large job made a run per rank, each with state for every rank (W² entries: ~13 GB at
//! W = 16,384, and the sessions behind it are replicated, so the attack followed every new
//! leader). Runs per job are bounded; this measures the core's live heap during the attack
//! and checks it against ARCHITECTURE.md's formula for a job's memory.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::time::{Duration, Instant};

use stoker_coordinator_core::Core;
use stoker_coordinator_core::config::SchedulerConfig;
use stoker_coordinator_core::scheduler::MAX_RUNS_PER_JOB;
use stoker_coordinator_core::state::ClusterState;
use stoker_coordinator_core::{CoreConfig, CountingIds, Event, Outcome, Then};
use stoker_plan::ids::{CertKey, Epoch, Pass, Position, Rank};
use stoker_plan::transform::TransformSpec;
use stoker_plan::{PlanSpec, Shuffle, Tail};
use stoker_proto::{ControlRequest, ControlResponse, DatasetInfo, ErrorCode, JobSpec, RemoteError};

struct LiveBytes;

thread_local! {
    static LIVE: Cell<i64> = const { Cell::new(0) };
}

// SAFETY: every call is forwarded to the system allocator unchanged; the counter is a
// const-initialised thread-local that itself never allocates.
unsafe impl GlobalAlloc for LiveBytes {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.with(|live| live.set(live.get() + layout.size() as i64));
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, pointer: *mut u8, layout: Layout) {
        LIVE.with(|live| live.set(live.get() - layout.size() as i64));
        unsafe { System.dealloc(pointer, layout) }
    }

    unsafe fn realloc(&self, pointer: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.with(|live| live.set(live.get() + new_size as i64 - layout.size() as i64));
        unsafe { System.realloc(pointer, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: LiveBytes = LiveBytes;

/// Ranks of the job. Before the bound, the attack below kept ~W²/2 rank entries (~100 MB).
const WORLD_SIZE: u32 = 2048;
/// The flow window of the job, in steps.
const PREFETCH: u32 = 4;
/// ARCHITECTURE.md's bytes per rank of a job outside runs (seat, owner, status, totals).
const PER_RANK: i64 = 1024;
/// ARCHITECTURE.md's bytes per rank of a run, plus per pending step of a rank.
const PER_RUN_RANK: i64 = 64;
const PER_PENDING_STEP: i64 = 160;

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
        max_batch_bytes: 1 << 40,
        max_world_size: WORLD_SIZE,
        max_prefetch: 16,
        max_jobs: 10,
        max_datasets: 10,
        max_jobs_per_certificate: 10,
        max_state_bytes: 256 << 20,
    }
}

fn step(core: &mut Core, request: ControlRequest, dataset: &DatasetInfo, now: Instant) -> Result<ControlResponse, RemoteError> {
    let mut event = Event::Request { request, caller: CertKey::UNCHECKED };
    for _ in 0..4 {
        match core.step(event, now) {
            Outcome::Reply { answer, .. } => return answer,
            Outcome::Commit { command, then } => {
                core.apply(command);
                match then {
                    Then::Again(request) => event = Event::Request { request: *request, caller: CertKey::UNCHECKED },
                    Then::Reply(answer) => return Ok(answer),
                }
            }
            Outcome::ReadManifest { name, .. } => event = Event::ManifestRead { name, read: Ok(dataset.clone()) },
            other => panic!("unexpected {other:?}"),
        }
    }
    panic!("too many rounds")
}

#[test]
fn ranks_opening_every_epoch_at_once_keep_a_bounded_number_of_runs() {
    let now = Instant::now();
    let mut core = Core::new(config(), "test".into(), ClusterState::new(), Box::new(CountingIds::new(1)), 1, now);
    core.step(Event::Lead { term: 1 }, now);
    // 64 steps of W one-sample batches per epoch.
    let dataset = DatasetInfo { name: "train".into(), manifest: "/m.json".into(), shard_counts: vec![1024; 128], version: 1 };
    step(&mut core, ControlRequest::AddDataset { name: "train".into(), manifest: "/m".into() }, &dataset, now).expect("dataset");
    let spec = JobSpec {
        name: "flood".into(),
        dataset: "train".into(),
        plan: PlanSpec {
            seed: 1,
            world_size: NonZeroU32::new(WORLD_SIZE).expect("ranks"),
            batch_size: NonZeroU32::MIN,
            shuffle: Shuffle::None,
            tail: Tail::Drop,
        },
        transforms: TransformSpec::imagenet_train(8),
        prefetch: PREFETCH,
    };
    let before = LIVE.with(Cell::get);
    let mut opened = 0;
    let mut refused = 0;
    for rank in 0..WORLD_SIZE {
        let attach = ControlRequest::Attach { spec: spec.clone(), rank: Rank(rank), client: u64::from(rank) };
        let Ok(ControlResponse::Attached { job, session, .. }) = step(&mut core, attach, &dataset, now) else { panic!("attach") };
        let open = ControlRequest::OpenEpoch {
            job,
            rank: Rank(rank),
            epoch: Epoch(u64::from(rank)),
            start: Position(0),
            session,
            pass: Pass(1),
            consumed: 0,
            holding: Vec::new(),
        };
        match step(&mut core, open, &dataset, now) {
            Ok(_) => opened += 1,
            Err(error) if error.code == ErrorCode::Unavailable && error.message.contains("epoch runs open") => refused += 1,
            Err(error) => panic!("{error}"),
        }
    }
    // A worker pulls, so the open runs cut their flow windows.
    let addr: SocketAddr = "127.0.0.1:7500".parse().expect("addr");
    let register = ControlRequest::RegisterWorker { addr, threads: 1, instance: 1, attempt: 1 };
    let Ok(ControlResponse::WorkerRegistered { worker, .. }) = step(&mut core, register, &dataset, now) else { panic!("register") };
    step(&mut core, ControlRequest::PullChunks { worker, max: 64, held: Vec::new() }, &dataset, now).expect("pull");
    let grown = LIVE.with(Cell::get) - before;

    let runs = MAX_RUNS_PER_JOB as i64;
    let window = i64::from(PREFETCH) + 2;
    let bound = i64::from(WORLD_SIZE) * (PER_RANK + runs * (PER_RUN_RANK + window * PER_PENDING_STEP));
    eprintln!(
        "{opened} runs opened, {refused} refused; the core grew by {grown} bytes for {WORLD_SIZE} ranks \
         (formula: {bound} bytes; {} per rank)",
        grown / i64::from(WORLD_SIZE)
    );
    assert_eq!(opened, MAX_RUNS_PER_JOB, "one run per epoch until the bound");
    assert_eq!(refused, WORLD_SIZE as usize - MAX_RUNS_PER_JOB);
    assert!(grown <= bound, "the core grew by {grown} bytes, over the formula's {bound}");
}
