//! The worker's shard cache (`--cache-dir`, `--cache-size`, issue 30): whole shards of datasets
//! in an object store, downloaded on demand into a folder of this host and mapped from there,
//! under a hard byte bound.
//!
//! * A chunk's shards are claimed together, all or none, before any of its batches is queued
//!   ([`ShardCache::acquire`]), one chunk at a time: a chunk that finds no room holds nothing
//!   while it waits, and one waits for shards others are downloading after its claiming turn,
//!   not in it (the protocol, and why it cannot deadlock: `claim.rs`). The pins are released
//!   when the chunk's batches are made ([`Pins`]); only unpinned files are evicted, and
//!   unmapped from their datasets.
//! * Eviction follows the plan: each chunk granted gets a turn ([`ShardCache::next_turn`], in
//!   grant order) at which its shards are planned while it waits for them, and the shards the
//!   worker expects to read after its chunks ([`ShardCache::expect_ahead`]) get the turns
//!   after; the unpinned file read furthest away (or never) is evicted first.
//! * A download is written aside (`NAME.part`), its size checked against the manifest, synced,
//!   then renamed into place: a partial file is never mapped. At start-up, `.part` files are
//!   deleted and complete files adopted; a file is used only if its size is the manifest's and
//!   its tar index builds with the manifest's sample count, else it is downloaded again.
//! * A chunk whose shards alone exceed the bound is refused with the size it needs.
//!
//! The bookkeeping is the pure [`table::CacheTable`]; this module does the I/O it decides.

mod claim;
#[cfg(test)]
mod hit_rate;
mod table;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use parking_lot::Mutex;
use stoker_format::{IndexPolicy, Shard};
use stoker_plan::ids::ShardId;
use stoker_proto::{HeldShards, MAX_HELD_DATASETS, MAX_HELD_SHARDS};
use stoker_store::{ObjectStores, ObjectUri, StoreError};
use tokio::sync::watch;
use tracing::{debug, info, warn};

use self::claim::ShardFile;
use self::table::CacheTable;
use crate::dataset::Dataset;
use crate::metrics::CacheMetrics;

/// How many turns after the chunks granted the next epoch's first reads are planned: after
/// every read of this epoch (a worker is granted far fewer chunks in an epoch).
const NEXT_EPOCH_TURNS: u64 = 1 << 32;

/// Downloads of one chunk's shards at once.
const PARALLEL_DOWNLOADS: usize = 4;

/// How long a chunk waits for room (other chunks' pins to go) before it gives up and is
/// granted again later.
const ROOM_PATIENCE: Duration = Duration::from_secs(120);

