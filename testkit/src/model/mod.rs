//! A randomized model of the delivery protocol (issue 15): the real coordinator (in memory, on
//! a simulated clock), the real trainer protocol ([`stoker_client::protocol`]) and the real
//! worker lease ledger ([`stoker_worker::node::ledger`]), connected by a simulated network
//! that delays, reorders, duplicates and loses messages, while workers die, wedge and come
//! back, trainers restart their process, call `set_epoch` or `load_state_dict` mid-epoch or
//! iterate an epoch again, and the coordinator restarts (losing its soft state).
//!
//! Each seed is one schedule: the faults happen in a first phase, then the world runs quietly.
//! The schedule passes when every pass of every rank yielded its steps exactly once, in order,
//! with the content its plan gives them, and every rank finished its training program within
//! two simulated minutes of the last fault (no step lost for good, no worker or window wedged).
//! A failing seed prints the schedule it ran; `STOKER_MODEL_SEED=N` replays it.

mod ctx;
mod net;
mod trainer;
mod worker;

use std::fmt;
use std::num::NonZeroU32;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use stoker_coordinator::state::ClusterState;
use stoker_coordinator::{CoordinatorConfig, LocalCoordinator};
use stoker_coordinator_core::SeededIds;
use stoker_format::manifest::MANIFEST_VERSION;
use stoker_format::{Manifest, ManifestShard};
use stoker_plan::ids::{Epoch, LeaseId, Rank};
use stoker_plan::prng::SplitMix64;
use stoker_plan::transform::TransformSpec;
use stoker_plan::{PlanSpec, ShardTable, Shuffle, Tail};
use stoker_proto::{ControlRequest, ControlResponse, JobSpec};

use self::ctx::{Ack, Ctx, Delivery, Hello, Sender, Setup};
use self::net::Net;
use self::trainer::{Program, SimTrainer};
use self::worker::SimWorker;

/// What one schedule did.
#[derive(Clone, Debug, Default)]
pub struct Outcome {
    /// Steps yielded by all ranks (every pass).
    pub steps_yielded: u64,
    /// Simulated time until every rank finished.
    pub simulated: Duration,
    /// Faults and protocol events seen.
    pub counts: FaultCounts,
}

/// Faults injected and protocol events seen in a schedule.
#[derive(Clone, Debug, Default)]
pub struct FaultCounts {
    /// Workers killed.
    pub worker_deaths: u64,
    /// Workers wedged (alive, making nothing) for a while.
    pub worker_wedges: u64,
    /// Trainer processes restarted (crashed or stopped).
    pub trainer_restarts: u64,
    /// Coordinator restarts (soft state lost).
    pub coordinator_restarts: u64,
    /// Control messages delivered seconds late (a call that timed out and was applied later).
    pub late_messages: u64,
    /// Control messages delivered twice.
    pub duplicated_messages: u64,
    /// Batches acknowledged and then lost by the trainer.
    pub lost_batches: u64,
    /// Batches delivered twice.
    pub duplicated_batches: u64,
    /// `set_epoch` calls mid-pass.
    pub set_epochs: u64,
    /// `load_state_dict` calls mid-pass.
    pub loads: u64,
    /// Progress reports that named missing steps.
    pub missing_reports: u64,
    /// Training loops that stopped iterating for a while, their loader alive.
    pub pauses: u64,
    /// The most times one step of one run of one rank was made.
    pub most_makes_of_a_step: u32,
    /// Grants a worker refused because the job's pipeline there was stuck.
    pub refusals: u64,
    /// The most times one chunk was refused after the faults stopped.
    pub most_quiet_refusals_of_a_chunk: u32,
    /// Heartbeats that reported a job stuck.
    pub stuck_reports: u64,
    /// Opens asked again (unanswered, or the coordinator could not answer yet).
    pub open_retries: u64,
    /// Copies of a step the trainers dropped.
    pub duplicates: u64,
    /// Batches of past runs the trainers dropped.
    pub dropped: u64,
}

