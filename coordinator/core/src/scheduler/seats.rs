//! Each rank's seat in its job: which trainer session holds it, which pass of which run that
//! session is in, and when it was last heard from. Pure.
//!
//! The newest session of a rank is the one served (a restarted or forked trainer replaces the
//! old one). Within a session, passes order the trainer's calls: every `OpenEpoch` starts a
//! new pass and every progress report names its pass, so a report that reaches the
//! coordinator after the next open (a report that timed out on the client and was applied
//! later, or one sent twice) is recognised and ignored instead of marking steps of the new pass
//! consumed. After a detach nothing of the session counts as a sign of life.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use stoker_plan::ids::{JobId, Pass, Rank, SessionId, Step};

use super::run::{Counted, RunKey};

/// A trainer's `OpenEpoch`, as the scheduler needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Opening {
    /// The trainer's session.
    pub session: SessionId,
    /// Its pass.
    pub pass: Pass,
    /// Steps it has consumed in this pass already.
    pub consumed: u64,
    /// Steps it holds.
    pub holding: Vec<Step>,
}

/// A trainer's `ReportProgress`, as the scheduler needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reporting {
    /// The trainer's session.
    pub session: SessionId,
    /// The pass the report belongs to.
    pub pass: Pass,
    /// Steps consumed.
    pub consumed: u64,
    /// Steps the trainer has waited for long enough to ask for them again.
    pub missing: Vec<Step>,
}

/// Why a seat refuses a trainer's request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SeatRefusal {
    /// A newer session holds the rank.
    Superseded {
        /// The job.
        job: JobId,
        /// The rank.
        rank: Rank,
        /// The session that asked.
        session: SessionId,
    },
    /// An open of an earlier pass than the seat's, or of a session that detached.
    Stale {
        /// The pass that asked.
        pass: Pass,
        /// The seat's pass.
        current: Pass,
    },
}

/// Where a progress report stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Standing {
    /// It belongs to the seat's current pass and run.
    Current,
    /// An earlier pass's, or the session detached: ignore it.
    Stale,
    /// A pass (or run) whose open the coordinator has not seen (it restarted, or the open is
    /// still on its way): the trainer should open it (again).
    Unopened,
}

#[derive(Debug)]
struct Seat {
    session: SessionId,
    /// The loader id of the attach that made this session (0 when adopted).
    client: u64,
    /// Taken from a request rather than issued by an attach here (after a restart): a newer
    /// session that turns up replaces it.
    adopted: bool,
    pass: Pass,
    run_opt: Option<RunKey>,
    /// When the trainer was last heard from; `None` once it detached.
    seen_opt: Option<Instant>,
}

/// The seats of every job's ranks.
#[derive(Debug, Default)]
pub(super) struct Seats {
    seats: BTreeMap<(JobId, Rank), Seat>,
    /// When a trainer of each job was last heard from (attach, open, report).
    heard: BTreeMap<JobId, Instant>,
    /// The newest `seen_opt` of each job's seats that have one (not detached): which jobs have
    /// a trainer heard from lately, without looking at every seat (issue 35).
    newest_seen: BTreeMap<JobId, Instant>,
}

impl Seat {
    /// Its trainer detached (after which nothing of the session counts).
    fn detached(&self) -> bool {
        self.seen_opt.is_none() && self.pass > Pass(0)
    }
}

impl Seats {
    /// The session an attach of loader `client` already has, if it still holds the rank.
    pub(super) fn attached(&self, job: JobId, rank: Rank, client: u64) -> Option<SessionId> {
        self.seats.get(&(job, rank)).filter(|seat| seat.client == client && client != 0).map(|seat| seat.session)
    }

    /// `session` (of loader `client`) now holds the rank; returns whether it replaced an earlier
    /// one. The rank's run stays where it was until the new session opens one.
    pub(super) fn attach(&mut self, job: JobId, rank: Rank, session: SessionId, client: u64, now: Instant) -> bool {
        self.heard.insert(job, now);
        let seat = Seat { session, client, adopted: false, pass: Pass(0), run_opt: None, seen_opt: Some(now) };
        self.saw(job, now);
        match self.seats.insert((job, rank), seat) {
            Some(earlier) => {
                if let Some(seat) = self.seats.get_mut(&(job, rank)) {
                    seat.run_opt = earlier.run_opt;
                }
                true
            }
            None => false,
        }
    }

    /// Refuse a session that is not the rank's newest. A session unknown here is adopted (this
    /// coordinator restarted since it attached), and replaces an adopted older one.
    pub(super) fn check(&mut self, job: JobId, rank: Rank, session: SessionId) -> Result<(), SeatRefusal> {
        self.seat(job, rank, session).map(|_| ())
    }

