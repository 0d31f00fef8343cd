//! The cache's bookkeeping, pure: which files it holds, their bytes, who pins them, and which
//! to evict to make room. No I/O: the cache ([`super::ShardCache`]) asks it, then acts.
//!
//! The bound: `held` counts every file the cache holds and every download it has reserved room
//! for, and a reservation is granted only if `held + bytes <= capacity` after evicting unpinned
//! files. So the files on disk never exceed the capacity, whatever downloads are in flight.

use std::collections::HashMap;

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

/// The files of a cache of `capacity` bytes.
#[derive(Debug)]
pub(crate) struct CacheTable {
    capacity: u64,
    held: u64,
    clock: u64,
    entries: HashMap<String, Entry>,
}

impl CacheTable {
    /// An empty cache of `capacity` bytes.
    pub(crate) fn new(capacity: u64) -> Self {
        Self { capacity, held: 0, clock: 0, entries: HashMap::new() }
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
        let evicted = self.evict_for(bytes).unwrap_or_default();
        self.clock += 1;
        self.entries.insert(name.to_owned(), Entry { bytes, pins: 0, ready: true, last_use: self.clock });
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

    /// Evict to make room for `bytes` and reserve it, pinned; `None` (nothing changed) if the
    /// unpinned files are not enough.
    fn reserve(&mut self, name: &str, bytes: u64) -> Option<Vec<String>> {
        let evicted = self.evict_for(bytes)?;
        self.entries.insert(name.to_owned(), Entry { bytes, pins: 1, ready: false, last_use: self.clock });
        self.held += bytes;
        Some(evicted)
    }

    /// Evict unpinned files, least recently used first, until `bytes` more fit; `None`
    /// (nothing evicted) if they would not.
    fn evict_for(&mut self, bytes: u64) -> Option<Vec<String>> {
        let free = self.capacity.saturating_sub(self.held);
        if bytes <= free {
            return Some(Vec::new());
        }
        let mut candidates: Vec<(u64, String, u64)> = self
            .entries
            .iter()
            .filter(|(_, entry)| entry.ready && entry.pins == 0)
            .map(|(name, entry)| (entry.last_use, name.clone(), entry.bytes))
            .collect();
        let evictable: u64 = candidates.iter().map(|(_, _, bytes)| bytes).sum();
        if free.saturating_add(evictable) < bytes {
            return None;
        }
        candidates.sort();
        let mut evicted = Vec::new();
        let mut room = free;
        for (_, name, file_bytes) in candidates {
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
    fn a_file_of_another_size_is_replaced() {
        let mut table = CacheTable::new(100);
        assert!(table.adopt("a", 30).is_empty());
        assert_eq!(table.claim("a", 50), Claim::Stale);
        assert_eq!(table.held(), 0);
        assert_eq!(table.claim("a", 50), Claim::Download { evicted: vec![] });
        assert_eq!(table.held(), 50);
    }

    proptest! {
        /// Whatever the order of claims, downloads, failures and releases, the bytes held never
        /// pass the bound, and a pinned file is never evicted.
        #[test]
        fn the_bound_holds_and_pinned_files_stay(steps in prop::collection::vec((0_u8..4, 0_usize..8, 1_u64..60), 1..200)) {
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
                    _ => {}
                }
                prop_assert!(table.held() <= table.capacity());
            }
        }
    }
}
