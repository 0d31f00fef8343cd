//! A trainer rank in the model: the real [`TrainerProtocol`] driven the way
//! `stoker_client::Loader` and its progress reporter drive it. The training loop attaches,
//! opens a pass and waits for the answer, yields what has arrived and publishes the rank's
//! standing; the reporter, independently and in every phase, sends the latest published
//! standing when it changes and at least every second, one report at a time, its missing steps
//! through the real [`MissingDamper`], and opens the pass again when the coordinator lost its
//! run. The program iterates its epochs, saves its state after every batch, and in the fault
//! phase restarts its process, calls `set_epoch` or `load_state_dict` mid-epoch, pauses (stops
//! iterating for a while, as validation or a Ctrl-C in a notebook does), or iterates an epoch
//! again.
//!
//! The oracle lives here: every batch a pass yields is the pass's next step (no gap, no
//! repeat, no other run's or rank's batch), with the content the plan gives it.
//!
//! Over 500 lines on purpose (STYLE G10): it is one state machine, a simulated process whose
//! phases (attach, open, iterate, report, restart) share its fields; split across files, a
//! reader would have to assemble one protocol from pieces.

use std::sync::Arc;

use stoker_client::protocol::{Delivered, MissingDamper, Offered, Open, Report, TrainerProtocol};
use stoker_client::reorder::RunKey;
use stoker_plan::ids::{Epoch, JobId, Rank, SessionId, Step};
use stoker_plan::{Checkpoint, EpochPlan};
use stoker_proto::{ControlRequest, ControlResponse, ErrorCode, RemoteError};

use super::{Ctx, Sender, Setup};

/// A batch in the model: which one it is, and the digest of what it holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SimBatch {
    pub(crate) job: JobId,
    pub(crate) run: RunKey,
    pub(crate) rank: Rank,
    pub(crate) step: Step,
    pub(crate) digest: u64,
}

impl Delivered for SimBatch {
    fn run(&self) -> RunKey {
        self.run
    }

    fn step(&self) -> Step {
        self.step
    }
}

/// How long the client waits for an answer before it gives up on a call (its QUIC call
/// timeout); the call may still be applied later.
const CALL_TIMEOUT_MS: u64 = 10_000;
/// The trainer's batch timeout: how long the loader asks again for an open that is not
/// answered before it gives up (and the next call opens a new pass).
const BATCH_TIMEOUT_MS: u64 = 30_000;

#[derive(Debug)]
enum Phase {
    Attaching {
        sent_ms: u64,
        call: u64,
    },
    Ready,
    /// The open in flight: when it went out, its call, the request (asked again unchanged
    /// while unanswered, as the loader does), and when the loader gives up.
    Opening {
        sent_ms: u64,
        call: u64,
        request: ControlRequest,
        give_up_ms: u64,
    },
    Iterating,
    Done,
}

/// What the training program has done and wants, across process restarts.
#[derive(Clone, Debug)]
pub(crate) struct Program {
    pub(crate) epoch: Epoch,
    pub(crate) last_epoch: Epoch,
    /// The state saved after the last batch yielded (what a checkpoint would hold).
    pub(crate) saved_opt: Option<Checkpoint>,
    /// The state loaded, as `Loader::resume` keeps it.
    pub(crate) resume_opt: Option<Checkpoint>,
}

/// One trainer process of a rank.
#[derive(Debug)]
pub(crate) struct SimTrainer {
    pub(crate) rank: Rank,
    pub(crate) generation: u64,
    pub(crate) session_opt: Option<SessionId>,
    pub(crate) program: Program,
    protocol: TrainerProtocol<SimBatch>,
    phase: Phase,
    plan_opt: Option<Arc<EpochPlan>>,
    /// Steps yielded in the current pass, in order.
    yielded: Vec<u64>,
    /// The report in flight: when it was sent, and its call.
    /// The report in flight: when it went out, its call, and whether it named missing steps.
    report_sent_opt: Option<(u64, u64, bool)>,
    /// The version of the worker list it holds (as the client keeps it).
    workers_version: u64,
    /// The last report sent, and when.
    last_report_opt: Option<(u64, Report)>,
    /// The standing the training loop published last (the loader's watch value).
    published_opt: Option<Report>,
    /// When the training loop last waited for a batch.
    waited_at_ms_opt: Option<u64>,
    damper: MissingDamper,
    /// The training loop does nothing before this (validation, a Ctrl-C'd notebook cell).
    paused_until_ms: u64,
    /// Whether this process already stopped once while overdue.
    paused_while_waiting: bool,
    pub(crate) yielded_total: u64,
    start_ms: u64,
    /// Workers (index, generation) this session said hello to.
    greeted: Vec<(usize, u64)>,
}

