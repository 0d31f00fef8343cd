//! How a chunk claims its shards in the cache, and why that cannot deadlock.
//!
//! * **All or none, in a turn, without waiting in it.** A chunk claims all its shards at once
//!   ([`claim_all`](super::table::CacheTable::claim_all)) in a claiming turn (one chunk at a time), and the turn is held
//!   over that claim and the deletes it decides only: nothing is awaited while it is held.
//! * **Back-off.** If the shards do not fit beside the pinned files, nothing is pinned,
//!   reserved or evicted: the chunk gives the turn back and waits, holding nothing, for the next
//!   change, then claims again from scratch. A chunk that already holds pins (it waits for a
//!   shard another is downloading, and that download failed) and then finds no room releases
//!   all its pins first.
//! * **Others' downloads are waited for outside the turn.** A shard another chunk or a fetch
//!   ahead is downloading is claimed again, each time in a turn of its own, after the chunk's
//!   own downloads are done; the next chunk claims (and starts its downloads) meanwhile. A
//!   download waits on nothing in the cache (its room is reserved), so a chunk that holds pins
//!   while it waits for one waits for the network only, within the store's timeouts.
//! * **No lost wake-up.** Every change that can give room or a shard bumps a generation while
//!   the table is locked ([`ShardCache::announce`]); a chunk reads the generation in the same
//!   lock as its failed claim, and waits for a later one.
//!
//! So a chunk waits either for room holding nothing, or for a download holding pins; downloads
//! wait for nobody; the turn and the table's lock are never held across a wait: no cycle of
//! waits can form. [`ROOM_PATIENCE`](super::ROOM_PATIENCE) bounds a chunk's waits in all (then
//! it fails as [`CacheError::Busy`] and is granted again).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use futures_util::StreamExt;
use tracing::debug;

use super::table::Claimed;
use super::{CacheError, PARALLEL_DOWNLOADS, Pins, ShardCache};

/// A shard of a chunk, as the cache knows it.
#[derive(Clone, Debug)]
pub(super) struct ShardFile {
    /// Its object.
    pub(super) uri: String,
    /// Its file in the cache ([`super::file_name`]).
    pub(super) name: String,
    /// Its size (the manifest's).
    pub(super) bytes: u64,
}

impl ShardCache {
    /// Claim `files` for a chunk: every one held, pinned and ready (downloaded here or by
    /// others) when this returns, or an error (a download failed, or no room or shard came by
    /// `deadline`). Each try that finds no room waits for a change first, so the loop ends by
    /// `deadline`.
    pub(super) async fn claim_files(self: &Arc<Self>, files: &[ShardFile], deadline: Instant) -> Result<Pins, CacheError> {
        loop {
            if let Some(pins) = self.try_claim(files, deadline).await? {
                return Ok(pins);
            }
        }
    }

    /// One try: claim `files` together; download those missing; wait (outside the turn) for
    /// those others download. `None`: the chunk found no room, released what it held, and
    /// waited for a change: claim again from scratch.
    async fn try_claim(self: &Arc<Self>, files: &[ShardFile], deadline: Instant) -> Result<Option<Pins>, CacheError> {
        let list: Vec<(String, u64)> = files.iter().map(|file| (file.name.clone(), file.bytes)).collect();
        let (claimed_opt, seen) = self.claim_in_turn(&list).await;
        let Some(claimed) = claimed_opt else {
            self.back_off(seen, deadline).await?;
            return Ok(None);
        };
        self.metrics.hits.inc_by(claimed.hits.len() as u64);
        self.metrics.misses.inc_by(claimed.downloads.len() as u64);
        let mut pins = Pins { cache: Arc::clone(self), names: claimed.hits };
        pins.names.extend(claimed.downloads.iter().cloned());
        self.metrics.bytes.set(self.held() as i64);
        let named = |names: &[String]| -> Vec<ShardFile> { files.iter().filter(|file| names.contains(&file.name)).cloned().collect() };
        self.download_all(named(&claimed.downloads)).await?;
        for file in named(&claimed.in_flight) {
            if !self.await_in_flight(&mut pins, &file, deadline).await? {
                return Ok(None);
            }
        }
        Ok(Some(pins))
    }

