//! A worker's requests: registration, heartbeats, pulling chunks, reporting them fatal.

use std::net::SocketAddr;
use std::time::Instant;

use stoker_plan::ids::{CertKey, LeaseId, WorkerId};
use stoker_proto::{Chunk, ChunkGrant, ControlResponse, HeldShards, LeaseProgress, MAX_NEXT_SHARDS, RemoteError, StuckJob};

use crate::core::Core;
use crate::errors::{invalid, refused};
use crate::event::{Outcome, Then};
use crate::scheduler::{Made, RunKey, WorkerProcess};
use crate::shards::{Holdings, next_shards, shards_read};
use crate::state::Command;
use crate::validate::check_list_len;

/// The most chunks one pull grants. A worker asks for half its free room; 64 is far above
/// what any worker's `--in-flight` makes it ask for, and keeps an answer's frame well under the
/// control limit (64 grants of a spec and up to 512 shard ids each).
const MAX_CHUNKS_PER_PULL: u32 = 64;

impl Core {
    pub(super) fn register_worker(
        &mut self,
        addr: SocketAddr,
        threads: u32,
        instance: u64,
        attempt: u64,
        caller: CertKey,
        now: Instant,
    ) -> Result<ControlResponse, RemoteError> {
        let process = WorkerProcess { instance, attempt };
        let worker = self.scheduler.register_worker_as(addr, threads, process, caller, now).map_err(refused)?;
        let timing = self.config.scheduler;
        Ok(ControlResponse::WorkerRegistered {
            worker,
            heartbeat_millis: self.config.heartbeat.as_millis() as u64,
            lease_ttl_millis: timing.lease_ttl.as_millis() as u64,
            lease_stall_millis: timing.lease_stall.as_millis() as u64,
        })
    }

    pub(super) fn heartbeat(
        &mut self,
        worker: WorkerId,
        leases: &[LeaseProgress],
        made: Made,
        stuck_jobs: &[StuckJob],
        now: Instant,
    ) -> Result<ControlResponse, RemoteError> {
        check_list_len("leases", leases.len())?;
        check_list_len("stuck_jobs", stuck_jobs.len())?;
        if let Some(long) = stuck_jobs.iter().find(|stuck| stuck.reason.len() > StuckJob::MAX_REASON_BYTES) {
            return Err(invalid(format!(
                "the reason given for stuck job {} has {} bytes, over the limit of {}",
                long.job,
                long.reason.len(),
                StuckJob::MAX_REASON_BYTES
            )));
        }
        // Only jobs that exist are kept (with their reasons): what a worker can make the
        // coordinator hold is bounded by the jobs, not by what it sends.
        let stuck_jobs: Vec<StuckJob> = stuck_jobs.iter().filter(|stuck| self.state.jobs.contains_key(&stuck.job)).cloned().collect();
        let revoked = self.scheduler.heartbeat(worker, leases, made, &stuck_jobs, now).map_err(refused)?;
        Ok(ControlResponse::HeartbeatAck { revoked, live_jobs: self.scheduler.live_jobs(now) })
    }

    pub(super) fn pull(&mut self, worker: WorkerId, max: u32, held: &[HeldShards], now: Instant) -> Result<ControlResponse, RemoteError> {
        // What one pull costs the core (each candidate's shards are counted for locality) and
        // what its answer holds (each grant names up to MAX_NEXT_SHARDS shards) stay bounded
        // whatever a worker asks for (found by review).
        let max = max.min(MAX_CHUNKS_PER_PULL);
        let holdings = Holdings::of(held)?;
        // Locality: what this worker holds now, and what every worker holds or was told to
        // read at its last pull; among the next chunks in grant order, those whose shards it
        // holds or fetches go first, and those only other workers fetch last.
        let scheduler = &self.scheduler;
        self.locality.retain(scheduler.worker_removals(), |known| scheduler.is_registered(known));
        if scheduler.is_registered(worker) {
            // (A pull of a worker not registered is refused below and leaves nothing here.)
            self.locality.report(worker, holdings);
        }
        let granted = if self.locality.is_empty() {
            self.scheduler.pull(worker, max, now, &mut *self.ids)
        } else {
            let (state, plans, locality) = (&self.state, &self.plans, &self.locality);
            let affinity = |chunk: &Chunk| {
                let version_opt = state.job_dataset(chunk.job).map(|dataset| dataset.version);
                match (version_opt, plans.get(&RunKey::of(chunk))) {
                    (Some(version), Some(plan)) => locality.affinity(worker, version, plan, chunk),
                    _ => 0,
                }
            };
            self.scheduler.pull_preferring(worker, max, now, &mut *self.ids, &affinity)
        }
        .map_err(refused)?;
        let mut withdrawn = Vec::new();
        let mut told = Vec::new();
        let grants = granted
            .into_iter()
            .filter_map(|(lease, chunk)| {
                let spec = self.state.jobs.get(&chunk.job)?.clone();
                let dataset = self.state.job_dataset(chunk.job)?;
                // Fail closed: a chunk whose session or owner is not known goes to nobody.
                let owned = self
                    .scheduler
                    .session_of(chunk.job, chunk.rank)
                    .and_then(|session| Some((session, self.owner_of(chunk.job, chunk.rank, session)?)));
                let Some((session, trainer)) = owned else {
                    withdrawn.push(lease);
                    return None;
                };
                let (read, next_shards) = self
                    .plans
                    .get(&RunKey::of(&chunk))
                    .map(|plan| {
                        let read = shards_read(plan, chunk.rank, chunk.first_step, u64::from(chunk.steps), MAX_NEXT_SHARDS);
                        // Those another worker holds or fetches are left to it (see
                        // `Locality::not_claimed_by_others`).
                        let next = next_shards(plan, &chunk, self.config.scheduler.chunk_steps);
                        (read, self.locality.not_claimed_by_others(worker, dataset.version, next))
                    })
                    .unwrap_or_default();
                told.push((dataset.version, read, next_shards.clone()));
                Some(ChunkGrant {
                    lease,
                    chunk,
                    spec,
                    manifest: dataset.manifest.clone(),
                    dataset_version: dataset.version,
                    session,
                    trainer,
                    next_shards,
                })
            })
            .collect();
        for (version, read, next) in told {
            self.locality.told(worker, version, &read);
            self.locality.told(worker, version, &next);
        }
        for lease in withdrawn {
            tracing::warn!(%worker, %lease, "a chunk's rank has no session with a known owner: not granted");
            self.scheduler.withdraw(worker, lease);
        }
        Ok(ControlResponse::Chunks { grants })
    }

    /// A chunk can never be made: its job fails (committed), and the worker is acknowledged.
    pub(super) fn chunk_fatal(&mut self, worker: WorkerId, lease: LeaseId, reason: String) -> Outcome {
        let Some(job) = self.scheduler.chunk_fatal(worker, lease) else { return Outcome::reply(Ok(ControlResponse::Ack)) };
        tracing::error!(%job, %worker, %lease, %reason, "job failed: a chunk cannot be made");
        // Kept in the replicated state: cut as a heartbeat's reason is (`state_budget::JOB_BYTES`).
        let reason = StuckJob::new(job, &reason).reason;
        Outcome::Commit { command: Command::FailJob { job, reason }, then: Then::Reply(ControlResponse::Ack) }
    }
}
