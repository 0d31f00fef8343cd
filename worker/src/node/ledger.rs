//! The worker's lease bookkeeping, pure: the leases it holds, how many of each lease's batches
//! are finished, the batches that count against its room to pull, and the one report each
//! lease ends in. The async side ([`super::link`]) feeds it events and sends what it returns.
//!
//! Invariants (checked by the tests below):
//! * every granted lease ends in exactly one report (done, failed or fatal), unless it was
//!   revoked, in which case it ends in none;
//! * `outstanding` counts the unfinished batches of leases not revoked: a finish decrements
//!   it once, a revoke writes off what its lease had left, and a late finish of a revoked
//!   lease (its batches were in the pipeline) changes nothing, so the count never wraps;
//! * a batch finished for a lease the ledger does not know changes nothing.
//!
//! It also tells which jobs' pipelines are stuck: a job is stuck when the ledger holds work of
//! it still inside the pipeline (revoked leases included), and nothing of the job came out of
//! the pipeline since the oldest of that work was granted, for a while. Batches made and
//! waiting for their trainer, and grants refused without entering the pipeline, do not count
//! either way.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use stoker_plan::ids::{JobId, LeaseId};
use stoker_proto::LeaseProgress;

/// Why a batch of a lease was not delivered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    /// What happened, for the coordinator's log.
    pub reason: String,
    /// The chunk can never be made (an `on_error=fail` sample): the job fails, no retry.
    pub fatal: bool,
}

impl Failure {
    /// A failure the coordinator retries (on any worker).
    pub fn retry(reason: impl Into<String>) -> Self {
        Self { reason: reason.into(), fatal: false }
    }
}

/// How a lease ended, for its report to the coordinator.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ending {
    /// Every batch delivered.
    Done,
    /// Not every batch was: the first failure (or the first fatal one).
    Failed(Failure),
}

#[derive(Debug)]
struct Entry {
    job: JobId,
    steps: u32,
    finished: u32,
    failure_opt: Option<Failure>,
    /// The coordinator took the lease back: no report, and its unfinished batches were
    /// written off `outstanding`.
    revoked: bool,
    /// Batches that left the pipeline (made, failed in it, or never entered it).
    made: u32,
    granted_at: Instant,
}

/// The leases a worker holds. Public so that the protocol model in `testkit` runs the same
/// bookkeeping as a worker.
#[derive(Debug, Default)]
pub struct LeaseLedger {
    leases: BTreeMap<LeaseId, Entry>,
    outstanding: usize,
    /// When a batch of each job with leases here last came out of its pipeline.
    progressed_at: BTreeMap<JobId, Instant>,
}

impl LeaseLedger {
    /// A lease of `steps` batches of `job` was granted at `now`. `false` (and nothing changes)
    /// if the ledger already holds it.
    pub fn grant(&mut self, lease: LeaseId, job: JobId, steps: u32, now: Instant) -> bool {
        if self.leases.contains_key(&lease) {
            return false;
        }
        self.leases.insert(lease, Entry { job, steps, finished: 0, failure_opt: None, revoked: false, made: 0, granted_at: now });
        self.outstanding += steps as usize;
        true
    }

    /// One batch of `lease` is finished (delivered, or not). When it is the last of a lease
    /// that was not revoked, returns how the lease ended: report it, once.
    pub fn finish(&mut self, lease: LeaseId, result: Result<(), Failure>) -> Option<Ending> {
        let entry = self.leases.get_mut(&lease)?;
        if entry.finished >= entry.steps {
            return None;
        }
        entry.finished += 1;
        let job = entry.job;
        if !entry.revoked {
            self.outstanding -= 1;
        }
        // The first failure is reported, unless a fatal one follows: that chunk must not be
        // retried.
        if let Err(failure) = result
            && entry.failure_opt.as_ref().is_none_or(|first| failure.fatal && !first.fatal)
        {
            entry.failure_opt = Some(failure);
        }
        if entry.finished < entry.steps {
            return None;
        }
        let ended = self.leases.remove(&lease)?;
        if !self.job_busy(job) {
            self.progressed_at.remove(&job);
        }
        if ended.revoked {
            return None;
        }
        Some(ended.failure_opt.map_or(Ending::Done, Ending::Failed))
    }

    /// The coordinator took `lease` back (it expired, stalled, or went to another worker):
    /// nothing of it is reported, and its unfinished batches stop counting against the room
    /// to pull (those still in the pipeline finish later without effect).
    pub fn revoke(&mut self, lease: LeaseId) {
        let Some(entry) = self.leases.get_mut(&lease) else { return };
        if entry.revoked {
            return;
        }
        entry.revoked = true;
        self.outstanding -= (entry.steps - entry.finished) as usize;
    }

