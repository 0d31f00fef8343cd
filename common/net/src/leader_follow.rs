//! Following the coordinators' Raft leader: which address to call next after a failed call, and
//! after how long. Pure (STYLE G4): time is a parameter, and [`super::QuicCoordinator`] performs
//! the calls and the waits.
//!
//! * `NotLeader { leader_hint: Some(a) }`: call `a` at once (learning it if it is new); a few
//!   times in a row at most, then with the backoff, so that two nodes naming each other during
//!   a change of leader do not spin.
//! * `NotLeader { leader_hint: None }` (an election is under way), or `Unavailable` when more
//!   than one address is known: the next address, after an exponential backoff.
//! * Anything else, and `Unavailable` with a single address (callers have their own retry loops
//!   and timing for a coordinator that restarts): give up at once.
//!
//! Every call gives up once its time budget is spent or after [`MAX_ATTEMPTS`] tries.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use super::CoordinatorAddrs;
use stoker_proto::ErrorCode;

/// The first pause between tries.
pub(crate) const INITIAL_BACKOFF: Duration = Duration::from_millis(50);

/// The longest pause between tries: short, so that a caller finds a newly elected leader
/// within a quarter second of the election (calls during one are cheap refusals).
pub(crate) const MAX_BACKOFF: Duration = Duration::from_millis(250);

/// How long one call looks for the leader before it returns the last error, by default.
pub(crate) const DEFAULT_FAILOVER_TIMEOUT: Duration = Duration::from_secs(15);

/// How long an address that did not answer is not followed to on a hint: about an election.
const UNREACHABLE_MEMORY: Duration = Duration::from_secs(3);

/// Redirects followed at once in a row before they too wait for the backoff.
const MAX_IMMEDIATE_REDIRECTS: u32 = 3;

/// Tries of one call at most, whatever the clock says.
pub(crate) const MAX_ATTEMPTS: u32 = 256;

/// Addresses learned from leader hints kept beyond the configured ones (the oldest is dropped).
const MAX_LEARNED: usize = 8;

/// The coordinator addresses a client knows, and where its next call starts: the last leader.
#[derive(Debug)]
pub(crate) struct KnownCoordinators {
    /// The configured addresses, then those learned from hints.
    addrs: Vec<SocketAddr>,
    /// How many of `addrs` were configured.
    configured: usize,
    /// Index in `addrs` of the address the next call starts at.
    next: usize,
    /// The last address that answered.
    leader: Option<SocketAddr>,
    /// Addresses found unreachable, and when: a follower that has not heard of an election yet
    /// still names the dead leader, and its hint is not followed back there for a while.
    unreachable: Vec<(SocketAddr, Instant)>,
}

impl KnownCoordinators {
    /// `addrs`, starting at the first.
    pub(crate) fn new(addrs: &CoordinatorAddrs) -> Self {
        Self { addrs: addrs.as_slice().to_vec(), configured: addrs.len(), next: 0, leader: None, unreachable: Vec::new() }
    }

    /// Where the next call starts.
    pub(crate) fn start(&self) -> SocketAddr {
        self.addrs[self.next]
    }

    /// Every address known, configured ones first.
    pub(crate) fn all(&self) -> &[SocketAddr] {
        &self.addrs
    }

    /// `addr` answered a call: it is the leader, and calls start there. Returns the previous
    /// leader (`Some(None)` if there was none yet) when this is a change.
    pub(crate) fn answered(&mut self, addr: SocketAddr) -> Option<Option<SocketAddr>> {
        self.unreachable.retain(|(known, _)| *known != addr);
        self.next = self.learn(addr);
        let previous = self.leader.replace(addr);
        (previous != Some(addr)).then_some(previous)
    }

    /// `addr` did not answer at `now`.
    fn unreachable_at(&mut self, addr: SocketAddr, now: Instant) {
        self.unreachable.retain(|(known, at)| *known != addr && now.saturating_duration_since(*at) < UNREACHABLE_MEMORY);
        self.unreachable.push((addr, now));
    }

