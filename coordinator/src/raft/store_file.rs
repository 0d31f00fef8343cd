//! The store file `--data-dir/raft.redb` that the log store and the state machine share: its
//! tables and records, durable writes, and reads on tokio's blocking pool.

use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use openraft::{Entry, LogId, Vote};
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::TypeConfig;
use crate::error::CoordinatorError;

/// Entries by index, each an openraft `Entry` as JSON.
pub(super) const LOG: TableDefinition<'_, u64, &[u8]> = TableDefinition::new("log");
/// Small named records, JSON: the vote, the committed and last purged log ids, the snapshot.
pub(super) const META: TableDefinition<'_, &str, &[u8]> = TableDefinition::new("meta");

pub(super) const VOTE: &str = "vote";
pub(super) const COMMITTED: &str = "committed";
pub(super) const LAST_PURGED: &str = "last_purged";
/// The record holding the latest snapshot (the state machine's).
pub(super) const SNAPSHOT: &str = "snapshot";

/// The file name of the store inside the data directory.
pub const STORE_FILE: &str = "raft.redb";

/// A failure of the store file, for openraft's errors.
#[derive(Debug, thiserror::Error)]
#[error("{path}: {message}")]
pub(super) struct FileError {
    path: String,
    message: String,
}

/// The open store file, shared by the log store and the state machine.
#[derive(Clone, Debug)]
pub struct StoreFile {
    db: Arc<Database>,
    path: PathBuf,
}

impl FileError {
    pub(super) fn new(message: String) -> Self {
        Self { path: String::new(), message }
    }
}

impl StoreFile {
    /// Open (creating) `raft.redb` in `dir`. A file that is not a redb database, or a damaged
    /// one, is an error naming it: never a silent reset.
    pub fn open(dir: &Path) -> Result<Self, CoordinatorError> {
        std::fs::create_dir_all(dir).map_err(|source| CoordinatorError::Storage {
            action: "cannot create data directory",
            path: dir.to_path_buf(),
            source,
        })?;
        let path = dir.join(STORE_FILE);
        // A coordinator of this process stopping a moment ago may still hold the file.
        let mut tries = 0;
        let db = loop {
            match Database::create(&path) {
                Err(redb::DatabaseError::DatabaseAlreadyOpen) if tries < 40 => {
                    tries += 1;
                    std::thread::sleep(std::time::Duration::from_millis(50));
                }
                Err(redb::DatabaseError::DatabaseAlreadyOpen) => {
                    return Err(CoordinatorError::Cluster {
                        message: format!("{} is in use by another coordinator: give each coordinator its own --data-dir", path.display()),
                    });
                }
                Err(error) => {
                    return Err(CoordinatorError::CorruptState {
                        path: path.clone(),
                        message: format!(
                            "cannot open the Raft store: {error} (move the file away to start this node empty: in a \
                             cluster, remove the node and add it back under a new id; alone, restore the file from a backup)"
                        ),
                    });
                }
                Ok(db) => break db,
            }
        };
        let file = Self { db: Arc::new(db), path };
        // Create the tables, so that readers never meet a missing one.
        file.write(|txn| {
            txn.open_table(LOG)?;
            txn.open_table(META)?;
            Ok(())
        })
        .map_err(|error| CoordinatorError::CorruptState { path: file.path.clone(), message: error.message })?;
        Ok(file)
    }

    /// Where it is.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether nothing was ever stored: no vote, no log entry, no snapshot. Such a node was
    /// never part of a cluster.
    pub fn is_fresh(&self) -> Result<bool, CoordinatorError> {
        let check = || -> Result<bool, FileError> {
            let vote: Option<Vote<u64>> = self.get_meta(VOTE)?;
            let purged: Option<LogId<u64>> = self.get_meta(LAST_PURGED)?;
            let snapshot: Option<serde_json::Value> = self.get_meta(SNAPSHOT)?;
            let empty_log = self.read(|txn| Ok(txn.open_table(LOG)?.first()?.is_none()))?;
            Ok(vote.is_none() && purged.is_none() && snapshot.is_none() && empty_log)
        };
        check().map_err(|error| CoordinatorError::CorruptState { path: self.path.clone(), message: error.message })
    }

