//! The worker registry: which worker processes are registered, under which id and certificate,
//! when each was last heard from and how fast it makes images.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use stoker_plan::ids::{CertKey, WorkerId};
use stoker_proto::{Decoded, WorkerInfo, WorkerList};
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
    /// What its decode threads had made and spent at the start of the next measure of
    /// `images_per_core_sec` (`None`: from its next heartbeat).
    decoded: Option<Decoded>,
    /// Images a second of one busy decode thread, smoothed over heartbeats (0: not measured).
    pub(super) images_per_core_sec: f64,
}

/// The fewest samples over which a worker's images per core-second is measured: fewer tell
/// more about those samples than about the job's.
const MIN_DECODED_MEASURE: u64 = 32;

/// More samples per CPU-second than any core makes (a microsecond each): such a measure is
/// refused.
const MAX_SAMPLES_PER_CORE_SEC: f64 = 1e6;

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
    /// The alive workers as last listed, while nothing has changed them.
    alive_opt: Option<AliveList>,
}

/// The list of alive workers kept between progress reports: building it looks at every worker,
/// and every report of every rank asks whether it changed (issue 35).
///
/// It stays right until a worker is added or removed, a worker not on it is heard from (it came
/// back), or `stale_at`, when the first worker on it would fall silent if not heard from again
/// (hearing from a listed worker only moves its own silence later). One computed at a later
/// `now` than a request's (requests handled out of order) serves that request too: the list
/// is advice to trainers, stale by at most the reordering.
#[derive(Debug)]
struct AliveList {
    list: WorkerList,
    ttl: Duration,
    stale_at: Instant,
}

impl WorkerRegistry {
    /// The id the next registration gets.
    pub(super) fn next_id(&self) -> u64 {
        self.next_worker
    }

    /// No workers; ids count from `id_base`.
    pub(super) fn new(id_base: u64) -> Self {
        Self { workers: BTreeMap::new(), keys: BTreeMap::new(), next_worker: id_base, next_sweep_opt: None, removals: 0, alive_opt: None }
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
        let worker = Worker {
            addr,
            process,
            threads,
            last_seen: now,
            images: 0,
            images_per_sec: 0.0,
            decoded: Some(Decoded::default()),
            images_per_core_sec: 0.0,
        };
        self.workers.insert(id, worker);
        self.keys.insert(id, key);
        self.alive_opt = None;
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
        self.heard_from(worker);
        Ok(())
    }

    /// `worker` was heard from: the alive list no longer holds if it is not on it.
    fn heard_from(&mut self, worker: WorkerId) {
        if self.alive_opt.as_ref().is_some_and(|alive| alive.list.workers.binary_search_by_key(&worker, |info| info.id).is_err()) {
            self.alive_opt = None;
        }
    }

    /// `worker`'s heartbeat at `now`, reporting `images` made and what its decode threads
    /// made and spent (`decoded`), in total.
    pub(super) fn heartbeat(&mut self, worker: WorkerId, images: u64, decoded: Decoded, now: Instant) -> Result<(), Refusal> {
        let entry = self.workers.get_mut(&worker).ok_or(Refusal::UnknownWorker(worker))?;
        let elapsed = now.saturating_duration_since(entry.last_seen).as_secs_f64();
        if elapsed > 0.0 {
            entry.images_per_sec = images.saturating_sub(entry.images) as f64 / elapsed;
        }
        match entry.decoded {
            Some(before) if decoded.samples >= before.samples && decoded.cpu_seconds >= before.cpu_seconds => {
                let (samples, seconds) = (decoded.samples - before.samples, decoded.cpu_seconds - before.cpu_seconds);
                // A measure faster than any core makes samples is not one (a worker's own
                // figures: a hostile one must not drive every job's estimate).
                let plausible = seconds > 0.0 && samples as f64 / seconds <= MAX_SAMPLES_PER_CORE_SEC;
                if samples >= MIN_DECODED_MEASURE && plausible {
                    let measured = samples as f64 / seconds;
                    entry.images_per_core_sec =
                        if entry.images_per_core_sec > 0.0 { 0.7 * entry.images_per_core_sec + 0.3 * measured } else { measured };
                    entry.decoded = Some(decoded);
                }
            }
            // Not a total this worker could have reported after the last one: measure again
            // from this one (from the next, if it is not a number).
            _ => entry.decoded = decoded.cpu_seconds.is_finite().then_some(decoded),
        }
        entry.images = images;
        entry.last_seen = now;
        self.heard_from(worker);
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
            self.alive_opt = None;
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
        if self.workers.len() < before {
            self.removals += (before - self.workers.len()) as u64;
            self.alive_opt = None;
        }
    }

