//! The cache's bookkeeping, pure: which files it holds, their bytes, who pins them, and which
//! to evict to make room. No I/O: the cache ([`super::ShardCache`]) asks it, then acts.
//!
//! The bound: `held` counts every file the cache holds and every download it has reserved room
//! for, and a reservation is granted only if `held + bytes <= capacity` after evicting unpinned
//! files. So the files on disk never exceed the capacity, whatever downloads are in flight.
//!
//! Eviction follows the plan (Belady's rule): the worker tells the table at which turn each
//! file will be read next ([`CacheTable::plan`]: a turn per chunk it was granted, in the order it
//! will make them, and further turns for the shards it expects to be granted after those), and
//! the unpinned file read furthest in the future goes first; files no plan reads go before any
//! planned one, least recently used first. With no plan at all that is LRU.

use std::cmp::Reverse;
use std::collections::{BTreeSet, HashMap};

/// One file of the cache.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Entry {
    bytes: u64,
    /// Chunks that need it now; a pinned file is never evicted.
    pins: u32,
    /// Downloaded and renamed into place (not a reservation any more).
    ready: bool,
    /// When it was last pinned, by the table's clock.
    last_use: u64,
    /// Fetched ahead and not claimed since: a bet on a read that may go to another worker.
    ahead: bool,
}

/// The reads a plan expects of one file (held or not).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Reads {
    /// Its size, to know the room the reads need before it is held.
    bytes: u64,
    /// The turns at which a planned chunk reads it, soonest first.
    turns: BTreeSet<u64>,
}

/// What [`CacheTable::claim`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Claim {
    /// Held, of the expected size, and now pinned.
    Hit,
    /// Room reserved and pinned: download it, then [`CacheTable::downloaded`] (or
    /// [`CacheTable::forget`] if that failed). The named files were evicted to make room:
    /// delete them.
    Download {
        /// Files to delete.
        evicted: Vec<String>,
    },
    /// Being downloaded for another chunk: wait, then claim again.
    InFlight,
    /// No room until pinned files are released: wait, then claim again.
    Full,
    /// A file of another size held under that name (an older object) was dropped from the
    /// table: delete it, then claim again.
    Stale,
}

/// What [`CacheTable::claim_all`] did for a chunk.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Claimed {
    /// Held, and now pinned.
    pub(crate) hits: Vec<String>,
    /// Room reserved and pinned: download each, then [`CacheTable::downloaded`] (or
    /// [`CacheTable::forget`]).
    pub(crate) downloads: Vec<String>,
    /// Being downloaded by another chunk or a fetch ahead: not pinned; claim each again once
    /// its download is done.
    pub(crate) in_flight: Vec<String>,
    /// Files dropped (evicted, or stale) to make room: delete them.
    pub(crate) evicted: Vec<String>,
}

/// The files of a cache of `capacity` bytes.
#[derive(Debug)]
pub(crate) struct CacheTable {
    capacity: u64,
    held: u64,
    clock: u64,
    entries: HashMap<String, Entry>,
    /// The planned reads of each file (held or not).
    planned: HashMap<String, Reads>,
}

impl CacheTable {
    /// An empty cache of `capacity` bytes.
    pub(crate) fn new(capacity: u64) -> Self {
        Self { capacity, held: 0, clock: 0, entries: HashMap::new(), planned: HashMap::new() }
    }

    /// The bound.
    pub(crate) fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Bytes of files held and of downloads reserved.
    pub(crate) fn held(&self) -> u64 {
        self.held
    }

    /// Files held (ready or reserved).
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// A complete file found on disk at start-up, of `bytes`; returns the files to delete to
    /// stay within the bound (the oldest found first: start-up order is the caller's).
    pub(crate) fn adopt(&mut self, name: &str, bytes: u64) -> Vec<String> {
        if bytes > self.capacity {
            return vec![name.to_owned()];
        }
        let evicted = self.evict_for(bytes, false).unwrap_or_default();
        self.clock += 1;
        self.entries.insert(name.to_owned(), Entry { bytes, pins: 0, ready: true, last_use: self.clock, ahead: false });
        self.held += bytes;
        evicted
    }

