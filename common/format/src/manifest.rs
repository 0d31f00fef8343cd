//! `manifest.json` (DESIGN §3): the shards of a dataset with their sample counts, and the class
//! names when the dataset was packed from an ImageFolder (label `i` is `classes[i]`).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::ShardError;
use stoker_plan::ShardTable;

/// Version written by this build; readers refuse newer ones. 2 added [`Manifest::packed`].
pub const MANIFEST_VERSION: u32 = 2;
/// Conventional file name of a manifest beside its shards.
pub const MANIFEST_FILE: &str = "manifest.json";

/// The largest manifest read: 256 MiB (about two million shards). Checked before reading, so
/// a path naming a device (`/dev/zero`) or a runaway file is refused instead of read forever.
pub const MAX_MANIFEST_BYTES: u64 = 256 << 20;

/// A dataset: its shards in order, with sample counts.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    /// Format version.
    pub version: u32,
    /// Shards, in manifest order (the order shard ids refer to).
    pub shards: Vec<ManifestShard>,
    /// Class names by label, when known.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub classes: Vec<String>,
    /// How `stoker pack` ordered the samples, when it wrote this manifest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub packed: Option<PackedOrder>,
}

/// The order `stoker pack` wrote samples in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase", tag = "order", deny_unknown_fields)]
pub enum PackedOrder {
    /// Shuffled across shards with this seed: any shuffle mode mixes classes.
    Shuffled {
        /// The seed of the shuffle (`stoker pack --seed`).
        seed: u64,
    },
    /// Folder order (`--no-shuffle`): classes are sorted, each in a run of consecutive
    /// samples, so only `full` and `block` shuffles mix them.
    Folder,
}

/// One shard of a manifest.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ManifestShard {
    /// Where the shard is: a path relative to the manifest's folder, an absolute path, a
    /// `file://` URI, or `s3://bucket/key`.
    pub uri: String,
    /// Samples in the shard.
    pub samples: u64,
    /// Size of the shard file in bytes.
    pub bytes: u64,
}

/// Where a shard URI points.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ShardLocation {
    /// A local file.
    File(PathBuf),
    /// An object in an S3-compatible store.
    S3 {
        /// Bucket name.
        bucket: String,
        /// Object key.
        key: String,
    },
}

impl Manifest {
    /// A manifest of `shards`, of the lowest version that holds what it says, so that older
    /// builds read it when they can (version 2 only adds [`Manifest::packed`]).
    pub fn new(shards: Vec<ManifestShard>, classes: Vec<String>, packed: Option<PackedOrder>) -> Self {
        let version = if packed.is_some() { MANIFEST_VERSION } else { 1 };
        Self { version, shards, classes, packed }
    }

    /// Read and check `path`.
    pub fn load(path: &Path) -> Result<Self, ShardError> {
        Self::load_versioned(path).map(|(manifest, _)| manifest)
    }

    /// Read and check `path`; also return its version: the xxh3-64 of the bytes read (never 0,
    /// which means "unversioned"). Coordinators bind jobs to it and workers compare it, so a
    /// manifest rewritten in place or differing between hosts is noticed.
    pub fn load_versioned(path: &Path) -> Result<(Self, u64), ShardError> {
        let text = read_manifest_text(path)?;
        let version = xxhash_rust::xxh3::xxh3_64(text.as_bytes()).max(1);
        Ok((Self::parse(&text, path)?, version))
    }

    /// Parse and check the text of a manifest (what [`Manifest::load`] does once it has read
    /// the file): its JSON, its version, and every shard URI. `path` names it in errors.
    pub fn parse(text: &str, path: &Path) -> Result<Self, ShardError> {
        let bad = |reason: String| ShardError::BadManifest { path: path.to_path_buf(), reason };
        let manifest: Self = serde_json::from_str(text).map_err(|error| match manifest_kind(text).as_deref() {
            Some(crate::tokens::TOKEN_MANIFEST_KIND) => {
                bad("a token dataset's manifest (stoker index of token files): jobs do not read token datasets yet; stoker inspect shows \
                 what it holds"
                    .to_owned())
            }
            _ => bad(format!("not a valid manifest: {error}")),
        })?;
        if manifest.version > MANIFEST_VERSION {
            return Err(bad(format!("version {} is newer than this build reads ({MANIFEST_VERSION}): upgrade stoker", manifest.version)));
        }
        for shard in &manifest.shards {
            parse_uri(&shard.uri).map_err(|error| bad(error.to_string()))?;
        }
        Ok(manifest)
    }

