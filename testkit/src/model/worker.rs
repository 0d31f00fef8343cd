//! A worker in the model: the real [`LeaseLedger`] driven the way `stoker_worker::node` drives
//! it (register, heartbeat with lease progress, pull when there is room, make each leased
//! step, push it to the newest trainer session of its rank that the grant allows, report each
//! lease once), with the faults of a real one: it dies (its leases expire), it wedges (it
//! heartbeats but makes nothing: its leases stall), and it comes back.

use std::collections::{BTreeMap, HashMap};

use stoker_plan::EpochPlan;
use stoker_plan::ids::{LeaseId, Rank, SessionId, Step, WorkerId};
use stoker_proto::{ChunkGrant, ControlRequest, ControlResponse, ErrorCode, RemoteError, StuckJob};
use stoker_worker::node::ledger::{Ending, Failure, LeaseLedger};

use super::trainer::SimBatch;
use super::{Ctx, Delivery, Sender, Setup};

/// How long a batch waits for its trainer's connection before its lease fails.
const TRAINER_PATIENCE_MS: u64 = 3_000;
/// Batches a worker makes or delivers at once.
const IN_FLIGHT: usize = 4;

#[derive(Debug)]
struct Held {
    grant: ChunkGrant,
    /// Steps of the chunk made so far.
    made: u32,
}

/// One worker process.
#[derive(Debug)]
pub(crate) struct SimWorker {
    pub(crate) index: usize,
    pub(crate) generation: u64,
    pub(crate) alive: bool,
    pub(crate) wedged_until_ms: u64,
    id_opt: Option<WorkerId>,
    register_sent_opt: Option<u64>,
    register_attempts: u64,
    ledger: LeaseLedger,
    held: BTreeMap<LeaseId, Held>,
    /// The trainer connection of each rank: (session, trainer generation).
    connections: HashMap<Rank, (SessionId, u64)>,
    /// Batches waiting for their trainer's connection, since when.
    waiting: Vec<(LeaseId, SimBatch, SessionId, u64)>,
    /// The pull in flight: when it was sent, and its call.
    pull_sent_opt: Option<(u64, u64)>,
    heartbeat_sent_ms: u64,
    /// The worker id each call in flight was sent under (as the worker does, an answer that
    /// the coordinator forgot an id only drops that id, not a newer one).
    sent_as: BTreeMap<u64, WorkerId>,
    /// Half the coordinator's lease stall, from the registration: a job's pipeline is stuck
    /// after making nothing of its work for this long.
    stuck_after: std::time::Duration,
}

impl SimWorker {
    pub(crate) fn new(index: usize, generation: u64) -> Self {
        Self {
            index,
            generation,
            alive: true,
            wedged_until_ms: 0,
            id_opt: None,
            register_sent_opt: None,
            register_attempts: 0,
            ledger: LeaseLedger::default(),
            held: BTreeMap::new(),
            connections: HashMap::new(),
            waiting: Vec::new(),
            pull_sent_opt: None,
            heartbeat_sent_ms: 0,
            sent_as: BTreeMap::new(),
            stuck_after: std::time::Duration::from_secs(30),
        }
    }

    fn me(&self) -> Sender {
        Sender::Worker { index: self.index, generation: self.generation }
    }

    /// What this worker holds, for a failure report.
    pub(crate) fn describe(&self) -> String {
        format!(
            "worker {} gen {} alive {} {:?} outstanding {} held {:?}",
            self.index,
            self.generation,
            self.alive,
            self.id_opt,
            self.ledger.outstanding(),
            self.held
                .iter()
                .map(|(lease, held)| (lease.0, held.grant.chunk.rank.0, held.grant.chunk.first_step.0, held.made))
                .collect::<Vec<_>>()
        )
    }