/// A schedule that broke the protocol's promise.
#[derive(Clone, Debug)]
pub struct ModelFailure {
    /// The seed that replays it.
    pub seed: u64,
    /// What went wrong.
    pub message: String,
    /// The schedule, one line per event.
    pub schedule: Vec<String>,
    /// Its scale.
    pub scale: Scale,
}

impl fmt::Display for ModelFailure {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(formatter, "protocol model, seed {}: {}", self.seed, self.message)?;
        let (variable, test) = match self.scale {
            Scale::Small => ("STOKER_MODEL_SEED", "protocol_model::every_step_is_yielded_exactly_once_under_random_faults"),
            Scale::Large => ("STOKER_MODEL_LARGE_SEED", "protocol_model::at_hundreds_of_ranks"),
        };
        writeln!(formatter, "replay: {variable}={} cargo test -p stoker-testkit --test it {test} -- --nocapture", self.seed)?;
        // `STOKER_MODEL_FULL_LOG=1`: every event, not the last 400.
        let kept = if std::env::var_os("STOKER_MODEL_FULL_LOG").is_some() { usize::MAX } else { 400 };
        let skip = self.schedule.len().saturating_sub(kept);
        writeln!(formatter, "schedule ({} events{}):", self.schedule.len(), if skip > 0 { ", the last 400" } else { "" })?;
        for line in &self.schedule[skip..] {
            writeln!(formatter, "  {line}")?;
        }
        Ok(())
    }
}

/// How big a schedule's cluster is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scale {
    /// 1–3 ranks and workers over 19 samples: every interleaving close together.
    Small,
    /// 100–300 ranks and 20–120 workers over 1,381 samples (issue 35): the same faults and
    /// checks where the scheduler's indexes, windows and liveness hold many ranks and workers.
    Large,
}

/// Run the schedule of `seed`.
pub fn run(seed: u64) -> Result<Outcome, ModelFailure> {
    run_at(seed, Scale::Small)
}

/// Run the schedule of `seed` at `scale`.
pub fn run_at(seed: u64, scale: Scale) -> Result<Outcome, ModelFailure> {
    let mut world = World::new(seed, scale).map_err(|message| ModelFailure { seed, message, schedule: Vec::new(), scale })?;
    match world.run() {
        Ok(outcome) => Ok(outcome),
        Err(message) => Err(ModelFailure { seed, message, schedule: std::mem::take(&mut world.ctx.log), scale }),
    }
}

/// The manifest every schedule of `scale` registers: 4 shards and 19 samples, or 12 shards and
/// 1,381 samples (only the counts matter; no shard is read).
fn manifest(scale: Scale) -> Result<PathBuf, String> {
    static SMALL: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    static LARGE: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let (path, counts): (_, &[u64]) = match scale {
        Scale::Small => (&SMALL, &[5, 3, 7, 4]),
        Scale::Large => (&LARGE, &[97, 131, 83, 149, 110, 77, 163, 121, 91, 139, 103, 117]),
    };
    path.get_or_init(|| {
        let dir = crate::unique_temp_dir("stoker-model")?;
        let shards =
            counts.iter().enumerate().map(|(index, samples)| ManifestShard { uri: format!("s{index}.tar"), samples: *samples, bytes: 0 });
        let manifest = Manifest { version: MANIFEST_VERSION, shards: shards.collect(), classes: Vec::new(), packed: None };
        let path = dir.join("manifest.json");
        manifest.save(&path).map_err(|error| error.to_string())?;
        Ok(path)
    })
    .clone()
}

/// The most times a step may be made once the faults have stopped.
const MAX_QUIET_MAKES: u32 = 6;
/// The most times a chunk may be refused once the faults have stopped: a stuck worker reports
/// the job at its next heartbeat, and then gets none of it.
const MAX_QUIET_REFUSALS: u32 = 2;

