//! The lease table: which worker holds which chunk, until when, with what progress; and which
//! workers are stuck on which job (they get none of its work for a while).

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use stoker_plan::ids::{JobId, LeaseId, WorkerId};
use stoker_proto::{Chunk, LeaseProgress, StuckJob};
use tracing::warn;

/// A chunk granted to a worker.
#[derive(Debug)]
pub(super) struct Lease {
    pub(super) chunk: Chunk,
    pub(super) worker: WorkerId,
    expires: Instant,
    /// Batches the worker has finished, as of its last heartbeat.
    finished: u32,
    /// When `finished` last grew (or the lease was granted).
    pub(super) progressed: Instant,
    /// When it was granted.
    pub(super) granted: Instant,
}

/// What a heartbeat's lease list changed.
#[derive(Debug, Default)]
pub(super) struct Renewal {
    /// Leases the worker lists that are not its own (any more).
    pub(super) revoked: Vec<LeaseId>,
    /// Leases the worker lists but made no progress on for the stall timeout: taken back.
    pub(super) stalled: Vec<(LeaseId, Lease)>,
}

/// Leases by id, and stuck (worker, job) pairs.
#[derive(Debug, Default)]
pub(super) struct Leases {
    held: BTreeMap<LeaseId, Lease>,
    /// Every held lease by when it expires: expiry looks at the expired ones only (issue 35).
    by_expiry: BTreeSet<(Instant, LeaseId)>,
    /// Workers stuck on a job (a hung open or decode), and until when they get none of its
    /// work: each heartbeat sets the jobs its worker reports stuck, for a lease TTL (a stall
    /// taken back here counts too, until the next heartbeat). A worker stuck on a job would
    /// otherwise take the very steps it stalled on straight back.
    /// Each with the reason the worker gave.
    stalled: BTreeMap<(WorkerId, JobId), (Instant, String)>,
}

impl Leases {
    /// Whether `lease` is held (by anyone).
    pub(super) fn contains(&self, lease: LeaseId) -> bool {
        self.held.contains_key(&lease)
    }

    /// Grant `chunk` to `worker` under `lease` at `now`, expiring after `ttl`.
    pub(super) fn grant(&mut self, lease: LeaseId, chunk: Chunk, worker: WorkerId, now: Instant, ttl: Duration) {
        let expires = now + ttl;
        if let Some(earlier) = self.held.insert(lease, Lease { chunk, worker, expires, finished: 0, progressed: now, granted: now }) {
            self.by_expiry.remove(&(earlier.expires, lease));
        }
        self.by_expiry.insert((expires, lease));
    }

    /// Remove `lease` from the table and the expiry index.
    fn remove(&mut self, lease: LeaseId) -> Option<Lease> {
        let held = self.held.remove(&lease)?;
        self.by_expiry.remove(&(held.expires, lease));
        Some(held)
    }

    /// Take `lease` back if `worker` holds it.
    pub(super) fn take(&mut self, worker: WorkerId, lease: LeaseId) -> Option<Lease> {
        if self.held.get(&lease).is_none_or(|held| held.worker != worker) {
            return None;
        }
        self.remove(lease)
    }

    /// `worker` reports `stuck_jobs` stuck at `now`: it gets none of their work until `until`
    /// (and forgets the jobs it no longer reports).
    pub(super) fn set_stuck(&mut self, worker: WorkerId, stuck_jobs: &[StuckJob], until: Instant) {
        self.stalled.retain(|(stuck, job), _| *stuck != worker || stuck_jobs.iter().any(|reported| reported.job == *job));
        for StuckJob { job, reason } in stuck_jobs {
            if self.stalled.insert((worker, *job), (until, reason.clone())).is_none() {
                warn!(%worker, %job, %reason, "the worker makes nothing of the job: it gets none of the job's work until it reports it no longer stuck");
            }
        }
    }

    /// Whether `worker` is stuck on `job` at `now`.
    pub(super) fn is_stuck(&self, worker: WorkerId, job: JobId, now: Instant) -> bool {
        self.stalled.get(&(worker, job)).is_some_and(|(until, _)| *until > now)
    }

