//! This trainer's attachment to its job: who it is to the coordinator, whether it still holds
//! its rank, and the calls that move the rank through a run (epoch opens, progress reports, the
//! detach), which reach the coordinator in the order the trainer made them.
//!
//! The order matters. The coordinator keeps a rank's consumed steps in a run as a maximum, and
//! iterating the same epoch again (no `set_epoch`, as with DistributedSampler) opens the same
//! run again. A report of the first pass that arrived after the second pass's open would mark
//! steps as consumed that the rank has not had yet; they would never be granted again and the
//! trainer would wait for them forever. A report that arrived after the detach would make the
//! coordinator think the trainer is back, and workers would make batches for nobody. So each
//! such call takes this session's turn, and a report reads its value only once it has the turn.
//!
//! The turn orders the calls as the trainer sends them, not as the coordinator receives them:
//! a report that timed out here gave up its turn but may still reach the coordinator later.
//! So every call also names its pass ([`crate::protocol`]), and the coordinator ignores a report
//! of an older pass than the last one it saw opened.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use stoker_plan::ids::{JobId, Rank, SessionId};
use stoker_proto::api::CoordinatorApi;
use stoker_proto::expect_response;
use stoker_proto::{ControlRequest, ErrorCode, RemoteError, WorkerInfo, WorkerList};
use tokio::sync::{OwnedMutexGuard, watch};
use tracing::{debug, info, warn};

use crate::error::ClientError;
use crate::protocol::{MissingDamper, Report};

/// What the progress reporter sends.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Progress {
    pub(crate) report: Report,
    pub(crate) wait_seconds: f64,
    /// Batches and samples yielded by this loader in total.
    pub(crate) batches: u64,
    pub(crate) samples: u64,
}

/// Held while a call that moves the rank is under way. Set it to `true` (detached) and no
/// report goes out any more.
pub(crate) type Turn = OwnedMutexGuard<bool>;

/// This trainer's attachment: what the coordinator knows it by, whether a newer trainer of
/// the same rank has replaced it, and whether the job failed.
#[derive(Clone, Debug)]
pub(crate) struct Session {
    pub(crate) job: JobId,
    pub(crate) rank: Rank,
    pub(crate) session: SessionId,
    pub(crate) superseded: Arc<AtomicBool>,
    /// Set when the coordinator says the job failed (`ErrorCode::JobFailed`): its error.
    failed: Arc<Mutex<Option<RemoteError>>>,
    /// Whose turn it is to call; `true` once the trainer detached.
    turn: Arc<tokio::sync::Mutex<bool>>,
    /// When the training loop last waited for a batch, in milliseconds after `created`
    /// (`u64::MAX`: never): missing steps are reported only while it waits.
    waited_ms: Arc<AtomicU64>,
    /// When the coordinator last answered a report, in milliseconds after `created`, and the
    /// error of the last report it did not answer since: a batch timeout names the coordinator
    /// when it is the one that stopped answering.
    answered_ms: Arc<AtomicU64>,
    last_call_error: Arc<Mutex<Option<String>>>,
    created: Instant,
}

impl Session {
    pub(crate) fn new(job: JobId, rank: Rank, session: SessionId) -> Self {
        Self {
            job,
            rank,
            session,
            superseded: Arc::default(),
            failed: Arc::default(),
            turn: Arc::default(),
            waited_ms: Arc::new(AtomicU64::new(u64::MAX)),
            answered_ms: Arc::new(AtomicU64::new(0)),
            last_call_error: Arc::default(),
            created: Instant::now(),
        }
    }

    /// The training loop is waiting for a batch now.
    pub(crate) fn mark_waiting(&self) {
        let millis = u64::try_from(self.created.elapsed().as_millis()).unwrap_or(u64::MAX - 1);
        self.waited_ms.store(millis, Ordering::Release);
    }

    /// When the training loop last waited for a batch.
    pub(crate) fn waited_at(&self) -> Option<Instant> {
        match self.waited_ms.load(Ordering::Acquire) {
            u64::MAX => None,
            millis => Some(self.created + Duration::from_millis(millis)),
        }
    }