/// Why a chunk's shards could not be made ready.
#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    /// The chunk's shards alone are larger than the cache.
    #[error(
        "the worker's shard cache ({capacity} bytes, --cache-size) is smaller than the shards one chunk of this job reads \
         ({needed} bytes): give the workers --cache-size {needed} or more (the job's shuffle window of shards must fit), \
         or a smaller shuffle window"
    )]
    TooSmall {
        /// Bytes the chunk's shards take.
        needed: u64,
        /// The cache's bound.
        capacity: u64,
    },
    /// Other chunks held the room for too long.
    #[error("no room in the shard cache within {seconds} s: other chunks hold every shard it has")]
    Busy {
        /// How long it waited.
        seconds: u64,
    },
    /// The object store failed (it names the URI).
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A downloaded shard did not open (not a tar, another sample count than the manifest's).
    #[error("shard {uri}: {reason}")]
    BadShard {
        /// The shard.
        uri: String,
        /// What is wrong.
        reason: String,
    },
    /// The cache folder.
    #[error("shard cache {path}: {source}")]
    Io {
        /// The file or folder.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
}

impl CacheError {
    /// Whether the job can never be made on this worker (its cache is too small).
    pub fn is_too_small(&self) -> bool {
        matches!(self, Self::TooSmall { .. })
    }

    /// Whether retrying the chunk (here or elsewhere) cannot help: the data is missing,
    /// refused or not what the manifest says.
    pub fn is_permanent(&self) -> bool {
        matches!(self, Self::Store(error) if !error.is_transient())
    }
}

/// Which datasets map a cached file as which shard, to unmap it when the file is evicted.
type Users = HashMap<String, Vec<(Weak<Dataset>, ShardId)>>;

/// The shard cache of one worker.
pub struct ShardCache {
    dir: PathBuf,
    stores: Arc<ObjectStores>,
    table: Mutex<CacheTable>,
    users: Mutex<Users>,
    /// A generation bumped at every change that can give a waiting chunk room or a shard (pins
    /// released, downloads done or failed, files dropped), always while the table is locked
    /// ([`ShardCache::announce`]): a chunk that saw generation `g` when it found no room waits
    /// for one above `g`, so no change after its look is missed and its own release of pins
    /// does not wake it.
    released_tx: watch::Sender<u64>,
    /// One chunk claims at a time; held over synchronous code only (claims and deletes), never
    /// while anything is waited for.
    claiming: tokio::sync::Mutex<()>,
    /// How long a chunk waits for room or for others' downloads in all ([`ROOM_PATIENCE`]).
    patience: Duration,
    /// Times a chunk found no room and backed off (for the tests and the debug log).
    backoffs: AtomicU64,
    /// One fetch ahead at a time (a grant that finds one running fetches nothing ahead).
    fetching_ahead: tokio::sync::Mutex<()>,
    /// The turn the next chunk granted gets.
    turns: AtomicU64,
    /// The files expected to be read after the chunks granted, with the turns planned for them
    /// (replaced by each [`ShardCache::expect_ahead`]).
    ahead: Mutex<Vec<((String, u64), u64)>>,
    /// Which shard of which dataset version each file claimed or fetched ahead is (for the
    /// locality report; files adopted at start-up are not known until a chunk reads them).
    identities: Mutex<HashMap<String, (u64, ShardId)>>,
    /// The files the running fetch ahead is to download (reported as held: they are coming).
    to_fetch: Mutex<BTreeSet<String>>,
    metrics: CacheMetrics,
}

impl std::fmt::Debug for ShardCache {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("ShardCache")
            .field("dir", &self.dir)
            .field("capacity", &self.table.lock().capacity())
            .finish_non_exhaustive()
    }
}

/// The pins of one chunk's shards; released on drop.
#[derive(Debug)]
pub struct Pins {
    cache: Arc<ShardCache>,
    names: Vec<String>,
}

impl Pins {
    /// Unpin every file now; returns the generation of the change (see
    /// [`ShardCache::announce`]).
    fn release(&mut self) -> u64 {
        let mut table = self.cache.table.lock();
        if self.names.is_empty() {
            return *self.cache.released_tx.borrow();
        }
        for name in self.names.drain(..) {
            table.unpin(&name);
        }
        self.cache.announce(&table)
    }
}

impl Drop for Pins {
    fn drop(&mut self) {
        self.release();
    }
}

/// Clears the running fetch ahead's list when it ends.
struct Fetched<'a>(&'a ShardCache);

impl Drop for Fetched<'_> {
    fn drop(&mut self) {
        self.0.to_fetch.lock().clear();
    }
}

/// A chunk's shards planned at its turn while it waits for them; unplanned on drop (claimed,
/// or given up).
struct Planned<'a> {
    cache: &'a ShardCache,
    /// The files, with their sizes.
    files: Vec<(String, u64)>,
    turn: u64,
}

impl<'a> Planned<'a> {
    fn new(cache: &'a ShardCache, files: Vec<(String, u64)>, turn: u64) -> Self {
        let mut table = cache.table.lock();
        for (name, bytes) in &files {
            table.plan(name, *bytes, turn);
        }
        drop(table);
        Self { cache, files, turn }
    }
}

impl Drop for Planned<'_> {
    fn drop(&mut self) {
        let mut table = self.cache.table.lock();
        for (name, _) in &self.files {
            table.unplan(name, self.turn);
        }
    }
}

/// The file name of the shard at `uri` in the cache: a hash of the URI (distinct objects, distinct files)
/// and its last part (for people looking at the folder).
pub fn file_name(uri: &str) -> String {
    let last: String =
        uri.rsplit('/').next().unwrap_or("").chars().filter(|c| c.is_ascii_alphanumeric() || "._-".contains(*c)).take(80).collect();
    format!("{:016x}-{last}", xxhash_rust::xxh3::xxh3_64(uri.as_bytes()))
}