impl SimTrainer {
    /// A trainer process that attaches at `start_ms` (a restarted process takes a while to
    /// start: an attach of the killed one still in flight is answered before).
    pub(crate) fn new(rank: Rank, generation: u64, program: Program, setup: &Setup, start_ms: u64) -> Self {
        Self {
            rank,
            generation,
            session_opt: None,
            program,
            protocol: TrainerProtocol::new(setup.nack_after),
            phase: Phase::Attaching { sent_ms: u64::MAX, call: 0 },
            start_ms,
            plan_opt: None,
            yielded: Vec::new(),
            report_sent_opt: None,
            workers_version: 0,
            last_report_opt: None,
            published_opt: None,
            waited_at_ms_opt: None,
            damper: MissingDamper::new(setup.nack_after),
            paused_until_ms: 0,
            paused_while_waiting: false,
            yielded_total: 0,
            greeted: Vec::new(),
        }
    }

    fn me(&self) -> Sender {
        Sender::Trainer { rank: self.rank, generation: self.generation }
    }

    pub(crate) fn is_done(&self) -> bool {
        matches!(self.phase, Phase::Done)
    }

    /// What this trainer is doing, for a failure report.
    pub(crate) fn describe(&self) -> String {
        format!(
            "{} gen {} {:?} {:?} pass {} run {:?} next {:?} yielded {} buffered {}",
            self.rank,
            self.generation,
            self.session_opt,
            self.phase,
            self.protocol.pass(),
            self.protocol.run(),
            self.protocol.next_step(),
            self.yielded.len(),
            self.protocol.buffered()
        )
    }

    /// The plan of the program's epoch: from the loaded state if it names the epoch.
    fn plan_for(&self, setup: &Setup) -> Result<EpochPlan, String> {
        match self.program.resume_opt {
            Some(checkpoint) if checkpoint.epoch == self.program.epoch => {
                EpochPlan::resume(Arc::clone(&setup.table), setup.spec.plan, &checkpoint).map_err(|error| error.to_string())
            }
            _ => Ok(EpochPlan::new(Arc::clone(&setup.table), setup.spec.plan, self.program.epoch)),
        }
    }

    /// One tick: the training loop (attach, open, yield what has arrived), then the reporter.
    pub(crate) fn tick(&mut self, ctx: &mut Ctx, setup: &Setup) -> Result<(), String> {
        self.step_loop(ctx, setup)?;
        self.run_reporter(ctx);
        Ok(())
    }

    fn step_loop(&mut self, ctx: &mut Ctx, setup: &Setup) -> Result<(), String> {
        if ctx.now_ms < self.paused_until_ms && matches!(self.phase, Phase::Ready | Phase::Iterating) {
            return Ok(());
        }
        match self.phase {
            Phase::Attaching { sent_ms, .. } => {
                if ctx.now_ms < self.start_ms {
                    return Ok(());
                }
                if sent_ms == u64::MAX || ctx.now_ms.saturating_sub(sent_ms) > CALL_TIMEOUT_MS {
                    let attach = ControlRequest::Attach { spec: setup.spec.clone(), rank: self.rank, client: 1_000 + self.generation };
                    let call = ctx.call(self.me(), attach);
                    self.phase = Phase::Attaching { sent_ms: ctx.now_ms, call };
                }
            }
            Phase::Ready => self.open(ctx, setup)?,
            Phase::Opening { sent_ms, .. } => {
                if ctx.now_ms.saturating_sub(sent_ms) > CALL_TIMEOUT_MS {
                    self.open_again(ctx, "timed out");
                }
            }
            Phase::Iterating => self.iterate(ctx, setup)?,
            Phase::Done => {}
        }
        Ok(())
    }