    /// The manifest's file text (pretty-printed JSON ending in a newline); `path` names it in
    /// an error.
    pub fn to_text(&self, path: &Path) -> Result<String, ShardError> {
        let mut text =
            serde_json::to_string_pretty(self).map_err(|error| ShardError::BadManifest { path: path.into(), reason: error.to_string() })?;
        text.push('\n');
        Ok(text)
    }

    /// Write to `path` atomically (temporary file + rename), pretty-printed.
    pub fn save(&self, path: &Path) -> Result<(), ShardError> {
        let text = self.to_text(path)?;
        let temporary = path.with_extension("json.tmp");
        std::fs::write(&temporary, text).map_err(|source| ShardError::io("failed to write manifest", &temporary, source))?;
        std::fs::rename(&temporary, path).map_err(|source| ShardError::io("failed to write manifest", path, source))
    }

    /// Total samples, saturating at `u64::MAX` (a manifest is untrusted: its counts may add up
    /// to more; [`Manifest::shard_table`] refuses such a dataset).
    pub fn samples(&self) -> u64 {
        self.shards.iter().fold(0, |total, shard| total.saturating_add(shard.samples))
    }

    /// Total bytes of all shards, saturating at `u64::MAX`.
    pub fn bytes(&self) -> u64 {
        self.shards.iter().fold(0, |total, shard| total.saturating_add(shard.bytes))
    }

    /// The planner's view of this dataset.
    pub fn shard_table(&self) -> Result<ShardTable, stoker_plan::error::PlanError> {
        ShardTable::new(self.shards.iter().map(|shard| shard.samples))
    }
}

/// The text of the manifest at `path`: a regular file of at most [`MAX_MANIFEST_BYTES`].
pub fn read_manifest_text(path: &Path) -> Result<String, ShardError> {
    let bad = |reason: String| ShardError::BadManifest { path: path.to_path_buf(), reason };
    let metadata = std::fs::metadata(path).map_err(|source| ShardError::io("failed to read manifest", path, source))?;
    // Not opened unless it is a regular file: opening a FIFO would block, a device never end.
    if !metadata.is_file() {
        return Err(bad("not a regular file (a device, a FIFO or a folder): give a manifest.json".to_owned()));
    }
    if metadata.len() > MAX_MANIFEST_BYTES {
        return Err(bad(format!("{} bytes, over the {MAX_MANIFEST_BYTES} bytes a manifest may have", metadata.len())));
    }
    let mut text = String::new();
    // Checked again on the open file: it may have been swapped for a FIFO since.
    let file = crate::regular_file::open_regular(path).map_err(|source| ShardError::io("failed to read manifest", path, source))?;
    // Bounded even if the file grows while it is read.
    std::io::Read::read_to_string(&mut std::io::Read::take(file, MAX_MANIFEST_BYTES + 1), &mut text)
        .map_err(|source| ShardError::io("failed to read manifest", path, source))?;
    if text.len() as u64 > MAX_MANIFEST_BYTES {
        return Err(bad(format!("over the {MAX_MANIFEST_BYTES} bytes a manifest may have (it grew while it was read)")));
    }
    Ok(text)
}

/// The `kind` a manifest's JSON declares (`"tokens"` for a token dataset's; image manifests
/// have none), or `None` when it has none or is not a JSON object.
pub fn manifest_kind(text: &str) -> Option<String> {
    #[derive(Deserialize)]
    struct Probe {
        kind: Option<String>,
    }
    serde_json::from_str::<Probe>(text).ok()?.kind
}

/// Where `uri` points, relative paths resolved against `manifest_dir`.
pub fn resolve_uri(uri: &str, manifest_dir: &Path) -> Result<ShardLocation, ShardError> {
    Ok(match parse_uri(uri)? {
        ShardLocation::File(path) if path.is_relative() => ShardLocation::File(manifest_dir.join(path)),
        location => location,
    })
}