    /// Pin `name`, which must have `bytes`: a hit, or room for its download.
    pub(crate) fn claim(&mut self, name: &str, bytes: u64) -> Claim {
        self.clock += 1;
        let clock = self.clock;
        if let Some(entry) = self.entries.get_mut(name) {
            if !entry.ready {
                return Claim::InFlight;
            }
            if entry.bytes == bytes {
                entry.pins += 1;
                entry.last_use = clock;
                entry.ahead = false;
                return Claim::Hit;
            }
            // Another size than the manifest's (an older version of the object): not used.
            if entry.pins > 0 {
                return Claim::Full;
            }
            let stale = entry.bytes;
            self.entries.remove(name);
            self.held -= stale;
            return Claim::Stale;
        }
        match self.reserve(name, bytes) {
            Some(evicted) => Claim::Download { evicted },
            None => Claim::Full,
        }
    }

    /// Claim a chunk's `files` (names and sizes, each once) together or not at all: if every
    /// one that is not held or in flight fits (beside the pinned files, the downloads in flight
    /// and those of `files` held), each held one is pinned, each missing one reserved (pinned),
    /// and those in flight are named; else nothing changes (no pin, no eviction) and `None`
    /// says the cache is full until pins are released. So a chunk that meets a full cache holds
    /// nothing while it waits, and a claim that fails evicts nothing.
    pub(crate) fn claim_all(&mut self, files: &[(String, u64)]) -> Option<Claimed> {
        let mut needed = 0_u64;
        for (name, bytes) in files {
            match self.entries.get(name) {
                Some(entry) if !entry.ready || entry.bytes == *bytes => {}
                // A file of another size pinned by another chunk: no room for this one.
                Some(entry) if entry.pins > 0 => return None,
                _ => needed = needed.saturating_add(*bytes),
            }
        }
        let hit = |name: &String, entry: &Entry| entry.ready && files.iter().any(|(file, bytes)| file == name && *bytes == entry.bytes);
        let evictable: u64 = self
            .entries
            .iter()
            .filter(|(name, entry)| entry.ready && entry.pins == 0 && !hit(name, entry))
            .map(|(_, entry)| entry.bytes)
            .sum();
        if self.capacity.saturating_sub(self.held).saturating_add(evictable) < needed {
            return None;
        }
        let mut claimed = Claimed::default();
        // Hits first, so that making room for the downloads never evicts one of them.
        for (name, bytes) in files {
            if self.entries.get(name).is_some_and(|entry| entry.ready && entry.bytes == *bytes) {
                let claim = self.claim(name, *bytes);
                debug_assert_eq!(claim, Claim::Hit);
                claimed.hits.push(name.clone());
            }
        }
        for (name, bytes) in files {
            if claimed.hits.contains(name) {
                continue;
            }
            // At most twice: a stale file is dropped by the first claim.
            for _ in 0..2 {
                match self.claim(name, *bytes) {
                    Claim::InFlight => claimed.in_flight.push(name.clone()),
                    Claim::Download { evicted } => {
                        claimed.evicted.extend(evicted);
                        claimed.downloads.push(name.clone());
                    }
                    Claim::Stale => {
                        claimed.evicted.push(name.clone());
                        continue;
                    }
                    Claim::Hit | Claim::Full => {
                        // Not reached (the room was counted above); undone all the same.
                        self.undo(&claimed);
                        return None;
                    }
                }
                break;
            }
        }
        Some(claimed)
    }

    /// Release what a [`CacheTable::claim_all`] took (its evictions stay done).
    fn undo(&mut self, claimed: &Claimed) {
        for name in &claimed.hits {
            self.unpin(name);
        }
        for name in &claimed.downloads {
            self.forget(name);
        }
    }

    /// Evict to make room for `bytes` and reserve it, pinned; `None` (nothing changed) if the
    /// unpinned files are not enough.
    fn reserve(&mut self, name: &str, bytes: u64) -> Option<Vec<String>> {
        let evicted = self.evict_for(bytes, false)?;
        self.entries.insert(name.to_owned(), Entry { bytes, pins: 1, ready: false, last_use: self.clock, ahead: false });
        self.held += bytes;
        Some(evicted)
    }

    /// A chunk to be made at `turn` reads `name`, of `bytes`: it is evicted after every file
    /// read later (or never), and a fetch ahead of a file read after `turn` leaves it room.
    /// Turns are the caller's order of need; a turn planned twice counts once.
    pub(crate) fn plan(&mut self, name: &str, bytes: u64, turn: u64) {
        let reads = self.planned.entry(name.to_owned()).or_default();
        reads.bytes = bytes;
        reads.turns.insert(turn);
    }

    /// The read of `name` at `turn` happened (its chunk claimed it) or will not (the chunk or
    /// the expectation went away).
    pub(crate) fn unplan(&mut self, name: &str, turn: u64) {
        if let Some(reads) = self.planned.get_mut(name) {
            reads.turns.remove(&turn);
            if reads.turns.is_empty() {
                self.planned.remove(name);
            }
        }
    }