    fn open(&mut self, ctx: &mut Ctx, setup: &Setup) -> Result<(), String> {
        let Some(session) = self.session_opt else { return Ok(()) };
        let plan = Arc::new(self.plan_for(setup)?);
        let Open { run: (epoch, start), pass, consumed, holding } = self.protocol.open((self.program.epoch, plan.start()), plan.steps());
        ctx.note(format!("{} opens {epoch} from {start} in {pass}, holding {holding:?}", self.rank));
        let request = ControlRequest::OpenEpoch { job: setup.job, rank: self.rank, epoch, start, session, pass, consumed, holding };
        let call = ctx.call(self.me(), request.clone());
        self.plan_opt = Some(plan);
        self.yielded.clear();
        self.phase = Phase::Opening { sent_ms: ctx.now_ms, call, request, give_up_ms: ctx.now_ms + BATCH_TIMEOUT_MS };
        Ok(())
    }

    /// The open was not answered (or the coordinator cannot answer yet): ask the same again,
    /// until the batch timeout; then the loader gives up and its next call opens a new pass.
    fn open_again(&mut self, ctx: &mut Ctx, why: &str) {
        let Phase::Opening { request, give_up_ms, .. } = &self.phase else { return };
        if ctx.now_ms >= *give_up_ms {
            ctx.note(format!("{} open {why}; gives up: next call opens a new pass", self.rank));
            self.protocol.close();
            self.phase = Phase::Ready;
            return;
        }
        ctx.note(format!("{} open {why}; asks again", self.rank));
        ctx.counts.open_retries += 1;
        let (request, give_up_ms) = (request.clone(), *give_up_ms);
        let call = ctx.call(self.me(), request.clone());
        self.phase = Phase::Opening { sent_ms: ctx.now_ms, call, request, give_up_ms };
    }

    /// The loader publishes the rank's standing (the reporter sends it).
    fn publish(&mut self, ctx: &Ctx) {
        if let Some(report) = self.protocol.report(ctx.now()) {
            self.published_opt = Some(report);
        }
    }

    fn iterate(&mut self, ctx: &mut Ctx, setup: &Setup) -> Result<(), String> {
        let Some(plan) = self.plan_opt.clone() else { return Err(format!("{} iterates without a plan", self.rank)) };
        while let Some((step, batch)) = self.protocol.pop() {
            self.check(&plan, step, &batch, setup)?;
            self.yielded.push(step.0);
            self.yielded_total += 1;
            self.program.saved_opt = Some(plan.checkpoint_after(step));
            self.publish(ctx);
            if self.protocol.is_done() {
                return self.finish_pass(ctx);
            }
            if ctx.faulty && self.user_action(ctx) {
                return Ok(());
            }
        }
        if self.protocol.is_done() {
            return self.finish_pass(ctx);
        }
        self.protocol.waiting(ctx.now());
        // As the loader does: it says it waits each time it wakes, at least every
        // `waiting_refresh` (not at every tick of the model).
        let refresh_ms = self.protocol.waiting_refresh().as_millis() as u64;
        if self.waited_at_ms_opt.is_none_or(|at| ctx.now_ms.saturating_sub(at) >= refresh_ms) {
            self.waited_at_ms_opt = Some(ctx.now_ms);
        }
        self.publish(ctx);
        // A Ctrl-C (or a caught timeout) while overdue: the loop stops with missing steps
        // published, the loader lives on, and its reporter keeps reporting.
        let overdue = self.protocol.nack_due().is_some_and(|due| ctx.now() >= due + setup.nack_after);
        if overdue && !self.paused_while_waiting && ctx.chance(0.05) {
            self.paused_while_waiting = true;
            let until = ctx.now_ms + 20_000 + ctx.rng.below(40_000);
            ctx.note(format!("{} stops iterating while overdue, until {until} ms", self.rank));
            ctx.counts.pauses += 1;
            self.paused_until_ms = until;
        }
        Ok(())
    }

    /// The oracle: the pass's next step, of this run and rank, with the plan's content.
    fn check(&self, plan: &EpochPlan, step: Step, batch: &SimBatch, setup: &Setup) -> Result<(), String> {
        let expected = self.yielded.len() as u64;
        if step.0 != expected {
            return Err(format!("{} yielded {step} where the pass's next step is {expected}: {}", self.rank, self.describe()));
        }
        if batch.rank != self.rank || batch.job != setup.job || Some(batch.run) != self.protocol.run() {
            return Err(format!("{} yielded another run's or rank's batch {batch:?}: {}", self.rank, self.describe()));
        }
        let digest = plan.batch_digest(setup.dataset_version, self.rank, step);
        if batch.digest != digest {
            return Err(format!("{} yielded {step} with content of another plan: {batch:?}", self.rank));
        }
        Ok(())
    }