/// The real coordinator in local mode (commits applied at once) over `state`, with ids drawn
/// from `seed` and counted from `id_base`, started at `now`.
fn coordinator(config: &CoordinatorConfig, state: ClusterState, seed: u64, id_base: u64, now: Instant) -> Result<LocalCoordinator, String> {
    let ids = Box::new(SeededIds::new(seed ^ id_base.rotate_left(17)));
    LocalCoordinator::new(config.clone(), state, ids, id_base, now).map_err(|error| error.to_string())
}

struct World {
    scale: Scale,
    ctx: Ctx,
    setup: Setup,
    config: CoordinatorConfig,
    coordinator: LocalCoordinator,
    /// The schedule's seed: the coordinator's ids are drawn from it (and the id base).
    seed: u64,
    id_base: u64,
    trainers: Vec<SimTrainer>,
    workers: Vec<SimWorker>,
    next_generation: u64,
    fault_until_ms: u64,
}

impl World {
    fn new(seed: u64, scale: Scale) -> Result<Self, String> {
        let mut rng = SplitMix64::new(seed);
        let mut pick = |low: u64, high: u64| low + rng.below(high - low + 1);
        let (world_size, batch_size) = match scale {
            Scale::Small => (pick(1, 3) as u32, pick(1, 3) as u32),
            Scale::Large => (pick(100, 300) as u32, pick(1, 2) as u32),
        };
        let tail = [Tail::Drop, Tail::Pad, Tail::Partial][pick(0, 2) as usize];
        let shuffle = [Shuffle::None, Shuffle::Full, Shuffle::Window { shards: NonZeroU32::MIN }, Shuffle::default()][pick(0, 3) as usize];
        let chunk_steps = pick(1, 3) as u32;
        let prefetch = pick(1, 4) as u32;
        let workers = match scale {
            Scale::Small => pick(1, 3) as usize,
            Scale::Large => pick(20, 120) as usize,
        };
        let epochs = pick(1, 3);
        let fault_until_ms = if pick(0, 9) == 0 { 0 } else { pick(2_000, 25_000) };
        let nack_after = Duration::from_millis([250, 1_000, 2_000][pick(0, 2) as usize]);
        let mut config = CoordinatorConfig::new(PathBuf::new());
        config.lease_ttl = Duration::from_secs(3);
        config.heartbeat = Duration::from_millis(500);
        config.chunk_steps = chunk_steps;
        config.retry_delay = Duration::from_millis(500);
        config.trainer_ttl = Duration::from_secs(5);
        config.lease_stall = Duration::from_secs(10);
        config.missing_grace = Duration::from_secs(1);
        let id_base = 1_000;
        let base = Instant::now();
        let coordinator = coordinator(&config, ClusterState::new(), seed, id_base, base)?;
        let path = manifest(scale)?;
        let added = coordinator
            .handle(ControlRequest::AddDataset { name: "model".into(), manifest: path.to_string_lossy().into_owned() }, base)
            .map_err(|error| error.to_string())?;
        let ControlResponse::DatasetAdded { dataset } = added else { return Err(format!("unexpected {added:?}")) };
        let plan = PlanSpec {
            seed: seed ^ 0x5eed,
            world_size: NonZeroU32::new(world_size).ok_or("world size 0")?,
            batch_size: NonZeroU32::new(batch_size).ok_or("batch size 0")?,
            shuffle,
            tail,
        };
        let spec = JobSpec { name: "model".into(), dataset: "model".into(), plan, transforms: TransformSpec::imagenet_train(8), prefetch };
        let attached = coordinator
            .handle(ControlRequest::Attach { spec: spec.clone(), rank: Rank(0), client: 1 }, base)
            .map_err(|error| error.to_string())?;
        let ControlResponse::Attached { job, .. } = attached else { return Err(format!("unexpected {attached:?}")) };
        let table = Arc::new(ShardTable::new(dataset.shard_counts.iter().copied()).map_err(|error| error.to_string())?);
        let setup = Setup { spec, job, table, dataset_version: dataset.version, nack_after, heartbeat_ms: 500 };
        let mut ctx = Ctx {
            rng,
            base,
            now_ms: 0,
            faulty: fault_until_ms > 0,
            faults_land_by_ms: 0,
            job,
            requests: Net::default(),
            replies: Net::default(),
            calls: 0,
            deliveries: Net::default(),
            acks: Net::default(),
            hellos: Net::default(),
            alive_workers: Vec::new(),
            quiet_makes: std::collections::HashMap::new(),
            quiet_refusals: std::collections::HashMap::new(),
            counts: FaultCounts::default(),
            log: Vec::new(),
        };
        ctx.note(format!(
            "W={world_size} B={batch_size} {tail:?} {shuffle:?} chunk={chunk_steps} prefetch={prefetch} workers={workers} epochs={epochs} nack_after={nack_after:?} faults until {fault_until_ms} ms"
        ));
        let program = Program { epoch: Epoch(0), last_epoch: Epoch(epochs - 1), saved_opt: None, resume_opt: None };
        let mut next_generation = 1;
        let mut trainers = Vec::new();
        for rank in 0..world_size {
            trainers.push(SimTrainer::new(Rank(rank), next_generation, program.clone(), &setup, 0));
            next_generation += 1;
        }
        let mut simulated_workers = Vec::new();
        for index in 0..workers {
            simulated_workers.push(SimWorker::new(index, next_generation));
            next_generation += 1;
        }
        Ok(Self {
            scale,
            ctx,
            setup,
            config,
            coordinator,
            seed,
            id_base,
            trainers,
            workers: simulated_workers,
            next_generation,
            fault_until_ms,
        })
    }