    /// Renew the leases `worker` lists (for `ttl` from `now`) that it holds and made progress
    /// on within `stall`; take back those it stalled on (the worker is stuck on their job
    /// until `stuck_until`).
    pub(super) fn renew(
        &mut self,
        worker: WorkerId,
        progress: &[LeaseProgress],
        now: Instant,
        ttl: Duration,
        stall: Duration,
        stuck_until: Instant,
    ) -> Renewal {
        let mut renewal = Renewal::default();
        let mut stalled = Vec::new();
        for listed in progress {
            match self.held.get_mut(&listed.lease) {
                Some(held) if held.worker == worker => {
                    if listed.finished > held.finished {
                        held.finished = listed.finished;
                        held.progressed = now;
                    }
                    if now.saturating_duration_since(held.progressed) < stall {
                        self.by_expiry.remove(&(held.expires, listed.lease));
                        held.expires = now + ttl;
                        self.by_expiry.insert((held.expires, listed.lease));
                    } else {
                        stalled.push(listed.lease);
                    }
                }
                _ => renewal.revoked.push(listed.lease),
            }
        }
        for lease in stalled {
            if let Some(held) = self.remove(lease) {
                let reason = format!("a lease of the job made no progress for {} s: taken back by the coordinator", stall.as_secs());
                self.stalled.insert((worker, held.chunk.job), (stuck_until, reason));
                renewal.stalled.push((lease, held));
            }
        }
        renewal
    }

    /// Take back every lease not renewed by `now`.
    pub(super) fn take_expired(&mut self, now: Instant) -> Vec<(LeaseId, Lease)> {
        let mut expired = Vec::new();
        while let Some(&(expires, lease)) = self.by_expiry.first()
            && expires <= now
        {
            self.by_expiry.pop_first();
            if let Some(held) = self.held.remove(&lease) {
                expired.push((lease, held));
            }
        }
        // In lease order, as the table lists them.
        expired.sort_unstable_by_key(|(lease, _)| *lease);
        expired
    }

    /// Take back every lease of `worker`.
    pub(super) fn take_all_of(&mut self, worker: WorkerId) -> Vec<(LeaseId, Lease)> {
        let handed_back: Vec<LeaseId> = self.held.iter().filter(|(_, held)| held.worker == worker).map(|(id, _)| *id).collect();
        handed_back.into_iter().filter_map(|lease| self.remove(lease).map(|held| (lease, held))).collect()
    }

    /// Forget stuck marks that ran out by `now`.
    pub(super) fn forget_stalls(&mut self, now: Instant) {
        self.stalled.retain(|_, (until, _)| *until > now);
    }

    /// Forget every lease and stuck mark of `job`.
    pub(super) fn forget_job(&mut self, job: JobId) {
        self.held.retain(|_, held| held.chunk.job != job);
        let held = &self.held;
        self.by_expiry.retain(|(_, lease)| held.contains_key(lease));
        self.stalled.retain(|(_, stalled_job), _| *stalled_job != job);
    }

    /// Leases of `job`.
    pub(super) fn count_of_job(&self, job: JobId) -> u32 {
        self.held.values().filter(|held| held.chunk.job == job).count() as u32
    }

    /// Every lease.
    pub(super) fn len(&self) -> usize {
        self.held.len()
    }

    /// Leases `worker` holds.
    pub(super) fn in_flight(&self, worker: WorkerId) -> u32 {
        self.held.values().filter(|held| held.worker == worker).count() as u32
    }

    /// The jobs `worker` is stuck on at `now`.
    pub(super) fn stuck_jobs(&self, worker: WorkerId, now: Instant) -> Vec<StuckJob> {
        self.stalled
            .range((worker, JobId(0))..=(worker, JobId(u64::MAX)))
            .filter(|(_, (until, _))| *until > now)
            .map(|((_, job), (_, reason))| StuckJob { job: *job, reason: reason.clone() })
            .collect()
    }
}