    fn finish_pass(&mut self, ctx: &mut Ctx) -> Result<(), String> {
        let again = ctx.faulty && ctx.chance(0.2);
        if again {
            ctx.note(format!("{} iterates {} again (no set_epoch)", self.rank, self.program.epoch));
        } else if self.program.epoch >= self.program.last_epoch {
            ctx.note(format!("{} finished its program", self.rank));
            if let Some(session) = self.session_opt {
                ctx.call(self.me(), ControlRequest::Detach { job: ctx.job, rank: self.rank, session });
            }
            self.protocol.close();
            self.phase = Phase::Done;
            return Ok(());
        } else {
            self.program.epoch = Epoch(self.program.epoch.0 + 1);
        }
        self.protocol.close();
        self.phase = Phase::Ready;
        Ok(())
    }

    /// In the fault phase, now and then: what a training script does to a loader mid-epoch.
    /// Returns whether the pass was left.
    fn user_action(&mut self, ctx: &mut Ctx) -> bool {
        if ctx.chance(0.03) {
            let until = ctx.now_ms + 3_000 + ctx.rng.below(17_000);
            ctx.note(format!("{} stops iterating until {until} ms (validation, a Ctrl-C'd cell)", self.rank));
            ctx.counts.pauses += 1;
            self.paused_until_ms = until;
            return true;
        }
        if ctx.chance(0.04) {
            ctx.note(format!("{} set_epoch({}) mid-pass: the next iteration opens it again", self.rank, self.program.epoch));
            ctx.counts.set_epochs += 1;
            self.protocol.close();
            self.phase = Phase::Ready;
            return true;
        }
        if ctx.chance(0.03)
            && let Some(saved) = self.program.saved_opt
        {
            ctx.note(format!("{} load_state_dict({} at {})", self.rank, saved.epoch, saved.position));
            ctx.counts.loads += 1;
            self.program.resume_opt = Some(saved);
            self.program.epoch = saved.epoch;
            self.protocol.close();
            self.phase = Phase::Ready;
            return true;
        }
        false
    }

    /// The reporter: the latest published standing when it changed, and at least every
    /// second, one report at a time; not while an open holds the session's turn, nor after the
    /// detach.
    fn run_reporter(&mut self, ctx: &mut Ctx) {
        if self.session_opt.is_none() || matches!(self.phase, Phase::Opening { .. } | Phase::Done | Phase::Attaching { .. }) {
            return;
        }
        if let Some((sent_ms, _, _)) = self.report_sent_opt {
            if ctx.now_ms.saturating_sub(sent_ms) <= CALL_TIMEOUT_MS {
                return;
            }
            // The client gives up on it (and the turn); the report may still arrive.
            self.report_sent_opt = None;
        }
        let Some(report) = self.published_opt.clone() else { return };
        let due = match &self.last_report_opt {
            Some((at_ms, last)) => *last != report || ctx.now_ms.saturating_sub(*at_ms) >= 1000,
            None => true,
        };
        if due {
            self.send_report(ctx, report);
        }
    }

    fn send_report(&mut self, ctx: &mut Ctx, report: Report) {
        let Some(session) = self.session_opt else { return };
        let Report { run: (epoch, start), pass, consumed, missing, .. } = report.clone();
        let waited_at = self.waited_at_ms_opt.map(|at| ctx.base + std::time::Duration::from_millis(at));
        let missing = self.damper.filter(missing, waited_at, ctx.now());
        let carries_missing = !missing.is_empty();
        if carries_missing {
            ctx.counts.missing_reports += 1;
        }
        let request = ControlRequest::ReportProgress {
            job: ctx.job,
            rank: self.rank,
            epoch,
            start,
            consumed,
            wait_seconds: 0.0,
            batches: 0,
            samples: 0,
            session,
            pass,
            missing,
            workers_version: self.workers_version,
        };
        let call = ctx.call(self.me(), request);
        self.report_sent_opt = Some((ctx.now_ms, call, carries_missing));
        self.last_report_opt = Some((ctx.now_ms, report));
    }