    /// Whether `lease` was revoked (its batches need not be delivered).
    pub fn is_revoked(&self, lease: LeaseId) -> bool {
        self.leases.get(&lease).is_none_or(|entry| entry.revoked)
    }

    /// The leases to renew in a heartbeat, with their progress.
    pub fn progress(&self) -> Vec<LeaseProgress> {
        self.leases
            .iter()
            .filter(|(_, entry)| !entry.revoked)
            .map(|(lease, entry)| LeaseProgress { lease: *lease, finished: entry.finished })
            .collect()
    }

    /// Leases held and not revoked.
    pub fn leases(&self) -> usize {
        self.leases.values().filter(|entry| !entry.revoked).count()
    }

    /// Batches of leases not revoked that have not left their pipeline yet (being made).
    pub fn in_pipelines(&self) -> usize {
        self.leases.values().filter(|entry| !entry.revoked).map(|entry| entry.steps.saturating_sub(entry.made) as usize).sum()
    }

    /// Batches being made or delivered for leases not revoked.
    pub fn outstanding(&self) -> usize {
        self.outstanding
    }

    /// Whether any lease of `job` still has batches to finish (revoked ones included: their
    /// batches may still be in the job's pipeline).
    pub fn job_busy(&self, job: JobId) -> bool {
        self.leases.values().any(|entry| entry.job == job)
    }

    /// A batch of `lease` came out of its job's pipeline at `now` (made, or failed there): the
    /// pipeline moves.
    pub fn made(&mut self, lease: LeaseId, now: Instant) {
        let Some(entry) = self.leases.get_mut(&lease) else { return };
        entry.made = (entry.made + 1).min(entry.steps);
        self.progressed_at.insert(entry.job, now);
    }

    /// A batch of `lease` that never entered the pipeline (refused, or the pipeline could not
    /// take it) is finished with `failure`: as [`Self::finish`], and it is not the pipeline's
    /// progress.
    pub fn finish_unmade(&mut self, lease: LeaseId, failure: Failure) -> Option<Ending> {
        let entry = self.leases.get_mut(&lease)?;
        entry.made = (entry.made + 1).min(entry.steps);
        self.finish(lease, Err(failure))
    }

    /// Whether `job`'s pipeline is stuck at `now` (a hung open or decode): work of the job still
    /// inside its pipeline has waited `after` since its grant and nothing of the job came out
    /// meanwhile. New work of
    /// the job would only queue behind it: the worker refuses it, and reports the job (see
    /// [`Self::stuck_jobs`]) so that the coordinator grants it elsewhere.
    pub fn job_stuck(&self, job: JobId, now: Instant, after: Duration) -> bool {
        let inside = self.leases.values().filter(|entry| entry.job == job && entry.made < entry.steps);
        let Some(oldest) = inside.map(|entry| entry.granted_at).min() else {
            return false;
        };
        let quiet_since = self.progressed_at.get(&job).map_or(oldest, |progressed| oldest.max(*progressed));
        now.saturating_duration_since(quiet_since) >= after
    }