    fn run(&mut self) -> Result<Outcome, String> {
        // Once the faults stop, the ranks finish within this (a rank may still pause for up to
        // a minute while it waits, as a user's Ctrl-C would). A large schedule's job has many
        // more steps to make after its faults, by fewer healthy workers per rank.
        let deadline_ms = self.fault_until_ms
            + match self.scale {
                Scale::Small => 120_000,
                Scale::Large => 300_000,
            };
        loop {
            if self.trainers.iter().all(SimTrainer::is_done) {
                let steps_yielded = self.trainers.iter().map(|trainer| trainer.yielded_total).sum();
                return Ok(Outcome { steps_yielded, simulated: Duration::from_millis(self.ctx.now_ms), counts: self.ctx.counts.clone() });
            }
            // Once the faults stop, a step is made again only for what the faults left behind,
            // a few times at most; more means a loop (a stale request repeated, a step handed
            // back and forth).
            if self.ctx.counts.most_makes_of_a_step > MAX_QUIET_MAKES {
                let (key, makes) =
                    self.ctx.quiet_makes.iter().max_by_key(|(_, makes)| **makes).map(|(key, makes)| (*key, *makes)).unwrap_or_default();
                return Err(format!("{key:?} was made {makes} times after the faults stopped:\n{}", self.state()));
            }
            if self.ctx.counts.most_quiet_refusals_of_a_chunk > MAX_QUIET_REFUSALS {
                let (key, refusals) =
                    self.ctx.quiet_refusals.iter().max_by_key(|(_, refusals)| **refusals).map(|(key, n)| (*key, *n)).unwrap_or_default();
                return Err(format!("the chunk {key:?} was refused {refusals} times after the faults stopped:\n{}", self.state()));
            }
            if self.ctx.now_ms > deadline_ms {
                return Err(self.wedged());
            }
            self.ctx.now_ms += 5 + self.ctx.rng.below(100);
            self.ctx.faulty = self.ctx.now_ms < self.fault_until_ms;
            self.coordinator.tick(self.ctx.now());
            if self.ctx.faulty {
                self.inject_faults()?;
            } else {
                // The quiet phase: every worker is back.
                for index in 0..self.workers.len() {
                    if !self.workers[index].alive {
                        self.start_worker_again(index);
                    }
                }
            }
            self.ctx.alive_workers =
                self.workers.iter().filter(|worker| worker.alive).map(|worker| (worker.index, worker.generation)).collect();
            self.deliver()?;
            for trainer in &mut self.trainers {
                trainer.tick(&mut self.ctx, &self.setup)?;
            }
            for worker in &mut self.workers {
                worker.tick(&mut self.ctx, &self.setup);
            }
        }
    }