    /// The coordinator answered a call now.
    pub(crate) fn mark_answered(&self) {
        let millis = u64::try_from(self.created.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.answered_ms.store(millis, Ordering::Release);
        *self.last_call_error.lock() = None;
    }

    /// A call to the coordinator failed with `error`.
    pub(crate) fn mark_unanswered(&self, error: &RemoteError) {
        *self.last_call_error.lock() = Some(error.to_string());
    }

    /// How long the coordinator has not answered, with the last error, when it has been silent
    /// for at least `at_least` (reports go out every second while attached).
    pub(crate) fn coordinator_silence(&self, at_least: Duration) -> Option<(Duration, String)> {
        let answered = self.created + Duration::from_millis(self.answered_ms.load(Ordering::Acquire));
        let silent = answered.elapsed();
        if silent < at_least {
            return None;
        }
        let error = self.last_call_error.lock().clone();
        Some((silent, error.unwrap_or_else(|| "no answer".to_owned())))
    }

    /// Wait for the turn to call the coordinator: every earlier call has been answered, and no
    /// report reads its progress before the turn is dropped.
    pub(crate) async fn turn(&self) -> Turn {
        Arc::clone(&self.turn).lock_owned().await
    }

    /// An error if this session may not go on: superseded, or its job failed.
    pub(crate) fn check(&self) -> Result<(), ClientError> {
        if self.superseded.load(Ordering::Acquire) {
            return Err(self.superseded_error());
        }
        match self.failed.lock().clone() {
            Some(source) => Err(ClientError::Coordinator { source }),
            None => Ok(()),
        }
    }

    pub(crate) fn superseded_error(&self) -> ClientError {
        ClientError::Superseded { job: self.job.0, rank: self.rank.0 }
    }
}

/// Send the latest progress whenever it changes (coalesced: one report in flight at a time),
/// and at least every second; pass the workers the coordinator lists to `workers_seen` after
/// each answer (`workers`, as attaching listed them, until an answer lists others). Missing
/// steps go out at most once per `nack_after` and only while the training loop waits
/// ([`MissingDamper`]). Ends when the session detached, was superseded, or its job failed.
pub(crate) async fn report_progress<A>(
    coordinator: Arc<A>,
    session: Session,
    mut progress_rx: watch::Receiver<Option<Progress>>,
    mut workers: WorkerList,
    workers_seen: impl Fn(&[WorkerInfo]) + Send + 'static,
    nack_after: Duration,
) where
    A: CoordinatorApi,
{
    let Session { job, rank, .. } = session;
    let mut damper = MissingDamper::new(nack_after);
    loop {
        let _ = tokio::time::timeout(Duration::from_secs(1), progress_rx.changed()).await;
        let turn = session.turn().await;
        if *turn {
            return;
        }
        let Some(progress) = progress_rx.borrow_and_update().clone() else { continue };
        let Report { run: (epoch, start), pass, steps, consumed, missing } = progress.report.clone();
        let sent_at = Instant::now();
        let missing = damper.filter(missing, session.waited_at(), sent_at);
        let carries_missing = !missing.is_empty();
        let request = ControlRequest::ReportProgress {
            job,
            rank,
            session: session.session,
            epoch,
            start,
            consumed,
            wait_seconds: progress.wait_seconds,
            batches: progress.batches,
            samples: progress.samples,
            pass,
            missing,
            workers_version: workers.version,
        };
        match coordinator.call(request).await.and_then(|answer| expect_response!(answer, ProgressRecorded { workers, run_known })) {
            Ok((listed, run_known)) => {
                session.mark_answered();
                if carries_missing {
                    damper.delivered(sent_at);
                }
                if let Some(listed) = listed {
                    workers = listed;
                }
                // Every time, not only when the list changed: the connector dials again the
                // listed workers whose connections dropped.
                workers_seen(&workers.workers);
                // The coordinator restarted and lost the run while this rank is still inside it
                // (and has not moved on meanwhile): open the same pass again, from where the
                // rank stands. Batches it holds are not named, so a few may be made twice.
                let still_current = progress_rx.borrow().as_ref().is_some_and(|latest| latest.report.pass == pass);
                if !run_known && consumed < steps && still_current {
                    let reopen = ControlRequest::OpenEpoch {
                        job,
                        rank,
                        epoch,
                        start,
                        session: session.session,
                        pass,
                        consumed,
                        holding: Vec::new(),
                    };
                    if let Err(error) = coordinator.call(reopen).await {
                        debug!(%error, "cannot re-open the epoch");
                    }
                }
            }
            Err(error) if error.code == ErrorCode::Superseded => {
                info!(%job, %rank, "another trainer attached as this rank; this loader stops");
                session.superseded.store(true, Ordering::Release);
                return;
            }
            Err(error) if error.code == ErrorCode::JobFailed => {
                warn!(%job, %rank, %error, "the job failed; this loader stops");
                *session.failed.lock() = Some(error);
                return;
            }
            Err(error) if error.code == ErrorCode::NotFound => {
                // Jobs are durable: one the coordinator does not know was removed.
                warn!(%job, %rank, %error, "the job was removed; this loader stops");
                let removed = RemoteError::new(
                    ErrorCode::NotFound,
                    format!(
                        "{job} was removed from the coordinator (stoker job rm, or no trainer for --job-ttl-hours): attach again to start a new job"
                    ),
                );
                *session.failed.lock() = Some(removed);
                return;
            }
            Err(error) => {
                debug!(%error, "progress report failed");
                session.mark_unanswered(&error);
                drop(turn);
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use stoker_plan::ids::{Epoch, Pass, Position};
    use stoker_proto::ControlResponse;
    use tokio::sync::Notify;

    use super::*;

    /// A coordinator that answers progress reports slowly and records what it finished, in order.
    #[derive(Default)]
    struct SlowCoordinator {
        finished: Mutex<Vec<ControlRequest>>,
        report_arrived: Notify,
    }

    impl SlowCoordinator {
        fn finished(&self) -> Vec<ControlRequest> {
            self.finished.lock().clone()
        }
    }

    impl CoordinatorApi for SlowCoordinator {
        async fn call(&self, request: ControlRequest) -> Result<ControlResponse, RemoteError> {
            let answer = match &request {
                ControlRequest::ReportProgress { .. } => {
                    self.report_arrived.notify_one();
                    tokio::time::sleep(Duration::from_millis(150)).await;
                    ControlResponse::ProgressRecorded { workers: None, run_known: true }
                }
                _ => ControlResponse::EpochOpened { steps: 12 },
            };
            self.finished.lock().push(request);
            Ok(answer)
        }
    }

    fn progress(consumed: u64) -> Option<Progress> {
        let report = Report { run: (Epoch(0), Position(0)), pass: Pass(1), steps: 12, consumed, missing: Vec::new() };
        Some(Progress { report, wait_seconds: 0.0, batches: 0, samples: 0 })
    }

    type Reporting = (Arc<SlowCoordinator>, Session, watch::Sender<Option<Progress>>, tokio::task::JoinHandle<()>);

    /// A reporter whose report of `consumed` steps is in flight.
    async fn reporting(consumed: u64) -> Reporting {
        let coordinator = Arc::new(SlowCoordinator::default());
        let session = Session::new(JobId(1), Rank(0), SessionId(1));
        let (progress_tx, progress_rx) = watch::channel(None);
        let reporter = tokio::spawn(report_progress(
            Arc::clone(&coordinator),
            session.clone(),
            progress_rx,
            WorkerList::default(),
            |_| {},
            Duration::from_secs(1),
        ));
        let arrived = coordinator.report_arrived.notified();
        progress_tx.send_replace(progress(consumed));
        tokio::time::timeout(Duration::from_secs(5), arrived).await.expect("the report went out");
        (coordinator, session, progress_tx, reporter)
    }

    fn consumed_in(request: &ControlRequest) -> Option<u64> {
        match request {
            ControlRequest::ReportProgress { consumed, .. } => Some(*consumed),
            _ => None,
        }
    }

    /// Regression: a report of the first pass over an epoch (in flight, or read just before
    /// the second pass opened it again) reached the coordinator after the open and marked steps
    /// of the second pass consumed; the trainer then waited for them forever.
    #[tokio::test]
    async fn no_report_of_an_earlier_pass_reaches_the_coordinator_after_the_next_open() {
        // The first pass: step 10 yielded, its report goes out and is slow.
        let (coordinator, session, progress_tx, reporter) = reporting(11).await;
        // The last step yielded while that report is in flight, and the epoch opened again
        // at once, as `for batch in loader` twice does.
        progress_tx.send_replace(progress(12));
        {
            let _turn = session.turn().await;
            let open = ControlRequest::OpenEpoch {
                job: JobId(1),
                rank: Rank(0),
                epoch: Epoch(0),
                start: Position(0),
                session: SessionId(1),
                pass: Pass(2),
                consumed: 0,
                holding: Vec::new(),
            };
            coordinator.call(open).await.expect("open");
            progress_tx.send_replace(progress(0));
        }

        let deadline = Instant::now() + Duration::from_secs(5);
        while !coordinator.finished().iter().any(|request| consumed_in(request) == Some(0)) && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let finished = coordinator.finished();
        let open_at = finished.iter().position(|request| matches!(request, ControlRequest::OpenEpoch { .. })).expect("opened");
        let after_open: Vec<u64> = finished[open_at..].iter().filter_map(consumed_in).collect();
        assert_eq!(after_open.first(), Some(&0), "the second pass reports from 0: {finished:?}");
        assert!(after_open.iter().all(|&consumed| consumed == 0), "a first-pass report came after the open: {finished:?}");
        assert_eq!(finished.iter().filter_map(consumed_in).next(), Some(11), "{finished:?}");
        reporter.abort();
    }

    /// Regression: a report sent after the detach told the coordinator the trainer was back,
    /// and workers made that rank's batches for nobody for another trainer TTL.
    #[tokio::test]
    async fn no_report_goes_out_after_the_detach() {
        let (coordinator, session, progress_tx, reporter) = reporting(3).await;
        progress_tx.send_replace(progress(4));
        {
            let mut turn = session.turn().await;
            *turn = true;
            coordinator.call(ControlRequest::Detach { job: JobId(1), rank: Rank(0), session: SessionId(1) }).await.expect("detach");
        }
        tokio::time::timeout(Duration::from_secs(5), reporter).await.expect("the reporter ends after the detach").expect("no panic");
        let finished = coordinator.finished();
        assert!(matches!(finished.last(), Some(ControlRequest::Detach { .. })), "{finished:?}");
        assert_eq!(finished.iter().filter_map(consumed_in).collect::<Vec<_>>(), vec![3], "{finished:?}");
    }
}
