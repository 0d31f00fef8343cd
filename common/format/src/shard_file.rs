//! An opened shard: the tar file mmapped, with a validated index, giving zero-copy slices of
//! each sample's members.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use memmap2::Mmap;

use super::index::{IndexBytes, MemberEntry, ShardIndex, build_index};
use crate::error::ShardError;

/// How the index of an opened shard was obtained.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IndexStatus {
    /// A valid `.idx` file was loaded.
    Loaded,
    /// The index was built by scanning the shard, because `reason`; `written` says whether it
    /// was saved beside the shard for next time.
    Built {
        /// Why the existing index was not used ("missing", or the validation error).
        reason: String,
        /// Whether the new index was written to disk.
        written: bool,
    },
}

/// What `Shard::open` may do about the index.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IndexPolicy {
    /// Load a valid index; otherwise build one and write it beside the shard.
    LoadOrBuildAndWrite,
    /// Load a valid index; otherwise build one in memory only (read-only use, `inspect`).
    LoadOrBuildInMemory,
    /// Ignore any existing index; build one and write it.
    Rebuild,
}

/// The bytes of a shard file (an empty file has no mapping).
#[derive(Debug)]
enum ShardBytes {
    Mapped(Mmap),
    Empty,
}

/// Why an existing index was not used. Only `Invalid` is worth a warning.
#[derive(Debug)]
enum Unusable {
    Missing,
    RebuildRequested,
    Invalid(ShardError),
}

impl std::fmt::Display for Unusable {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Missing => formatter.write_str("missing"),
            Self::RebuildRequested => formatter.write_str("rebuild requested"),
            Self::Invalid(error) => write!(formatter, "{error}"),
        }
    }
}

/// An opened shard.
#[derive(Debug)]
pub struct Shard {
    path: PathBuf,
    bytes: ShardBytes,
    index: ShardIndex,
    index_status: IndexStatus,
}

/// One sample: its key and its members, each a slice of the shard's mmap.
#[derive(Clone, Copy, Debug)]
pub struct Sample<'a> {
    shard: &'a Shard,
    sample: usize,
}

/// The index path of a shard: the shard's file name with `.idx` appended.
pub fn index_path(shard_path: &Path) -> PathBuf {
    let mut name = shard_path.as_os_str().to_owned();
    name.push(".idx");
    PathBuf::from(name)
}

impl Shard {
    /// Open the shard at `path`, with its index handled per `policy`.
    pub fn open(path: &Path, policy: IndexPolicy) -> Result<Self, ShardError> {
        // Only a regular file: opening a FIFO would block, a device never end.
        let file = crate::regular_file::open_regular(path).map_err(|source| ShardError::io("failed to open shard", path, source))?;
        let len = file.metadata().map_err(|source| ShardError::io("failed to stat shard", path, source))?.len();
        let bytes = if len == 0 {
            ShardBytes::Empty
        } else {
            // SAFETY: shards are immutable once written (DESIGN §3). If another process
            // truncates one while it is mapped, reads past the new end fault (SIGBUS); that is
            // a broken deployment, and the index's staleness check catches rewrites between opens.
            let map = unsafe { Mmap::map(&file) }.map_err(|source| ShardError::io("failed to map shard", path, source))?;
            ShardBytes::Mapped(map)
        };
        let data: &[u8] = match &bytes {
            ShardBytes::Mapped(map) => map,
            ShardBytes::Empty => &[],
        };
        let index_file = index_path(path);
        let loaded = match policy {
            IndexPolicy::Rebuild => Err(Unusable::RebuildRequested),
            IndexPolicy::LoadOrBuildAndWrite | IndexPolicy::LoadOrBuildInMemory => match ShardIndex::load(&index_file, data) {
                Ok(index) => Ok(index),
                Err(ShardError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => Err(Unusable::Missing),
                Err(error) => Err(Unusable::Invalid(error)),
            },
        };
        let (index, index_status) = match loaded {
            Ok(index) => (index, IndexStatus::Loaded),
            Err(unusable) => {
                let encoded = build_index(data).map_err(|error| with_shard_path(error, path))?;
                let written = policy != IndexPolicy::LoadOrBuildInMemory && write_index(&index_file, &encoded);
                if let Unusable::Invalid(error) = &unusable {
                    tracing::warn!(index = %index_file.display(), %error, "index not usable; rebuilt it");
                }
                let index = ShardIndex::from_bytes(IndexBytes::Owned(encoded), data, &index_file)?;
                (index, IndexStatus::Built { reason: unusable.to_string(), written })
            }
        };
        Ok(Self { path: path.to_path_buf(), bytes, index, index_status })
    }

    /// Path the shard was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The whole shard file.
    pub fn bytes(&self) -> &[u8] {
        match &self.bytes {
            ShardBytes::Mapped(map) => map,
            ShardBytes::Empty => &[],
        }
    }

    /// The validated index.
    pub fn index(&self) -> &ShardIndex {
        &self.index
    }

    /// How the index was obtained.
    pub fn index_status(&self) -> &IndexStatus {
        &self.index_status
    }

    /// Number of samples.
    pub fn len(&self) -> usize {
        self.index.samples()
    }

    /// True when the shard holds no samples.
    pub fn is_empty(&self) -> bool {
        self.index.samples() == 0
    }

    /// Sample `sample`, or `None` past the end.
    pub fn sample(&self, sample: usize) -> Option<Sample<'_>> {
        (sample < self.len()).then_some(Sample { shard: self, sample })
    }
}

impl<'a> Sample<'a> {
    /// The sample's key.
    pub fn key(&self) -> &'a str {
        self.shard.index.key(self.sample)
    }

    /// Each member's extension and bytes (a slice of the mmap), in tar order.
    pub fn members(&self) -> impl ExactSizeIterator<Item = (&'a str, &'a [u8])> + 'a {
        let shard = self.shard;
        shard.index.sample_members(self.sample).map(move |entry: MemberEntry<'a>| (entry.extension, member_bytes(shard, entry)))
    }

    /// The bytes of the member with extension `extension` (lower case), if the sample has one.
    pub fn member(&self, extension: &str) -> Option<&'a [u8]> {
        self.members().find(|(member_extension, _)| *member_extension == extension).map(|(_, bytes)| bytes)
    }
}

fn member_bytes<'a>(shard: &'a Shard, entry: MemberEntry<'_>) -> &'a [u8] {
    // The index was validated against this shard's length.
    &shard.bytes()[entry.offset as usize..(entry.offset + entry.size) as usize]
}

/// Name the shard in tar errors that only know offsets.
fn with_shard_path(error: ShardError, path: &Path) -> ShardError {
    ShardError::InShard { path: path.to_path_buf(), source: Box::new(error) }
}

/// Write the index atomically (temporary file + rename). Returns whether it was written;
/// failure (a read-only dataset directory) is logged and the in-memory index is used.
fn write_index(path: &Path, encoded: &[u8]) -> bool {
    let temporary = {
        let mut name = path.as_os_str().to_owned();
        name.push(format!(".tmp{}", std::process::id()));
        PathBuf::from(name)
    };
    let result = File::create(&temporary)
        .and_then(|mut file| file.write_all(encoded).and_then(|()| file.sync_all()))
        .and_then(|()| std::fs::rename(&temporary, path));
    if let Err(error) = result {
        let _ = std::fs::remove_file(&temporary);
        tracing::warn!(index = %path.display(), %error, "could not write the index; using it from memory");
        return false;
    }
    true
}
