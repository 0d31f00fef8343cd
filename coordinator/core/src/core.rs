//! [`Core`]: the coordinator's state and decisions, stepped by events (STYLE G4). It validates
//! a request, asks the [`Scheduler`] for decisions and answers, or asks its driver to commit a
//! [`Command`] first; committed commands come back through [`Core::apply`] on every replica.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use stoker_plan::ids::{JobId, Rank, SessionId};
use stoker_plan::{Checkpoint, EpochPlan};
use stoker_proto::RankStatus;

use crate::authz::Owners;
use crate::config::CoreConfig;
use crate::demand::Demand;
use crate::event::{Event, Outcome};
use crate::figures::RankTotals;
use crate::ids::IdSource;
use crate::scheduler::{RunKey, Scheduler};
use crate::shards::Locality;
use crate::state::{Applied, ClusterState, Command};

/// Random low bits of trainer session ids. The high bits count up, so sessions still order
/// by age (a worker serves the newest; a coordinator adopts a newer one after a restart),
/// while a peer cannot name another trainer's session by counting.
pub(crate) const SESSION_RANDOM_BITS: u32 = 21;

/// Sessions one leader may hand out in its term (the count's bits in a session's high bits).
const SESSION_COUNT_BITS: u32 = 22;
/// Set in the high bits of every session a leader hands out since ids come from the Raft term
/// (issue 31, item 7): above every session of the earlier scheme (wall-clock milliseconds,
/// below 2^42 until 2109), so a session recorded before the upgrade never supersedes a new one.
const SESSION_TERM_SCHEME: u64 = 1 << 42;
/// Terms the session scheme has room for (2^20); a later term hands out no sessions.
const SESSION_TERMS: u64 = 1 << (42 - SESSION_COUNT_BITS);
/// Set in every worker id a leader hands out: worker ids are `flag | term << 32 | count`.
const WORKER_TERM_SCHEME: u64 = 1 << 62;

/// The first session (high bits) and the end of the range a leader of `term` hands out: a
/// range of its own, so leaders never hand out the same session whatever their clocks say.
fn session_range(term: u64) -> (u64, u64) {
    let first = SESSION_TERM_SCHEME | term.min(SESSION_TERMS) << SESSION_COUNT_BITS;
    let end = if term >= SESSION_TERMS { first } else { first + (1 << SESSION_COUNT_BITS) };
    (first, end)
}

/// Where in its term's range a leader starts counting worker ids: below 2^31, which leaves
/// 2^31 registrations a term.
const WORKER_START_MASK: u64 = (1 << 31) - 1;

/// The first worker id a leader of `term` hands out (2^32 a term; terms below 2^30).
fn worker_id_base(term: u64) -> u64 {
    WORKER_TERM_SCHEME | (term & ((1 << 30) - 1)) << 32
}

/// A coordinator's state and logic, without IO, clocks, randomness or locks.
pub struct Core {
    pub(crate) config: CoreConfig,
    /// The address status reports.
    pub(crate) advertised: String,
    pub(crate) state: ClusterState,
    pub(crate) scheduler: Scheduler,
    pub(crate) plans: BTreeMap<RunKey, Arc<EpochPlan>>,
    /// Which shards each worker holds or was told to read (soft state, for locality).
    pub(crate) locality: Locality,
    pub(crate) ranks: BTreeMap<(JobId, Rank), RankStatus>,
    /// What each rank's trainer reported it consumed in total (for metrics).
    pub(crate) totals: BTreeMap<(JobId, Rank), RankTotals>,
    /// What each job asks of the workers, from the growth of its ranks' totals.
    pub(crate) demand: BTreeMap<JobId, Demand>,
    /// The high bits of the next session id.
    pub(crate) next_session: u64,
    /// The high bits no session of this leader reaches: its range ends there.
    pub(crate) session_end: u64,
    /// Which certificate owns each rank's newest session.
    pub(crate) owners: Owners,
    /// Checkpoints not yet committed: one `RecordCheckpoints` entry carries all of them at the
    /// next flush.
    pub(crate) pending: BTreeMap<JobId, Checkpoint>,
    /// The Raft term this node leads with the soft state it holds.
    pub(crate) led_term: Option<u64>,
    /// The last term this node led and where its id ranges had got to (next worker id, next
    /// session): leading again in that term continues them, never hands an id out twice.
    pub(crate) ids_used: Option<(u64, u64, u64)>,
    /// When this coordinator started leading: a job no trainer was heard from since is idle
    /// since then.
    pub(crate) started: Instant,
    /// Lease ids and the low bits of session ids.
    pub(crate) ids: Box<dyn IdSource>,
}