    /// One tick: register, heartbeat, pull, make and push batches.
    pub(crate) fn tick(&mut self, ctx: &mut Ctx, setup: &Setup) {
        if !self.alive {
            return;
        }
        let Some(worker) = self.id_opt else {
            if self.register_sent_opt.is_none_or(|sent| ctx.now_ms.saturating_sub(sent) > 10_000) {
                self.register_attempts += 1;
                // The process: a restarted worker is another one, at the same address.
                let instance = (self.index as u64 + 1) << 32 | self.generation;
                let register = ControlRequest::RegisterWorker {
                    addr: setup.worker_addr(self.index),
                    threads: 1,
                    instance,
                    attempt: self.register_attempts,
                };
                ctx.call(self.me(), register);
                self.register_sent_opt = Some(ctx.now_ms);
            }
            return;
        };
        if ctx.now_ms.saturating_sub(self.heartbeat_sent_ms) >= setup.heartbeat_ms {
            let stuck_jobs: Vec<StuckJob> =
                self.ledger.stuck_jobs(ctx.now(), self.stuck_after).into_iter().map(|job| StuckJob::new(job, "made nothing")).collect();
            if !stuck_jobs.is_empty() {
                ctx.counts.stuck_reports += 1;
                ctx.note(format!("worker {} reports {stuck_jobs:?} stuck", self.index));
            }
            let call = ctx.call(
                self.me(),
                ControlRequest::Heartbeat {
                    worker,
                    leases: self.ledger.progress(),
                    images: 0,
                    stuck_jobs,
                    decoded: stoker_proto::Decoded::default(),
                },
            );
            self.sent_as.insert(call, worker);
            self.heartbeat_sent_ms = ctx.now_ms;
        }
        if self.ledger.outstanding() < IN_FLIGHT && self.pull_sent_opt.is_none_or(|(sent, _)| ctx.now_ms.saturating_sub(sent) > 10_000) {
            let max = ((IN_FLIGHT - self.ledger.outstanding()) / 2).max(1) as u32;
            let call = ctx.call(self.me(), ControlRequest::PullChunks { worker, max, held: Vec::new() });
            self.sent_as.insert(call, worker);
            self.pull_sent_opt = Some((ctx.now_ms, call));
        }
        self.push_waiting(ctx);
        if ctx.now_ms < self.wedged_until_ms {
            return;
        }
        self.make_one(ctx, setup);
    }

    /// Make the next step of one lease (the pipeline's order is not the lease order: pick one).
    fn make_one(&mut self, ctx: &mut Ctx, setup: &Setup) {
        let ready: Vec<LeaseId> =
            self.held.iter().filter(|(_, held)| held.made < held.grant.chunk.steps).map(|(lease, _)| *lease).collect();
        if ready.is_empty() {
            return;
        }
        let lease = ready[ctx.rng.below(ready.len() as u64) as usize];
        let Some(held) = self.held.get_mut(&lease) else { return };
        let chunk = held.grant.chunk;
        let step = Step(chunk.first_step.0 + u64::from(held.made));
        held.made += 1;
        let session = held.grant.session;
        if held.made == chunk.steps {
            self.held.remove(&lease);
        }
        self.ledger.made(lease, ctx.now());
        if self.ledger.is_revoked(lease) {
            self.finish(ctx, lease, Ok(()));
            return;
        }
        ctx.made((chunk.epoch, chunk.start), chunk.rank, step);
        let plan = EpochPlan::starting_at(std::sync::Arc::clone(&setup.table), setup.spec.plan, chunk.epoch, chunk.start);
        let batch = SimBatch {
            job: chunk.job,
            run: (chunk.epoch, chunk.start),
            rank: chunk.rank,
            step,
            digest: plan.batch_digest(setup.dataset_version, chunk.rank, step),
        };
        self.waiting.push((lease, batch, session, ctx.now_ms));
        self.push_waiting(ctx);
    }

    /// Push the batches whose trainer is connected (a session at least the grant's); fail
    /// those that waited out the patience.
    fn push_waiting(&mut self, ctx: &mut Ctx) {
        let waiting = std::mem::take(&mut self.waiting);
        for (lease, batch, oldest, since_ms) in waiting {
            match self.connections.get(&batch.rank) {
                Some(&(session, trainer_generation)) if session >= oldest => {
                    let delivery = Delivery { worker: self.index, worker_generation: self.generation, trainer_generation, lease, batch };
                    ctx.deliver(delivery);
                }
                _ if ctx.now_ms.saturating_sub(since_ms) > TRAINER_PATIENCE_MS => {
                    self.finish(ctx, lease, Err(Failure::retry("no trainer connected")));
                }
                _ => self.waiting.push((lease, batch, oldest, since_ms)),
            }
        }
    }

