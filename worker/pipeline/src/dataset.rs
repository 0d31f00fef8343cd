//! A dataset opened for reading: every shard of a manifest mapped, with its index, and the
//! lookups the pipeline needs (a sample's image member, its label, its shard's path).

use std::path::{Path, PathBuf};
use std::sync::Arc;

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

/// The shards of one manifest, mapped.
#[derive(Debug)]
pub struct Dataset {
    manifest_path: PathBuf,
    /// The manifest's version (hash of its bytes).
    version: u64,
    shards: Vec<Shard>,
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
            shards.push(shard);
        }
        let table = Arc::new(manifest.shard_table().map_err(|e| PipelineError::Start(e.to_string()))?);
        Ok(Self { manifest_path: path.to_path_buf(), version, shards, table, classes: manifest.classes })
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

    /// A sample by reference; `None` if it is outside the dataset.
    pub fn sample(&self, sample: SampleRef) -> Option<Sample<'_>> {
        let index = usize::try_from(sample.index).ok()?;
        self.shards.get(sample.shard.0 as usize)?.sample(index)
    }

    /// The path of a shard.
    pub fn shard_path(&self, shard: ShardId) -> &Path {
        self.shards.get(shard.0 as usize).map_or(Path::new("?"), Shard::path)
    }

    /// All opened shards, in manifest order.
    pub fn shards(&self) -> &[Shard] {
        &self.shards
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
