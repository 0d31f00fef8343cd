//! A dataset opened for reading: the shards of a manifest mapped, with their indexes, and the
//! lookups the pipeline needs (a sample's image member, its label, its shard's path).
//!
//! A local dataset maps every shard when it opens. A dataset in an object store starts with no
//! shard mapped: the worker's cache maps a shard into its slot ([`Dataset::install`]) before
//! any batch that reads it is queued, and takes it out ([`Dataset::evict`]) only when no queued
//! batch needs it. A reader holds an `Arc` of the shard for as long as it reads, so eviction
//! never pulls a mapping from under it.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::RwLock;

use stoker_format::{DatasetRoots, IndexPolicy, Manifest, Sample, Shard, ShardLocation, resolve_uri};

use stoker_plan::ids::ShardId;
use stoker_plan::{SampleRef, ShardTable};

use crate::error::PipelineError;

/// Member extensions taken as the image, in order of preference.
pub const IMAGE_EXTENSIONS: [&str; 5] = ["jpg", "jpeg", "png", "webp", "bmp"];

/// `IMAGE_EXTENSIONS` for messages.
pub(crate) const IMAGE_EXTENSIONS_TEXT: &str = "jpg, jpeg, png, webp, bmp";

/// The label of a sample without a readable `.cls` member.
pub const NO_LABEL: i64 = -1;

/// The shards of one manifest, mapped (all of them, or those the cache holds now).
#[derive(Debug)]
pub struct Dataset {
    manifest_path: PathBuf,
    /// The manifest's version (hash of its bytes).
    version: u64,
    /// One slot per shard, in manifest order: the mapped shard, or none (not in the cache).
    shards: Vec<RwLock<Option<Arc<Shard>>>>,
    /// Where each shard comes from: its path, or its object-store URI (remote datasets).
    shard_uris: Vec<String>,
    /// Each shard's size by the manifest.
    shard_bytes: Vec<u64>,
    /// Whether shards come from an object store, mapped on demand.
    remote: bool,
    table: Arc<ShardTable>,
    classes: Vec<String>,
}

impl Dataset {
    /// Open every shard listed in the manifest at `path` (building missing indexes and writing
    /// them beside the shards when the directory is writable).
    pub fn open(path: &Path) -> Result<Self, PipelineError> {
        Self::open_version(path, 0)
    }

    /// [`Dataset::open`], refusing (before any shard is opened) a manifest whose version is
    /// not `expected` (0: any): the file was rewritten since the job was created, or this host
    /// has another file at that path.
    pub fn open_version(path: &Path, expected: u64) -> Result<Self, PipelineError> {
        Self::open_confined(path, expected, &DatasetRoots::anywhere())
    }

    /// [`Dataset::open_version`], refusing (before reading them) a manifest or shard outside
    /// `roots`, symlinks resolved.
    pub fn open_confined(path: &Path, expected: u64, roots: &DatasetRoots) -> Result<Self, PipelineError> {
        let path = &if roots.is_confined() { roots.check_file(path)? } else { path.to_path_buf() };
        let (manifest, version) = Manifest::load_versioned(path)?;
        if expected != 0 && version != expected {
            return Err(PipelineError::ManifestChanged { path: path.to_path_buf(), expected, found: version });
        }
        let dir = path.parent().unwrap_or_else(|| Path::new("."));
        let mut shards = Vec::with_capacity(manifest.shards.len());
        let mut shard_uris = Vec::with_capacity(manifest.shards.len());
        for entry in &manifest.shards {
            let file = match resolve_uri(&entry.uri, dir)? {
                ShardLocation::File(file) => file,
                ShardLocation::S3 { .. } => return Err(PipelineError::ObjectStoreNotSupported { uri: entry.uri.clone() }),
            };
            let file = if roots.is_confined() { roots.check_file(&file)? } else { file };
            let shard = Shard::open(&file, IndexPolicy::LoadOrBuildAndWrite)?;
            if shard.len() as u64 != entry.samples {
                return Err(PipelineError::ShardCountMismatch { shard: file, manifest: entry.samples, actual: shard.len() as u64 });
            }
            shard_uris.push(file.display().to_string());
            shards.push(RwLock::new(Some(Arc::new(shard))));
        }
        let table = Arc::new(manifest.shard_table().map_err(|e| PipelineError::Start(e.to_string()))?);
        let shard_bytes = manifest.shards.iter().map(|shard| shard.bytes).collect();
        let manifest_path = path.to_path_buf();
        Ok(Self { manifest_path, version, shards, shard_uris, shard_bytes, remote: false, table, classes: manifest.classes })
    }

