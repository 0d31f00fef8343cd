//! Shards in an object store for `stoker index` and `stoker inspect`: a shard is downloaded,
//! with the index beside it where the store has one, into a temporary folder (under `TMPDIR`)
//! and read there as a local file. Indexing or inspecting a shard reads all of it, so the
//! download costs nothing the local path does not; the copy is deleted when dropped.

use std::path::PathBuf;

use anyhow::Context;
use stoker_format::ManifestShard;
use stoker_store::{ObjectStores, ObjectUri, StoreError};
use tokio::runtime::Runtime;

/// A shard downloaded into a temporary folder, removed when this is dropped.
pub(crate) struct LocalCopy {
    _folder: tempfile::TempDir,
    /// The shard's copy; its index, where the store had one, beside it (`index_path`).
    pub(crate) shard: PathBuf,
}

/// Download `uri`, and the index beside it where `with_index` and the store has one.
pub(crate) fn download_shard(runtime: &Runtime, stores: &ObjectStores, uri: &ObjectUri, with_index: bool) -> anyhow::Result<LocalCopy> {
    let folder = tempfile::Builder::new().prefix("stoker-object-").tempdir().context("cannot make a temporary folder (TMPDIR)")?;
    let shard = folder.path().join(uri.file_name());
    runtime.block_on(stores.download(uri, &shard, None))?;
    if with_index {
        let index = stoker_format::index_path(&shard);
        match runtime.block_on(stores.download(&uri.index(), &index, None)) {
            Ok(_) => {}
            // No index in the store: the file the download created is empty; a local shard
            // without an index is what the caller expects.
            Err(StoreError::NotFound { .. }) => std::fs::remove_file(&index).or_else(ignore_not_found)?,
            Err(error) => return Err(error.into()),
        }
    }
    Ok(LocalCopy { _folder: folder, shard })
}

fn ignore_not_found(error: std::io::Error) -> std::io::Result<()> {
    if error.kind() == std::io::ErrorKind::NotFound { Ok(()) } else { Err(error) }
}

/// What a HEAD of a manifest's shard (and of the index beside it) found.
pub(crate) struct ObjectCheck {
    /// For the report's status column.
    pub(crate) status: String,
    /// What is wrong, if anything: it names the URI.
    pub(crate) problem_opt: Option<String>,
}

/// Check that the shard `uri` exists with the size `entry` says, and whether its index does.
pub(crate) fn check_shard(runtime: &Runtime, stores: &ObjectStores, uri: &ObjectUri, entry: &ManifestShard) -> ObjectCheck {
    let size = match runtime.block_on(stores.head(uri)) {
        Ok((size, _)) => size,
        Err(error) => return ObjectCheck { status: "unreadable".into(), problem_opt: Some(error.to_string()) },
    };
    if entry.bytes != 0 && size != entry.bytes {
        let problem = format!("{uri}: the manifest says {} bytes, the object has {size}", entry.bytes);
        return ObjectCheck { status: "size differs".into(), problem_opt: Some(problem) };
    }
    match runtime.block_on(stores.head(&uri.index())) {
        Ok(_) => ObjectCheck { status: "in the store, index beside it (not read)".into(), problem_opt: None },
        Err(StoreError::NotFound { .. }) => {
            ObjectCheck { status: "in the store, no index (workers build it; `stoker index` stores one)".into(), problem_opt: None }
        }
        Err(error) => ObjectCheck { status: "index unreadable".into(), problem_opt: Some(error.to_string()) },
    }
}