    fn inject_faults(&mut self) -> Result<(), String> {
        for index in 0..self.workers.len() {
            if self.workers[index].alive && self.ctx.chance(0.003) {
                self.ctx.counts.worker_deaths += 1;
                self.ctx.note(format!("worker {index} killed: {}", self.workers[index].describe()));
                self.workers[index].alive = false;
            } else if !self.workers[index].alive && self.ctx.chance(0.01) {
                self.start_worker_again(index);
            } else if self.workers[index].alive && self.ctx.chance(0.002) {
                // Often past the lease stall timeout (10 s here): the coordinator takes the
                // leases back, and the worker must not take the job's steps straight back.
                // Sometimes for good (a mount that never comes back), while another worker is
                // healthy: the job must go on without it.
                let others_healthy =
                    self.workers.iter().filter(|worker| worker.index != index && worker.wedged_until_ms != u64::MAX).count();
                let until = if others_healthy > 0 && self.ctx.chance(0.3) {
                    u64::MAX
                } else {
                    self.ctx.now_ms + 5_000 + self.ctx.rng.below(35_000)
                };
                self.ctx.counts.worker_wedges += 1;
                self.ctx.note(format!(
                    "worker {index} wedged until {}",
                    if until == u64::MAX { "forever".to_owned() } else { format!("{until} ms") }
                ));
                self.workers[index].wedged_until_ms = until;
            }
        }
        for rank in 0..self.trainers.len() {
            if !self.trainers[rank].is_done() && self.ctx.chance(0.002) {
                self.restart_trainer(rank);
            }
        }
        if self.ctx.chance(0.0005) {
            self.ctx.counts.coordinator_restarts += 1;
            self.ctx.note("coordinator restarts (soft state lost)".to_owned());
            self.id_base += 1_000_000_000;
            self.coordinator = coordinator(&self.config, self.coordinator.state(), self.seed, self.id_base, self.ctx.now())?;
        }
        Ok(())
    }

    /// A new worker process in place of a dead one; trainers connect to it (they learn of it
    /// from their progress answers).
    fn start_worker_again(&mut self, index: usize) {
        self.ctx.note(format!("worker {index} starts again"));
        self.workers[index] = SimWorker::new(index, self.next_generation);
        self.next_generation += 1;
        let worker_generation = self.workers[index].generation;
        for trainer in &self.trainers {
            if let Some(session) = trainer.session_opt {
                let at = self.ctx.now_ms + 50 + self.ctx.rng.below(1_000);
                let hello = Hello { worker: index, worker_generation, rank: trainer.rank, session, trainer_generation: trainer.generation };
                self.ctx.hellos.send(at, hello);
            }
        }
    }

    /// A trainer process stops (killed, or its loader dropped: then it detaches) and a new one
    /// starts from the state the program saved.
    fn restart_trainer(&mut self, rank: usize) {
        let old = &self.trainers[rank];
        let graceful = self.ctx.chance(0.5);
        self.ctx.counts.trainer_restarts += 1;
        self.ctx.note(format!("{} restarts ({}): {}", old.rank, if graceful { "detaches" } else { "killed" }, old.describe()));
        if graceful && let Some(session) = old.session_opt {
            let from = Sender::Trainer { rank: old.rank, generation: old.generation };
            self.ctx.call(from, ControlRequest::Detach { job: self.setup.job, rank: old.rank, session });
        }
        let mut program = old.program.clone();
        program.resume_opt = None;
        let start_ms = self.ctx.now_ms + 500 + self.ctx.rng.below(2_500);
        let new = SimTrainer::new(old.rank, self.next_generation, program, &self.setup, start_ms);
        self.next_generation += 1;
        self.trainers[rank] = new;
    }