    /// The jobs stuck at `now` ([`Self::job_stuck`]), for the heartbeat.
    pub fn stuck_jobs(&self, now: Instant, after: Duration) -> Vec<JobId> {
        let mut jobs: Vec<JobId> = self.leases.values().map(|entry| entry.job).collect();
        jobs.sort_unstable();
        jobs.dedup();
        jobs.retain(|job| self.job_stuck(*job, now, after));
        jobs
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    const JOB: JobId = JobId(1);

    /// One instant for the tests that are not about time.
    fn at() -> Instant {
        static AT: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
        *AT.get_or_init(Instant::now)
    }

    #[test]
    fn a_lease_reports_once_when_its_last_batch_finishes() {
        let mut ledger = LeaseLedger::default();
        assert!(ledger.grant(LeaseId(1), JOB, 2, at()));
        assert!(!ledger.grant(LeaseId(1), JOB, 2, at()), "a repeated grant changes nothing");
        assert_eq!(ledger.outstanding(), 2);
        assert_eq!(ledger.finish(LeaseId(1), Ok(())), None);
        assert_eq!(ledger.progress(), vec![LeaseProgress { lease: LeaseId(1), finished: 1 }]);
        assert_eq!(ledger.finish(LeaseId(1), Err(Failure::retry("no trainer"))), Some(Ending::Failed(Failure::retry("no trainer"))));
        assert_eq!(ledger.finish(LeaseId(1), Ok(())), None, "a finish after the end is ignored");
        assert_eq!(ledger.outstanding(), 0);
        assert!(!ledger.job_busy(JOB));
    }

    #[test]
    fn a_fatal_failure_wins_over_an_earlier_retryable_one() {
        let mut ledger = LeaseLedger::default();
        ledger.grant(LeaseId(1), JOB, 3, at());
        ledger.finish(LeaseId(1), Err(Failure::retry("first")));
        ledger.finish(LeaseId(1), Err(Failure { reason: "bad sample".into(), fatal: true }));
        let ending = ledger.finish(LeaseId(1), Err(Failure::retry("third")));
        assert_eq!(ending, Some(Ending::Failed(Failure { reason: "bad sample".into(), fatal: true })));
    }

    /// Regression (issue 15, item 6): a revoked lease's batches were still counted, so a
    /// worker stuck on them never pulled again; and counting them twice wrapped the counter.
    #[test]
    fn a_revoked_lease_is_written_off_and_never_reported() {
        let mut ledger = LeaseLedger::default();
        ledger.grant(LeaseId(1), JOB, 4, at());
        ledger.grant(LeaseId(2), JobId(2), 1, at());
        ledger.finish(LeaseId(1), Ok(()));
        ledger.revoke(LeaseId(1));
        ledger.revoke(LeaseId(1));
        assert_eq!(ledger.outstanding(), 1, "only lease 2's batch counts");
        assert_eq!(ledger.progress(), vec![LeaseProgress { lease: LeaseId(2), finished: 0 }]);
        assert!(ledger.job_busy(JOB), "its batches may still be in the pipeline");
        for _ in 0..3 {
            assert_eq!(ledger.finish(LeaseId(1), Ok(())), None);
        }
        assert_eq!(ledger.outstanding(), 1);
        assert!(!ledger.job_busy(JOB));
    }

    /// A job is stuck when its oldest work still inside the pipeline waited `after` with
    /// nothing of the job coming out; revoked leases count (their batches are still inside), a
    /// job with nothing inside is never stuck, and a batch coming out lifts it.
    #[test]
    fn a_job_is_stuck_while_its_pipeline_makes_nothing_of_the_work_it_holds() {
        let start = Instant::now();
        let after = Duration::from_secs(30);
        let second = Duration::from_secs(1);
        let mut ledger = LeaseLedger::default();
        ledger.grant(LeaseId(1), JOB, 2, start);
        ledger.grant(LeaseId(2), JobId(2), 1, start);
        assert!(!ledger.job_stuck(JOB, start + after - second, after), "not yet");
        assert_eq!(ledger.stuck_jobs(start + after, after), vec![JOB, JobId(2)]);
        ledger.made(LeaseId(1), start + after);
        ledger.finish(LeaseId(1), Ok(()));
        assert_eq!(ledger.stuck_jobs(start + after, after), vec![JobId(2)], "a batch came out");
        ledger.revoke(LeaseId(1));
        ledger.grant(LeaseId(3), JOB, 1, start + after * 2 - second);
        assert!(ledger.job_stuck(JOB, start + after * 2, after), "the revoked lease's batch is still inside; a new grant changes nothing");
        ledger.made(LeaseId(1), start + after * 2);
        assert!(!ledger.job_stuck(JOB, start + after * 2, after), "a batch came out of the pipeline");
        ledger.finish(LeaseId(1), Ok(()));
        ledger.made(LeaseId(3), start + after * 2);
        assert!(!ledger.job_stuck(JOB, start + after * 10, after), "made and waiting for its trainer: not the pipeline's doing");
        ledger.finish(LeaseId(3), Ok(()));
        ledger.grant(LeaseId(4), JOB, 1, start + after * 11);
        assert!(!ledger.job_stuck(JOB, start + after * 11 + second, after), "idle in between is not stuck");
        assert!(ledger.job_stuck(JOB, start + after * 12, after));
    }

    /// Found by review: a grant the worker refused (its batches finished at once, without
    /// entering the pipeline) counted as the job's progress, so the next heartbeat reported the
    /// job no longer stuck and the coordinator sent its work back to the hung pipeline.
    #[test]
    fn a_refused_grant_is_not_progress_of_a_stuck_job() {
        let start = Instant::now();
        let after = Duration::from_secs(30);
        let mut ledger = LeaseLedger::default();
        ledger.grant(LeaseId(1), JOB, 1, start);
        let stuck_at = start + after;
        assert!(ledger.job_stuck(JOB, stuck_at, after));
        ledger.grant(LeaseId(2), JOB, 2, stuck_at);
        assert_eq!(ledger.finish_unmade(LeaseId(2), Failure::retry("stuck")), None);
        let ending = ledger.finish_unmade(LeaseId(2), Failure::retry("stuck"));
        assert_eq!(ending, Some(Ending::Failed(Failure::retry("stuck"))), "reported once, as failed");
        assert_eq!(ledger.stuck_jobs(stuck_at + Duration::from_secs(1), after), vec![JOB], "still stuck");
    }

    #[derive(Clone, Debug)]
    enum Event {
        Grant(u8, u8),
        Finish(u8, bool),
        Revoke(u8),
        Made(u8),
        FinishUnmade(u8),
    }

    fn event() -> impl Strategy<Value = Event> {
        prop_oneof![
            (0u8..6, 1u8..4).prop_map(|(lease, steps)| Event::Grant(lease, steps)),
            (0u8..6, any::<bool>()).prop_map(|(lease, ok)| Event::Finish(lease, ok)),
            (0u8..6).prop_map(Event::Revoke),
            (0u8..6).prop_map(Event::Made),
            (0u8..6).prop_map(Event::FinishUnmade),
        ]
    }

    proptest! {
        /// Whatever the order of grants, finishes and revokes: `outstanding` equals the
        /// unfinished batches of unrevoked leases, and no lease reports twice or after a revoke;
        /// and the job counts as stuck (with no grace) exactly while a lease holds work still
        /// inside the pipeline (batches neither made nor finished unmade).
        #[test]
        fn outstanding_matches_the_unfinished_batches_and_each_lease_reports_at_most_once(
            events in proptest::collection::vec(event(), 0..80),
        ) {
            let mut ledger = LeaseLedger::default();
            // Per lease id: (steps, finished, revoked, reports), for leases granted and not ended.
            let mut model: std::collections::HashMap<u8, (u32, u32, bool)> = std::collections::HashMap::new();
            // Per lease id: batches out of the pipeline.
            let mut made: std::collections::HashMap<u8, u32> = std::collections::HashMap::new();
            let mut reports: std::collections::HashMap<u8, u32> = std::collections::HashMap::new();
            for event in events {
                match event {
                    Event::Grant(lease, steps) => {
                        if ledger.grant(LeaseId(u64::from(lease)), JOB, u32::from(steps), at()) {
                            prop_assert!(!model.contains_key(&lease));
                            model.insert(lease, (u32::from(steps), 0, false));
                            made.insert(lease, 0);
                            reports.insert(lease, 0);
                        }
                    }
                    Event::Made(lease) => {
                        ledger.made(LeaseId(u64::from(lease)), at());
                        if let (Some(count), Some((steps, _, _))) = (made.get_mut(&lease), model.get(&lease)) {
                            *count = (*count + 1).min(*steps);
                        }
                    }
                    Event::Finish(_, _) | Event::FinishUnmade(_) => {
                        let (lease, ending) = match event {
                            Event::Finish(lease, ok) => {
                                let result = if ok { Ok(()) } else { Err(Failure::retry("x")) };
                                (lease, ledger.finish(LeaseId(u64::from(lease)), result))
                            }
                            Event::FinishUnmade(lease) => {
                                if let (Some(count), Some((steps, _, _))) = (made.get_mut(&lease), model.get(&lease)) {
                                    *count = (*count + 1).min(*steps);
                                }
                                (lease, ledger.finish_unmade(LeaseId(u64::from(lease)), Failure::retry("refused")))
                            }
                            _ => unreachable!("matched above"),
                        };
                        if ending.is_some() {
                            *reports.entry(lease).or_default() += 1;
                        }
                        if let Some((steps, finished, revoked)) = model.get_mut(&lease) {
                            *finished += 1;
                            if *finished == *steps {
                                prop_assert_eq!(ending.is_some(), !*revoked);
                                model.remove(&lease);
                                made.remove(&lease);
                            }
                        } else {
                            prop_assert!(ending.is_none());
                        }
                    }
                    Event::Revoke(lease) => {
                        ledger.revoke(LeaseId(u64::from(lease)));
                        if let Some(entry) = model.get_mut(&lease) {
                            entry.2 = true;
                        }
                    }
                }
                let expected: u32 = model.values().filter(|(_, _, revoked)| !revoked).map(|(steps, finished, _)| steps - finished).sum();
                prop_assert_eq!(ledger.outstanding(), expected as usize);
                prop_assert!(reports.values().all(|&count| count <= 1));
                let inside = model.iter().any(|(lease, (steps, _, _))| made.get(lease).is_some_and(|count| count < steps));
                prop_assert_eq!(ledger.job_stuck(JOB, at(), Duration::ZERO), inside);
                prop_assert!(!ledger.job_stuck(JOB, at(), Duration::from_secs(3600)));
            }
        }
    }
}
