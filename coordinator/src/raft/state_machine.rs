//! The Raft state machine: committed entries applied to the coordinator's state through
//! [`Replica`], and snapshots of that state kept in the store file. The state itself is not
//! written per entry: on start it is the last snapshot plus the committed entries after it,
//! which openraft applies again. It also times snapshots ([`super::snapshot_due`]): it counts
//! the entries applied since the last one and asks for the next through
//! [`StateMachine::snapshot_requests`], which the node passes on to openraft.

use std::io::Cursor;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use openraft::storage::{RaftStateMachine, Snapshot};
use openraft::{
    BasicNode, Entry, EntryPayload, LogId, Membership, RaftSnapshotBuilder, SnapshotMeta, StorageError, StorageIOError, StoredMembership,
};
use serde::{Deserialize, Serialize};

use super::store_file::{FileError, SNAPSHOT, StoreFile};
use super::{Replica, TypeConfig};
use crate::error::CoordinatorError;
use crate::state::{Applied, ClusterState, Command};
use tracing::error;

#[derive(Serialize, Deserialize)]
struct StoredSnapshot {
    meta: SnapshotMeta<u64, BasicNode>,
    /// The state as JSON: the snapshot's bytes as sent to followers.
    data: Vec<u8>,
}

/// Applies committed commands to a [`Replica`].
pub struct StateMachine {
    file: StoreFile,
    replica: Arc<dyn Replica>,
    last_applied: Option<LogId<u64>>,
    membership: StoredMembership<u64, BasicNode>,
    snapshots_built: u64,
    /// Entries applied since the last snapshot was built or installed.
    entries_since_snapshot: u64,
    /// The bytes of the last snapshot (its builder writes them when done).
    snapshot_bytes: Arc<AtomicU64>,
    /// Told when a snapshot is due.
    snapshot_requests: Arc<tokio::sync::Notify>,
}

impl std::fmt::Debug for StateMachine {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("StateMachine").field("last_applied", &self.last_applied).finish_non_exhaustive()
    }
}

impl StateMachine {
    /// The state machine of `file` over `replica`, starting from the stored snapshot if any.
    pub fn open(file: StoreFile, replica: Arc<dyn Replica>) -> Result<Self, CoordinatorError> {
        let corrupt = |message: String| CoordinatorError::CorruptState { path: file.path().to_path_buf(), message };
        let stored: Option<StoredSnapshot> = file.get_meta(SNAPSHOT).map_err(|error| corrupt(error.to_string()))?;
        let mut machine = Self {
            file: file.clone(),
            replica,
            last_applied: None,
            membership: StoredMembership::default(),
            snapshots_built: 0,
            entries_since_snapshot: 0,
            snapshot_bytes: Arc::new(AtomicU64::new(0)),
            snapshot_requests: Arc::new(tokio::sync::Notify::new()),
        };
        if let Some(stored) = stored {
            machine.snapshot_bytes.store(stored.data.len() as u64, Ordering::Relaxed);
            let state = decode_state(&stored.data).map_err(corrupt)?;
            machine.replica.restore(state);
            machine.last_applied = stored.meta.last_log_id;
            machine.membership = stored.meta.last_membership;
        }
        Ok(machine)
    }

    /// Notified whenever a snapshot is due: the node answers with `raft.trigger().snapshot()`
    /// (openraft's own policy is `Never`).
    pub fn snapshot_requests(&self) -> Arc<tokio::sync::Notify> {
        Arc::clone(&self.snapshot_requests)
    }
}

fn decode_state(bytes: &[u8]) -> Result<ClusterState, String> {
    let state: ClusterState = serde_json::from_slice(bytes).map_err(|error| format!("the snapshot is unreadable: {error}"))?;
    if state.version != crate::state::STATE_VERSION {
        return Err(format!("the snapshot has state version {}, this build reads {}", state.version, crate::state::STATE_VERSION));
    }
    Ok(state)
}

/// Why an `Import` (which replaces the whole state) may not be applied, if it may not. It is
/// the import of an earlier version's single-node store, proposed once by a node that starts
/// alone: it applies only while the cluster is that one voter with no learner and nothing was
/// committed to the state yet. Elsewhere a member could replace the whole state through one
/// entry. Decided from the log alone (the membership applied before the entry, and the state),
/// so every replica decides alike.
pub(crate) fn import_refused(membership: &Membership<u64, BasicNode>, state: &ClusterState) -> Option<String> {
    let voters: Vec<u64> = membership.voter_ids().collect();
    let learners = membership.learner_ids().count();
    if voters.len() != 1 || learners != 0 {
        return Some(format!(
            "an Import applies only on a single-node cluster at its first start; this one has voters {voters:?} and {learners} learner(s)"
        ));
    }
    if *state != ClusterState::new() {
        return Some("an Import applies only at a cluster's first start; this state holds committed data already".to_owned());
    }
    None
}

