//! The simulated world's shared context: the clock, the seeded randomness, the simulated
//! network's queues (requests, replies, batch deliveries, acknowledgements, hellos) and the
//! fault counts; and the messages that travel on it.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use stoker_client::reorder::RunKey;
use stoker_plan::ShardTable;
use stoker_plan::ids::{JobId, LeaseId, Rank, SessionId, Step};
use stoker_plan::prng::SplitMix64;
use stoker_proto::{ControlRequest, ControlResponse, JobSpec, RemoteError};

use super::FaultCounts;
use super::net::Net;
use super::trainer::SimBatch;

/// Who sent a call (the answer goes back to that process, if it still exists).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Sender {
    Trainer { rank: Rank, generation: u64 },
    Worker { index: usize, generation: u64 },
}

/// A batch on its way from a worker to a trainer process.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Delivery {
    pub(crate) worker: usize,
    pub(crate) worker_generation: u64,
    pub(crate) trainer_generation: u64,
    pub(crate) lease: LeaseId,
    pub(crate) batch: SimBatch,
}

/// A worker's delivery answered (or not) by the trainer.
#[derive(Clone, Copy, Debug)]
pub(super) struct Ack {
    pub(super) worker: usize,
    pub(super) worker_generation: u64,
    pub(super) lease: LeaseId,
    pub(super) delivered: bool,
}

/// A trainer connecting to a worker.
#[derive(Clone, Copy, Debug)]
pub(super) struct Hello {
    pub(super) worker: usize,
    pub(super) worker_generation: u64,
    pub(super) rank: Rank,
    pub(super) session: SessionId,
    pub(super) trainer_generation: u64,
}

/// What every actor knows about the job.
#[derive(Debug)]
pub(crate) struct Setup {
    pub(crate) spec: JobSpec,
    pub(crate) job: JobId,
    pub(crate) table: Arc<ShardTable>,
    pub(crate) dataset_version: u64,
    pub(crate) nack_after: Duration,
    pub(crate) heartbeat_ms: u64,
}

impl Setup {
    pub(crate) fn worker_addr(&self, index: usize) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, 7500 + index as u16))
    }
}

/// The clock, the network, the random choices and the schedule log.
pub(crate) struct Ctx {
    pub(crate) rng: SplitMix64,
    pub(crate) base: Instant,
    pub(crate) now_ms: u64,
    /// Whether faults happen now.
    pub(crate) faulty: bool,
    /// When the last message the faults delayed or copied lands: the quiet phase starts once
    /// the faults stopped and this passed.
    pub(super) faults_land_by_ms: u64,
    pub(crate) job: JobId,
    pub(super) requests: Net<(Sender, u64, ControlRequest)>,
    pub(super) replies: Net<(Sender, u64, Result<ControlResponse, RemoteError>)>,
    /// Calls made so far: each call's id, which its answer carries back.
    pub(super) calls: u64,
    pub(super) deliveries: Net<Delivery>,
    pub(super) acks: Net<Ack>,
    pub(super) hellos: Net<Hello>,
    /// Workers alive now (index, generation), for trainers' hellos.
    pub(super) alive_workers: Vec<(usize, u64)>,
    /// Times each step of each run of each rank was made in the quiet phase.
    pub(super) quiet_makes: std::collections::HashMap<(RunKey, Rank, Step), u32>,
    /// Times each chunk (by its first step) was refused in the quiet phase.
    pub(super) quiet_refusals: std::collections::HashMap<(RunKey, Rank, Step), u32>,
    pub(crate) counts: FaultCounts,
    pub(super) log: Vec<String>,
}

impl Ctx {
    pub(crate) fn now(&self) -> Instant {
        self.base + Duration::from_millis(self.now_ms)
    }

    pub(crate) fn chance(&mut self, probability: f64) -> bool {
        self.rng.next_f64() < probability
    }

    pub(super) fn latency(&mut self) -> u64 {
        1 + self.rng.below(20)
    }

    pub(crate) fn note(&mut self, line: String) {
        self.log.push(format!("{:>7} ms  {line}", self.now_ms));
    }