impl std::fmt::Debug for Core {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("Core").field("advertised", &self.advertised).field("led_term", &self.led_term).finish_non_exhaustive()
    }
}

impl Core {
    /// A core over `state`, reporting `advertised` as its address, with ids from `ids`, counted
    /// ids (workers, sessions) from `id_base` on (local mode: anything above the ids of an
    /// earlier run), started at `now`. It schedules at once; a replicated coordinator steps
    /// [`Event::Lead`] before each request, and counts its ids from the Raft term instead.
    pub fn new(config: CoreConfig, advertised: String, state: ClusterState, ids: Box<dyn IdSource>, id_base: u64, now: Instant) -> Self {
        Self {
            scheduler: Scheduler::new(config.scheduler, id_base),
            config,
            advertised,
            state,
            plans: BTreeMap::new(),
            locality: Locality::default(),
            ranks: BTreeMap::new(),
            totals: BTreeMap::new(),
            demand: BTreeMap::new(),
            next_session: id_base,
            session_end: u64::MAX >> SESSION_RANDOM_BITS,
            owners: Owners::default(),
            pending: BTreeMap::new(),
            led_term: None,
            ids_used: None,
            started: now,
            ids,
        }
    }

    /// Decide on `event` at `now`: the one entry of the core.
    pub fn step(&mut self, event: Event, now: Instant) -> Outcome {
        match event {
            Event::Request { request, caller } => self.request(request, caller, now),
            Event::ManifestRead { name, read } => self.manifest_read(name, read),
            Event::Tick { flush } => Outcome::CommitEach(self.tick(now, flush)),
            Event::Flush => Outcome::CommitEach(self.flush().into_iter().collect()),
            Event::CommitFailed { command } => {
                self.commit_failed(command);
                Outcome::Done
            }
            Event::Lead { term } => {
                self.lead(term, now);
                Outcome::Done
            }
            Event::Follow => {
                self.follow();
                Outcome::Done
            }
        }
    }

    /// Apply a committed command (on every replica), and forget the soft state of a job it
    /// removes or fails.
    pub fn apply(&mut self, command: Command) -> Applied {
        let removed = match &command {
            Command::RemoveJob { job } => Some(*job),
            _ => None,
        };
        let failed = matches!(command, Command::FailJob { .. });
        let applied = self.state.apply(command);
        if let Some(job) = removed {
            self.scheduler.forget_job(job);
            self.ranks.retain(|(ranked_job, _), _| *ranked_job != job);
            self.totals.retain(|(ranked_job, _), _| *ranked_job != job);
            self.demand.remove(&job);
            self.pending.remove(&job);
        }
        if removed.is_some() || failed {
            self.forget_plans_of_finished_runs();
        }
        applied
    }

    /// The durable state (for snapshots, status and tests).
    pub fn state(&self) -> &ClusterState {
        &self.state
    }

    /// Replace the durable state with a snapshot's.
    pub fn restore(&mut self, state: ClusterState) {
        self.state = state;
    }

    /// Leases expired so far (for metrics and tests).
    pub fn leases_expired(&self) -> u64 {
        self.scheduler.leases_expired()
    }

    /// Chunks workers reported failed so far (for metrics and tests).
    pub fn chunks_failed(&self) -> u64 {
        self.scheduler.chunks_failed()
    }