    /// The trainer's stack acknowledged a batch (or the connection failed).
    pub(crate) fn on_ack(&mut self, ctx: &mut Ctx, lease: LeaseId, delivered: bool) {
        let result = if delivered { Ok(()) } else { Err(Failure::retry("connection lost")) };
        self.finish(ctx, lease, result);
    }

    fn finish(&mut self, ctx: &mut Ctx, lease: LeaseId, result: Result<(), Failure>) {
        let ending_opt = self.ledger.finish(lease, result);
        self.report(ctx, lease, ending_opt);
    }

    /// A batch refused before it entered the pipeline (not the pipeline's progress).
    fn finish_unmade(&mut self, ctx: &mut Ctx, lease: LeaseId, failure: Failure) {
        let ending_opt = self.ledger.finish_unmade(lease, failure);
        self.report(ctx, lease, ending_opt);
    }

    fn report(&mut self, ctx: &mut Ctx, lease: LeaseId, ending_opt: Option<Ending>) {
        let (Some(ending), Some(worker)) = (ending_opt, self.id_opt) else { return };
        let request = match ending {
            Ending::Done => ControlRequest::ChunkDone { worker, lease },
            Ending::Failed(failure) => ControlRequest::ChunkFailed { worker, lease, reason: failure.reason },
        };
        ctx.call(self.me(), request);
    }

    /// A trainer's hello: serve it unless a newer session of its rank is connected.
    pub(crate) fn on_hello(&mut self, rank: Rank, session: SessionId, trainer_generation: u64, alive: impl Fn(u64) -> bool) {
        if let Some(&(newest, generation)) = self.connections.get(&rank)
            && newest > session
            && alive(generation)
        {
            return;
        }
        self.connections.insert(rank, (session, trainer_generation));
    }

    /// The answer to this worker's call `call`.
    pub(crate) fn on_reply(&mut self, ctx: &mut Ctx, call: u64, answer: Result<ControlResponse, RemoteError>) {
        if self.pull_sent_opt.is_some_and(|(_, pull)| pull == call) {
            self.pull_sent_opt = None;
        }
        let sent_as_opt = self.sent_as.remove(&call);
        match answer {
            Ok(ControlResponse::WorkerRegistered { worker, lease_stall_millis, .. }) => {
                self.stuck_after = std::time::Duration::from_millis(lease_stall_millis / 2);
                self.id_opt = Some(worker);
                self.register_sent_opt = None;
            }
            Ok(ControlResponse::HeartbeatAck { revoked, .. }) => {
                for lease in revoked {
                    self.ledger.revoke(lease);
                }
            }
            Ok(ControlResponse::Chunks { grants }) => {
                for grant in grants {
                    let stuck = self.ledger.job_stuck(grant.chunk.job, ctx.now(), self.stuck_after);
                    if !self.ledger.grant(grant.lease, grant.chunk.job, grant.chunk.steps, ctx.now()) {
                        continue;
                    }
                    if stuck {
                        // As the worker does: refused at once while the job's pipeline makes
                        // nothing of the work it holds.
                        ctx.note(format!("worker {} refuses {}: its pipeline is stuck", self.index, grant.lease));
                        ctx.refused((grant.chunk.epoch, grant.chunk.start), grant.chunk.rank, grant.chunk.first_step);
                        for _ in 0..grant.chunk.steps {
                            self.finish_unmade(ctx, grant.lease, Failure::retry("stuck"));
                        }
                        continue;
                    }
                    ctx.note(format!(
                        "worker {} leased {} {} {} steps {}..+{}",
                        self.index, grant.lease, grant.chunk.epoch, grant.chunk.rank, grant.chunk.first_step, grant.chunk.steps
                    ));
                    self.held.insert(grant.lease, Held { grant, made: 0 });
                }
            }
            Err(error) if error.code == ErrorCode::NotFound && sent_as_opt.is_some() && sent_as_opt == self.id_opt => {
                // The coordinator forgot this worker (it restarted): register again; the leases
                // it still lists are revoked at its next heartbeat.
                self.id_opt = None;
                self.pull_sent_opt = None;
            }
            Ok(_) | Err(_) => {}
        }
    }
}