    fn seat(&mut self, job: JobId, rank: Rank, session: SessionId) -> Result<&mut Seat, SeatRefusal> {
        let adopted = Seat { session, client: 0, adopted: true, pass: Pass(0), run_opt: None, seen_opt: None };
        match self.seats.get(&(job, rank)) {
            None => {
                self.seats.insert((job, rank), adopted);
            }
            Some(seat) if seat.session == session => {}
            Some(seat) if seat.adopted && session > seat.session => {
                let lost_seen = seat.seen_opt.is_some();
                let run_opt = seat.run_opt;
                self.seats.insert((job, rank), Seat { run_opt, ..adopted });
                if lost_seen {
                    Self::recount_newest(&self.seats, &mut self.newest_seen, job);
                }
            }
            Some(_) => return Err(SeatRefusal::Superseded { job, rank, session }),
        }
        self.seats.get_mut(&(job, rank)).ok_or(SeatRefusal::Superseded { job, rank, session })
    }

    /// An `OpenEpoch`: returns whether it starts a new pass (or moves the seat to another run)
    /// rather than repeating the current one.
    pub(super) fn open(&mut self, key: RunKey, rank: Rank, opening: &Opening, now: Instant) -> Result<bool, SeatRefusal> {
        let seat = self.seat(key.job, rank, opening.session)?;
        if opening.pass < seat.pass || seat.detached() {
            return Err(SeatRefusal::Stale { pass: opening.pass, current: seat.pass });
        }
        let fresh = opening.pass > seat.pass || seat.run_opt != Some(key);
        seat.pass = opening.pass;
        seat.run_opt = Some(key);
        // Never backwards: requests reach the core with their `now` out of order.
        seat.seen_opt = Some(seat.seen_opt.map_or(now, |seen| seen.max(now)));
        self.heard.insert(key.job, now);
        self.saw(key.job, now);
        Ok(fresh)
    }

    /// A `ReportProgress`: where it stands. A current or unopened one is a sign of life.
    pub(super) fn report(&mut self, key: RunKey, rank: Rank, reporting: &Reporting, now: Instant) -> Result<Standing, SeatRefusal> {
        let seat = self.seat(key.job, rank, reporting.session)?;
        if seat.detached() {
            return Ok(Standing::Stale);
        }
        if reporting.pass < seat.pass {
            return Ok(Standing::Stale);
        }
        // Never backwards: requests reach the core with their `now` out of order.
        seat.seen_opt = Some(seat.seen_opt.map_or(now, |seen| seen.max(now)));
        let standing = if reporting.pass > seat.pass || seat.run_opt != Some(key) { Standing::Unopened } else { Standing::Current };
        self.heard.insert(key.job, now);
        self.saw(key.job, now);
        Ok(standing)
    }

    /// The trainer of the seat's session stopped.
    pub(super) fn detach(&mut self, job: JobId, rank: Rank, session: SessionId) -> Result<(), SeatRefusal> {
        let seat = self.seat(job, rank, session)?;
        let lost_opt = seat.seen_opt.take();
        seat.pass = seat.pass.max(Pass(1));
        if lost_opt.is_some() {
            Self::recount_newest(&self.seats, &mut self.newest_seen, job);
        }
        Ok(())
    }

    /// Until when the rank's trainer is live (heard from within `ttl`, not detached), if it is
    /// live at all: `is_live` at `now` is `live_until > now`.
    pub(super) fn live_until(&self, job: JobId, rank: Rank, ttl: Duration) -> Option<Instant> {
        self.seats.get(&(job, rank)).and_then(|seat| seat.seen_opt).map(|seen| seen + ttl)
    }

    /// Whether the rank's trainer was heard from within `ttl` and has not detached.
    pub(super) fn is_live(&self, job: JobId, rank: Rank, now: Instant, ttl: Duration) -> bool {
        self.seats.get(&(job, rank)).and_then(|seat| seat.seen_opt).is_some_and(|seen| now.saturating_duration_since(seen) < ttl)
    }

