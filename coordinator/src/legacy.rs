//! The data directory of earlier versions (a single-node store: `state.json` plus a JSON-lines
//! log of [`Command`]s, `commands.jsonl`), read once to import its state into the Raft store.

use std::fs::{self, File};
use std::io::{BufRead, BufReader};
use std::path::Path;

use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use crate::error::CoordinatorError;
use crate::state::{ClusterState, Command, STATE_VERSION};

const LOG_FILE: &str = "commands.jsonl";
const SNAPSHOT_FILE: &str = "state.json";

#[derive(Serialize, Deserialize)]
struct LogEntry {
    version: u32,
    #[serde(flatten)]
    command: Command,
}

fn io_error<'a>(action: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> CoordinatorError + 'a {
    move |source| CoordinatorError::Storage { action, path: path.to_path_buf(), source }
}

/// The state a data directory of the single-node store holds, if it has one.
pub fn load(dir: &Path) -> Result<Option<ClusterState>, CoordinatorError> {
    let snapshot_path = dir.join(SNAPSHOT_FILE);
    let log_path = dir.join(LOG_FILE);
    if !snapshot_path.exists() && !log_path.exists() {
        return Ok(None);
    }
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
    let (entries, _) = replay(&log_path, &mut state)?;
    info!(dir = %dir.display(), datasets = state.datasets.len(), jobs = state.jobs.len(), entries, "found a single-node store to import");
    Ok(Some(state))
}

/// Rename the single-node store's files once their state is in the Raft store, so that they
/// are never imported twice (and are kept, in case).
pub fn retire(dir: &Path) -> Result<(), CoordinatorError> {
    for name in [SNAPSHOT_FILE, LOG_FILE] {
        let path = dir.join(name);
        if path.exists() {
            let retired = dir.join(format!("{name}.imported"));
            fs::rename(&path, &retired).map_err(io_error("cannot rename", &path))?;
        }
    }
    Ok(())
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
    use std::io::Write;

    use stoker_proto::DatasetInfo;

    use super::*;

    fn line(name: &str) -> String {
        let command = Command::AddDataset {
            dataset: DatasetInfo { name: name.to_owned(), manifest: "/m.json".to_owned(), shard_counts: vec![1], version: 1 },
            max_state_bytes: None,
        };
        let mut line = serde_json::to_string(&LogEntry { version: STATE_VERSION, command }).expect("serialises");
        line.push('\n');
        line
    }

    #[test]
    fn a_directory_without_the_old_files_has_nothing_to_import() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert_eq!(load(dir.path()).expect("loads"), None);
    }

    #[test]
    fn the_old_log_is_imported_without_its_torn_last_entry_and_retired() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut log = File::create(dir.path().join(LOG_FILE)).expect("log");
        log.write_all(format!("{}{}", line("a"), line("b")).as_bytes()).expect("writes");
        log.write_all(br#"{"version":1,"command":"add_da"#).expect("writes");
        let state = load(dir.path()).expect("loads").expect("a state");
        assert_eq!(state.datasets.keys().collect::<Vec<_>>(), ["a", "b"]);
        retire(dir.path()).expect("retires");
        assert_eq!(load(dir.path()).expect("loads"), None, "imported once only");
        assert!(dir.path().join("commands.jsonl.imported").exists());
    }

    #[test]
    fn an_unreadable_entry_before_the_last_is_an_error_naming_the_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        fs::write(dir.path().join(LOG_FILE), format!("garbage\n{}", line("a"))).expect("writes");
        let error = load(dir.path()).expect_err("refused");
        assert!(error.to_string().contains("commands.jsonl"), "{error}");
    }
}