    /// Whether `addr` did not answer within the last [`UNREACHABLE_MEMORY`].
    fn is_unreachable(&self, addr: SocketAddr, now: Instant) -> bool {
        self.unreachable.iter().any(|(known, at)| *known == addr && now.saturating_duration_since(*at) < UNREACHABLE_MEMORY)
    }

    /// `hint` is said to be the leader: learn it if new, and start there.
    fn redirect(&mut self, hint: SocketAddr) {
        self.next = self.learn(hint);
    }

    /// The address after `failed`. When another call has moved the start away from `failed`
    /// already, that start.
    fn rotate_from(&mut self, failed: SocketAddr) -> SocketAddr {
        if self.addrs[self.next] == failed {
            self.next = (self.next + 1) % self.addrs.len();
        }
        self.start()
    }

    /// The index of `addr`, added (as learned) if it is new.
    fn learn(&mut self, addr: SocketAddr) -> usize {
        if let Some(index) = self.addrs.iter().position(|known| *known == addr) {
            return index;
        }
        if self.addrs.len() - self.configured >= MAX_LEARNED {
            self.addrs.remove(self.configured);
            if self.next > self.configured {
                self.next -= 1;
            }
        }
        self.addrs.push(addr);
        self.addrs.len() - 1
    }
}

/// What a call does after a try failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Next {
    /// Wait `after` (zero: not at all), then call `addr`.
    Call {
        /// Where to call.
        addr: SocketAddr,
        /// How long to wait first.
        after: Duration,
    },
    /// Return the error of the last try.
    GiveUp,
}

/// The retry state of one call.
#[derive(Debug)]
pub(crate) struct FollowAttempt {
    deadline: Instant,
    backoff: Duration,
    immediate_redirects: u32,
    attempts: u32,
}

impl FollowAttempt {
    /// A call that started at `now` and may look for the leader for `budget`.
    pub(crate) fn new(now: Instant, budget: Duration) -> Self {
        Self { deadline: now.checked_add(budget).unwrap_or(now), backoff: INITIAL_BACKOFF, immediate_redirects: 0, attempts: 0 }
    }

    /// Tries made so far (each [`FollowAttempt::after_failure`] counts one).
    pub(crate) fn attempts(&self) -> u32 {
        self.attempts
    }

    /// The try at `failed` failed with `code` at `now`: what next. Updates `known` (a hinted
    /// leader is learned, the start moves past a failed address).
    /// `answered`: the coordinator answered with this error (it is alive), rather than the
    /// transport failing.
    pub(crate) fn after_failure(
        &mut self,
        known: &mut KnownCoordinators,
        failed: SocketAddr,
        code: &ErrorCode,
        answered: bool,
        now: Instant,
    ) -> Next {
        self.attempts += 1;
        let follow = match code {
            ErrorCode::NotLeader { .. } => true,
            ErrorCode::Unavailable => known.all().len() > 1,
            _ => false,
        };
        if !follow || self.attempts >= MAX_ATTEMPTS || now >= self.deadline {
            return Next::GiveUp;
        }
        if *code == ErrorCode::Unavailable && !answered {
            known.unreachable_at(failed, now);
        }
        match code {
            ErrorCode::NotLeader { leader_hint: Some(hint) } if !known.is_unreachable(*hint, now) => {
                known.redirect(*hint);
                if *hint != failed && self.immediate_redirects < MAX_IMMEDIATE_REDIRECTS {
                    self.immediate_redirects += 1;
                    Next::Call { addr: *hint, after: Duration::ZERO }
                } else {
                    self.pause_then(*hint, now)
                }
            }
            _ => {
                // The next address that was not found unreachable lately (any, if all were).
                let mut addr = known.rotate_from(failed);
                for _ in 0..known.all().len() {
                    if !known.is_unreachable(addr, now) {
                        break;
                    }
                    addr = known.rotate_from(addr);
                }
                self.pause_then(addr, now)
            }
        }
    }