    /// This node leads in `term`: if it did not lead in that term until now, its soft state
    /// (runs, leases, windows, workers, sessions) starts empty, as after a restart; workers
    /// and trainers rebuild it by registering and opening again (DESIGN §6). Its worker ids and
    /// sessions come from a range of the term's own: Raft gives a term one leader at most, and
    /// later terms higher ranges, so a new leader never hands out an id an earlier one did
    /// (its wall clock plays no part: issue 31, item 7).
    fn lead(&mut self, term: u64, now: Instant) {
        if self.led_term == Some(term) {
            return;
        }
        // Leading again in a term it led before (it stopped for a moment): the ids it handed out
        // then may be live, so both counts go on from where they had got to.
        let (worker_used, session_used) = match self.ids_used {
            Some((used_term, worker, session)) if used_term == term => (worker, session),
            _ => (0, 0),
        };
        // Worker ids start at a random point of the lower half of the term's range: a second
        // soft-state start in one term that this node does not remember (seen once in the
        // whole-cluster restart test: a node leading term 3 afresh twice, with no step down
        // between) does not hand a live worker's id out again either.
        let start = worker_id_base(term) + (self.ids.next_u64() & WORKER_START_MASK);
        self.drop_soft_state(start.max(worker_used));
        let (first, end) = session_range(term);
        // Above every session recorded too (sessions of the scheme before are below `first`).
        let recorded =
            self.state.sessions.values().flat_map(BTreeMap::values).map(|(session, _)| (session.0 >> SESSION_RANDOM_BITS) + 1).max();
        self.next_session = first.max(recorded.unwrap_or(0)).max(session_used);
        self.session_end = end;
        self.started = now;
        self.led_term = Some(term);
        tracing::info!(term, node = %self.advertised, "leading: scheduling starts afresh; workers and trainers reconnect");
    }

    /// This node no longer leads: drop the soft state so that nothing stale is served if it
    /// leads again.
    fn follow(&mut self) {
        if let Some(term) = self.led_term.take() {
            self.ids_used = Some((term, self.scheduler.next_worker_id(), self.next_session));
            self.drop_soft_state(WORKER_TERM_SCHEME);
            self.session_end = self.next_session;
            tracing::info!("no longer leading: soft state dropped");
        }
    }

    fn drop_soft_state(&mut self, id_base: u64) {
        self.scheduler = Scheduler::new(self.config.scheduler, id_base);
        self.owners.clear();
        self.plans.clear();
        self.locality = Locality::default();
        self.ranks.clear();
        self.totals.clear();
        self.demand.clear();
        self.pending.clear();
    }

    /// Expire leases and forget dead workers (also done on every request). Returns the
    /// removal of every job no trainer was heard from for the job TTL and, if `flush`, the
    /// checkpoints recorded since the last flush as one command: to commit.
    fn tick(&mut self, now: Instant, flush: bool) -> Vec<Command> {
        self.scheduler.expire(now);
        let mut commands = Vec::new();
        if let Some(ttl) = self.config.job_ttl {
            let idle = self
                .state
                .jobs
                .keys()
                .copied()
                .filter(|job| now.saturating_duration_since(self.scheduler.last_heard(*job).unwrap_or(self.started)) >= ttl)
                .map(|job| Command::RemoveJob { job });
            for command in idle {
                tracing::info!(?command, ttl_seconds = ttl.as_secs(), "job removed: no trainer for the job TTL (--job-ttl-hours)");
                commands.push(command);
            }
        }
        if flush {
            commands.extend(self.flush());
        }
        commands
    }

    /// The checkpoints recorded since the last flush, as one command.
    fn flush(&mut self) -> Option<Command> {
        if self.pending.is_empty() {
            return None;
        }
        let checkpoints = std::mem::take(&mut self.pending).into_iter().collect();
        Some(Command::RecordCheckpoints { checkpoints })
    }

    /// Put back checkpoints whose commit failed, unless newer ones were recorded meanwhile.
    fn commit_failed(&mut self, command: Command) {
        let Command::RecordCheckpoints { checkpoints } = command else { return };
        for (job, checkpoint) in checkpoints {
            if self.state.jobs.contains_key(&job) {
                self.pending.entry(job).or_insert(checkpoint);
            }
        }
    }

    /// A new session id: counted within this leader's range, with random low bits; `None`
    /// when the range is used up (a new term gives a new one).
    pub(crate) fn new_session(&mut self) -> Option<SessionId> {
        if self.next_session >= self.session_end {
            return None;
        }
        let count = self.next_session;
        self.next_session += 1;
        Some(SessionId(count << SESSION_RANDOM_BITS | self.ids.next_u64() >> (64 - SESSION_RANDOM_BITS)))
    }

    /// Drop the plans of runs that are gone (finished, left by every rank, or failed).
    pub(crate) fn forget_plans_of_finished_runs(&mut self) {
        let scheduler = &self.scheduler;
        self.plans.retain(|key, _| scheduler.has_run(*key));
    }
}

#[cfg(test)]
#[path = "core_tests.rs"]
mod tests;
