//! Reading a dataset's manifest for `stoker dataset add` (file IO, which the core asks the
//! driver to do): confined to the dataset roots, after symlinks are resolved.

use std::path::{Path, PathBuf};

use stoker_format::error::ShardError;
use stoker_format::{DatasetRoots, Manifest};
use stoker_proto::{DatasetInfo, ErrorCode, RemoteError};

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