    fn pause_then(&mut self, addr: SocketAddr, now: Instant) -> Next {
        let after = self.backoff.min(self.deadline.saturating_duration_since(now));
        self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
        self.immediate_redirects = 0;
        Next::Call { addr, after }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(last: u8) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, last], 7400))
    }

    fn known(lasts: &[u8]) -> KnownCoordinators {
        KnownCoordinators::new(&CoordinatorAddrs::from_addrs(lasts.iter().map(|last| addr(*last))).expect("some"))
    }

    fn not_leader(hint: Option<u8>) -> ErrorCode {
        ErrorCode::NotLeader { leader_hint: hint.map(addr) }
    }

    /// Found in the fail-over benchmark: followers still name a dead leader until the election
    /// ends, and following them back to it cost a connect timeout each time.
    #[test]
    fn a_hint_naming_an_address_this_call_found_unreachable_is_not_followed() {
        let mut known = known(&[1, 2, 3]);
        let now = Instant::now();
        let mut attempt = FollowAttempt::new(now, DEFAULT_FAILOVER_TIMEOUT);
        let next = attempt.after_failure(&mut known, addr(1), &ErrorCode::Unavailable, false, now);
        assert!(matches!(next, Next::Call { addr: to, .. } if to == addr(2)), "{next:?}");
        let next = attempt.after_failure(&mut known, addr(2), &not_leader(Some(1)), true, now);
        assert!(matches!(next, Next::Call { addr: to, after } if to == addr(3) && after > Duration::ZERO), "{next:?}");
        let next = attempt.after_failure(&mut known, addr(3), &not_leader(Some(1)), true, now);
        assert!(matches!(next, Next::Call { addr: to, .. } if to == addr(2)), "the rotation skips the unreachable one: {next:?}");
        let next = attempt.after_failure(&mut known, addr(2), &not_leader(Some(3)), true, now);
        assert_eq!(next, Next::Call { addr: addr(3), after: Duration::ZERO }, "a hint to a live address is followed");
        let mut later = FollowAttempt::new(now, DEFAULT_FAILOVER_TIMEOUT);
        let next = later.after_failure(&mut known, addr(2), &not_leader(Some(1)), true, now);
        assert!(matches!(next, Next::Call { addr: to, .. } if to != addr(1)), "the next call remembers too: {next:?}");
        let much_later = now + UNREACHABLE_MEMORY;
        let next = later.after_failure(&mut known, addr(2), &not_leader(Some(1)), true, much_later);
        assert!(matches!(next, Next::Call { addr: to, .. } if to == addr(1)), "and forgets after a while: {next:?}");
    }

    /// From the second review: a leader answering `Unavailable` itself ("cannot commit") is
    /// alive, and hints to it are still followed.
    #[test]
    fn an_answered_unavailable_does_not_mark_the_address_unreachable() {
        let mut known = known(&[1, 2]);
        let now = Instant::now();
        let mut attempt = FollowAttempt::new(now, DEFAULT_FAILOVER_TIMEOUT);
        attempt.after_failure(&mut known, addr(1), &ErrorCode::Unavailable, true, now);
        let next = attempt.after_failure(&mut known, addr(2), &not_leader(Some(1)), true, now);
        assert_eq!(next, Next::Call { addr: addr(1), after: Duration::ZERO });
    }

    fn after(next: Next) -> Duration {
        match next {
            Next::Call { after, .. } => after,
            Next::GiveUp => panic!("gave up"),
        }
    }

    #[test]
    fn a_hint_is_followed_at_once_and_becomes_where_calls_start() {
        let mut known = known(&[1, 2, 3]);
        let now = Instant::now();
        let mut attempt = FollowAttempt::new(now, DEFAULT_FAILOVER_TIMEOUT);
        assert_eq!(known.start(), addr(1));
        let next = attempt.after_failure(&mut known, addr(1), &not_leader(Some(3)), true, now);
        assert_eq!(next, Next::Call { addr: addr(3), after: Duration::ZERO });
        assert_eq!(known.start(), addr(3));
        assert_eq!(known.answered(addr(3)), Some(None), "the first leader");
        assert_eq!(known.answered(addr(3)), None, "no change");
        assert_eq!(known.start(), addr(3));
    }

    #[test]
    fn an_unknown_hint_is_learned() {
        let mut known = known(&[1]);
        let now = Instant::now();
        let mut attempt = FollowAttempt::new(now, DEFAULT_FAILOVER_TIMEOUT);
        let next = attempt.after_failure(&mut known, addr(1), &not_leader(Some(9)), true, now);
        assert_eq!(next, Next::Call { addr: addr(9), after: Duration::ZERO });
        assert_eq!(known.all(), &[addr(1), addr(9)]);
        assert_eq!(known.answered(addr(9)), Some(None));
        assert_eq!(known.answered(addr(1)), Some(Some(addr(9))), "a change of leader names the previous one");
    }

    #[test]
    fn learned_addresses_are_bounded_and_configured_ones_kept() {
        let mut known = known(&[1, 2]);
        for last in 10..40 {
            known.redirect(addr(last));
            assert_eq!(known.start(), addr(last));
        }
        assert_eq!(known.all().len(), 2 + MAX_LEARNED);
        assert_eq!(&known.all()[..2], &[addr(1), addr(2)]);
        assert_eq!(known.all().last(), Some(&addr(39)));
    }

    #[test]
    fn unavailable_with_one_address_gives_up_at_once() {
        let mut known = known(&[1]);
        let now = Instant::now();
        let mut attempt = FollowAttempt::new(now, DEFAULT_FAILOVER_TIMEOUT);
        assert_eq!(attempt.after_failure(&mut known, addr(1), &ErrorCode::Unavailable, false, now), Next::GiveUp);
    }

    #[test]
    fn errors_that_another_node_cannot_fix_give_up_at_once() {
        for code in [ErrorCode::InvalidArgument, ErrorCode::NotFound, ErrorCode::Timeout, ErrorCode::VersionMismatch, ErrorCode::Internal] {
            let mut known = known(&[1, 2, 3]);
            let now = Instant::now();
            let mut attempt = FollowAttempt::new(now, DEFAULT_FAILOVER_TIMEOUT);
            assert_eq!(attempt.after_failure(&mut known, addr(1), &code, true, now), Next::GiveUp, "{code:?}");
            assert_eq!(known.start(), addr(1));
        }
    }

    #[test]
    fn unavailable_with_several_addresses_tries_the_next_with_a_growing_capped_backoff() {
        let mut known = known(&[1, 2, 3]);
        let mut now = Instant::now();
        let mut attempt = FollowAttempt::new(now, Duration::from_secs(60));
        let mut pauses = Vec::new();
        let mut called = Vec::new();
        let mut failed = addr(1);
        for _ in 0..8 {
            match attempt.after_failure(&mut known, failed, &ErrorCode::Unavailable, false, now) {
                Next::Call { addr, after } => {
                    pauses.push(after.as_millis());
                    called.push(addr);
                    now += after;
                    failed = addr;
                }
                Next::GiveUp => panic!("gave up"),
            }
        }
        assert_eq!(pauses, [50, 100, 200, 250, 250, 250, 250, 250]);
        assert_eq!(called, [addr(2), addr(3), addr(1), addr(2), addr(3), addr(1), addr(2), addr(3)]);
    }

    #[test]
    fn no_leader_known_waits_and_moves_on_even_with_one_address() {
        let mut known = known(&[1]);
        let now = Instant::now();
        let mut attempt = FollowAttempt::new(now, DEFAULT_FAILOVER_TIMEOUT);
        assert_eq!(
            attempt.after_failure(&mut known, addr(1), &not_leader(None), true, now),
            Next::Call { addr: addr(1), after: INITIAL_BACKOFF }
        );
        let mut known = self::known(&[1, 2]);
        let mut attempt = FollowAttempt::new(now, DEFAULT_FAILOVER_TIMEOUT);
        assert_eq!(
            attempt.after_failure(&mut known, addr(1), &not_leader(None), true, now),
            Next::Call { addr: addr(2), after: INITIAL_BACKOFF }
        );
    }

    #[test]
    fn a_start_moved_by_another_call_is_where_a_failed_one_goes() {
        let mut known = known(&[1, 2, 3]);
        let now = Instant::now();
        known.answered(addr(3));
        let mut attempt = FollowAttempt::new(now, DEFAULT_FAILOVER_TIMEOUT);
        // This call failed at 1 (it started before 3 answered another call): it goes to 3.
        assert_eq!(
            attempt.after_failure(&mut known, addr(1), &ErrorCode::Unavailable, false, now),
            Next::Call { addr: addr(3), after: INITIAL_BACKOFF }
        );
    }

    #[test]
    fn nodes_naming_each_other_are_followed_with_a_backoff_after_a_few_redirects() {
        let mut known = known(&[1, 2]);
        let mut now = Instant::now();
        let mut attempt = FollowAttempt::new(now, DEFAULT_FAILOVER_TIMEOUT);
        let mut failed = addr(1);
        let mut pauses = Vec::new();
        for _ in 0..8 {
            let hint = if failed == addr(1) { 2 } else { 1 };
            let next = attempt.after_failure(&mut known, failed, &not_leader(Some(hint)), true, now);
            assert_eq!(next, Next::Call { addr: addr(hint), after: after(next) });
            pauses.push(after(next).as_millis());
            now += after(next);
            failed = addr(hint);
        }
        assert_eq!(pauses, [0, 0, 0, 50, 0, 0, 0, 100]);
    }

    #[test]
    fn a_node_naming_itself_is_retried_after_a_pause() {
        let mut known = known(&[1, 2]);
        let now = Instant::now();
        let mut attempt = FollowAttempt::new(now, DEFAULT_FAILOVER_TIMEOUT);
        assert_eq!(
            attempt.after_failure(&mut known, addr(1), &not_leader(Some(1)), true, now),
            Next::Call { addr: addr(1), after: INITIAL_BACKOFF }
        );
    }

    #[test]
    fn the_budget_bounds_the_wait_and_then_the_call_gives_up() {
        let mut known = known(&[1, 2]);
        let start = Instant::now();
        let budget = Duration::from_millis(120);
        let mut attempt = FollowAttempt::new(start, budget);
        let mut now = start;
        let mut failed = addr(1);
        let mut waited = Duration::ZERO;
        while let Next::Call { addr, after } = attempt.after_failure(&mut known, failed, &ErrorCode::Unavailable, false, now) {
            waited += after;
            now += after;
            failed = addr;
            assert!(attempt.attempts() < MAX_ATTEMPTS);
        }
        assert_eq!(waited, budget, "50 + 70 (the rest of the budget, not 100)");
        let mut zero = FollowAttempt::new(start, Duration::ZERO);
        assert_eq!(zero.after_failure(&mut known, addr(1), &not_leader(Some(2)), true, start), Next::GiveUp, "no budget: no following");
    }

    #[test]
    fn attempts_are_bounded_even_if_time_stands_still() {
        let mut known = known(&[1, 2]);
        let now = Instant::now();
        let mut attempt = FollowAttempt::new(now, DEFAULT_FAILOVER_TIMEOUT);
        let mut tries = 0;
        while let Next::Call { addr: to, .. } = attempt.after_failure(&mut known, addr(1), &not_leader(Some(2)), true, now) {
            assert_eq!(to, addr(2));
            tries += 1;
            assert!(tries < 10 * MAX_ATTEMPTS, "unbounded");
        }
        assert_eq!(tries, MAX_ATTEMPTS - 1);
    }
}
