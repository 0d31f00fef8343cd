//! Reading a dataset's manifest for `stoker dataset add` (file IO, which the core asks the
//! driver to do): confined to the dataset roots, after symlinks are resolved; or one GET from
//! an object store, confined to the object roots. The coordinator reads a manifest once, here:
//! trainers get its shard counts from the coordinator, workers its version in each grant.

use std::path::{Path, PathBuf};

use stoker_format::error::ShardError;
use stoker_format::{DatasetRoots, Manifest};
use stoker_proto::{DatasetInfo, ErrorCode, RemoteError};
use stoker_store::{MAX_OBJECT_READ_BYTES, ObjectStores, ObjectUri, StoreError};

fn invalid(message: impl Into<String>) -> RemoteError {
    RemoteError::new(ErrorCode::InvalidArgument, message)
}

/// A dataset path refused: one outside the roots is forbidden, the rest is a mistake (a
/// missing file, a device) to fix.
fn refused_path(error: ShardError) -> RemoteError {
    let forbidden = matches!(&error, ShardError::Confined { reason, .. } if reason.contains("--dataset-root"));
    RemoteError::new(if forbidden { ErrorCode::Forbidden } else { ErrorCode::InvalidArgument }, error.to_string())
}

/// Load the manifest at `manifest` (a file, or the folder holding `manifest.json`), checking
/// that it and its shards are inside `roots` (empty: anywhere). The dataset's name is the
/// core's to fill in.
pub(crate) fn read(roots: &[PathBuf], manifest: &str) -> Result<DatasetInfo, RemoteError> {
    let given = Path::new(manifest);
    let path = if given.is_dir() { given.join("manifest.json") } else { given.to_path_buf() };
    // After symlinks are resolved: a link inside a root to a file outside it is outside.
    let roots = DatasetRoots::new(roots.iter().cloned()).map_err(refused_path)?;
    let path = roots.check_file(&path).map_err(|error| match error {
        ShardError::Io { .. } => invalid(format!("{error} (give a manifest.json, or the folder `stoker pack` wrote)")),
        other => refused_path(other),
    })?;
    let (loaded, version) = Manifest::load_versioned(&path).map_err(|error| invalid(error.to_string()))?;
    roots.check_shards(&loaded, path.parent().unwrap_or(&path)).map_err(refused_path)?;
    Ok(DatasetInfo {
        name: String::new(),
        manifest: path.to_string_lossy().into_owned(),
        shard_counts: loaded.shards.iter().map(|shard| shard.samples).collect(),
        version,
    })
}

/// A store error as the caller sees it: confinement is forbidden, a missing object not found,
/// the rest a mistake to fix or an outage to retry.
fn store_refusal(error: &StoreError) -> RemoteError {
    let code = match error {
        StoreError::Confined { .. } => ErrorCode::Forbidden,
        StoreError::NotFound { .. } => ErrorCode::NotFound,
        StoreError::Unavailable { .. } => ErrorCode::Unavailable,
        _ => ErrorCode::InvalidArgument,
    };
    RemoteError::new(code, error.to_string())
}

/// Load the manifest at the object-store URI `manifest` (`s3://bucket/key`, or a prefix
/// holding `manifest.json`), checking that it and its shards are under the object roots.
pub(crate) async fn read_remote(stores: &ObjectStores, manifest: &str) -> Result<DatasetInfo, RemoteError> {
    let uri = ObjectUri::manifest(manifest).map_err(|error| store_refusal(&error))?;
    stores.roots().check(&uri).map_err(|error| store_refusal(&error))?;
    let bytes = stores.read(&uri, MAX_OBJECT_READ_BYTES).await.map_err(|error| store_refusal(&error))?;
    let version = xxhash_rust::xxh3::xxh3_64(&bytes).max(1);
    let text = std::str::from_utf8(&bytes).map_err(|_| invalid(format!("{uri}: the manifest is not UTF-8 text")))?;
    let loaded = Manifest::parse(text, Path::new(&uri.to_string())).map_err(|error| invalid(error.to_string()))?;
    for shard in &loaded.shards {
        let resolved = uri.resolve_shard(&shard.uri).map_err(|error| store_refusal(&error))?;
        stores.roots().check(&resolved).map_err(|error| store_refusal(&error))?;
    }
    Ok(DatasetInfo {
        name: String::new(),
        manifest: uri.to_string(),
        shard_counts: loaded.shards.iter().map(|shard| shard.samples).collect(),
        version,
    })
}
