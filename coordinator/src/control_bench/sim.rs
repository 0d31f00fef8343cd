//! The simulated cluster of the control-plane benchmark, and its exactly-once book.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::{Ipv4Addr, SocketAddr};
use std::num::NonZeroU32;
use std::time::{Duration, Instant};

use stoker_coordinator_core::config::SchedulerConfig;
use stoker_coordinator_core::state::ClusterState;
use stoker_coordinator_core::{Core, CoreConfig, CountingIds, Event, Outcome, Then};
use stoker_plan::ids::{CertKey, Epoch, JobId, LeaseId, Pass, Position, Rank, SessionId, WorkerId};
use stoker_plan::transform::TransformSpec;
use stoker_plan::{PlanSpec, Shuffle, Tail};
use stoker_proto::{ControlRequest, ControlResponse, DatasetInfo, JobSpec, LeaseProgress};

use super::{ControlBenchConfig, ControlBenchError, ControlBenchReport, KindReport};

/// Heartbeats per worker: every this many rounds.
const HEARTBEAT_ROUNDS: u64 = 5;

/// One simulated rank.
struct Trainer {
    job: JobId,
    rank: Rank,
    session: SessionId,
    /// Steps of epoch 0 made.
    made: Vec<bool>,
    /// Steps `0..consumed` made (what it reports).
    consumed: u64,
    /// What its last report said it consumed (what the coordinator knows).
    reported: u64,
    /// The version of the worker list it holds, as a trainer names it in its reports.
    workers_version: u64,
}

/// One simulated worker.
struct Worker {
    id: WorkerId,
    /// Its certificate (each its own: one certificate registers a bounded number of workers).
    key: CertKey,
    /// Leases granted in the last round, reported done in this one.
    leases: Vec<LeaseId>,
}

/// Where each lease's steps are, for the book.
struct Leased {
    trainer: usize,
    epoch: u64,
    first: u64,
    steps: u64,
}

/// Per-kind latencies, in nanoseconds.
#[derive(Default)]
struct Timings {
    by_kind: BTreeMap<&'static str, Vec<u64>>,
}

impl Timings {
    fn record(&mut self, kind: &'static str, took: Duration) {
        self.by_kind.entry(kind).or_default().push(took.as_nanos().min(u128::from(u64::MAX)) as u64);
    }

    fn total_seconds(&self, kinds: &[&str]) -> f64 {
        kinds.iter().filter_map(|kind| self.by_kind.get(kind)).flatten().map(|&nanos| nanos as f64 / 1e9).sum()
    }

    fn reports(&mut self) -> Vec<KindReport> {
        self.by_kind
            .iter_mut()
            .map(|(kind, nanos)| {
                nanos.sort_unstable();
                let at = |fraction: f64| {
                    let index = ((fraction * nanos.len() as f64).ceil() as usize).clamp(1, nanos.len()) - 1;
                    nanos[index] as f64 / 1e3
                };
                KindReport {
                    kind,
                    count: nanos.len() as u64,
                    total_seconds: nanos.iter().map(|&value| value as f64 / 1e9).sum(),
                    p50_micros: at(0.5),
                    p99_micros: at(0.99),
                    max_micros: at(1.0),
                }
            })
            .collect()
    }
}

/// The core and what stepping it cost.
struct Driven {
    core: Core,
    dataset: DatasetInfo,
    timings: Timings,
    /// Commands committed, and their bytes in the log's encoding.
    entries: u64,
    entry_bytes: u64,
    errors: BTreeMap<String, u64>,
    /// The last refusal, for the error that stops the run.
    last_error: Option<String>,
}

impl Driven {
    /// [`Driven::request_as`] for a trainer or an admin (`--insecure`'s certificate).
    fn request(&mut self, kind: &'static str, request: ControlRequest, now: Instant) -> Option<ControlResponse> {
        self.request_as(kind, request, CertKey::UNCHECKED, now)
    }

