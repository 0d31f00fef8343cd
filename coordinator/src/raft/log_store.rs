//! The Raft log and vote in `--data-dir/raft.redb` (redb: an embedded pure-Rust B-tree whose
//! commits are fsynced). Every append is one write transaction, committed before openraft is
//! told the entries are flushed, so an acknowledged write survives `kill -9` and power loss.
//! Calls run on tokio's blocking pool: the runtime threads never wait for the disk.

use std::fmt::Debug;
use std::ops::{Bound, RangeBounds};

use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{Entry, LogId, RaftLogReader, StorageError, StorageIOError, Vote};
use redb::ReadableTable;

use super::TypeConfig;
use super::store_file::{COMMITTED, LAST_PURGED, LOG, StoreFile, VOTE};

fn bounds(range: &impl RangeBounds<u64>) -> (Bound<u64>, Bound<u64>) {
    (range.start_bound().cloned(), range.end_bound().cloned())
}

/// The Raft log and vote.
#[derive(Clone, Debug)]
pub struct LogStore {
    file: StoreFile,
}

impl LogStore {
    /// The log of `file`.
    pub fn new(file: StoreFile) -> Self {
        Self { file }
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + Send>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry<TypeConfig>>, StorageError<u64>> {
        let (start, end) = bounds(&range);
        self.file.blocking(move |file| file.entries(start, end)).await.map_err(|error| StorageIOError::read_logs(&error).into())
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError<u64>> {
        let read = self.file.blocking(|file| {
            let last_purged: Option<LogId<u64>> = file.get_meta(LAST_PURGED)?;
            let last = file.read(|txn| Ok(txn.open_table(LOG)?.last()?.map(|(_, bytes)| bytes.value().to_vec())))?;
            let last_log_id = match last {
                Some(bytes) => Some(
                    serde_json::from_slice::<Entry<TypeConfig>>(&bytes)
                        .map_err(|error| file.error(format!("the last log entry is unreadable: {error}")))?
                        .log_id,
                ),
                None => last_purged,
            };
            Ok(LogState { last_purged_log_id: last_purged, last_log_id })
        });
        read.await.map_err(|error| StorageIOError::read_logs(&error).into())
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<u64>) -> Result<(), StorageError<u64>> {
        let vote = *vote;
        self.file.blocking(move |file| file.put_meta(VOTE, &vote)).await.map_err(|error| StorageIOError::write_vote(&error).into())
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<u64>>, StorageError<u64>> {
        self.file.blocking(|file| file.get_meta(VOTE)).await.map_err(|error| StorageIOError::read_vote(&error).into())
    }

    async fn save_committed(&mut self, committed: Option<LogId<u64>>) -> Result<(), StorageError<u64>> {
        // A hint that lets a restart apply committed entries before an election: written
        // without its own fsync (the next append's fsync carries it). Lost, it costs nothing
        // but that head start.
        let saved = self.file.blocking(move |file| file.put_meta_lazily(COMMITTED, &committed));
        saved.await.map_err(|error| StorageIOError::write(&error).into())
    }

    async fn read_committed(&mut self) -> Result<Option<LogId<u64>>, StorageError<u64>> {
        let read = self.file.blocking(|file| file.get_meta::<Option<LogId<u64>>>(COMMITTED));
        read.await.map(Option::flatten).map_err(|error| StorageIOError::read(&error).into())
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> Result<(), StorageError<u64>>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + Send,
        I::IntoIter: Send,
    {
        let encoded = entries
            .into_iter()
            .map(|entry| serde_json::to_vec(&entry).map(|bytes| (entry.log_id.index, bytes)))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|error| StorageIOError::write_logs(&error))?;
        let written = self
            .file
            .blocking(move |file| {
                file.write(|txn| {
                    let mut table = txn.open_table(LOG)?;
                    for (index, bytes) in &encoded {
                        table.insert(*index, bytes.as_slice())?;
                    }
                    Ok(())
                })
            })
            .await;
        match written {
            Ok(()) => {
                callback.log_io_completed(Ok(()));
                Ok(())
            }
            Err(error) => {
                callback.log_io_completed(Err(std::io::Error::other(error.to_string())));
                Err(StorageIOError::write_logs(&error).into())
            }
        }
    }

    async fn truncate(&mut self, log_id: LogId<u64>) -> Result<(), StorageError<u64>> {
        let from = log_id.index;
        self.file
            .blocking(move |file| file.write(|txn| remove_range(txn, from..)))
            .await
            .map_err(|error| StorageIOError::write_logs(&error).into())
    }

    async fn purge(&mut self, log_id: LogId<u64>) -> Result<(), StorageError<u64>> {
        let purged = self.file.blocking(move |file| {
            file.put_meta(LAST_PURGED, &log_id)?;
            file.write(|txn| remove_range(txn, ..=log_id.index))
        });
        purged.await.map_err(|error| StorageIOError::write_logs(&error).into())
    }
}

fn remove_range(txn: &redb::WriteTransaction, range: impl RangeBounds<u64>) -> Result<(), redb::Error> {
    let mut table = txn.open_table(LOG)?;
    let keys: Vec<u64> = table.range::<u64>(bounds(&range))?.map(|item| item.map(|(key, _)| key.value())).collect::<Result<_, _>>()?;
    for key in keys {
        table.remove(key)?;
    }
    Ok(())
}