/// Builds a snapshot of the state as it was when the builder was made.
pub struct SnapshotBuilder {
    file: StoreFile,
    state: ClusterState,
    last_applied: Option<LogId<u64>>,
    membership: StoredMembership<u64, BasicNode>,
    seq: u64,
    /// Where the snapshot's size goes once built.
    snapshot_bytes: Arc<AtomicU64>,
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError<u64>> {
        let data = serde_json::to_vec(&self.state).map_err(|error| StorageIOError::write_snapshot(None, &error))?;
        let snapshot_id = match self.last_applied {
            Some(log_id) => format!("{}-{}-{}", log_id.leader_id.term, log_id.index, self.seq),
            None => format!("none-{}", self.seq),
        };
        let meta = SnapshotMeta { last_log_id: self.last_applied, last_membership: self.membership.clone(), snapshot_id };
        let stored = StoredSnapshot { meta: meta.clone(), data: data.clone() };
        let saved = self.file.blocking(move |file| file.put_meta(SNAPSHOT, &stored)).await;
        saved.map_err(|error| StorageIOError::write_snapshot(Some(meta.signature()), &error))?;
        self.snapshot_bytes.store(data.len() as u64, Ordering::Relaxed);
        Ok(Snapshot { meta, snapshot: Box::new(Cursor::new(data)) })
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotBuilder = SnapshotBuilder;

    async fn applied_state(&mut self) -> Result<(Option<LogId<u64>>, StoredMembership<u64, BasicNode>), StorageError<u64>> {
        Ok((self.last_applied, self.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<Applied>, StorageError<u64>>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + Send,
        I::IntoIter: Send,
    {
        let mut applied = Vec::new();
        for entry in entries {
            self.last_applied = Some(entry.log_id);
            applied.push(match entry.payload {
                EntryPayload::Blank => Applied::Done,
                EntryPayload::Normal(Command::Import { state }) => {
                    match import_refused(self.membership.membership(), &self.replica.snapshot()) {
                        None => self.replica.apply(Command::Import { state }),
                        Some(reason) => {
                            error!(entry = %entry.log_id, %reason, "refused an Import entry: the state is left as it was");
                            Applied::Refused(reason)
                        }
                    }
                }
                EntryPayload::Normal(command) => self.replica.apply(command),
                EntryPayload::Membership(membership) => {
                    self.membership = StoredMembership::new(Some(entry.log_id), membership);
                    Applied::Done
                }
            });
            self.entries_since_snapshot += 1;
        }
        if super::snapshot_due(self.entries_since_snapshot, self.snapshot_bytes.load(Ordering::Relaxed)) {
            self.snapshot_requests.notify_one();
        }
        Ok(applied)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.snapshots_built += 1;
        self.entries_since_snapshot = 0;
        SnapshotBuilder {
            file: self.file.clone(),
            state: self.replica.snapshot(),
            last_applied: self.last_applied,
            membership: self.membership.clone(),
            seq: self.snapshots_built,
            snapshot_bytes: Arc::clone(&self.snapshot_bytes),
        }
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<Cursor<Vec<u8>>>, StorageError<u64>> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<u64, BasicNode>,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError<u64>> {
        let data = snapshot.into_inner();
        let state =
            decode_state(&data).map_err(|message| StorageIOError::read_snapshot(Some(meta.signature()), &FileError::new(message)))?;
        let data_len = data.len() as u64;
        let stored = StoredSnapshot { meta: meta.clone(), data };
        let saved = self.file.blocking(move |file| file.put_meta(SNAPSHOT, &stored)).await;
        saved.map_err(|error| StorageIOError::write_snapshot(Some(meta.signature()), &error))?;
        self.snapshot_bytes.store(data_len, Ordering::Relaxed);
        self.entries_since_snapshot = 0;
        self.replica.restore(state);
        self.last_applied = meta.last_log_id;
        self.membership = meta.last_membership.clone();
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<TypeConfig>>, StorageError<u64>> {
        let stored: Option<StoredSnapshot> =
            self.file.blocking(|file| file.get_meta(SNAPSHOT)).await.map_err(|error| StorageIOError::read_snapshot(None, &error))?;
        Ok(stored.map(|stored| Snapshot { meta: stored.meta, snapshot: Box::new(Cursor::new(stored.data)) }))
    }
}