    /// Claim `list` together in a claiming turn, deleting the files that evicts in it; with the
    /// generation seen in the same lock of the table as the claim.
    async fn claim_in_turn(&self, list: &[(String, u64)]) -> (Option<Claimed>, u64) {
        let _turn = self.claiming.lock().await;
        let (claimed_opt, seen) = {
            let mut table = self.table.lock();
            let claimed_opt = table.claim_all(list);
            (claimed_opt, *self.released_tx.borrow())
        };
        if let Some(claimed) = &claimed_opt {
            self.delete(&claimed.evicted);
        }
        (claimed_opt, seen)
    }

    /// No room: wait, holding nothing and out of the turn, for a change after generation `seen`.
    async fn back_off(&self, seen: u64, deadline: Instant) -> Result<(), CacheError> {
        let backoffs = self.backoffs.fetch_add(1, Ordering::Relaxed) + 1;
        debug!(backoffs, "a chunk found no room in the shard cache: it holds nothing while it waits");
        self.wait_for_change(seen, deadline).await
    }

    /// Wait until the generation passes `seen`, or fail as [`CacheError::Busy`] at `deadline`.
    async fn wait_for_change(&self, seen: u64, deadline: Instant) -> Result<(), CacheError> {
        let mut changes = self.released_tx.subscribe();
        let busy = CacheError::Busy { seconds: self.patience.as_secs() };
        match tokio::time::timeout_at(deadline.into(), changes.wait_for(|&now| now > seen)).await {
            Ok(Ok(_)) => Ok(()),
            // The sender lives as long as the cache: not reached.
            Ok(Err(_)) | Err(_) => Err(busy),
        }
    }

    /// Download `files` (their room reserved and pinned), a few at once; the first failure,
    /// once all are done. Each download, done or failed, wakes the chunks waiting for it.
    async fn download_all(&self, files: Vec<ShardFile>) -> Result<(), CacheError> {
        if files.is_empty() {
            return Ok(());
        }
        let mut results = futures_util::stream::iter(files)
            .map(|file| async move {
                let result = self.download(&file.uri, &file.name, file.bytes).await;
                (file.name, result)
            })
            .buffer_unordered(PARALLEL_DOWNLOADS);
        let mut failure_opt = None;
        while let Some((name, result)) = results.next().await {
            let mut table = self.table.lock();
            match result {
                Ok(()) => table.downloaded(&name),
                Err(error) => {
                    table.forget(&name);
                    failure_opt.get_or_insert(error);
                }
            }
            // Chunks waiting for this download look again now, not once all are done.
            self.announce(&table);
        }
        self.metrics.bytes.set(self.held() as i64);
        failure_opt.map_or(Ok(()), Err)
    }