    /// Step `request` of `caller` to its answer as a driver in local mode does (commits applied
    /// at once), timing the whole of it under `kind`.
    fn request_as(&mut self, kind: &'static str, request: ControlRequest, caller: CertKey, now: Instant) -> Option<ControlResponse> {
        let started = Instant::now();
        let mut event = Event::Request { request, caller };
        let mut answer = None;
        for _ in 0..8 {
            match self.core.step(event, now) {
                Outcome::Reply { answer: reply, .. } => {
                    answer = Some(reply);
                    break;
                }
                Outcome::Commit { command, then } => {
                    self.entries += 1;
                    self.entry_bytes += serde_json::to_vec(&command).map_or(0, |bytes| bytes.len() as u64);
                    self.core.apply(command);
                    match then {
                        Then::Again(request) => event = Event::Request { request: *request, caller },
                        Then::Reply(reply) => {
                            answer = Some(Ok(reply));
                            break;
                        }
                    }
                }
                Outcome::ReadManifest { name, .. } => event = Event::ManifestRead { name, read: Ok(self.dataset.clone()) },
                _ => break,
            }
        }
        self.timings.record(kind, started.elapsed());
        match answer {
            Some(Ok(response)) => Some(response),
            Some(Err(error)) => {
                *self.errors.entry(format!("{kind}: {}", error.message)).or_default() += 1;
                self.last_error = Some(error.message);
                None
            }
            None => {
                *self.errors.entry(format!("{kind}: no answer")).or_default() += 1;
                None
            }
        }
    }

    /// A tick (lease expiry, flushes), timed as `Tick`; the commands it hands out applied.
    fn tick(&mut self, flush: bool, now: Instant) {
        let started = Instant::now();
        if let Outcome::CommitEach(commands) = self.core.step(Event::Tick { flush }, now) {
            for command in commands {
                self.entries += 1;
                self.entry_bytes += serde_json::to_vec(&command).map_or(0, |bytes| bytes.len() as u64);
                self.core.apply(command);
            }
        }
        self.timings.record("Tick", started.elapsed());
    }
}

fn refused(kind: &'static str, driven: &mut Driven, response: Option<ControlResponse>) -> ControlBenchError {
    let message = match (driven.last_error.take(), response) {
        (Some(error), _) => error,
        (None, response) => format!("answered {response:?}"),
    };
    ControlBenchError::Refused { kind, message }
}

