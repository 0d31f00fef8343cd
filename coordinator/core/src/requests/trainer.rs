//! A trainer's requests: attach (creating its job), open an epoch, report progress, detach;
//! and the checks that a session speaks for its rank.

use std::sync::Arc;
use std::time::Instant;

use stoker_plan::ids::{CertKey, Epoch, JobId, Pass, Position, Rank, SessionId, Step};
use stoker_plan::{EpochPlan, ShardTable};
use stoker_proto::{ControlRequest, ControlResponse, ErrorCode, JobSpec, RankStatus, RemoteError};

use crate::core::Core;
use crate::demand::Demand;
use crate::errors::{invalid, not_found, refused};
use crate::event::{Outcome, Then};
use crate::figures::RankTotals;
use crate::scheduler::{Opening, Refusal, Reporting, RunKey, RunShape, SeatRefusal};
use crate::state::{Command, JobBounds};
use crate::state_budget::check_new_job;
use crate::validate::{check_batch_size, check_job_limits, check_list_len, describe_difference, validate_spec};

/// A progress report, as the request gives it.
#[derive(Debug)]
pub(super) struct Report {
    pub(super) epoch: Epoch,
    pub(super) start: Position,
    pub(super) consumed: u64,
    pub(super) wait_seconds: f64,
    pub(super) batches: u64,
    pub(super) samples: u64,
    pub(super) session: SessionId,
    pub(super) pass: Pass,
    pub(super) missing: Vec<Step>,
    pub(super) workers_version: u64,
}

/// What attaching needs first.
enum AttachNeeds {
    /// This committed.
    Commit(Command),
    /// Nothing: it is refused.
    Refusal(RemoteError),
}

impl Core {
    pub(super) fn attach(&mut self, spec: JobSpec, rank: Rank, client: u64, caller: CertKey, now: Instant) -> Outcome {
        if let Err(error) = validate_spec(&spec, rank) {
            return Outcome::reply(Err(error));
        }
        match self.attach_existing(&spec, rank, client, caller, now) {
            // Under mutual TLS the session and its certificate are committed before the trainer
            // learns the session, so that a later leader adopts that session from that
            // certificate only (nobody can take a rank over by naming a session after a
            // fail-over).
            // The same loader asking again keeps its session, already recorded: nothing to
            // commit (an attach storm of one loader writes nothing).
            Ok(Some(ControlResponse::Attached { job, dataset, workers, checkpoint, session }))
                if caller != CertKey::UNCHECKED && !self.recorded(job, rank, session, caller) =>
            {
                let answer = ControlResponse::Attached { job, dataset, workers, checkpoint, session };
                Outcome::Commit { command: Command::RecordSession { job, rank, session, key: caller }, then: Then::Reply(answer) }
            }
            Ok(Some(answer)) => Outcome::reply(Ok(answer)),
            Ok(None) => Outcome::reply(Err(RemoteError::new(ErrorCode::Internal, "attach needs no commit"))),
            Err(AttachNeeds::Commit(command)) => {
                Outcome::Commit { command, then: Then::Again(Box::new(ControlRequest::Attach { spec, rank, client })) }
            }
            Err(AttachNeeds::Refusal(error)) => Outcome::reply(Err(error)),
        }
    }