fn parse_uri(uri: &str) -> Result<ShardLocation, ShardError> {
    let unsupported = |reason: &str| ShardError::UnsupportedUri { uri: uri.to_string(), reason: reason.to_string() };
    if uri.is_empty() {
        return Err(unsupported("empty"));
    }
    if let Some(path) = uri.strip_prefix("file://") {
        if !path.starts_with('/') {
            return Err(unsupported("file:// URIs must be absolute (file:///data/x.tar)"));
        }
        return Ok(ShardLocation::File(PathBuf::from(path)));
    }
    if let Some(rest) = uri.strip_prefix("s3://") {
        let (bucket, key) = rest.split_once('/').ok_or_else(|| unsupported("s3 URIs are s3://bucket/key"))?;
        if bucket.is_empty() || key.is_empty() {
            return Err(unsupported("s3 URIs are s3://bucket/key"));
        }
        return Ok(ShardLocation::S3 { bucket: bucket.to_string(), key: key.to_string() });
    }
    if let Some((scheme, _)) = uri.split_once("://") {
        return Err(unsupported(&format!("scheme {scheme}:// is not supported (use a path, file:// or s3://)")));
    }
    Ok(ShardLocation::File(PathBuf::from(uri)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uris_resolve_against_the_manifest_folder() {
        let dir = Path::new("/data/set");
        assert_eq!(resolve_uri("a-000.tar", dir).ok(), Some(ShardLocation::File("/data/set/a-000.tar".into())));
        assert_eq!(resolve_uri("/abs/a.tar", dir).ok(), Some(ShardLocation::File("/abs/a.tar".into())));
        assert_eq!(resolve_uri("file:///abs/a.tar", dir).ok(), Some(ShardLocation::File("/abs/a.tar".into())));
        assert_eq!(resolve_uri("s3://b/k/a.tar", dir).ok(), Some(ShardLocation::S3 { bucket: "b".into(), key: "k/a.tar".into() }));
        for bad in ["", "file://rel", "s3://bucket", "http://x/a.tar"] {
            assert!(resolve_uri(bad, dir).is_err(), "{bad}");
        }
    }

    #[test]
    fn totals_of_huge_counts_saturate_instead_of_overflowing() {
        // Reproduced with the `manifest` fuzz target: `samples()` overflowed (a panic with overflow checks).
        let text = r#"{"version":1,"shards":[{"uri":"a.tar","samples":18446744073709551615,"bytes":1},
            {"uri":"b.tar","samples":1,"bytes":18446744073709551615}]}"#;
        let manifest = Manifest::parse(text, Path::new("manifest.json")).unwrap_or_else(|error| panic!("{error}"));
        assert_eq!((manifest.samples(), manifest.bytes()), (u64::MAX, u64::MAX));
        assert!(manifest.shard_table().is_err());
    }

    #[test]
    fn manifest_round_trips_and_refuses_unknown_fields() {
        let dir = tempfile::tempdir().unwrap_or_else(|error| panic!("{error}"));
        let path = dir.path().join(MANIFEST_FILE);
        let manifest = Manifest {
            version: 1,
            shards: vec![ManifestShard { uri: "a.tar".into(), samples: 3, bytes: 10 }],
            classes: vec!["cat".into()],
            packed: None,
        };
        manifest.save(&path).unwrap_or_else(|error| panic!("{error}"));
        assert_eq!(Manifest::load(&path).ok(), Some(manifest));
        for packed in [PackedOrder::Shuffled { seed: 7 }, PackedOrder::Folder] {
            let manifest = Manifest { version: MANIFEST_VERSION, shards: Vec::new(), classes: Vec::new(), packed: Some(packed) };
            manifest.save(&path).unwrap_or_else(|error| panic!("{error}"));
            assert_eq!(Manifest::load(&path).ok(), Some(manifest));
        }
        std::fs::write(&path, r#"{"version":1,"shards":[],"extra":1}"#).unwrap_or_else(|error| panic!("{error}"));
        assert!(matches!(Manifest::load(&path), Err(ShardError::BadManifest { .. })));
        std::fs::write(&path, r#"{"version":7,"shards":[]}"#).unwrap_or_else(|error| panic!("{error}"));
        assert!(Manifest::load(&path).err().is_some_and(|error| error.to_string().contains("upgrade")));
    }
}