    /// Pin `file`, which another chunk or a fetch ahead was downloading when the chunk claimed:
    /// claimed again in a turn of its own each time it may have changed. Downloaded here if
    /// that download failed. `false`: no room for that download; every pin the chunk held was
    /// released (claim again from scratch).
    async fn await_in_flight(&self, pins: &mut Pins, file: &ShardFile, deadline: Instant) -> Result<bool, CacheError> {
        let list = [(file.name.clone(), file.bytes)];
        loop {
            let (claimed_opt, seen) = self.claim_in_turn(&list).await;
            let Some(claimed) = claimed_opt else {
                // Claimed again from scratch at once: that claim, all or nothing, finds whether
                // the room these pins held is enough, and waits holding nothing if not.
                pins.release();
                return Ok(false);
            };
            if !claimed.hits.is_empty() {
                self.metrics.hits.inc();
                pins.names.push(file.name.clone());
                return Ok(true);
            }
            if !claimed.downloads.is_empty() {
                self.metrics.misses.inc();
                pins.names.push(file.name.clone());
                self.download_all(vec![file.clone()]).await?;
                return Ok(true);
            }
            self.wait_for_change(seen, deadline).await?;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::Ordering;
    use std::time::{Duration, Instant};

    use stoker_store::{ObjectRoots, ObjectStores, StoreConfig};

    use super::ShardFile;
    use crate::cache::{CacheError, Pins, ShardCache};
    use crate::metrics::WorkerMetrics;

    /// Far below the cache's 120 s: a deadlock fails a test instead of hanging it.
    const BOUND: Duration = Duration::from_secs(5);

    fn cache(dir: &tempfile::TempDir, capacity: u64) -> Arc<ShardCache> {
        let stores = Arc::new(ObjectStores::new(StoreConfig::default(), ObjectRoots::anywhere()));
        let opened = ShardCache::open(dir.path(), capacity, stores, WorkerMetrics::unobserved().cache);
        let mut cache = Arc::into_inner(opened.expect("a new cache in a temporary folder")).expect("one owner");
        cache.patience = 2 * BOUND;
        Arc::new(cache)
    }

    /// A shard whose download fails at once, without any request: these tests need no store
    /// (a chunk that reaches its download has been given room).
    fn shard(name: &str, bytes: u64) -> ShardFile {
        ShardFile { uri: format!("not-an-object-uri/{name}"), name: name.to_owned(), bytes }
    }

    /// Poll `done` every 5 ms, at most `BOUND`; whether it came true.
    async fn eventually(mut done: impl FnMut() -> bool) -> bool {
        for _ in 0..BOUND.as_millis() / 5 {
            if done() {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        done()
    }

    fn pins_of(cache: &ShardCache, name: &str) -> u32 {
        cache.table.lock().pins(name)
    }

    /// The finished download of `name` (as a fetch ahead's would end), announced.
    fn downloaded(cache: &ShardCache, name: &str) {
        let mut table = cache.table.lock();
        table.downloaded(name);
        cache.announce(&table);
    }

    /// The reverted design's deadlock (review of 33b250d): chunk A holds the pin of `a` and
    /// waits for `s`, which a fetch ahead downloads; chunk C finds no room (only A's pins
    /// would give it: it needs more than the free room and `s` together). C used to wait for room holding the claiming turn, and A, its `s` in,
    /// waited for the turn to pin it: both stuck for the 120 s patience. Now C holds nothing
    /// while it waits, A pins `s` and goes on, and C gets its room once A's pins go.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_chunk_waiting_for_room_does_not_stop_one_waiting_for_a_download() {
        let dir = tempfile::tempdir().expect("temporary folder");
        let cache = cache(&dir, 100);
        {
            let mut table = cache.table.lock();
            assert!(table.adopt("a", 40).is_empty());
            assert_eq!(table.reserve_ahead("s", 40), Some(vec![]), "a fetch ahead of s");
        }
        let deadline = Instant::now() + cache.patience;
        let chunk_a = tokio::spawn({
            let cache = Arc::clone(&cache);
            async move { cache.claim_files(&[shard("a", 40), shard("s", 40)], deadline).await }
        });
        assert!(eventually(|| pins_of(&cache, "a") == 1).await, "A pins a and waits for s");
        let chunk_c = tokio::spawn({
            let cache = Arc::clone(&cache);
            async move { cache.claim_files(&[shard("c", 70)], deadline).await }
        });
        assert!(eventually(|| cache.backoffs.load(Ordering::Relaxed) >= 1).await, "C finds no room (20 free, a pinned)");
        assert_eq!(pins_of(&cache, "c"), 0, "C holds nothing while it waits");
        downloaded(&cache, "s");
        let pins: Pins = tokio::time::timeout(BOUND, chunk_a)
            .await
            .expect("A pins s while C waits for room (the reverted design waited here for 120 s)")
            .expect("A's task")
            .expect("A's shards");
        assert_eq!((pins_of(&cache, "a"), pins_of(&cache, "s")), (1, 1));
        assert!(!chunk_c.is_finished(), "C still has no room");
        drop(pins);
        let claimed = tokio::time::timeout(BOUND, chunk_c).await.expect("C is woken by A's release").expect("C's task");
        assert!(
            matches!(claimed, Err(CacheError::Store(_))),
            "C was given room and went on to download c (this test's URIs fail at once): {claimed:?}"
        );
        assert!(cache.held() <= 100);
    }

    /// A chunk that holds pins and must download a shard whose download by another failed,
    /// with no room for it, lets its pins go while it waits (it never waits for room holding
    /// them), and claims again once room comes.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_chunk_that_finds_no_room_after_claiming_releases_its_pins_and_claims_again() {
        let dir = tempfile::tempdir().expect("temporary folder");
        let cache = cache(&dir, 100);
        {
            let mut table = cache.table.lock();
            assert!(table.adopt("a", 40).is_empty());
            assert_eq!(table.reserve_ahead("s", 40), Some(vec![]));
        }
        let deadline = Instant::now() + cache.patience;
        let chunk_a = tokio::spawn({
            let cache = Arc::clone(&cache);
            async move { cache.claim_files(&[shard("a", 40), shard("s", 40)], deadline).await }
        });
        assert!(eventually(|| pins_of(&cache, "a") == 1).await);
        {
            // The fetch ahead of s fails, and another chunk takes the room s had first.
            let mut table = cache.table.lock();
            table.forget("s");
            assert!(matches!(table.claim("other", 60), super::super::table::Claim::Download { .. }));
            cache.announce(&table);
        }
        assert!(eventually(|| pins_of(&cache, "a") == 0).await, "A lets a go: no room to download s");
        assert!(!chunk_a.is_finished(), "A waits, holding nothing");
        {
            let mut table = cache.table.lock();
            table.downloaded("other");
            table.unpin("other");
            cache.announce(&table);
        }
        let claimed = tokio::time::timeout(BOUND, chunk_a).await.expect("A is woken by the release").expect("A's task");
        assert!(matches!(claimed, Err(CacheError::Store(_))), "A was given room for s and downloaded it: {claimed:?}");
        assert!(cache.held() <= 100);
    }

    /// A release that falls between a chunk's failed claim and its wait is not lost: the chunk
    /// waits for a change after the generation it saw with the claim, not after the one at the
    /// start of its wait. And with no change it is not woken (it waits until its deadline).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_release_between_a_failed_claim_and_the_wait_wakes_the_chunk() {
        let dir = tempfile::tempdir().expect("temporary folder");
        let cache = cache(&dir, 100);
        assert!(cache.table.lock().adopt("held", 100).is_empty());
        let holder = {
            let mut table = cache.table.lock();
            assert_eq!(table.claim("held", 100), super::super::table::Claim::Hit);
            Pins { cache: Arc::clone(&cache), names: vec!["held".to_owned()] }
        };
        let list = [("c".to_owned(), 30)];
        let (claimed, seen) = cache.claim_in_turn(&list).await;
        assert_eq!(claimed, None, "held is pinned: no room");
        let short = Instant::now() + Duration::from_millis(50);
        assert!(matches!(cache.back_off(seen, short).await, Err(CacheError::Busy { .. })), "nothing changed: no wake-up");
        drop(holder);
        let woken = tokio::time::timeout(BOUND, cache.back_off(seen, Instant::now() + 2 * BOUND)).await;
        assert!(matches!(woken, Ok(Ok(()))), "the release after the claim wakes the chunk: {woken:?}");
        let (claimed, _) = cache.claim_in_turn(&list).await;
        assert_eq!(claimed.map(|claimed| claimed.downloads), Some(vec!["c".to_owned()]));
    }

    /// No lost wake-up, and no wake-up by a chunk's own back-off: chunks that find no room
    /// are woken by every release, however it falls against their claims, and do not spin
    /// while nothing changes.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn every_release_wakes_the_chunks_waiting_for_room_and_nothing_else_does() {
        let dir = tempfile::tempdir().expect("temporary folder");
        let cache = cache(&dir, 100);
        for round in 0..50_u32 {
            let holder = {
                let mut table = cache.table.lock();
                table.forget("held");
                assert!(table.adopt("held", 100).is_empty(), "the waiters' failed downloads left nothing");
                assert_eq!(table.claim("held", 100), super::super::table::Claim::Hit);
                Pins { cache: Arc::clone(&cache), names: vec!["held".to_owned()] }
            };
            let before = cache.backoffs.load(Ordering::Relaxed);
            let deadline = Instant::now() + cache.patience;
            let waiters: Vec<_> = (0..3)
                .map(|waiter| {
                    let cache = Arc::clone(&cache);
                    tokio::spawn(async move { cache.claim_files(&[shard(&format!("w{round}-{waiter}"), 30)], deadline).await })
                })
                .collect();
            // The release falls anywhere from before the waiters' first claims to after.
            for _ in 0..round % 4 {
                tokio::task::yield_now().await;
            }
            if round % 2 == 0 {
                assert!(eventually(|| cache.backoffs.load(Ordering::Relaxed) >= before + 3).await);
                tokio::time::sleep(Duration::from_millis(20)).await;
                assert_eq!(cache.backoffs.load(Ordering::Relaxed), before + 3, "nothing changed: nobody tries again");
            }
            drop(holder);
            for waiter in waiters {
                let claimed = tokio::time::timeout(BOUND, waiter).await.expect("woken by the release").expect("task");
                assert!(matches!(claimed, Err(CacheError::Store(_))), "given room: {claimed:?}");
            }
            assert!(cache.held() <= 100);
        }
    }
}