    fn deliver(&mut self) -> Result<(), String> {
        let now = self.ctx.now();
        for (from, call, request) in self.ctx.requests.due(self.ctx.now_ms) {
            let answer = self.coordinator.handle(request, now);
            let at = self.ctx.now_ms + self.ctx.latency();
            self.ctx.replies.send(at, (from, call, answer));
        }
        for (to, call, answer) in self.ctx.replies.due(self.ctx.now_ms) {
            match to {
                Sender::Trainer { rank, generation } => {
                    if let Some(trainer) = self.trainers.get_mut(rank.0 as usize).filter(|trainer| trainer.generation == generation) {
                        trainer.on_reply(&mut self.ctx, &self.setup, call, answer)?;
                    }
                }
                Sender::Worker { index, generation } => {
                    if let Some(worker) = self.workers.get_mut(index).filter(|worker| worker.generation == generation && worker.alive) {
                        worker.on_reply(&mut self.ctx, call, answer);
                    }
                }
            }
        }
        for hello in self.ctx.hellos.due(self.ctx.now_ms) {
            let trainers = &self.trainers;
            let alive = |generation: u64| trainers.iter().any(|trainer| trainer.generation == generation);
            if let Some(worker) =
                self.workers.get_mut(hello.worker).filter(|worker| worker.generation == hello.worker_generation && worker.alive)
            {
                worker.on_hello(hello.rank, hello.session, hello.trainer_generation, alive);
            }
        }
        for delivery in self.ctx.deliveries.due(self.ctx.now_ms) {
            let rank = delivery.batch.rank.0 as usize;
            let reached = self.trainers.get(rank).is_some_and(|trainer| trainer.generation == delivery.trainer_generation);
            if reached {
                if self.ctx.faulty && self.ctx.chance(0.03) {
                    self.ctx.counts.lost_batches += 1;
                    self.ctx.note(format!("batch {:?} {} acknowledged, then lost by the trainer", delivery.batch.run, delivery.batch.step));
                } else if let Some(trainer) = self.trainers.get_mut(rank) {
                    trainer.on_batch(&mut self.ctx, delivery.batch);
                }
            }
            if delivery.lease != LeaseId(u64::MAX) {
                let at = self.ctx.now_ms + self.ctx.latency();
                self.ctx.acks.send(
                    at,
                    Ack {
                        worker: delivery.worker,
                        worker_generation: delivery.worker_generation,
                        lease: delivery.lease,
                        delivered: reached,
                    },
                );
            }
        }
        for ack in self.ctx.acks.due(self.ctx.now_ms) {
            if let Some(worker) =
                self.workers.get_mut(ack.worker).filter(|worker| worker.generation == ack.worker_generation && worker.alive)
            {
                worker.on_ack(&mut self.ctx, ack.lease, ack.delivered);
            }
        }
        Ok(())
    }

    fn wedged(&mut self) -> String {
        let (now_ms, faults_ms) = (self.ctx.now_ms, self.fault_until_ms);
        format!("not every rank finished in time after the last fault (at {faults_ms} ms; at {now_ms} ms):\n{}", self.state())
    }

    /// Every actor's state and the coordinator's view, for a failure report.
    fn state(&mut self) -> String {
        let mut lines = Vec::new();
        lines.extend(self.trainers.iter().map(|trainer| format!("  {}", trainer.describe())));
        lines.extend(self.workers.iter().map(|worker| format!("  {}", worker.describe())));
        if let Ok(ControlResponse::Status { status }) = self.coordinator.handle(ControlRequest::Status, self.ctx.now()) {
            for job in status.jobs {
                lines.push(format!(
                    "  coordinator: steps queued {} chunks leased {} ranks {:?}",
                    job.steps_queued, job.chunks_leased, job.ranks
                ));
            }
        }
        lines.push(format!("  messages in flight: {}", self.ctx.requests.len()));
        lines.join("\n")
    }
}