    /// How the new run `key` counts `rank` in. It may still come, and so holds the run's flow
    /// window, when its trainer is attached here and in no run of this epoch or a later one: a
    /// rank in an earlier epoch will come (the run's batches for it are made early). One in a
    /// later epoch is ahead and never will. One in this epoch from another start (it resumed
    /// elsewhere) never will either, but whether it is past this run's steps is not known, so
    /// it is absent, as is one whose trainer detached, one this coordinator has not heard of
    /// since it started, and a new session that has not opened a run yet where an earlier one
    /// had (a restarted trainer: where it resumes is not known). A rank left out is counted in
    /// when it opens the run.
    pub(super) fn counted(&self, job: JobId, rank: Rank, key: RunKey) -> Counted {
        match self.seats.get(&(job, rank)) {
            None => Counted::Absent,
            Some(seat) if seat.detached() => Counted::Absent,
            Some(seat) if seat.pass == Pass(0) && seat.run_opt.is_some() => Counted::Absent,
            Some(seat) => match seat.run_opt {
                Some(their_run) if their_run.epoch > key.epoch => Counted::Ahead,
                Some(their_run) if their_run.epoch == key.epoch => Counted::Absent,
                _ => Counted::MayCome,
            },
        }
    }

    /// The session that holds the rank.
    pub(super) fn session_of(&self, job: JobId, rank: Rank) -> Option<SessionId> {
        self.seats.get(&(job, rank)).map(|seat| seat.session)
    }

    /// The run the rank's trainer (whichever session holds the seat) last opened.
    pub(super) fn run_now(&self, job: JobId, rank: Rank) -> Option<RunKey> {
        self.seats.get(&(job, rank)).and_then(|seat| seat.run_opt)
    }

    /// The run `session`'s trainer of `rank` last opened, if that session holds the seat.
    pub(super) fn run_of(&self, job: JobId, rank: Rank, session: SessionId) -> Option<RunKey> {
        self.seats.get(&(job, rank)).filter(|seat| seat.session == session).and_then(|seat| seat.run_opt)
    }

    /// When a trainer of `job` was last heard from, since this coordinator started.
    pub(super) fn heard(&self, job: JobId) -> Option<Instant> {
        self.heard.get(&job).copied()
    }

    /// Forget every seat of `job`.
    pub(super) fn forget_job(&mut self, job: JobId) {
        self.seats.retain(|(seat_job, _), _| *seat_job != job);
        self.heard.remove(&job);
        self.newest_seen.remove(&job);
    }

    /// A seat of `job` was seen at `now`.
    fn saw(&mut self, job: JobId, now: Instant) {
        let newest = self.newest_seen.entry(job).or_insert(now);
        *newest = (*newest).max(now);
    }

    /// A seat of `job` lost its `seen_opt`: the newest is found again among the job's seats.
    fn recount_newest(seats: &BTreeMap<(JobId, Rank), Seat>, newest_seen: &mut BTreeMap<JobId, Instant>, job: JobId) {
        match seats.range((job, Rank(0))..=(job, Rank(u32::MAX))).filter_map(|(_, seat)| seat.seen_opt).max() {
            Some(newest) => newest_seen.insert(job, newest),
            None => newest_seen.remove(&job),
        };
    }

    /// Jobs with a trainer heard from within `horizon` that has not detached.
    pub(super) fn attached_jobs(&self, now: Instant, horizon: Duration) -> impl Iterator<Item = JobId> + '_ {
        self.newest_seen.iter().filter(move |(_, seen)| now.saturating_duration_since(**seen) < horizon).map(|(job, _)| *job)
    }
}

#[cfg(test)]
mod tests {
    use stoker_plan::ids::{Epoch, Position};

    use super::*;

    fn key(epoch: u64) -> RunKey {
        RunKey { job: JobId(1), epoch: Epoch(epoch), start: Position(0) }
    }

    fn opening(session: u64, pass: u64) -> Opening {
        Opening { session: SessionId(session), pass: Pass(pass), consumed: 0, holding: Vec::new() }
    }

    fn reporting(session: u64, pass: u64, consumed: u64) -> Reporting {
        Reporting { session: SessionId(session), pass: Pass(pass), consumed, missing: Vec::new() }
    }

    /// Regression (issue 15, loss path 2): a report that timed out on the client could be
    /// applied after the next pass's open and mark that pass's steps consumed.
    #[test]
    fn a_report_of_an_earlier_pass_is_stale_once_the_next_pass_opened() {
        let now = Instant::now();
        let mut seats = Seats::default();
        seats.attach(JobId(1), Rank(0), SessionId(5), 50, now);
        assert_eq!(seats.open(key(0), Rank(0), &opening(5, 1), now), Ok(true));
        assert_eq!(seats.report(key(0), Rank(0), &reporting(5, 1, 3), now), Ok(Standing::Current));
        assert_eq!(seats.open(key(0), Rank(0), &opening(5, 2), now), Ok(true), "the same epoch again: a new pass");
        assert_eq!(seats.report(key(0), Rank(0), &reporting(5, 1, 12), now), Ok(Standing::Stale), "the late first-pass report");
        assert_eq!(seats.open(key(0), Rank(0), &opening(5, 1), now), Err(SeatRefusal::Stale { pass: Pass(1), current: Pass(2) }));
        assert_eq!(seats.open(key(0), Rank(0), &opening(5, 2), now), Ok(false), "a repeated open of the current pass");
        assert_eq!(seats.report(key(0), Rank(0), &reporting(5, 3, 0), now), Ok(Standing::Unopened), "its open has not arrived");
    }