    /// A dataset in an object store: `manifest` (read from `manifest_uri`, of `version`) with
    /// its shards at `shard_uris` (resolved, in manifest order), none mapped yet.
    pub fn remote(manifest: Manifest, version: u64, manifest_uri: &str, shard_uris: Vec<String>) -> Result<Self, PipelineError> {
        let table = Arc::new(manifest.shard_table().map_err(|e| PipelineError::Start(e.to_string()))?);
        if shard_uris.len() != manifest.shards.len() {
            return Err(PipelineError::Start(format!(
                "{manifest_uri}: {} shard URIs for {} shards",
                shard_uris.len(),
                manifest.shards.len()
            )));
        }
        Ok(Self {
            manifest_path: PathBuf::from(manifest_uri),
            version,
            shards: manifest.shards.iter().map(|_| RwLock::new(None)).collect(),
            shard_bytes: manifest.shards.iter().map(|shard| shard.bytes).collect(),
            shard_uris,
            remote: true,
            table,
            classes: manifest.classes,
        })
    }

    /// Whether shards come from an object store and are mapped on demand.
    pub fn is_remote(&self) -> bool {
        self.remote
    }

    /// Where `shard` comes from: its path, or its object-store URI.
    pub fn shard_uri(&self, shard: ShardId) -> &str {
        self.shard_uris.get(shard.0 as usize).map_or("?", String::as_str)
    }

    /// The size of `shard` by the manifest.
    pub fn shard_bytes(&self, shard: ShardId) -> u64 {
        self.shard_bytes.get(shard.0 as usize).copied().unwrap_or(0)
    }

    /// Map `opened` as `shard` (a remote dataset's, from the cache), refusing a shard whose
    /// sample count is not the manifest's.
    pub fn install(&self, shard: ShardId, opened: Shard) -> Result<(), PipelineError> {
        let Some(slot) = self.shards.get(shard.0 as usize) else {
            return Err(PipelineError::Start(format!("no shard {shard} in {}", self.manifest_path.display())));
        };
        let expected = self.table.count(shard);
        if opened.len() as u64 != expected {
            return Err(PipelineError::ShardCountMismatch {
                shard: opened.path().to_path_buf(),
                manifest: expected,
                actual: opened.len() as u64,
            });
        }
        *slot.write() = Some(Arc::new(opened));
        Ok(())
    }

    /// Unmap `shard` (the cache dropped it). Readers holding it keep their mapping.
    pub fn evict(&self, shard: ShardId) {
        if let Some(slot) = self.shards.get(shard.0 as usize) {
            *slot.write() = None;
        }
    }

    /// Whether `shard` is mapped.
    pub fn is_mapped(&self, shard: ShardId) -> bool {
        self.shards.get(shard.0 as usize).is_some_and(|slot| slot.read().is_some())
    }

    /// The mapped `shard`, if it is.
    pub fn shard(&self, shard: ShardId) -> Option<Arc<Shard>> {
        self.shards.get(shard.0 as usize)?.read().clone()
    }

    /// The manifest's version: the xxh3-64 of its bytes.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// The manifest this dataset was opened from.
    pub fn manifest_path(&self) -> &Path {
        &self.manifest_path
    }

    /// Sample counts per shard, for planning.
    pub fn table(&self) -> Arc<ShardTable> {
        Arc::clone(&self.table)
    }

    /// Class names from the manifest (may be empty).
    pub fn classes(&self) -> &[String] {
        &self.classes
    }

    /// Total samples.
    pub fn samples(&self) -> u64 {
        self.table.samples()
    }

    /// Call `read` with a sample by reference: `None` if it is outside the dataset or its
    /// shard is not mapped (a remote dataset's shard the cache does not hold).
    pub fn with_sample<R>(&self, sample: SampleRef, read: impl FnOnce(Option<&Sample<'_>>) -> R) -> R {
        let shard = self.shard(sample.shard);
        let found = shard.as_deref().zip(usize::try_from(sample.index).ok()).and_then(|(shard, index)| shard.sample(index));
        read(found.as_ref())
    }

    /// The path (or URI) of a shard, for messages.
    pub fn shard_path(&self, shard: ShardId) -> &Path {
        Path::new(self.shard_uri(shard))
    }

    /// The shards mapped now, in manifest order (every shard of a local dataset).
    pub fn shards(&self) -> Vec<Arc<Shard>> {
        self.shards.iter().filter_map(|slot| slot.read().clone()).collect()
    }
}

/// The image member of a sample: the first of [`IMAGE_EXTENSIONS`] present.
pub fn image_member<'a>(sample: &Sample<'a>) -> Option<&'a [u8]> {
    IMAGE_EXTENSIONS.iter().find_map(|ext| sample.member(ext))
}

/// The label of a sample: its `.cls` member as a decimal integer, or [`NO_LABEL`].
pub fn label(sample: &Sample<'_>) -> i64 {
    sample.member("cls").and_then(|bytes| std::str::from_utf8(bytes).ok()).and_then(|text| text.trim().parse().ok()).unwrap_or(NO_LABEL)
}