    /// The answer to this trainer's call `call`.
    pub(crate) fn on_reply(
        &mut self,
        ctx: &mut Ctx,
        setup: &Setup,
        call: u64,
        answer: Result<ControlResponse, RemoteError>,
    ) -> Result<(), String> {
        let opening = matches!(self.phase, Phase::Opening { call: open_call, .. } if open_call == call);
        let reporting = self.report_sent_opt.is_some_and(|(_, report_call, _)| report_call == call);
        match answer {
            Ok(ControlResponse::Attached { session, job, workers, .. }) => {
                if !matches!(self.phase, Phase::Attaching { call: attach_call, .. } if attach_call == call) {
                    return Ok(());
                }
                if job != setup.job {
                    return Err(format!("{} attached to {job}, not {}", self.rank, setup.job));
                }
                ctx.note(format!("{} attached as {session}", self.rank));
                self.workers_version = workers.version;
                self.session_opt = Some(session);
                let greeted = ctx.hello_new(self.rank, self.generation, session, &self.greeted);
                self.greeted.extend(greeted);
                self.phase = Phase::Ready;
                if let Some(saved) = self.program.saved_opt {
                    self.program.resume_opt = Some(saved);
                    self.program.epoch = saved.epoch;
                    if saved.epoch > self.program.last_epoch {
                        // Saved after the program's last batch: nothing left to train.
                        ctx.call(self.me(), ControlRequest::Detach { job, rank: self.rank, session });
                        self.phase = Phase::Done;
                    }
                }
            }
            Ok(ControlResponse::EpochOpened { steps }) => {
                if opening {
                    let planned = self.plan_opt.as_ref().map_or(0, |plan| plan.steps());
                    if steps != planned {
                        return Err(format!("{} coordinator plans {steps} steps, the trainer {planned}", self.rank));
                    }
                    self.phase = Phase::Iterating;
                    self.publish(ctx);
                }
            }
            Ok(ControlResponse::ProgressRecorded { run_known, workers }) => {
                if let Some(listed) = workers {
                    self.workers_version = listed.version;
                }
                if !reporting {
                    return Ok(());
                }
                let Some((sent_ms, _, carried_missing)) = self.report_sent_opt.take() else { return Ok(()) };
                if carried_missing {
                    self.damper.delivered(ctx.base + std::time::Duration::from_millis(sent_ms));
                }
                if let Some(session) = self.session_opt {
                    let greeted = ctx.hello_new(self.rank, self.generation, session, &self.greeted);
                    self.greeted.extend(greeted);
                }
                // As the reporter does: the coordinator lost the run (it restarted) while this
                // rank is inside it, in this pass: open the same pass again from where it stands.
                if let (false, Some((_, last)), Some(session)) = (run_known, &self.last_report_opt, self.session_opt)
                    && last.consumed < last.steps
                    && self.published_opt.as_ref().is_some_and(|latest| latest.pass == last.pass)
                {
                    let (epoch, start) = last.run;
                    let reopen = ControlRequest::OpenEpoch {
                        job: setup.job,
                        rank: self.rank,
                        epoch,
                        start,
                        session,
                        pass: last.pass,
                        consumed: last.consumed,
                        holding: Vec::new(),
                    };
                    ctx.note(format!("{} reopens {epoch} in {} at {}", self.rank, last.pass, last.consumed));
                    ctx.call(self.me(), reopen);
                }
            }
            Ok(_) => {}
            Err(error) if error.code == ErrorCode::Stale => {
                if opening {
                    self.protocol.close();
                    self.phase = Phase::Ready;
                }
            }
            Err(error) if error.code == ErrorCode::Superseded => {
                return Err(format!("{} (gen {}) was superseded though it is the newest trainer: {error}", self.rank, self.generation));
            }
            Err(error) if opening && error.is_retryable() => self.open_again(ctx, &format!("failed ({error})")),
            Err(error) => {
                ctx.note(format!("{} call failed: {error}", self.rank));
                if opening {
                    self.protocol.close();
                    self.phase = Phase::Ready;
                }
                if reporting {
                    self.report_sent_opt = None;
                }
            }
        }
        Ok(())
    }

    /// A batch reached this trainer's QUIC stack (the worker hears it acknowledged).
    pub(crate) fn on_batch(&mut self, ctx: &mut Ctx, batch: SimBatch) {
        if batch.rank != self.rank {
            return;
        }
        match self.protocol.offer(batch) {
            Offered::Duplicate => ctx.counts.duplicates += 1,
            Offered::Dropped => ctx.counts.dropped += 1,
            Offered::Kept | Offered::Early => {}
        }
    }
}