    pub(super) fn error(&self, error: impl std::fmt::Display) -> FileError {
        FileError { path: self.path.display().to_string(), message: error.to_string() }
    }

    pub(super) fn read<T>(&self, body: impl FnOnce(&redb::ReadTransaction) -> Result<T, redb::Error>) -> Result<T, FileError> {
        let txn = self.db.begin_read().map_err(|error| self.error(error))?;
        body(&txn).map_err(|error| self.error(error))
    }

    /// One write transaction, committed durably (fsync) before this returns.
    pub(super) fn write<T>(&self, body: impl FnOnce(&redb::WriteTransaction) -> Result<T, redb::Error>) -> Result<T, FileError> {
        let txn = self.db.begin_write().map_err(|error| self.error(error))?;
        let value = body(&txn).map_err(|error| self.error(error))?;
        txn.commit().map_err(|error| self.error(error))?;
        Ok(value)
    }

    pub(super) fn get_meta<T: DeserializeOwned>(&self, key: &str) -> Result<Option<T>, FileError> {
        let bytes = self.read(|txn| Ok(txn.open_table(META)?.get(key)?.map(|value| value.value().to_vec())))?;
        bytes
            .map(|bytes| serde_json::from_slice(&bytes).map_err(|error| self.error(format!("record {key:?} is unreadable: {error}"))))
            .transpose()
    }

    pub(super) fn put_meta<T: Serialize>(&self, key: &str, value: &T) -> Result<(), FileError> {
        let bytes = serde_json::to_vec(value).map_err(|error| self.error(error))?;
        self.write(|txn| {
            txn.open_table(META)?.insert(key, bytes.as_slice())?;
            Ok(())
        })
    }

    /// [`Self::put_meta`] without an fsync of its own: durable with the next durable commit.
    pub(super) fn put_meta_lazily<T: Serialize>(&self, key: &str, value: &T) -> Result<(), FileError> {
        let bytes = serde_json::to_vec(value).map_err(|error| self.error(error))?;
        let mut txn = self.db.begin_write().map_err(|error| self.error(error))?;
        txn.set_durability(redb::Durability::None).map_err(|error| self.error(error))?;
        {
            let mut table = txn.open_table(META).map_err(|error| self.error(error))?;
            table.insert(key, bytes.as_slice()).map_err(|error| self.error(error))?;
        }
        txn.commit().map_err(|error| self.error(error))
    }

    /// Run `body` on the blocking pool with a clone of this file.
    pub(super) async fn blocking<T: Send + 'static>(
        &self,
        body: impl FnOnce(&Self) -> Result<T, FileError> + Send + 'static,
    ) -> Result<T, FileError> {
        let file = self.clone();
        tokio::task::spawn_blocking(move || body(&file)).await.map_err(|error| self.error(format!("store task failed: {error}")))?
    }

    pub(super) fn entries(&self, start: Bound<u64>, end: Bound<u64>) -> Result<Vec<Entry<TypeConfig>>, FileError> {
        let raw: Vec<(u64, Vec<u8>)> = self.read(|txn| {
            let table = txn.open_table(LOG)?;
            let mut raw = Vec::new();
            for item in table.range::<u64>((start, end))? {
                let (index, bytes) = item?;
                raw.push((index.value(), bytes.value().to_vec()));
            }
            Ok(raw)
        })?;
        raw.into_iter()
            .map(|(index, bytes)| {
                serde_json::from_slice(&bytes).map_err(|error| self.error(format!("log entry {index} is unreadable: {error}")))
            })
            .collect()
    }
}