/// Run the benchmark. `memory` reads the process's resident bytes where the caller can (the
/// CLI reads `/proc/self/statm`); `progress` is told what is happening.
pub fn run(
    config: &ControlBenchConfig,
    memory: &dyn Fn() -> Option<u64>,
    progress: &mut dyn FnMut(&str),
) -> Result<ControlBenchReport, ControlBenchError> {
    let (jobs, ranks, workers) = (config.jobs.max(1), config.ranks, config.workers);
    if ranks == 0 || workers == 0 || config.steps == 0 || config.chunk_steps == 0 || config.prefetch == 0 || config.pull_max == 0 {
        return Err(ControlBenchError::Config("ranks, workers, steps, chunk steps, prefetch and pull-max must be at least 1".into()));
    }
    if ranks % jobs != 0 {
        return Err(ControlBenchError::Config(format!("{ranks} ranks do not split evenly over {jobs} jobs")));
    }
    let world_size = ranks / jobs;
    let start = Instant::now();
    let core_config = CoreConfig {
        scheduler: SchedulerConfig {
            lease_ttl: Duration::from_secs(10),
            lease_stall: Duration::from_secs(60),
            chunk_steps: config.chunk_steps,
            retry_delay: Duration::from_millis(500),
            trainer_ttl: Duration::from_secs(30),
            missing_grace: Duration::from_secs(10),
        },
        heartbeat: Duration::from_millis(config.round_millis * HEARTBEAT_ROUNDS),
        job_ttl: None,
        max_batch_bytes: 1 << 40,
        max_world_size: world_size,
        max_prefetch: config.prefetch,
        max_jobs: jobs as usize,
        max_datasets: 1,
        max_jobs_per_certificate: jobs as usize,
        max_state_bytes: 512 << 20,
    };
    // A shard per step (W samples each): an epoch of exactly `steps` steps of one-sample batches.
    let shard_counts = vec![u64::from(world_size); config.steps as usize];
    let dataset = DatasetInfo { name: "bench".into(), manifest: "/bench/manifest.json".into(), shard_counts, version: 1 };
    let mut core = Core::new(core_config, "bench".into(), ClusterState::new(), Box::new(CountingIds::new(1)), 1, start);
    core.step(Event::Lead { term: 1 }, start);
    let mut driven =
        Driven { core, dataset, timings: Timings::default(), entries: 0, entry_bytes: 0, errors: BTreeMap::new(), last_error: None };
    let add = ControlRequest::AddDataset { name: "bench".into(), manifest: "/bench/manifest.json".into() };
    if !matches!(driven.request("AddDataset", add, start), Some(ControlResponse::DatasetAdded { .. })) {
        return Err(refused("AddDataset", &mut driven, None));
    }

    // Ranks attach and open epoch 0.
    progress(&format!("attaching {ranks} ranks of {jobs} job(s)"));
    let before_ranks = memory();
    let mut trainers = Vec::with_capacity(ranks as usize);
    for job_index in 0..jobs {
        let spec = JobSpec {
            name: format!("job-{job_index}"),
            dataset: "bench".into(),
            plan: PlanSpec {
                seed: u64::from(job_index),
                world_size: NonZeroU32::new(world_size).unwrap_or(NonZeroU32::MIN),
                batch_size: NonZeroU32::MIN,
                shuffle: Shuffle::default(),
                tail: Tail::Drop,
            },
            transforms: TransformSpec::imagenet_train(8),
            prefetch: config.prefetch,
        };
        for rank in 0..world_size {
            let attach =
                ControlRequest::Attach { spec: spec.clone(), rank: Rank(rank), client: u64::from(job_index) << 32 | u64::from(rank) };
            let Some(ControlResponse::Attached { job, session, workers, .. }) = driven.request("Attach", attach, start) else {
                return Err(refused("Attach", &mut driven, None));
            };
            let open = ControlRequest::OpenEpoch {
                job,
                rank: Rank(rank),
                epoch: Epoch(0),
                start: Position(0),
                session,
                pass: Pass(1),
                consumed: 0,
                holding: Vec::new(),
            };
            match driven.request("OpenEpoch", open, start) {
                Some(ControlResponse::EpochOpened { steps }) if steps == u64::from(config.steps) => {}
                other => return Err(refused("OpenEpoch", &mut driven, other)),
            }
            trainers.push(Trainer {
                job,
                rank: Rank(rank),
                session,
                made: vec![false; config.steps as usize],
                consumed: 0,
                reported: 0,
                workers_version: workers.version,
            });
        }
    }
    let after_ranks = memory();

    progress(&format!("registering {workers} workers"));
    let mut simulated = Vec::with_capacity(workers as usize);
    for index in 0..workers {
        let octets = (index + 1).to_be_bytes();
        let addr = SocketAddr::from((Ipv4Addr::new(127, octets[1], octets[2], octets[3]), 7000));
        let register = ControlRequest::RegisterWorker { addr, threads: 8, instance: u64::from(index) + 1, attempt: 1 };
        let mut key = [0u8; 32];
        key[..4].copy_from_slice(&(index + 1).to_le_bytes());
        let key = CertKey(key);
        let Some(ControlResponse::WorkerRegistered { worker, .. }) = driven.request_as("RegisterWorker", register, key, start) else {
            return Err(refused("RegisterWorker", &mut driven, None));
        };
        simulated.push(Worker { id: worker, key, leases: Vec::new() });
    }
    let after_workers = memory();
    let setup_log_entries = driven.entries;
    let (setup_entries, setup_bytes) = (driven.entries, driven.entry_bytes);
    // Only the steady state's requests count below.
    for kind in ["AddDataset", "Attach", "OpenEpoch", "RegisterWorker"] {
        if let Some(nanos) = driven.timings.by_kind.get_mut(kind) {
            nanos.shrink_to_fit();
        }
    }

    let by_trainer: HashMap<(JobId, Rank), usize> =
        trainers.iter().enumerate().map(|(index, trainer)| ((trainer.job, trainer.rank), index)).collect();
    let expected = u64::from(ranks) * u64::from(config.steps);
    // The flow window as the coordinator must see it: per job, how many ranks reported how
    // many steps consumed (every rank is live throughout). No step at or past the slowest
    // report + prefetch, rounded up to whole chunks, may be granted.
    let mut reported: HashMap<JobId, BTreeMap<u64, u32>> = HashMap::new();
    for trainer in &trainers {
        *reported.entry(trainer.job).or_default().entry(0).or_default() += 1;
    }
    let chunk_steps = u64::from(config.chunk_steps);
    let window_end = |slowest: u64| (slowest + u64::from(config.prefetch)).div_ceil(chunk_steps) * chunk_steps;
    let mut leased: HashMap<LeaseId, Leased> = HashMap::new();
    // (trainer, epoch, step) → the live lease holding it. The core plans the next epoch ahead
    // of the trainers' opening it, so grants of epoch 1 come too: they are checked the same way.
    let mut holding: HashMap<(usize, u64, u64), LeaseId> = HashMap::new();
    let mut made_later: HashSet<(usize, u64, u64)> = HashSet::new();
    let (mut made, mut grants, mut round) = (0u64, 0u64, 0u64);
    let rounds_per_second = (1000 / config.round_millis.max(1)).max(1);
    progress(&format!("running epoch 0: {expected} steps of {ranks} ranks"));
    while made < expected {
        if round >= config.max_rounds {
            return Err(ControlBenchError::Stalled { rounds: round, done: made, expected });
        }
        let now = start + Duration::from_millis(round * config.round_millis);
        // Workers: last round's chunks done, a heartbeat now and then, then a pull.
        let count = simulated.len();
        for offset in 0..count {
            let worker = &mut simulated[(offset + round as usize) % count];
            for lease in std::mem::take(&mut worker.leases) {
                let Some(Leased { trainer, epoch, first, steps }) = leased.remove(&lease) else {
                    continue;
                };
                if !matches!(
                    driven.request_as("ChunkDone", ControlRequest::ChunkDone { worker: worker.id, lease }, worker.key, now),
                    Some(ControlResponse::Ack)
                ) {
                    continue;
                }
                for step in first..first + steps {
                    holding.remove(&(trainer, epoch, step));
                    if epoch > 0 {
                        if !made_later.insert((trainer, epoch, step)) {
                            return Err(ControlBenchError::Violation(format!(
                                "step {step} of epoch {epoch} of trainer {trainer} made twice"
                            )));
                        }
                        continue;
                    }
                    let slot = &mut trainers[trainer].made[step as usize];
                    if *slot {
                        return Err(ControlBenchError::Violation(format!("step {step} of trainer {trainer} made twice")));
                    }
                    *slot = true;
                    made += 1;
                }
            }
            if round % HEARTBEAT_ROUNDS == (offset as u64) % HEARTBEAT_ROUNDS {
                let heartbeat = ControlRequest::Heartbeat {
                    worker: worker.id,
                    leases: Vec::<LeaseProgress>::new(),
                    images: 0,
                    stuck_jobs: Vec::new(),
                    decoded: stoker_proto::Decoded::default(),
                };
                if let Some(ControlResponse::HeartbeatAck { revoked, .. }) = driven.request_as("Heartbeat", heartbeat, worker.key, now)
                    && !revoked.is_empty()
                {
                    return Err(ControlBenchError::Violation(format!("leases {revoked:?} revoked from a worker that holds none")));
                }
            }
            let pull = ControlRequest::PullChunks { worker: worker.id, max: config.pull_max, held: Vec::new() };
            let Some(ControlResponse::Chunks { grants: granted }) = driven.request_as("PullChunks", pull, worker.key, now) else {
                continue;
            };
            for grant in granted {
                let chunk = grant.chunk;
                let Some(&trainer) = by_trainer.get(&(chunk.job, chunk.rank)) else {
                    return Err(ControlBenchError::Violation(format!("a chunk of an unknown rank: {chunk:?}")));
                };
                let (epoch, first, steps) = (chunk.epoch.0, chunk.first_step.0, u64::from(chunk.steps));
                // Epoch 1's run (made early) has no rank in it yet: its window starts at 0.
                let slowest = match epoch {
                    0 => reported.get(&chunk.job).and_then(|counts| counts.keys().next().copied()).unwrap_or(0),
                    _ => 0,
                };
                if first + steps > window_end(slowest) {
                    return Err(ControlBenchError::Violation(format!(
                        "{chunk:?} granted past the flow window (slowest rank reported {slowest}, prefetch {})",
                        config.prefetch
                    )));
                }
                for step in first..first + steps {
                    let made_already = match epoch {
                        0 => trainers[trainer].made.get(step as usize).copied().unwrap_or(true),
                        _ => made_later.contains(&(trainer, epoch, step)),
                    };
                    if step >= u64::from(config.steps) || made_already {
                        return Err(ControlBenchError::Violation(format!("step {step} of {chunk:?} granted again after it was made")));
                    }
                    if let Some(other) = holding.insert((trainer, epoch, step), grant.lease) {
                        return Err(ControlBenchError::Violation(format!(
                            "step {step} of {chunk:?} granted under {other} and {}",
                            grant.lease
                        )));
                    }
                }
                leased.insert(grant.lease, Leased { trainer, epoch, first, steps });
                worker.leases.push(grant.lease);
                grants += 1;
            }
        }
        // Trainers report what they consumed once a virtual second, spread over the rounds.
        for (index, trainer) in trainers.iter_mut().enumerate() {
            if (index as u64) % rounds_per_second != round % rounds_per_second {
                continue;
            }
            while trainer.made.get(trainer.consumed as usize).copied().unwrap_or(false) {
                trainer.consumed += 1;
            }
            let report = ControlRequest::ReportProgress {
                job: trainer.job,
                rank: trainer.rank,
                epoch: Epoch(0),
                start: Position(0),
                consumed: trainer.consumed,
                wait_seconds: 0.0,
                batches: trainer.consumed,
                samples: trainer.consumed,
                session: trainer.session,
                pass: Pass(1),
                missing: Vec::new(),
                workers_version: trainer.workers_version,
            };
            let answer = driven.request("ReportProgress", report, now);
            if let Some(ControlResponse::ProgressRecorded { workers: Some(listed), .. }) = &answer {
                trainer.workers_version = listed.version;
            }
            if answer.is_some() && trainer.consumed != trainer.reported {
                let counts = reported.entry(trainer.job).or_default();
                if let Some(count) = counts.get_mut(&trainer.reported) {
                    *count -= 1;
                    if *count == 0 {
                        counts.remove(&trainer.reported);
                    }
                }
                *counts.entry(trainer.consumed).or_default() += 1;
                trainer.reported = trainer.consumed;
            }
        }
        driven.tick(round % rounds_per_second == 0, now);
        round += 1;
        if round % (rounds_per_second * 10) == 0 {
            progress(&format!("{made} of {expected} steps made, {grants} chunks granted"));
        }
    }
    let left = holding.keys().filter(|(_, epoch, _)| *epoch == 0).count();
    if left > 0 {
        return Err(ControlBenchError::Violation(format!("{left} steps of epoch 0 still leased after it was made")));
    }

    let steady = ["PullChunks", "ChunkDone", "ReportProgress", "Heartbeat", "Tick"];
    let core_seconds = driven.timings.total_seconds(&steady);
    let virtual_seconds = (round * config.round_millis) as f64 / 1000.0;
    let progress_seconds = driven.timings.total_seconds(&["ReportProgress"]);
    let per = |after: Option<u64>, before: Option<u64>, count: u32| match (after, before) {
        (Some(after), Some(before)) => Some(after.saturating_sub(before) as f64 / f64::from(count)),
        _ => None,
    };
    Ok(ControlBenchReport {
        config: config.clone(),
        grants,
        steps_made: made,
        grants_per_core_second: if core_seconds > 0.0 { grants as f64 / core_seconds } else { 0.0 },
        core_millis_per_1000_grants: if grants > 0 { core_seconds * 1e3 * 1000.0 / grants as f64 } else { 0.0 },
        progress_core_share: if virtual_seconds > 0.0 { progress_seconds / virtual_seconds } else { 0.0 },
        virtual_seconds,
        log_entries_per_second: if virtual_seconds > 0.0 { (driven.entries - setup_entries) as f64 / virtual_seconds } else { 0.0 },
        log_bytes_per_second: if virtual_seconds > 0.0 { (driven.entry_bytes - setup_bytes) as f64 / virtual_seconds } else { 0.0 },
        setup_log_entries,
        errors: driven.errors.into_iter().collect(),
        kinds: driven.timings.reports(),
        memory_per_rank_bytes: per(after_ranks, before_ranks, ranks),
        memory_per_worker_bytes: per(after_workers, after_ranks, workers),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 35's test at a reduced size: 1,000 ranks of 2 jobs and 100 workers through a
    /// whole epoch, every grant checked against the book (no step leased twice, none made
    /// twice, none left over); correctness, not speed.
    #[test]
    fn a_thousand_ranks_and_a_hundred_workers_make_every_step_once() {
        let config = ControlBenchConfig { ranks: 1_000, workers: 100, jobs: 2, steps: 8, ..ControlBenchConfig::default() };
        let report = run(&config, &|| None, &mut |_| {}).unwrap_or_else(|error| panic!("{error}"));
        assert_eq!(report.steps_made, 1_000 * 8, "every step of epoch 0 made");
        assert!(report.grants >= 1_000 * 8 / 2, "{} grants (epoch 0's chunks of 2 steps, and some of epoch 1)", report.grants);
        assert!(report.errors.is_empty(), "{:?}", report.errors);
        let kinds: Vec<&str> = report.kinds.iter().map(|kind| kind.kind).collect();
        for kind in ["Attach", "ChunkDone", "Heartbeat", "OpenEpoch", "PullChunks", "RegisterWorker", "ReportProgress", "Tick"] {
            assert!(kinds.contains(&kind), "{kind} missing from {kinds:?}");
        }
    }

    /// More workers than one certificate may register (each has its own, as in a cluster).
    #[test]
    fn workers_beyond_one_certificates_bound_register() {
        let config = ControlBenchConfig { ranks: 8, workers: 300, jobs: 1, steps: 4, ..ControlBenchConfig::default() };
        let report = run(&config, &|| None, &mut |_| {}).unwrap_or_else(|error| panic!("{error}"));
        assert_eq!(report.steps_made, 32);
    }

    #[test]
    fn a_cluster_that_cannot_be_simulated_is_refused() {
        let uneven = ControlBenchConfig { ranks: 10, jobs: 3, ..ControlBenchConfig::default() };
        assert!(matches!(run(&uneven, &|| None, &mut |_| {}), Err(ControlBenchError::Config(_))));
        let no_workers = ControlBenchConfig { workers: 0, ..ControlBenchConfig::default() };
        assert!(matches!(run(&no_workers, &|| None, &mut |_| {}), Err(ControlBenchError::Config(_))));
    }

    /// A round budget too small to finish is a stall, reported with how far it got.
    #[test]
    fn an_epoch_that_does_not_finish_is_a_stall() {
        let config =
            ControlBenchConfig { ranks: 100, workers: 1, jobs: 1, steps: 64, pull_max: 1, max_rounds: 3, ..ControlBenchConfig::default() };
        match run(&config, &|| None, &mut |_| {}) {
            Err(ControlBenchError::Stalled { rounds: 3, done, expected: 6_400 }) => assert!(done <= 3 * 2, "{done}"),
            other => panic!("{other:?}"),
        }
    }
}