    /// Every registered worker.
    pub(super) fn iter(&self) -> impl Iterator<Item = (WorkerId, &Worker)> {
        self.workers.iter().map(|(id, worker)| (*id, worker))
    }

    /// Workers heard from within `ttl`, by id, with the list's version: kept from the last
    /// call while it holds ([`AliveList`]), so that asking costs O(1), not O(workers).
    pub(super) fn alive(&mut self, now: Instant, ttl: Duration) -> &WorkerList {
        let holds = self.alive_opt.as_ref().is_some_and(|alive| alive.ttl == ttl && now < alive.stale_at);
        let alive = match self.alive_opt.take() {
            Some(alive) if holds => alive,
            _ => self.list_alive(now, ttl),
        };
        &self.alive_opt.insert(alive).list
    }

    fn list_alive(&self, now: Instant, ttl: Duration) -> AliveList {
        let listed: Vec<(WorkerInfo, Instant)> = self
            .iter()
            .filter(|(_, worker)| worker.is_alive(now, ttl))
            .filter_map(|(id, worker)| Some((WorkerInfo { id, addr: worker.addr, key: self.key_of(id)? }, worker.last_seen)))
            .collect();
        // No listed worker falls silent before the first of them; with none listed, the list
        // holds until a worker is added or heard from.
        let stale_at = listed.iter().map(|(_, last_seen)| *last_seen + ttl).min().unwrap_or(now + ttl).max(now);
        let workers: Vec<WorkerInfo> = listed.into_iter().map(|(info, _)| info).collect();
        AliveList { list: WorkerList { version: version_of(&workers), workers }, ttl, stale_at }
    }

    /// How many workers were heard from within `ttl` (for figures; looks at every worker).
    pub(super) fn alive_count(&self, now: Instant, ttl: Duration) -> usize {
        self.workers.values().filter(|worker| worker.is_alive(now, ttl)).count()
    }

    /// Decode threads of the workers heard from within `ttl`, and the images a second one of
    /// their cores makes (the median by threads over the workers that measured it, so that no
    /// one worker's figures, an honest outlier's or a hostile one's, decide it; `None` when
    /// none has). Looks at every worker: for status and figures, not per request.
    pub(super) fn cores(&self, now: Instant, ttl: Duration) -> (u32, Option<f64>) {
        let alive = || self.workers.values().filter(|worker| worker.is_alive(now, ttl));
        let threads = alive().map(|worker| worker.threads).fold(0u32, u32::saturating_add);
        let mut measured: Vec<(f64, u64)> = alive()
            .filter(|worker| worker.images_per_core_sec > 0.0)
            .map(|worker| (worker.images_per_core_sec, u64::from(worker.threads.max(1))))
            .collect();
        measured.sort_by(|left, right| left.0.total_cmp(&right.0));
        let half = measured.iter().map(|(_, weight)| weight).sum::<u64>().div_ceil(2);
        let mut seen = 0;
        let median = measured.iter().find(|(_, weight)| {
            seen += weight;
            seen >= half
        });
        (threads, median.map(|(rate, _)| *rate))
    }
}