    /// Send a call to the coordinator. In the fault phase a call may arrive seconds late
    /// (its sender timed out and went on) or twice. Not an `Attach`: a loader takes the session
    /// of the answer it gets, and a copy applied after a coordinator restart (which forgot the
    /// loader's id) would make a newer session and supersede it; the client never sends one
    /// twice, and a retry would take the retry's answer.
    pub(crate) fn call(&mut self, from: Sender, request: ControlRequest) -> u64 {
        self.calls += 1;
        let call = self.calls;
        let mut at = self.now_ms + self.latency();
        if matches!(request, ControlRequest::Attach { .. }) {
            self.requests.send(at, (from, call, request));
            return call;
        }
        if self.faulty && self.chance(0.02) {
            at += 1_000 + self.rng.below(14_000);
            self.faults_land_by_ms = self.faults_land_by_ms.max(at);
            self.counts.late_messages += 1;
            self.note(format!("late by {} ms: {from:?} {}", at - self.now_ms, describe(&request)));
        }
        if self.faulty && self.chance(0.01) {
            let again = at + self.rng.below(3_000);
            self.faults_land_by_ms = self.faults_land_by_ms.max(again);
            self.counts.duplicated_messages += 1;
            self.note(format!("sent twice: {from:?} {}", describe(&request)));
            self.requests.send(again, (from, call, request.clone()));
        }
        self.requests.send(at, (from, call, request));
        call
    }

    /// Push a batch to a trainer process; in the fault phase it may arrive twice.
    pub(crate) fn deliver(&mut self, delivery: Delivery) {
        let at = self.now_ms + self.latency();
        if self.faulty && self.chance(0.02) {
            self.counts.duplicated_batches += 1;
            let again = at + self.rng.below(2_000);
            self.faults_land_by_ms = self.faults_land_by_ms.max(again);
            self.deliveries.send(again, Delivery { lease: LeaseId(u64::MAX), ..delivery });
        }
        self.deliveries.send(at, delivery);
    }

    /// Whether the world is quiet: the faults stopped and every message they delayed or copied
    /// has landed.
    fn quiet(&self) -> bool {
        !self.faulty && self.now_ms >= self.faults_land_by_ms
    }

    /// A worker made `step` of `run` for `rank`: in the quiet phase, count it.
    pub(crate) fn made(&mut self, run: RunKey, rank: Rank, step: Step) {
        if !self.quiet() {
            return;
        }
        let makes = self.quiet_makes.entry((run, rank, step)).or_default();
        *makes += 1;
        self.counts.most_makes_of_a_step = self.counts.most_makes_of_a_step.max(*makes);
    }

    /// A worker refused the chunk of `run` for `rank` from `first_step` (its pipeline for the
    /// job is stuck): in the quiet phase, count it.
    pub(crate) fn refused(&mut self, run: RunKey, rank: Rank, first_step: Step) {
        self.counts.refusals += 1;
        if !self.quiet() {
            return;
        }
        let refusals = self.quiet_refusals.entry((run, rank, first_step)).or_default();
        *refusals += 1;
        self.counts.most_quiet_refusals_of_a_chunk = self.counts.most_quiet_refusals_of_a_chunk.max(*refusals);
    }

    /// A trainer session says hello to every worker alive it has not greeted yet (as the
    /// client connects to the workers each answer lists); returns those it greeted now.
    pub(crate) fn hello_new(
        &mut self,
        rank: Rank,
        trainer_generation: u64,
        session: SessionId,
        greeted: &[(usize, u64)],
    ) -> Vec<(usize, u64)> {
        let new: Vec<(usize, u64)> = self.alive_workers.iter().filter(|worker| !greeted.contains(worker)).copied().collect();
        for &(worker, worker_generation) in &new {
            let at = self.now_ms + self.latency() * 10;
            self.hellos.send(at, Hello { worker, worker_generation, rank, session, trainer_generation });
        }
        new
    }
}

fn describe(request: &ControlRequest) -> String {
    let text = format!("{request:?}");
    text.split(" spec:").next().unwrap_or(&text).chars().take(220).collect()
}
