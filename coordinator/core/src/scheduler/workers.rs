//! The worker registry: which worker processes are registered, under which id and certificate,
//! when each was last heard from and how fast it makes images.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use stoker_plan::ids::{CertKey, WorkerId};
use stoker_proto::WorkerInfo;
use tracing::warn;

use super::{Refusal, WorkerProcess};

/// One registered worker.
#[derive(Debug)]
pub(super) struct Worker {
    pub(super) addr: SocketAddr,
    pub(super) process: WorkerProcess,
    pub(super) threads: u32,
    pub(super) last_seen: Instant,
    images: u64,
    pub(super) images_per_sec: f64,
}

/// Registered workers, by id.
#[derive(Debug)]
pub(super) struct WorkerRegistry {
    workers: BTreeMap<WorkerId, Worker>,
    /// The certificate each worker registered with: requests under its id must come with it.
    keys: BTreeMap<WorkerId, CertKey>,
    next_worker: u64,
    /// No sweep for silent workers before this (a sweep looks at every worker; one per tenth
    /// of the silence that forgets is enough, not one per request: issue 35).
    next_sweep_opt: Option<Instant>,
    /// Counts removals: who keeps something per worker looks again only when it moved.
    removals: u64,
}

impl WorkerRegistry {
    /// The id the next registration gets.
    pub(super) fn next_id(&self) -> u64 {
        self.next_worker
    }

    /// No workers; ids count from `id_base`.
    pub(super) fn new(id_base: u64) -> Self {
        Self { workers: BTreeMap::new(), keys: BTreeMap::new(), next_worker: id_base, next_sweep_opt: None, removals: 0 }
    }

    /// The registrations a new one of `process` at `addr` with `key` replaces: the process's
    /// earlier ones with the same certificate (a late registration never replaces a newer one).
    pub(super) fn replaced_by(&self, addr: SocketAddr, process: WorkerProcess, key: CertKey) -> Vec<WorkerId> {
        let mut replaced = Vec::new();
        for (id, worker) in &self.workers {
            let same_key = self.keys.get(id) == Some(&key);
            if worker.process.instance == process.instance && worker.process.attempt < process.attempt && same_key {
                replaced.push(*id);
            } else if worker.addr == addr && worker.process.instance != process.instance {
                warn!(%addr, worker = %id, "another worker process registered at the address this worker advertises: \
                    trainers cannot tell them apart; give each worker its own --advertise address");
            }
        }
        replaced
    }

    /// Register a worker under a new id.
    pub(super) fn insert(&mut self, addr: SocketAddr, threads: u32, process: WorkerProcess, key: CertKey, now: Instant) -> WorkerId {
        let id = WorkerId(self.next_worker);
        self.next_worker += 1;
        self.workers.insert(id, Worker { addr, process, threads, last_seen: now, images: 0, images_per_sec: 0.0 });
        self.keys.insert(id, key);
        let workers = &self.workers;
        self.keys.retain(|known, _| workers.contains_key(known));
        id
    }

    /// Workers registered with `key`.
    pub(super) fn count_of(&self, key: CertKey) -> usize {
        self.workers.keys().filter(|id| self.keys.get(id) == Some(&key)).count()
    }

    /// `worker` was heard from at `now`.
    pub(super) fn seen(&mut self, worker: WorkerId, now: Instant) -> Result<(), Refusal> {
        let entry = self.workers.get_mut(&worker).ok_or(Refusal::UnknownWorker(worker))?;
        entry.last_seen = now;
        Ok(())
    }

    /// `worker`'s heartbeat at `now`, reporting `images` made in total.
    pub(super) fn heartbeat(&mut self, worker: WorkerId, images: u64, now: Instant) -> Result<(), Refusal> {
        let entry = self.workers.get_mut(&worker).ok_or(Refusal::UnknownWorker(worker))?;
        let elapsed = now.saturating_duration_since(entry.last_seen).as_secs_f64();
        if elapsed > 0.0 {
            entry.images_per_sec = images.saturating_sub(entry.images) as f64 / elapsed;
        }
        entry.images = images;
        entry.last_seen = now;
        Ok(())
    }

    /// Refuse `caller` speaking for `worker` if the worker registered with another
    /// certificate, or is not known (fail closed: it registers again).
    pub(super) fn check_key(&self, worker: WorkerId, caller: CertKey) -> Result<(), Refusal> {
        match self.keys.get(&worker) {
            Some(key) if *key == caller => Ok(()),
            Some(key) => Err(Refusal::NotYours { worker, owner: *key, caller }),
            None => Err(Refusal::UnknownWorker(worker)),
        }
    }

    /// The certificate `worker` registered with, if it is known.
    pub(super) fn key_of(&self, worker: WorkerId) -> Option<CertKey> {
        self.keys.get(&worker).copied()
    }

    /// Whether `worker` is registered.
    pub(super) fn contains(&self, worker: WorkerId) -> bool {
        self.workers.contains_key(&worker)
    }

    /// A worker leaves.
    pub(super) fn remove(&mut self, worker: WorkerId) {
        if self.workers.remove(&worker).is_some() {
            self.removals += 1;
        }
    }

    /// Removals so far: when it has not moved, every worker seen registered still is.
    pub(super) fn removals(&self) -> u64 {
        self.removals
    }

    /// Forget workers silent for `forget_after`.
    pub(super) fn forget_silent(&mut self, now: Instant, forget_after: Duration) {
        if self.next_sweep_opt.is_some_and(|next| now < next) {
            return;
        }
        self.next_sweep_opt = Some(now + forget_after / 10);
        let before = self.workers.len();
        self.workers.retain(|_, worker| now.saturating_duration_since(worker.last_seen) < forget_after);
        self.removals += (before - self.workers.len()) as u64;
    }

    /// Every registered worker.
    pub(super) fn iter(&self) -> impl Iterator<Item = (WorkerId, &Worker)> {
        self.workers.iter().map(|(id, worker)| (*id, worker))
    }

    /// Workers heard from within `ttl`.
    pub(super) fn alive(&self, now: Instant, ttl: Duration) -> Vec<WorkerInfo> {
        self.iter()
            .filter(|(_, worker)| worker.is_alive(now, ttl))
            .filter_map(|(id, worker)| Some(WorkerInfo { id, addr: worker.addr, key: self.key_of(id)? }))
            .collect()
    }
}

impl Worker {
    /// Whether it was heard from within `ttl`.
    pub(super) fn is_alive(&self, now: Instant, ttl: Duration) -> bool {
        now.saturating_duration_since(self.last_seen) < ttl
    }
}
