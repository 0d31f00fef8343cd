//! Persistence of the single-node coordinator: a JSON-lines log of [`Command`]s in
//! `--data-dir`, compacted into a snapshot now and then. On start the snapshot is loaded and
//! the log replayed through the same `apply` as at run time. (With Raft, openraft's log and
//! snapshot storage take this file's place; the commands stay the same.)

use std::fs::{self, File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use crate::error::CoordinatorError;
use crate::state::{Applied, ClusterState, Command, STATE_VERSION};

/// Log entries after which the state is written as a snapshot and the log emptied.
const COMPACT_AFTER: u64 = 10_000;
const LOG_FILE: &str = "commands.jsonl";
const SNAPSHOT_FILE: &str = "state.json";

#[derive(Serialize, Deserialize)]
struct LogEntry {
    version: u32,
    #[serde(flatten)]
    command: Command,
}

/// The command log and snapshot of one data directory, or nothing (in memory: for tests and
/// simulations that must not touch the disk).
#[derive(Debug)]
pub struct Store {
    files_opt: Option<Files>,
}

#[derive(Debug)]
struct Files {
    dir: PathBuf,
    log: File,
    entries: u64,
}

fn io_error<'a>(action: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> CoordinatorError + 'a {
    move |source| CoordinatorError::Storage { action, path: path.to_path_buf(), source }
}

impl Store {
    /// Open (creating) the store in `dir` and rebuild the state it holds.
    pub fn open(dir: &Path) -> Result<(Self, ClusterState), CoordinatorError> {
        fs::create_dir_all(dir).map_err(io_error("cannot create data directory", dir))?;
        let snapshot_path = dir.join(SNAPSHOT_FILE);
        let mut state = match fs::read(&snapshot_path) {
            Ok(bytes) => {
                let state: ClusterState = serde_json::from_slice(&bytes)
                    .map_err(|error| CoordinatorError::CorruptState { path: snapshot_path.clone(), message: error.to_string() })?;
                if state.version != STATE_VERSION {
                    return Err(CoordinatorError::CorruptState {
                        path: snapshot_path,
                        message: format!("state version {} is not {STATE_VERSION}, the version this build reads", state.version),
                    });
                }
                state
            }
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => ClusterState::new(),
            Err(error) => return Err(io_error("cannot read", &snapshot_path)(error)),
        };
        let log_path = dir.join(LOG_FILE);
        let (entries, good_bytes) = replay(&log_path, &mut state)?;
        let log = OpenOptions::new().create(true).append(true).open(&log_path).map_err(io_error("cannot open", &log_path))?;
        if let Some(good_bytes) = good_bytes {
            log.set_len(good_bytes).map_err(io_error("cannot truncate", &log_path))?;
        }
        info!(dir = %dir.display(), datasets = state.datasets.len(), jobs = state.jobs.len(), entries, "state loaded");
        Ok((Self { files_opt: Some(Files { dir: dir.to_path_buf(), log, entries }) }, state))
    }

    /// A store that keeps nothing: the state lives as long as the process.
    pub fn in_memory() -> (Self, ClusterState) {
        (Self { files_opt: None }, ClusterState::new())
    }

    /// Log `command`, then apply it to `state`.
    pub fn commit(&mut self, state: &mut ClusterState, command: Command) -> Result<Applied, CoordinatorError> {
        let Some(files) = &mut self.files_opt else { return Ok(state.apply(command)) };
        files.commit(state, command)
    }
}

impl Files {
    fn commit(&mut self, state: &mut ClusterState, command: Command) -> Result<Applied, CoordinatorError> {
        let mut line = serde_json::to_vec(&LogEntry { version: STATE_VERSION, command: command.clone() })
            .map_err(|error| CoordinatorError::Internal { message: format!("cannot serialise a command: {error}") })?;
        line.push(b'\n');
        let log_path = self.dir.join(LOG_FILE);
        self.log.write_all(&line).map_err(io_error("cannot append to", &log_path))?;
        self.entries += 1;
        let applied = state.apply(command);
        if self.entries >= COMPACT_AFTER {
            self.compact(state)?;
        }
        Ok(applied)
    }

    /// Write `state` as the snapshot (atomically) and empty the log.
    fn compact(&mut self, state: &ClusterState) -> Result<(), CoordinatorError> {
        let snapshot_path = self.dir.join(SNAPSHOT_FILE);
        let temporary = self.dir.join(format!("{SNAPSHOT_FILE}.tmp"));
        let bytes = serde_json::to_vec_pretty(state)
            .map_err(|error| CoordinatorError::Internal { message: format!("cannot serialise the state: {error}") })?;
        fs::write(&temporary, bytes).map_err(io_error("cannot write", &temporary))?;
        File::open(&temporary).and_then(|file| file.sync_all()).map_err(io_error("cannot sync", &temporary))?;
        fs::rename(&temporary, &snapshot_path).map_err(io_error("cannot replace", &snapshot_path))?;
        let log_path = self.dir.join(LOG_FILE);
        self.log.set_len(0).map_err(io_error("cannot truncate", &log_path))?;
        self.entries = 0;
        Ok(())
    }
}

/// Apply every entry of the log; returns the entry count and, if the last line is torn (a
/// crash mid-write), the length of the good prefix to truncate to.
fn replay(log_path: &Path, state: &mut ClusterState) -> Result<(u64, Option<u64>), CoordinatorError> {
    let file = match File::open(log_path) {
        Ok(file) => file,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok((0, None)),
        Err(error) => return Err(io_error("cannot open", log_path)(error)),
    };
    let mut reader = BufReader::new(file);
    let (mut entries, mut good_bytes) = (0u64, 0u64);
    let mut line = Vec::new();
    loop {
        line.clear();
        let read = reader.read_until(b'\n', &mut line).map_err(io_error("cannot read", log_path))?;
        if read == 0 {
            return Ok((entries, None));
        }
        let parsed = (line.last() == Some(&b'\n')).then(|| serde_json::from_slice::<LogEntry>(&line));
        match parsed {
            Some(Ok(entry)) if entry.version == STATE_VERSION => {
                state.apply(entry.command);
                entries += 1;
                good_bytes += read as u64;
            }
            Some(Ok(entry)) => {
                return Err(CoordinatorError::CorruptState {
                    path: log_path.to_path_buf(),
                    message: format!("entry {} has version {}, this build reads {STATE_VERSION}", entries + 1, entry.version),
                });
            }
            Some(Err(_)) | None => {
                let mut rest = Vec::new();
                std::io::Read::read_to_end(&mut reader, &mut rest).map_err(io_error("cannot read", log_path))?;
                if !rest.is_empty() {
                    return Err(CoordinatorError::CorruptState {
                        path: log_path.to_path_buf(),
                        message: format!("entry {} is unreadable and is not the last", entries + 1),
                    });
                }
                warn!(path = %log_path.display(), entries, "dropping a torn last log entry");
                return Ok((entries, Some(good_bytes)));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use stoker_common::proto::DatasetInfo;

    use super::*;

    fn dataset(name: &str) -> Command {
        Command::AddDataset {
            dataset: DatasetInfo { name: name.to_owned(), manifest: "/m.json".to_owned(), shard_counts: vec![1], version: 1 },
        }
    }

    #[test]
    fn a_reopened_store_has_the_same_state() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (mut store, mut state) = Store::open(dir.path()).expect("opens");
        store.commit(&mut state, dataset("a")).expect("commits");
        store.commit(&mut state, dataset("b")).expect("commits");
        drop(store);
        let (_, reopened) = Store::open(dir.path()).expect("reopens");
        assert_eq!(reopened, state);
    }

    #[test]
    fn a_torn_last_entry_is_dropped_and_the_rest_kept() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (mut store, mut state) = Store::open(dir.path()).expect("opens");
        store.commit(&mut state, dataset("a")).expect("commits");
        drop(store);
        let mut log = OpenOptions::new().append(true).open(dir.path().join(LOG_FILE)).expect("log");
        log.write_all(br#"{"version":1,"command":"add_da"#).expect("writes");
        let (mut store, mut reopened) = Store::open(dir.path()).expect("reopens");
        assert_eq!(reopened, state);
        store.commit(&mut reopened, dataset("b")).expect("commits after the torn entry");
        drop(store);
        let (_, again) = Store::open(dir.path()).expect("reopens");
        assert_eq!(again.datasets.len(), 2);
    }

    #[test]
    fn compaction_keeps_the_state() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (mut store, mut state) = Store::open(dir.path()).expect("opens");
        store.commit(&mut state, dataset("a")).expect("commits");
        store.files_opt.as_mut().expect("files").compact(&state).expect("compacts");
        store.commit(&mut state, dataset("b")).expect("commits");
        drop(store);
        let (_, reopened) = Store::open(dir.path()).expect("reopens");
        assert_eq!(reopened, state);
    }
}
