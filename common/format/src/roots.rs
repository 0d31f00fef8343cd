//! The folders datasets must be in (`--dataset-root`, DESIGN §10): a manifest and the shards
//! it lists are read only from inside them, after symlinks are resolved, and only when they
//! are regular files (a FIFO would block its reader for ever, a device never ends).

use std::path::{Component, Path, PathBuf};

use super::manifest::{Manifest, ShardLocation, resolve_uri};
use crate::error::ShardError;

/// Where datasets may be read from; no roots: anywhere the process can read.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DatasetRoots {
    roots: Vec<PathBuf>,
}

impl DatasetRoots {
    /// No confinement.
    pub fn anywhere() -> Self {
        Self::default()
    }

    /// Confined to `roots`, each resolved now (each must exist).
    pub fn new(roots: impl IntoIterator<Item = PathBuf>) -> Result<Self, ShardError> {
        let mut resolved = Vec::new();
        for root in roots {
            let path = root.canonicalize().map_err(|source| ShardError::io("--dataset-root: cannot resolve the folder", &root, source))?;
            if !path.is_dir() {
                return Err(ShardError::Confined { path, reason: "--dataset-root must be a folder".to_owned() });
            }
            resolved.push(path);
        }
        Ok(Self { roots: resolved })
    }

    /// The roots, resolved (empty: anywhere).
    pub fn roots(&self) -> &[PathBuf] {
        &self.roots
    }

    /// Whether reading is confined to roots.
    pub fn is_confined(&self) -> bool {
        !self.roots.is_empty()
    }

    /// `path` with symlinks resolved, if it is a regular file inside a root.
    pub fn check_file(&self, path: &Path) -> Result<PathBuf, ShardError> {
        let resolved = path.canonicalize().map_err(|source| ShardError::io("cannot open", path, source))?;
        let metadata = std::fs::metadata(&resolved).map_err(|source| ShardError::io("cannot read", &resolved, source))?;
        if !metadata.is_file() {
            return Err(ShardError::Confined {
                path: resolved,
                reason: "not a regular file (a device, a FIFO or a folder): datasets are files".to_owned(),
            });
        }
        self.check_inside(resolved)
    }

    /// Every local shard `manifest` (read from `manifest_dir`) lists is inside a root: resolved
    /// when this host has the file, judged by its path alone when it does not (a coordinator
    /// without the data; each worker checks again against its own roots when it opens them).
    pub fn check_shards(&self, manifest: &Manifest, manifest_dir: &Path) -> Result<(), ShardError> {
        if !self.is_confined() {
            return Ok(());
        }
        for shard in &manifest.shards {
            let ShardLocation::File(path) = resolve_uri(&shard.uri, manifest_dir)? else { continue };
            if path.exists() {
                self.check_file(&path)?;
            } else {
                self.check_inside(lexically_normal(&path))?;
            }
        }
        Ok(())
    }

    fn check_inside(&self, path: PathBuf) -> Result<PathBuf, ShardError> {
        if self.roots.is_empty() || self.roots.iter().any(|root| path.starts_with(root)) {
            return Ok(path);
        }
        let listed: Vec<String> = self.roots.iter().map(|root| root.display().to_string()).collect();
        Err(ShardError::Confined {
            path,
            reason: format!("outside every --dataset-root ({}): datasets must be in those folders", listed.join(", ")),
        })
    }
}

/// `path` with `.` and `..` taken out by their meaning alone (no file system access).
fn lexically_normal(path: &Path) -> PathBuf {
    let mut normal = PathBuf::new();
    for component in path.components() {
        match component {
            Component::CurDir => {}
            Component::ParentDir => {
                normal.pop();
            }
            other => normal.push(other),
        }
    }
    normal
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ManifestShard;

    fn manifest(uris: &[&str]) -> Manifest {
        let shards = uris.iter().map(|uri| ManifestShard { uri: (*uri).to_owned(), samples: 1, bytes: 1 }).collect();
        Manifest::new(shards, Vec::new(), None)
    }

    #[test]
    fn files_outside_the_roots_through_links_or_dots_are_refused() {
        let dir = tempfile::tempdir().unwrap_or_else(|error| panic!("{error}"));
        let (root, outside) = (dir.path().join("root"), dir.path().join("outside"));
        for folder in [&root, &outside] {
            std::fs::create_dir(folder).unwrap_or_else(|error| panic!("{error}"));
            std::fs::write(folder.join("a.tar"), b"x").unwrap_or_else(|error| panic!("{error}"));
        }
        std::os::unix::fs::symlink(outside.join("a.tar"), root.join("escape.tar")).unwrap_or_else(|error| panic!("{error}"));
        let roots = DatasetRoots::new([root.clone()]).unwrap_or_else(|error| panic!("{error}"));
        assert!(roots.check_file(&root.join("a.tar")).is_ok());
        for refused in [outside.join("a.tar"), root.join("escape.tar"), root.join("../outside/a.tar")] {
            let error = roots.check_file(&refused).expect_err("outside");
            assert!(error.to_string().contains("outside every --dataset-root"), "{error}");
        }
        let error = roots.check_file(Path::new("/dev/zero")).expect_err("a device");
        assert!(error.to_string().contains("not a regular file"), "{error}");
        assert!(DatasetRoots::anywhere().check_file(Path::new("/dev/null")).is_err(), "devices are refused even unconfined");

        assert!(roots.check_shards(&manifest(&["a.tar", "missing.tar"]), &root).is_ok());
        for escaping in ["escape.tar", "../outside/a.tar", "../outside/missing.tar", "/etc/passwd"] {
            assert!(roots.check_shards(&manifest(&[escaping]), &root).is_err(), "{escaping}");
        }
        assert!(DatasetRoots::anywhere().check_shards(&manifest(&["/anywhere.tar"]), &root).is_ok());
    }
}