/// The version of a worker list: the first 8 bytes of the SHA-256 of its ids, addresses and
/// certificates, never 0 (0 names no list). Any coordinator makes the same one for the same
/// workers, so trainers that hold the list are not sent it again after a leader change; and a
/// worker, which chooses the address it advertises, cannot choose one that makes a new list
/// look like the list trainers hold (a mixing function that can be run backwards would let it:
/// trainers would keep a revoked worker's connection and never learn of new workers).
fn version_of(workers: &[WorkerInfo]) -> u64 {
    let mut context = ring::digest::Context::new(&ring::digest::SHA256);
    context.update(&(workers.len() as u64).to_le_bytes());
    for worker in workers {
        let ip = match worker.addr.ip() {
            std::net::IpAddr::V4(ip) => ip.to_ipv6_mapped(),
            std::net::IpAddr::V6(ip) => ip,
        };
        context.update(&[u8::from(worker.addr.is_ipv4())]);
        context.update(&worker.id.0.to_le_bytes());
        context.update(&ip.octets());
        context.update(&worker.addr.port().to_le_bytes());
        context.update(&worker.key.0);
    }
    let digest = context.finish();
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest.as_ref()[..8]);
    u64::from_le_bytes(first).max(1)
}

impl Worker {
    /// Whether it was heard from within `ttl`.
    pub(super) fn is_alive(&self, now: Instant, ttl: Duration) -> bool {
        now.saturating_duration_since(self.last_seen) < ttl
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    const TTL: Duration = Duration::from_secs(3);

    fn addr(port: u16) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], port))
    }

    fn process(instance: u64) -> WorkerProcess {
        WorkerProcess { instance, attempt: 1 }
    }

    /// What the registry does to its workers, `advance_ms` after the one before.
    #[derive(Clone, Debug)]
    enum Op {
        Register,
        Heartbeat(usize),
        Seen(usize),
        Remove(usize),
        Forget,
    }

    fn op() -> impl Strategy<Value = (Op, u64)> {
        let op = prop_oneof![
            Just(Op::Register),
            (0..8usize).prop_map(Op::Heartbeat),
            (0..8usize).prop_map(Op::Seen),
            (0..8usize).prop_map(Op::Remove),
            Just(Op::Forget),
        ];
        (op, 0..2_000u64)
    }

    proptest! {
        /// The kept list is always the list made afresh: whatever registers, beats, falls
        /// silent, comes back or leaves, and whenever it is asked.
        #[test]
        fn the_kept_alive_list_is_the_list_made_afresh(ops in prop::collection::vec(op(), 1..80)) {
            let start = Instant::now();
            let mut registry = WorkerRegistry::new(1);
            let mut now = start;
            let mut ids = Vec::new();
            for (step, (op, advance_ms)) in ops.into_iter().enumerate() {
                now += Duration::from_millis(advance_ms);
                match op {
                    Op::Register => ids.push(registry.insert(addr(7000 + step as u16), 1, process(step as u64), CertKey([step as u8; 32]), now)),
                    Op::Heartbeat(at) => if let Some(id) = ids.get(at) { let _ = registry.heartbeat(*id, 0, Decoded::default(), now); },
                    Op::Seen(at) => if let Some(id) = ids.get(at) { let _ = registry.seen(*id, now); },
                    Op::Remove(at) => if let Some(id) = ids.get(at) { registry.remove(*id); },
                    Op::Forget => registry.forget_silent(now, TTL * 2),
                }
                let fresh = registry.list_alive(now, TTL).list;
                prop_assert_eq!(registry.alive(now, TTL), &fresh);
                prop_assert_eq!(registry.alive_count(now, TTL), fresh.workers.len());
            }
        }
    }

    #[test]
    fn the_version_names_the_workers_listed_and_only_them() {
        let start = Instant::now();
        let mut registry = WorkerRegistry::new(1);
        let empty = registry.alive(start, TTL).version;
        let first = registry.insert(addr(7001), 1, process(1), CertKey([1; 32]), start);
        let one = registry.alive(start, TTL).version;
        assert_ne!(one, empty);
        assert_ne!(one, 0, "0 names no list");
        let _ = registry.heartbeat(first, 10, Decoded::default(), start + Duration::from_secs(1));
        assert_eq!(registry.alive(start + Duration::from_secs(2), TTL).version, one, "a beat of a listed worker changes nothing");
        let second = registry.insert(addr(7002), 1, process(2), CertKey([2; 32]), start + Duration::from_secs(2));
        let two = registry.alive(start + Duration::from_secs(2), TTL).version;
        assert_ne!(two, one);
        // The first falls silent: the list is the second alone, and says so.
        let later = start + Duration::from_millis(4_500);
        let listed = registry.alive(later, TTL);
        assert_eq!(listed.workers.iter().map(|info| info.id).collect::<Vec<_>>(), vec![second]);
        assert!(![empty, one, two].contains(&listed.version));
        // It comes back before the second would fall silent: listed again, the version as before.
        let _ = registry.heartbeat(first, 20, Decoded::default(), later);
        assert_eq!(registry.alive(later, TTL).version, two);
        // Another coordinator (a new leader) with the same workers names the same version.
        let mut other = WorkerRegistry::new(1);
        other.insert(addr(7001), 1, process(1), CertKey([1; 32]), later);
        other.insert(addr(7002), 1, process(2), CertKey([2; 32]), later);
        assert_eq!(other.alive(later, TTL).version, two);
        registry.remove(second);
        assert_eq!(registry.alive(later, TTL).version, one);
    }

    #[test]
    fn a_core_makes_what_the_decode_times_of_the_heartbeats_say() {
        let start = Instant::now();
        let mut registry = WorkerRegistry::new(1);
        let timed = registry.insert(addr(7001), 4, process(1), CertKey([1; 32]), start);
        let untimed = registry.insert(addr(7002), 2, process(2), CertKey([2; 32]), start);
        assert_eq!(registry.cores(start, TTL), (6, None), "nothing measured yet");
        let at = |seconds: u64| start + Duration::from_secs(seconds);
        let decoded = |samples: u64, cpu_seconds: f64| Decoded { samples, cpu_seconds };
        registry.heartbeat(timed, 10, decoded(10, 0.05), at(1)).expect("known");
        assert_eq!(registry.cores(at(1), TTL), (6, None), "ten samples are too few to tell");
        registry.heartbeat(timed, 300, decoded(400, 2.0), at(2)).expect("known");
        registry.heartbeat(untimed, 1_000, Decoded::default(), at(2)).expect("known");
        assert_eq!(registry.cores(at(2), TTL), (6, Some(200.0)), "400 samples in 2 busy seconds; the untimed worker tells nothing");
        // Smoothed: a measure of 100 a second moves it 30% of the way.
        registry.heartbeat(timed, 500, decoded(600, 4.0), at(3)).expect("known");
        let (_, per_core) = registry.cores(at(3), TTL);
        assert!(per_core.is_some_and(|rate| (rate - 170.0).abs() < 1e-9), "{per_core:?}");
        // A total that goes back, or is not a number, starts the measure again.
        registry.heartbeat(timed, 600, decoded(700, f64::NAN), at(4)).expect("known");
        registry.heartbeat(timed, 700, decoded(800, 1.0), at(5)).expect("known");
        registry.heartbeat(timed, 800, decoded(100, 9.0), at(6)).expect("known");
        let (_, kept) = registry.cores(at(6), TTL);
        assert_eq!(kept, per_core);
        // A measure no core could make is refused.
        registry.heartbeat(timed, 900, decoded(10_100, 9.000_001), at(7)).expect("known");
        assert_eq!(registry.cores(at(7), TTL).1, per_core);
        // The rate is the median by threads: one worker's wild figure does not move it.
        let wild = registry.insert(addr(7003), 1, process(3), CertKey([3; 32]), at(7));
        registry.heartbeat(wild, 0, decoded(1_000, 0.01), at(8)).expect("known");
        registry.heartbeat(timed, 1_000, decoded(10_200, 10.0), at(8)).expect("known");
        let (threads, median) = registry.cores(at(8), TTL);
        assert_eq!(threads, 5, "the untimed worker fell silent at 5 s");
        assert!(median.is_some_and(|rate| rate < 10_000.0), "{median:?}: the 4-thread worker's rate, not the 1-thread one's 100,000");
        // Silent workers count neither their threads nor their rate.
        assert_eq!(registry.cores(at(8) + TTL, TTL), (0, None));
    }
}