    /// The soonest turn at which a planned chunk reads `name`.
    pub(crate) fn next_use(&self, name: &str) -> Option<u64> {
        self.planned.get(name).and_then(|reads| reads.turns.first().copied())
    }

    /// Evict unpinned files until `bytes` more fit, in the plan's order (those no plan reads
    /// first, least recently used first among them; then the one read furthest away). For a
    /// fetch `ahead`, only files that no plan reads any more and a chunk has read since they
    /// came (what a claim evicts first): a fetch ahead is a bet that this worker reads the file
    /// (its chunk may go to another worker), so it never evicts a file a plan reads, even later
    /// (measured: evicting those, a cache of half the dataset fetched 1.0-1.1x the dataset a
    /// warm epoch with fetch-ahead against 0.8-1.0x without), nor one fetched ahead and not read
    /// yet (that may be another rank's shard whose plan the next grant replaced: evicting it
    /// would download it again; found by review). `None` (nothing evicted) if they would not
    /// make room.
    fn evict_for(&mut self, bytes: u64, ahead: bool) -> Option<Vec<String>> {
        let free = self.capacity.saturating_sub(self.held);
        if bytes <= free {
            return Some(Vec::new());
        }
        let mut candidates: Vec<(Reverse<u64>, u64, String, u64)> = self
            .entries
            .iter()
            .filter(|(name, entry)| entry.ready && entry.pins == 0 && (!ahead || (self.next_use(name).is_none() && !entry.ahead)))
            .map(|(name, entry)| (Reverse(self.next_use(name).unwrap_or(u64::MAX)), entry.last_use, name.clone(), entry.bytes))
            .collect();
        let evictable: u64 = candidates.iter().map(|(_, _, _, bytes)| bytes).sum();
        if free.saturating_add(evictable) < bytes {
            return None;
        }
        candidates.sort();
        let mut evicted = Vec::new();
        let mut room = free;
        for (_, _, name, file_bytes) in candidates {
            if room >= bytes {
                break;
            }
            self.entries.remove(&name);
            self.held -= file_bytes;
            room += file_bytes;
            evicted.push(name);
        }
        Some(evicted)
    }

    /// The room that files other than `except` take by `turn`: pinned ones, downloads in
    /// flight, held files a plan reads at or before it, and planned files not held yet that are
    /// read at or before it (their chunks will claim that room).
    fn needed_by(&self, turn: u64, except: &str) -> u64 {
        let read_by = |name: &str| self.next_use(name).is_some_and(|next| next <= turn);
        let held: u64 = self
            .entries
            .iter()
            .filter(|(name, entry)| *name != except && (entry.pins > 0 || !entry.ready || read_by(name)))
            .map(|(_, entry)| entry.bytes)
            .sum();
        let coming: u64 = self
            .planned
            .iter()
            .filter(|(name, reads)| {
                *name != except && !self.entries.contains_key(*name) && reads.turns.first().is_some_and(|&next| next <= turn)
            })
            .map(|(_, reads)| reads.bytes)
            .sum();
        held.saturating_add(coming)
    }

    /// Reserve room for a download of `name` fetched ahead, unpinned, if it is not held and the
    /// cache can hold it beside every file read sooner (held or still to come: a fetch ahead
    /// never takes the room of a chunk's shards that are needed first). The room is free room,
    /// or that of unpinned files read and planned no more (see [`CacheTable::evict_for`]); a
    /// file no plan reads takes free room only. The files to delete, or `None` if nothing was
    /// reserved.
    pub(crate) fn reserve_ahead(&mut self, name: &str, bytes: u64) -> Option<Vec<String>> {
        if self.entries.contains_key(name) || bytes > self.capacity {
            return None;
        }
        let evicted = match self.next_use(name) {
            Some(turn) if self.needed_by(turn, name).saturating_add(bytes) <= self.capacity => self.evict_for(bytes, true)?,
            Some(_) => return None,
            None if self.held.saturating_add(bytes) <= self.capacity => Vec::new(),
            None => return None,
        };
        self.clock += 1;
        self.entries.insert(name.to_owned(), Entry { bytes, pins: 0, ready: false, last_use: self.clock, ahead: true });
        self.held += bytes;
        Some(evicted)
    }

    /// Whether `name` is held or being downloaded.
    pub(crate) fn contains(&self, name: &str) -> bool {
        self.entries.contains_key(name)
    }