    #[test]
    fn the_newest_session_holds_the_rank_and_an_adopted_one_yields_to_a_newer() {
        let now = Instant::now();
        let mut seats = Seats::default();
        seats.attach(JobId(1), Rank(0), SessionId(5), 50, now);
        assert_eq!(seats.attached(JobId(1), Rank(0), 50), Some(SessionId(5)), "an attach of the same loader again");
        assert!(seats.attach(JobId(1), Rank(0), SessionId(6), 60, now), "replaces session 5");
        assert_eq!(seats.attached(JobId(1), Rank(0), 50), None, "that loader no longer holds the rank");
        assert!(matches!(seats.check(JobId(1), Rank(0), SessionId(5)), Err(SeatRefusal::Superseded { .. })));
        assert!(matches!(seats.check(JobId(1), Rank(0), SessionId(7)), Err(SeatRefusal::Superseded { .. })), "not issued here");
        // After a restart: the first session heard from is adopted; a newer one replaces it.
        let mut restarted = Seats::default();
        assert_eq!(restarted.check(JobId(1), Rank(0), SessionId(5)), Ok(()));
        assert_eq!(restarted.check(JobId(1), Rank(0), SessionId(6)), Ok(()));
        assert!(matches!(restarted.check(JobId(1), Rank(0), SessionId(5)), Err(SeatRefusal::Superseded { .. })));
    }

    /// Found by review: a restarted trainer's new session inherited the old session's run, and
    /// a new run of that epoch counted the rank as ahead of it (past it, for the job's
    /// checkpoint) though where the new session resumes is not known until it opens a run.
    #[test]
    fn a_new_session_that_has_not_opened_a_run_is_absent_from_new_runs() {
        let now = Instant::now();
        let mut seats = Seats::default();
        assert_eq!(seats.counted(JobId(1), Rank(0), key(1)), Counted::Absent, "never heard of");
        seats.attach(JobId(1), Rank(0), SessionId(5), 50, now);
        assert_eq!(seats.counted(JobId(1), Rank(0), key(1)), Counted::MayCome, "attached, in no run yet");
        seats.open(key(1), Rank(0), &opening(5, 1), now).expect("opens");
        assert_eq!(seats.counted(JobId(1), Rank(0), key(0)), Counted::Ahead, "in a later epoch");
        let elsewhere = RunKey { start: Position(40), ..key(1) };
        assert_eq!(seats.counted(JobId(1), Rank(0), elsewhere), Counted::Absent, "in this epoch from another start: not known past it");
        assert_eq!(seats.counted(JobId(1), Rank(0), key(2)), Counted::MayCome, "an earlier epoch: it will come");
        seats.attach(JobId(1), Rank(0), SessionId(6), 60, now);
        assert_eq!(seats.counted(JobId(1), Rank(0), key(0)), Counted::Absent, "restarted: where it resumes is not known");
        seats.open(key(0), Rank(0), &opening(6, 1), now).expect("opens");
        assert_eq!(seats.counted(JobId(1), Rank(0), key(1)), Counted::MayCome, "it resumed in epoch 0");
    }

    #[test]
    fn after_a_detach_nothing_of_the_session_is_a_sign_of_life() {
        let now = Instant::now();
        let ttl = Duration::from_secs(5);
        let mut seats = Seats::default();
        seats.attach(JobId(1), Rank(0), SessionId(5), 50, now);
        seats.open(key(0), Rank(0), &opening(5, 1), now).expect("opens");
        assert!(seats.is_live(JobId(1), Rank(0), now, ttl));
        seats.detach(JobId(1), Rank(0), SessionId(5)).expect("detaches");
        assert!(!seats.is_live(JobId(1), Rank(0), now, ttl));
        assert_eq!(seats.report(key(0), Rank(0), &reporting(5, 1, 3), now), Ok(Standing::Stale), "a late report");
        assert!(!seats.is_live(JobId(1), Rank(0), now, ttl));
        assert!(matches!(seats.open(key(0), Rank(0), &opening(5, 2), now), Err(SeatRefusal::Stale { .. })));
        assert_eq!(seats.attached_jobs(now, ttl).count(), 0);
    }
}
