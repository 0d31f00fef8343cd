//! Requests, dispatched in one place to the handling of each role: [`admin`] (datasets, jobs,
//! status), [`trainer`] (attach, open, progress, detach) and [`worker`] (registration,
//! heartbeats, grants, chunk reports).

mod admin;
mod trainer;
mod worker;

use std::time::Instant;

use stoker_plan::ids::CertKey;
use stoker_proto::{ControlRequest, ControlResponse, ErrorCode, RemoteError};

use crate::core::Core;
use crate::errors::refused;
use crate::event::{Outcome, Then};
use crate::scheduler::Made;
use crate::state::Command;

impl Core {
    /// Handle one request of `caller` as far as it goes without IO.
    pub(crate) fn request(&mut self, request: ControlRequest, caller: CertKey, now: Instant) -> Outcome {
        if let Some(worker) = worker_of(&request)
            && let Err(refusal) = self.scheduler.check_worker_key(worker, caller)
        {
            return Outcome::reply(Err(refused(refusal)));
        }
        match request {
            ControlRequest::AddDataset { name, manifest } => self.add_dataset(name, manifest),
            ControlRequest::RemoveJob { name, job, force } => self.remove_job(name, job, force, now),
            ControlRequest::ListDatasets => {
                Outcome::reply(Ok(ControlResponse::Datasets { datasets: self.state.datasets.values().cloned().collect() }))
            }
            ControlRequest::Status => Outcome::reply(Ok(ControlResponse::Status { status: self.status(now) })),
            ControlRequest::Attach { spec, rank, client } => self.attach(spec, rank, client, caller, now),
            ControlRequest::OpenEpoch { job, rank, epoch, start, session, pass, consumed, holding } => {
                let opening = crate::scheduler::Opening { session, pass, consumed, holding };
                Outcome::reply(self.open_epoch(job, rank, epoch, start, opening, caller, now))
            }
            ControlRequest::ReportProgress {
                job,
                rank,
                epoch,
                start,
                consumed,
                wait_seconds,
                batches,
                samples,
                session,
                pass,
                missing,
                workers_version,
            } => {
                let report =
                    trainer::Report { epoch, start, consumed, wait_seconds, batches, samples, session, pass, missing, workers_version };
                let answer = self.report_progress(job, rank, report, caller, now);
                // Acknowledged means durable: the job's checkpoint, if one is pending, is
                // committed before the answer goes out (issue 31, item 7).
                let after_flush = answer.is_ok() && self.pending.contains_key(&job);
                Outcome::Reply { answer, lease_held_opt: None, after_flush }
            }
            ControlRequest::Detach { job, rank, session } => match self.detach(job, rank, session, caller) {
                // The rank's record goes too (issue 31, item 2: the state keeps the sessions
                // of attached ranks, not of every rank that ever attached).
                Ok(answer) if self.state.sessions.get(&job).is_some_and(|ranks| ranks.contains_key(&rank)) => {
                    Outcome::Commit { command: Command::ForgetSession { job, rank, session }, then: Then::Reply(answer) }
                }
                answer => Outcome::reply(answer),
            },
            ControlRequest::RegisterWorker { addr, threads, instance, attempt } => {
                Outcome::reply(self.register_worker(addr, threads, instance, attempt, caller, now))
            }
            ControlRequest::Heartbeat { worker, leases, images, stuck_jobs, decoded } => {
                Outcome::reply(self.heartbeat(worker, &leases, Made { images, decoded }, &stuck_jobs, now))
            }
            ControlRequest::PullChunks { worker, max, held } => Outcome::reply(self.pull(worker, max, &held, now)),
            ControlRequest::ChunkDone { worker, lease } => {
                let lease_held_opt = self.scheduler.chunk_done(worker, lease, now);
                Outcome::Reply { answer: Ok(ControlResponse::Ack), lease_held_opt, after_flush: false }
            }
            ControlRequest::ChunkFailed { worker, lease, reason } => {
                tracing::warn!(%worker, %lease, %reason, "chunk failed; granting it again");
                self.scheduler.chunk_failed(worker, lease, now);
                Outcome::reply(Ok(ControlResponse::Ack))
            }
            ControlRequest::ChunkFatal { worker, lease, reason } => self.chunk_fatal(worker, lease, reason),
            ControlRequest::Deregister { worker } => {
                self.scheduler.deregister(worker);
                Outcome::reply(Ok(ControlResponse::Ack))
            }
            ControlRequest::Raft { .. }
            | ControlRequest::NodeStatus
            | ControlRequest::AddNode { .. }
            | ControlRequest::RemoveNode { .. } => {
                Outcome::reply(Err(RemoteError::new(ErrorCode::InvalidArgument, "this coordinator does not answer that request here")))
            }
        }
    }
}

/// The worker a worker's request speaks for.
fn worker_of(request: &ControlRequest) -> Option<stoker_plan::ids::WorkerId> {
    match request {
        ControlRequest::Heartbeat { worker, .. }
        | ControlRequest::PullChunks { worker, .. }
        | ControlRequest::ChunkDone { worker, .. }
        | ControlRequest::ChunkFailed { worker, .. }
        | ControlRequest::ChunkFatal { worker, .. }
        | ControlRequest::Deregister { worker } => Some(*worker),
        _ => None,
    }
}