    /// The download of `name` finished and its file is in place.
    pub(crate) fn downloaded(&mut self, name: &str) {
        if let Some(entry) = self.entries.get_mut(name) {
            entry.ready = true;
        }
    }

    /// Drop `name` (a failed download, or a file that did not verify), pinned or not.
    pub(crate) fn forget(&mut self, name: &str) {
        if let Some(entry) = self.entries.remove(name) {
            self.held -= entry.bytes;
        }
    }

    /// The pins of `name` (0 if not held).
    #[cfg(test)]
    pub(crate) fn pins(&self, name: &str) -> u32 {
        self.entries.get(name).map_or(0, |entry| entry.pins)
    }

    /// One pin of `name` released.
    pub(crate) fn unpin(&mut self, name: &str) {
        if let Some(entry) = self.entries.get_mut(name) {
            entry.pins = entry.pins.saturating_sub(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::{CacheTable, Claim};

    #[test]
    fn hits_pin_misses_reserve_and_the_least_recently_used_unpinned_file_goes() {
        let mut table = CacheTable::new(100);
        assert_eq!(table.claim("a", 40), Claim::Download { evicted: vec![] });
        assert_eq!(table.claim("a", 40), Claim::InFlight, "a download in flight is not a hit");
        table.downloaded("a");
        assert_eq!(table.claim("b", 40), Claim::Download { evicted: vec![] });
        table.downloaded("b");
        assert_eq!(table.claim("c", 40), Claim::Full, "a and b are pinned");
        table.unpin("a");
        assert_eq!(table.claim("c", 40), Claim::Download { evicted: vec!["a".to_owned()] });
        assert_eq!(table.held(), 80);
        assert_eq!(table.claim("b", 40), Claim::Hit);
        assert_eq!(table.claim("d", 101), Claim::Full, "never more than the bound");
    }

    #[test]
    fn the_file_read_furthest_away_goes_first_and_unplanned_files_before_it() {
        let mut table = CacheTable::new(90);
        for name in ["a", "b", "c"] {
            assert_eq!(table.claim(name, 30), Claim::Download { evicted: vec![] });
            table.downloaded(name);
            table.unpin(name);
        }
        table.plan("a", 30, 7);
        table.plan("b", 30, 3);
        table.plan("c", 30, 5);
        assert_eq!(table.claim("d", 30), Claim::Download { evicted: vec!["a".to_owned()] }, "a is read last");
        table.downloaded("d");
        table.unpin("d");
        assert_eq!(table.claim("e", 30), Claim::Download { evicted: vec!["d".to_owned()] }, "no plan reads d");
        table.downloaded("e");
        table.unplan("b", 3);
        assert_eq!(table.next_use("b"), None);
        table.plan("c", 30, 9);
        assert_eq!(table.next_use("c"), Some(5), "the soonest turn counts");
        assert_eq!(table.claim("f", 30), Claim::Download { evicted: vec!["b".to_owned()] }, "b is read no more; e is pinned");
    }

    #[test]
    fn fetching_ahead_evicts_no_file_a_plan_reads() {
        let mut table = CacheTable::new(100);
        for (name, turn) in [("a", 2), ("b", 8)] {
            assert_eq!(table.claim(name, 40), Claim::Download { evicted: vec![] });
            table.downloaded(name);
            table.unpin(name);
            table.plan(name, 40, turn);
        }
        table.plan("c", 20, 5);
        assert_eq!(table.reserve_ahead("c", 20), Some(vec![]), "free room");
        table.downloaded("c");
        table.plan("d", 40, 6);
        assert_eq!(table.reserve_ahead("d", 40), None, "b is read after d, but a claim needs no room yet: it stays");
        assert_eq!(table.claim("d", 40), Claim::Download { evicted: vec!["b".to_owned()] }, "a claim evicts by the plan");
        assert_eq!(table.held(), 100);
    }

    /// The benchmark's cache of half the dataset fetched more with fetch-ahead than without:
    /// a fetch ahead could evict only planned files, so it let go the next epoch's first reads
    /// while files already read and planned no more stayed (a claim evicts those first).
    #[test]
    fn fetching_ahead_evicts_only_files_read_and_planned_no_more() {
        let mut table = CacheTable::new(100);
        for name in ["read", "next-epoch"] {
            assert_eq!(table.claim(name, 40), Claim::Download { evicted: vec![] });
            table.downloaded(name);
            table.unpin(name);
        }
        table.plan("next-epoch", 40, 1 << 32);
        table.plan("c", 40, 5);
        assert_eq!(table.reserve_ahead("c", 40), Some(vec!["read".to_owned()]), "read is planned no more");
        table.downloaded("c");
        table.unplan("c", 5);
        table.plan("d", 40, 6);
        assert_eq!(table.reserve_ahead("d", 40), None, "c was fetched ahead and is not read yet; next-epoch is planned");
    }

    /// A fetch ahead leaves the room that files read sooner than it need, held or not: the
    /// shards of a chunk granted before it come first.
    #[test]
    fn fetching_ahead_leaves_room_for_files_read_sooner_that_are_not_held_yet() {
        let mut table = CacheTable::new(100);
        table.plan("granted", 60, 2);
        table.plan("later", 50, 5);
        assert_eq!(table.reserve_ahead("later", 50), None, "the chunk of turn 2 needs 60 of the 100");
        table.plan("small", 40, 3);
        assert_eq!(table.reserve_ahead("small", 40), Some(vec![]), "60 + 40 fit (later is read after small)");
        assert_eq!(table.claim("granted", 60), Claim::Download { evicted: vec![] }, "its room was left free");
        table.downloaded("granted");
        assert_eq!(table.reserve_ahead("later", 50), None, "still needed after the claim: granted is pinned");
    }

    #[test]
    fn fetching_ahead_unplanned_takes_only_free_room_and_is_claimed_after_its_download() {
        let mut table = CacheTable::new(100);
        assert_eq!(table.reserve_ahead("a", 60), Some(vec![]));
        assert_eq!(table.reserve_ahead("b", 60), None, "no eviction for a fetch no plan reads");
        assert_eq!(table.reserve_ahead("a", 10), None, "held already");
        assert_eq!(table.claim("a", 60), Claim::InFlight);
        table.downloaded("a");
        assert_eq!(table.claim("a", 60), Claim::Hit);
        table.unpin("a");
        assert_eq!(table.claim("b", 60), Claim::Download { evicted: vec!["a".to_owned()] });
    }

    #[test]
    fn a_file_of_another_size_is_replaced() {
        let mut table = CacheTable::new(100);
        assert!(table.adopt("a", 30).is_empty());
        assert_eq!(table.claim("a", 50), Claim::Stale);
        assert_eq!(table.held(), 0);
        assert_eq!(table.claim("a", 50), Claim::Download { evicted: vec![] });
        assert_eq!(table.held(), 50);
    }

    fn files(list: &[(&str, u64)]) -> Vec<(String, u64)> {
        list.iter().map(|(name, bytes)| ((*name).to_owned(), *bytes)).collect()
    }

    /// The reverted design's deadlock began with a chunk that met a full cache while it held
    /// pins of part of its shards: a chunk's claim is all or nothing.
    #[test]
    fn a_chunk_claims_all_its_files_or_none_and_a_failed_claim_evicts_nothing() {
        let mut table = CacheTable::new(100);
        for name in ["held", "other"] {
            assert_eq!(table.claim(name, 30), Claim::Download { evicted: vec![] });
            table.downloaded(name);
        }
        table.unpin("other");
        assert_eq!(table.reserve_ahead("coming", 20), Some(vec![]));
        let before = (table.held(), table.len());
        // 30 + 30 + 20 held; "held" pinned, "coming" in flight: 20 free + 30 evictable < 60.
        assert_eq!(table.claim_all(&files(&[("other", 30), ("new", 60)])), None);
        assert_eq!((table.held(), table.len()), before, "nothing reserved, nothing evicted");
        assert_eq!(table.claim("other", 30), Claim::Hit, "other was not evicted");
        table.unpin("other");
        table.unpin("held");
        let claimed = table.claim_all(&files(&[("held", 30), ("coming", 20), ("new", 50)])).expect("room");
        assert_eq!(claimed.hits, vec!["held".to_owned()]);
        assert_eq!(claimed.in_flight, vec!["coming".to_owned()]);
        assert_eq!(claimed.downloads, vec!["new".to_owned()]);
        assert_eq!(claimed.evicted, vec!["other".to_owned()], "the hit is pinned before room is made");
        assert_eq!(table.held(), 100);
        assert_eq!(table.claim_all(&files(&[("held", 40)])), None, "another size of a pinned file");
    }

    proptest! {
        /// A chunk's claim is all or nothing: when it fails nothing changes (no pin, no
        /// eviction), and when it succeeds no pinned file was evicted and the bound holds.
        #[test]
        fn claiming_together_is_all_or_nothing(
            steps in prop::collection::vec((0_u8..4, 0_usize..8, 1_u64..4), 1..150),
        ) {
            let mut table = CacheTable::new(100);
            let mut pinned: Vec<String> = Vec::new();
            for (action, first, count) in steps {
                let chunk: Vec<(String, u64)> =
                    (first..first + count as usize).map(|file| (format!("f{}", file % 8), 10 + (file % 8) as u64 * 5)).collect();
                match action {
                    0 | 1 => {
                        let before = (table.held(), table.len());
                        match table.claim_all(&chunk) {
                            None => prop_assert_eq!((table.held(), table.len()), before),
                            Some(claimed) => {
                                for gone in &claimed.evicted {
                                    prop_assert!(!pinned.contains(gone), "pinned {} evicted", gone);
                                }
                                for name in claimed.downloads.iter().chain(&claimed.in_flight) {
                                    table.downloaded(name);
                                }
                                pinned.extend(claimed.hits);
                                pinned.extend(claimed.downloads);
                            }
                        }
                    }
                    2 => if !pinned.is_empty() {
                        let name = pinned.remove(first % pinned.len());
                        table.unpin(&name);
                    },
                    _ => {
                        let (name, bytes) = &chunk[0];
                        let _ = table.reserve_ahead(name, *bytes);
                    }
                }
                prop_assert!(table.held() <= table.capacity());
            }
        }


        /// Whatever the order of claims, downloads, failures and releases, the bytes held never
        /// pass the bound, and a pinned file is never evicted.
        #[test]
        fn the_bound_holds_and_pinned_files_stay(steps in prop::collection::vec((0_u8..6, 0_usize..8, 1_u64..60), 1..200)) {
            let mut table = CacheTable::new(100);
            let mut pinned: Vec<String> = Vec::new();
            for (action, file, bytes) in steps {
                let name = format!("f{file}");
                let size = 10 + (file as u64) * 7;
                match action {
                    0 => match table.claim(&name, size) {
                        Claim::Hit => pinned.push(name),
                        Claim::Download { evicted } => {
                            for gone in &evicted {
                                prop_assert!(!pinned.contains(gone), "pinned {gone} evicted");
                            }
                            table.downloaded(&name);
                            pinned.push(name);
                        }
                        Claim::InFlight | Claim::Full | Claim::Stale => {}
                    },
                    1 => if let Some(at) = pinned.iter().position(|held| *held == name) {
                        table.unpin(&pinned.remove(at));
                    },
                    2 if bytes % 5 == 0 && !pinned.contains(&name) => table.forget(&name),
                    3 => if let Some(evicted) = table.reserve_ahead(&name, size) {
                        for gone in &evicted {
                            prop_assert!(!pinned.contains(gone), "pinned {gone} evicted ahead");
                        }
                        table.downloaded(&name);
                    },
                    4 => table.plan(&name, size, bytes),
                    5 => table.unplan(&name, bytes),
                    _ => {}
                }
                prop_assert!(table.held() <= table.capacity());
            }
        }

        /// With the future known (each read planned at its turn), evicting the file read
        /// furthest away hits at least as often as least recently used, on any trace of files
        /// of one size (Belady's MIN is optimal there).
        #[test]
        fn the_plan_hits_at_least_as_often_as_lru(trace in prop::collection::vec(0_usize..12, 1..300), files in 1_u64..8) {
            let planned = hits(&trace, files, true);
            let lru = hits(&trace, files, false);
            prop_assert!(planned >= lru, "plan {planned} < LRU {lru}");
        }
    }

    /// Hits over `trace` (file numbers, each read by one chunk in turn) in a cache of `files`
    /// files of one size, evicting by the plan or (with none) least recently used.
    fn hits(trace: &[usize], files: u64, planned: bool) -> usize {
        const SIZE: u64 = 10;
        let mut table = CacheTable::new(files * SIZE);
        let name = |file: usize| format!("f{file}");
        if planned {
            for (turn, &file) in trace.iter().enumerate() {
                table.plan(&name(file), SIZE, turn as u64);
            }
        }
        let mut hits = 0;
        for (turn, &file) in trace.iter().enumerate() {
            let name = name(file);
            table.unplan(&name, turn as u64);
            match table.claim(&name, SIZE) {
                Claim::Hit => hits += 1,
                Claim::Download { .. } => table.downloaded(&name),
                other => panic!("{other:?}: nothing is pinned between reads"),
            }
            table.unpin(&name);
        }
        hits
    }
}