impl ShardCache {
    /// The cache in `dir` (created if missing) of `capacity` bytes, reading from `stores`:
    /// partial downloads a crash left are deleted, complete files adopted (oldest first
    /// evicted if they exceed the bound).
    pub fn open(dir: &Path, capacity: u64, stores: Arc<ObjectStores>, metrics: CacheMetrics) -> Result<Arc<Self>, CacheError> {
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| CacheError::Io { path, source }
        };
        std::fs::create_dir_all(dir).map_err(io(dir))?;
        let mut found = Vec::new();
        for entry in std::fs::read_dir(dir).map_err(io(dir))? {
            let entry = entry.map_err(io(dir))?;
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            let metadata = entry.metadata().map_err(io(&path))?;
            if !metadata.is_file() {
                continue;
            }
            if name.ends_with(".part") {
                info!(file = %path.display(), "shard cache: deleting a partial download left by an earlier run");
                std::fs::remove_file(&path).map_err(io(&path))?;
                continue;
            }
            found.push((metadata.modified().ok(), name, metadata.len()));
        }
        found.sort();
        let mut table = CacheTable::new(capacity);
        for (_, name, bytes) in found {
            for evicted in table.adopt(&name, bytes) {
                let path = dir.join(&evicted);
                std::fs::remove_file(&path).map_err(io(&path))?;
            }
        }
        info!(dir = %dir.display(), capacity, files = table.len(), held = table.held(), "shard cache open");
        metrics.bytes.set(table.held() as i64);
        let (released_tx, _) = watch::channel(0);
        Ok(Arc::new(Self {
            dir: dir.to_path_buf(),
            stores,
            table: Mutex::new(table),
            users: Mutex::new(HashMap::new()),
            released_tx,
            claiming: tokio::sync::Mutex::new(()),
            patience: ROOM_PATIENCE,
            backoffs: AtomicU64::new(0),
            fetching_ahead: tokio::sync::Mutex::new(()),
            turns: AtomicU64::new(0),
            ahead: Mutex::new(Vec::new()),
            identities: Mutex::new(HashMap::new()),
            to_fetch: Mutex::new(BTreeSet::new()),
            metrics,
        }))
    }

    /// The object stores it reads from.
    pub fn stores(&self) -> &Arc<ObjectStores> {
        &self.stores
    }

    /// The bound, in bytes.
    pub fn capacity(&self) -> u64 {
        self.table.lock().capacity()
    }

    /// Bytes held now (files and reserved downloads).
    pub fn held(&self) -> u64 {
        self.table.lock().held()
    }

    /// The shards the cache holds, is downloading or is about to fetch ahead, by dataset
    /// version, at most [`MAX_HELD_SHARDS`]: what a pull reports, so that the coordinator
    /// prefers granting this worker chunks that read them, and other workers other chunks.
    pub fn held_shards(&self) -> Vec<HeldShards> {
        let table = self.table.lock();
        let to_fetch = self.to_fetch.lock();
        let mut identities = self.identities.lock();
        identities.retain(|name, _| table.contains(name) || to_fetch.contains(name));
        let mut by_version: BTreeMap<u64, Vec<ShardId>> = BTreeMap::new();
        for (_, &(version, shard)) in identities.iter().take(MAX_HELD_SHARDS) {
            by_version.entry(version).or_default().push(shard);
        }
        by_version.into_iter().take(MAX_HELD_DATASETS).map(|(dataset_version, shards)| HeldShards { dataset_version, shards }).collect()
    }

    /// Remember that the file `name` is `shard` of `dataset` (for [`ShardCache::held_shards`]).
    fn identify(&self, name: &str, dataset: &Dataset, shard: ShardId) {
        self.identities.lock().insert(name.to_owned(), (dataset.version(), shard));
    }

    /// The turn of a chunk granted now: chunks granted later are needed later, and eviction
    /// keeps the shards of the sooner ones.
    pub fn next_turn(&self) -> u64 {
        self.turns.fetch_add(1, Ordering::Relaxed)
    }

    /// After the chunk of `turn`, the worker expects to read `shards` of `dataset`, in this
    /// order, and after every read of this epoch `next_epoch` (what the next epoch reads first,
    /// in order): each is planned at a turn after `turn` (by its place), replacing what the last
    /// call expected. So at the end of an epoch eviction keeps the shards the next one starts
    /// with, and lets go first those it reads late or not at all.
    pub fn expect_ahead(&self, dataset: &Dataset, shards: &[ShardId], next_epoch: &[ShardId], turn: u64) {
        let file = |shard: ShardId| (file_name(dataset.shard_uri(shard)), dataset.shard_bytes(shard));
        let soon = shards.iter().enumerate().map(|(place, &shard)| (file(shard), turn.saturating_add(1 + place as u64)));
        let later = next_epoch
            .iter()
            .enumerate()
            .map(|(place, &shard)| (file(shard), turn.saturating_add(NEXT_EPOCH_TURNS).saturating_add(place as u64)));
        let expected: Vec<((String, u64), u64)> = soon.chain(later).collect();
        let mut table = self.table.lock();
        let mut ahead = self.ahead.lock();
        for ((name, _), at) in ahead.drain(..) {
            table.unplan(&name, at);
        }
        for ((name, bytes), at) in &expected {
            table.plan(name, *bytes, *at);
        }
        *ahead = expected;
    }

    /// Make `shards` of `dataset` (a remote one), read by the chunk of `turn`, ready and mapped,
    /// pinned until the returned [`Pins`] are dropped: hits as they are, misses downloaded (a
    /// few at once), evicting unpinned files by the plan as needed.
    pub async fn acquire(self: &Arc<Self>, dataset: &Arc<Dataset>, shards: &BTreeSet<ShardId>, turn: u64) -> Result<Pins, CacheError> {
        let needed: u64 = shards.iter().map(|&shard| dataset.shard_bytes(shard)).sum();
        let capacity = self.table.lock().capacity();
        if needed > capacity {
            return Err(CacheError::TooSmall { needed, capacity });
        }
        let files: Vec<ShardFile> = shards
            .iter()
            .map(|&shard| {
                let (uri, bytes) = (dataset.shard_uri(shard).to_owned(), dataset.shard_bytes(shard));
                let name = file_name(&uri);
                self.identify(&name, dataset, shard);
                ShardFile { uri, name, bytes }
            })
            .collect();
        let _planned = Planned::new(self, files.iter().map(|file| (file.name.clone(), file.bytes)).collect(), turn);
        let waited = Instant::now();
        let pins = self.claim_files(&files, waited + self.patience).await?;
        self.map(dataset, shards).await?;
        self.metrics.wait_seconds.inc_by(waited.elapsed().as_secs_f64());
        Ok(pins)
    }

    /// Fetch ahead: download those of `shards` of `dataset` (in the order they will be read)
    /// that the cache does not hold, unpinned, into free room or room made by evicting files the
    /// plan reads after them (those [`ShardCache::expect_ahead`] did not plan take free room
    /// only). A later chunk that needs one finds it there, or waits for its download. Failures
    /// are left for that chunk to meet.
    pub async fn prefetch(self: &Arc<Self>, dataset: &Arc<Dataset>, shards: &[ShardId]) {
        let Ok(_ahead) = self.fetching_ahead.try_lock() else { return };
        let names: Vec<String> = shards
            .iter()
            .map(|&shard| {
                let name = file_name(dataset.shard_uri(shard));
                self.identify(&name, dataset, shard);
                name
            })
            .collect();
        *self.to_fetch.lock() = names.into_iter().collect();
        let _fetched = Fetched(self);
        let mut downloads = Vec::new();
        let mut evicted = Vec::new();
        {
            let _turn = self.claiming.lock().await;
            let mut table = self.table.lock();
            for &shard in shards {
                let (uri, bytes) = (dataset.shard_uri(shard).to_owned(), dataset.shard_bytes(shard));
                let name = file_name(&uri);
                if let Some(gone) = table.reserve_ahead(&name, bytes) {
                    self.identify(&name, dataset, shard);
                    evicted.extend(gone);
                    downloads.push((uri, name, bytes));
                }
            }
        }
        self.delete(&evicted);
        if downloads.is_empty() {
            return;
        }
        self.metrics.bytes.set(self.held() as i64);
        let mut results = futures_util::stream::iter(downloads)
            .map(|(uri, name, bytes)| async move { (name.clone(), self.download(&uri, &name, bytes).await) })
            .buffer_unordered(PARALLEL_DOWNLOADS);
        while let Some((name, result)) = results.next().await {
            let mut table = self.table.lock();
            match result {
                Ok(()) => {
                    self.metrics.prefetched.inc();
                    table.downloaded(&name);
                }
                Err(error) => {
                    debug!(%error, "a shard fetched ahead failed; the chunk that needs it fetches it again");
                    table.forget(&name);
                }
            }
            // A chunk waiting for this file goes on now: at a cold start the next chunk's
            // shards are the first of the list, and waiting for the whole list stalled the
            // ranks at their second chunk (measured: 349 ms at step 2, none without fetch-ahead).
            self.announce(&table);
        }
        self.metrics.bytes.set(self.held() as i64);
    }

    /// Tell waiting chunks that `table` (locked by the caller, who just changed it) changed:
    /// bumps the generation and returns it. Called with the table locked, so the generations
    /// follow the table's changes in order.
    fn announce(&self, _table: &CacheTable) -> u64 {
        let mut now = 0;
        self.released_tx.send_modify(|generation| {
            *generation += 1;
            now = *generation;
        });
        now
    }

    /// Download `uri` (of `bytes`) as the cache file `name`: aside, checked, synced, renamed.
    async fn download(&self, uri: &str, name: &str, bytes: u64) -> Result<(), CacheError> {
        let object = ObjectUri::parse(uri)?;
        let (part, path) = (self.dir.join(format!("{name}.part")), self.dir.join(name));
        let started = Instant::now();
        if let Err(error) = self.stores.download(&object, &part, Some(bytes)).await {
            let _ = tokio::fs::remove_file(&part).await;
            return Err(error.into());
        }
        tokio::fs::rename(&part, &path).await.map_err(|source| CacheError::Io { path: path.clone(), source })?;
        self.metrics.fetched_bytes.inc_by(bytes);
        debug!(%uri, bytes, seconds = started.elapsed().as_secs_f64(), "shard downloaded into the cache");
        Ok(())
    }

    /// Map every shard of `shards` that `dataset` does not map yet, from its cache file; a
    /// file that does not open as the manifest says is deleted (downloaded again next time).
    async fn map(&self, dataset: &Arc<Dataset>, shards: &BTreeSet<ShardId>) -> Result<(), CacheError> {
        for &shard in shards {
            if dataset.is_mapped(shard) {
                continue;
            }
            let uri = dataset.shard_uri(shard).to_owned();
            let name = file_name(&uri);
            let path = self.dir.join(&name);
            let opening = Arc::clone(dataset);
            let opened = tokio::task::spawn_blocking(move || {
                let opened = Shard::open(&path, IndexPolicy::LoadOrBuildInMemory).map_err(|error| error.to_string())?;
                opening.install(shard, opened).map_err(|error| error.to_string())
            })
            .await
            .map_err(|error| CacheError::BadShard { uri: uri.clone(), reason: error.to_string() })?;
            if let Err(reason) = opened {
                warn!(%uri, %reason, "a cached shard did not open as its manifest says; it is downloaded again next time");
                {
                    let mut table = self.table.lock();
                    table.forget(&name);
                    self.announce(&table);
                }
                self.delete(std::slice::from_ref(&name));
                return Err(CacheError::BadShard { uri, reason });
            }
            self.users.lock().entry(name).or_default().push((Arc::downgrade(dataset), shard));
        }
        Ok(())
    }

    /// Delete the files `names` (evicted or stale) and unmap them from the datasets using them.
    fn delete(&self, names: &[String]) {
        for name in names {
            for (dataset, shard) in self.users.lock().remove(name).unwrap_or_default() {
                if let Some(dataset) = dataset.upgrade() {
                    dataset.evict(shard);
                }
            }
            let path = self.dir.join(name);
            match std::fs::remove_file(&path) {
                Ok(()) => self.metrics.evictions.inc(),
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
                Err(error) => warn!(file = %path.display(), %error, "shard cache: cannot delete an evicted file"),
            }
        }
    }
}