    /// Attach to the job of `spec` if it exists and has not failed; otherwise the command that
    /// creates it (or clears its failure) first.
    // Once per attach, and the "error" is the usual way on: a command is no burden to move.
    #[allow(clippy::result_large_err)]
    fn attach_existing(
        &mut self,
        spec: &JobSpec,
        rank: Rank,
        client: u64,
        caller: CertKey,
        now: Instant,
    ) -> Result<Option<ControlResponse>, AttachNeeds> {
        let Some(current) = self.state.datasets.get(&spec.dataset).cloned() else {
            return Err(AttachNeeds::Refusal(not_found(format!(
                "dataset {:?} is not registered: add it with `stoker dataset add {} PATH`",
                spec.dataset, spec.dataset
            ))));
        };
        let job = match self.state.job_named(&spec.name) {
            Some((id, existing)) if existing == spec => {
                if let Some(bound) = self.state.job_dataset(id).filter(|bound| bound.version != current.version) {
                    return Err(AttachNeeds::Refusal(invalid(format!(
                        "job {:?} was made for dataset {:?} as it was when the job started (manifest {}, version {:016x}); \
                         the name now stands for other data (manifest {}, version {:016x}), and the job's checkpoints and \
                         plans refer to the old one: give this run another job name to train on the new data",
                        spec.name, spec.dataset, bound.manifest, bound.version, current.manifest, current.version
                    ))));
                }
                id
            }
            Some((_, existing)) => {
                return Err(AttachNeeds::Refusal(invalid(format!(
                    "job {:?} exists with another spec ({}); attach every rank with the same spec, or pick another job name",
                    spec.name,
                    describe_difference(existing, spec)
                ))));
            }
            None => {
                // Limits apply to new jobs only: a job that exists keeps being served to the
                // ranks that come back (its spec cannot change), whatever the limit says now.
                check_batch_size(spec, self.config.max_batch_bytes).map_err(AttachNeeds::Refusal)?;
                check_job_limits(spec, &self.config).map_err(AttachNeeds::Refusal)?;
                check_new_job(&self.state, spec, &current, caller, &self.config).map_err(AttachNeeds::Refusal)?;
                tracing::info!(name = %spec.name, dataset = %spec.dataset, "creating job");
                let creator = (caller != CertKey::UNCHECKED).then_some(caller);
                let bounds = Some(JobBounds::of(&self.config));
                return Err(AttachNeeds::Commit(Command::CreateJob { spec: spec.clone(), creator, bounds }));
            }
        };
        if let Some(reason) = self.state.failed.get(&job) {
            tracing::info!(%job, %reason, "a trainer attached to a failed job: trying again");
            return Err(AttachNeeds::Commit(Command::ClearFailure { job }));
        }
        let checkpoint = self.state.checkpoints.get(&job).copied();
        let dataset = self.state.job_dataset(job).cloned().unwrap_or(current);
        // The same loader asking again (its answer was lost) keeps its session; anyone else,
        // even with the same client number, gets a new one.
        let repeated = self.scheduler.attached(job, rank, client).filter(|session| self.owners.owner(job, rank, *session) == Some(caller));
        let session = match repeated {
            Some(session) => session,
            None => {
                let Some(session) = self.new_session() else {
                    return Err(AttachNeeds::Refusal(RemoteError::new(
                        ErrorCode::Unavailable,
                        "this coordinator handed out every session id of its Raft term: try again after the next election",
                    )));
                };
                self.owners.record(job, rank, session, caller);
                if self.scheduler.attach(job, rank, session, client, now) {
                    tracing::info!(%job, %rank, %session, "rank attached again; the earlier trainer is no longer served");
                }
                session
            }
        };
        let workers = self.scheduler.alive_workers(now).clone();
        Ok(Some(ControlResponse::Attached { job, dataset, workers, checkpoint, session }))
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn open_epoch(
        &mut self,
        job: JobId,
        rank: Rank,
        epoch: Epoch,
        start: Position,
        opening: Opening,
        caller: CertKey,
        now: Instant,
    ) -> Result<ControlResponse, RemoteError> {
        self.check_job(job, rank)?;
        self.check_owner(job, rank, opening.session, caller)?;
        self.check_not_failed(job)?;
        check_list_len("holding", opening.holding.len())?;
        let steps = self.open_run(RunKey { job, epoch, start }, rank, &opening, now);
        self.forget_plans_of_finished_runs();
        Ok(ControlResponse::EpochOpened { steps: steps? })
    }

    pub(super) fn report_progress(
        &mut self,
        job: JobId,
        rank: Rank,
        report: Report,
        caller: CertKey,
        now: Instant,
    ) -> Result<ControlResponse, RemoteError> {
        let Report { epoch, start, consumed, wait_seconds, batches, samples, session, pass, missing, workers_version } = report;
        self.check_job(job, rank)?;
        self.check_owner(job, rank, session, caller)?;
        self.check_not_failed(job)?;
        check_list_len("missing", missing.len())?;
        let reporting = Reporting { session, pass, consumed, missing };
        let run_known = self.record_progress(RunKey { job, epoch, start }, rank, &reporting, wait_seconds, now)?;
        self.record_totals(job, rank, RankTotals { session, batches, samples, wait_seconds }, now);
        let alive = self.scheduler.alive_workers(now);
        let workers = (alive.version != workers_version).then(|| alive.clone());
        Ok(ControlResponse::ProgressRecorded { workers, run_known })
    }

    pub(super) fn detach(&mut self, job: JobId, rank: Rank, session: SessionId, caller: CertKey) -> Result<ControlResponse, RemoteError> {
        self.check_job(job, rank)?;
        self.check_record(job, rank, session, caller)?;
        self.owners.check(job, rank, session, caller)?;
        self.scheduler.detach(job, rank, session).map_err(refused)?;
        self.forget_plans_of_finished_runs();
        tracing::info!(%job, %rank, %session, "trainer detached");
        Ok(ControlResponse::Ack)
    }

    /// Refuse a trainer's request for a job that does not exist or a rank outside it.
    pub(crate) fn check_job(&self, job: JobId, rank: Rank) -> Result<(), RemoteError> {
        let Some(spec) = self.state.jobs.get(&job) else {
            return Err(not_found(format!("{job} does not exist: attach first")));
        };
        if rank.0 >= spec.plan.world_size.get() {
            return Err(invalid(format!("{rank} is outside world size {}", spec.plan.world_size)));
        }
        Ok(())
    }

    /// Refuse the requests of a failed job's trainers, with the reason it failed.
    /// Keep a trainer's totals: a newer session's replace an older one's (a new trainer counts
    /// from 0), and within a session they only grow (a report that arrives late, after a newer
    /// one, changes nothing).
    fn record_totals(&mut self, job: JobId, rank: Rank, reported: RankTotals, now: Instant) {
        let totals = self.totals.entry((job, rank)).or_insert(reported);
        let demand = self.demand.entry(job).or_insert_with(|| Demand::new(now));
        if reported.session > totals.session {
            // A new trainer: its totals start again, and so does its share of the demand.
            *totals = reported;
            demand.forget(rank);
            demand.record(rank, 0, 0.0, now);
        } else if reported.session == totals.session {
            let samples = reported.samples.saturating_sub(totals.samples);
            let waited = (reported.wait_seconds - totals.wait_seconds).max(0.0);
            totals.batches = totals.batches.max(reported.batches);
            totals.samples = totals.samples.max(reported.samples);
            totals.wait_seconds = totals.wait_seconds.max(reported.wait_seconds);
            demand.record(rank, samples, waited, now);
        }
    }

    /// Refuse `caller` speaking for a session another certificate owns, or one that is not the
    /// rank's newest; a session adopted here (the coordinator restarted since it attached) is
    /// owned by the first certificate that speaks for it.
    fn check_owner(&mut self, job: JobId, rank: Rank, session: SessionId, caller: CertKey) -> Result<(), RemoteError> {
        self.check_record(job, rank, session, caller)?;
        self.owners.check(job, rank, session, caller)?;
        self.scheduler.check_session(job, rank, session).map_err(refused)?;
        if self.owners.owner(job, rank, session).is_none() {
            self.owners.record(job, rank, session, caller);
        }
        Ok(())
    }

    /// Refuse a session other than the rank's recorded newest, or the recorded one from another
    /// certificate. Nothing is recorded under `--insecure`: then the seats alone decide,
    /// adopting unknown newer sessions. Under mutual TLS every session a trainer was given was
    /// recorded before it was given, so a session with no record was never given: refused
    /// (issue 31, item 7: an unknown owner refuses, it never admits).
    fn check_record(&self, job: JobId, rank: Rank, session: SessionId, caller: CertKey) -> Result<(), RemoteError> {
        let Some((recorded, owner)) = self.state.sessions.get(&job).and_then(|ranks| ranks.get(&rank)) else {
            if caller == CertKey::UNCHECKED {
                return Ok(());
            }
            return Err(RemoteError::new(
                ErrorCode::Forbidden,
                format!("{session} of {rank} of {job} was never recorded as given to a certificate: attach to get a session"),
            ));
        };
        match session.cmp(recorded) {
            std::cmp::Ordering::Equal if *owner == caller => Ok(()),
            std::cmp::Ordering::Equal => Err(crate::authz::not_yours(session, *owner, caller)),
            std::cmp::Ordering::Less => Err(refused(Refusal::Seat(SeatRefusal::Superseded { job, rank, session }))),
            std::cmp::Ordering::Greater => Err(RemoteError::new(
                ErrorCode::Forbidden,
                format!("{session} was never given to {rank} of {job} (its newest is {recorded}): attach to get a session"),
            )),
        }
    }

    /// Whether the state records `session` from `caller` as the newest of (job, rank).
    fn recorded(&self, job: JobId, rank: Rank, session: SessionId, caller: CertKey) -> bool {
        self.state.sessions.get(&job).and_then(|ranks| ranks.get(&rank)) == Some(&(session, caller))
    }

    /// The certificate that owns `session` of (job, rank): as this leader saw it attach or
    /// re-open, else as recorded; `None` if neither knows (then nobody is served).
    pub(crate) fn owner_of(&self, job: JobId, rank: Rank, session: SessionId) -> Option<CertKey> {
        if let Some(soft) = self.owners.owner(job, rank, session) {
            return Some(soft);
        }
        match self.state.sessions.get(&job).and_then(|ranks| ranks.get(&rank)) {
            Some((recorded, owner)) if *recorded == session => Some(*owner),
            _ => None,
        }
    }

    fn check_not_failed(&self, job: JobId) -> Result<(), RemoteError> {
        match self.state.failed.get(&job) {
            Some(reason) => Err(RemoteError::new(ErrorCode::JobFailed, format!("{job} failed: {reason}"))),
            None => Ok(()),
        }
    }

    fn open_run(&mut self, key: RunKey, rank: Rank, opening: &Opening, now: Instant) -> Result<u64, RemoteError> {
        let Some(spec) = self.state.jobs.get(&key.job) else {
            return Err(not_found(format!("{} does not exist: attach first", key.job)));
        };
        let plan = match self.plans.get(&key) {
            Some(plan) => Arc::clone(plan),
            None => {
                let dataset =
                    self.state.job_dataset(key.job).ok_or_else(|| not_found(format!("dataset {:?} was removed", spec.dataset)))?;
                let table = ShardTable::new(dataset.shard_counts.iter().copied()).map_err(|error| invalid(error.to_string()))?;
                if key.start.0 > table.samples() {
                    return Err(invalid(format!("start {} is past the epoch's {} samples", key.start, table.samples())));
                }
                Arc::new(EpochPlan::starting_at(Arc::new(table), spec.plan, key.epoch, key.start))
            }
        };
        let shape = RunShape { steps: plan.steps(), world_size: spec.plan.world_size.get(), prefetch: spec.prefetch };
        self.scheduler.open_run(key, rank, opening, shape, now).map_err(refused)?;
        self.plans.insert(key, Arc::clone(&plan));
        let status = self.ranks.entry((key.job, rank)).or_insert(RankStatus {
            rank,
            epoch: key.epoch,
            consumed: Step(0),
            steps: plan.steps(),
            wait_seconds: 0.0,
        });
        status.epoch = key.epoch;
        status.consumed = Step(opening.consumed);
        status.steps = plan.steps();
        Ok(plan.steps())
    }

    /// Record a rank's progress; `false` if the run is unknown (finished, or lost in a
    /// coordinator restart: a rank still inside it opens it again). A late report of a
    /// finished run must not re-create it, so unknown runs are never opened here.
    fn record_progress(
        &mut self,
        key: RunKey,
        rank: Rank,
        reporting: &Reporting,
        wait_seconds: f64,
        now: Instant,
    ) -> Result<bool, RemoteError> {
        let recorded = self.scheduler.record_progress(key, rank, reporting, now).map_err(refused)?;
        let Some(slowest) = recorded.slowest_opt else { return Ok(recorded.run_known) };
        if let Some(status) = self.ranks.get_mut(&(key.job, rank)).filter(|status| status.epoch == key.epoch) {
            status.consumed = Step(reporting.consumed);
            status.wait_seconds = wait_seconds;
        }
        let Some(plan) = self.plans.get(&key) else { return Ok(true) };
        if slowest == 0 {
            return Ok(true);
        }
        let checkpoint = plan.checkpoint_after(Step(slowest - 1));
        let latest = self.pending.get(&key.job).or_else(|| self.state.checkpoints.get(&key.job));
        let unchanged = latest == Some(&checkpoint);
        if !self.scheduler.has_run(key) {
            self.plans.remove(&key);
        }
        if !unchanged {
            // Committed at the next flush, with every other job's (`take_checkpoints`).
            self.pending.insert(key.job, checkpoint);
        }
        Ok(true)
    }
}
