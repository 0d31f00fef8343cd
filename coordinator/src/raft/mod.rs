//! Replication of the durable state with openraft (DESIGN §6): the type configuration, the
//! store in `--data-dir` (log, vote, snapshots in redb), the state machine that applies
//! [`Command`]s to the coordinator's state, and the transport over the control endpoint.

use std::io::Cursor;

use crate::state::{Applied, ClusterState, Command};

mod log_store;
mod network;
mod state_machine;
mod store_file;

pub use self::log_store::LogStore;
pub use self::network::{MAX_SNAPSHOT_BYTES, Network, RaftCodecError, answer_raft_rpc};
pub use self::state_machine::StateMachine;
pub use self::store_file::{STORE_FILE, StoreFile};

openraft::declare_raft_types!(
    /// Stoker's Raft types: commands in, what they did out, nodes named by their address.
    pub TypeConfig:
        D = Command,
        R = Applied,
        NodeId = u64,
        Node = openraft::BasicNode,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = Cursor<Vec<u8>>,
        AsyncRuntime = openraft::TokioRuntime,
);

/// A coordinator's Raft node.
pub type Raft = openraft::Raft<TypeConfig>;

/// What the state machine applies commands to: the coordinator's state. Applying must be
/// deterministic (every replica applies the same log) and quick (it runs on Raft's task).
pub trait Replica: Send + Sync + 'static {
    /// Apply one committed command.
    fn apply(&self, command: Command) -> Applied;
    /// A copy of the whole state, for a snapshot.
    fn snapshot(&self) -> ClusterState;
    /// Replace the whole state with a snapshot's.
    fn restore(&self, state: ClusterState);
}

/// A state alone (for the storage conformance suite and tools).
#[derive(Debug)]
pub struct PlainReplica(pub parking_lot::Mutex<ClusterState>);

impl Default for PlainReplica {
    fn default() -> Self {
        Self(parking_lot::Mutex::new(ClusterState::new()))
    }
}

impl PlainReplica {
    fn state(&self) -> parking_lot::MutexGuard<'_, ClusterState> {
        self.0.lock()
    }
}

impl Replica for PlainReplica {
    fn apply(&self, command: Command) -> Applied {
        self.state().apply(command)
    }

    fn snapshot(&self) -> ClusterState {
        self.state().clone()
    }

    fn restore(&self, state: ClusterState) {
        *self.state() = state;
    }
}

/// Raft timing and log bounds. Heartbeats every 100 ms and an election timeout of 0.3–0.6 s:
/// openraft 0.9's followers first wait out the leader's lease (the maximum timeout, 0.6 s), so
/// a dead leader is replaced 0.9–1.2 s after its last heartbeat (measured: 0.93–1.13 s).
/// Snapshots are not openraft's to time: the state machine asks for one when [`snapshot_due`]
/// says so (`StateMachine::snapshot_requests`), keeping 200 entries behind it for slow
/// followers.
pub fn raft_config(cluster: &str) -> openraft::Config {
    openraft::Config {
        cluster_name: cluster.to_owned(),
        heartbeat_interval: 100,
        election_timeout_min: 300,
        election_timeout_max: 600,
        install_snapshot_timeout: 2000,
        max_payload_entries: 64,
        snapshot_policy: openraft::SnapshotPolicy::Never,
        max_in_snapshot_log_to_keep: KEEP_BEHIND_SNAPSHOT,
        purge_batch_size: 64,
        snapshot_max_chunk_size: 1 << 20,
        ..openraft::Config::default()
    }
}

/// The fewest entries between snapshots.
pub const SNAPSHOT_EVERY: u64 = 1000;
/// Entries kept in the log behind a snapshot.
pub const KEEP_BEHIND_SNAPSHOT: u64 = 200;
/// Snapshot bytes each entry since the last snapshot pays for: a state of S bytes is written
/// again only after S / 128 entries.
pub const SNAPSHOT_BYTES_PER_ENTRY: u64 = 128;

/// Whether a snapshot is due after `entries` applied since the last one, which took
/// `snapshot_bytes`: after `max(SNAPSHOT_EVERY, snapshot_bytes / SNAPSHOT_BYTES_PER_ENTRY)`
/// entries. So the snapshots written over a history of N entries take at most
/// `N × SNAPSHOT_BYTES_PER_ENTRY` bytes plus one state for every `SNAPSHOT_EVERY` entries while
/// the state is under 128 KB: linear in N however large the state grew (a snapshot every 1,000
/// entries of a state that grows with them costs N² / 1,000), and the log between two
/// snapshots holds at most `max(1,000, S / 128)` entries.
pub fn snapshot_due(entries: u64, snapshot_bytes: u64) -> bool {
    entries >= SNAPSHOT_EVERY.max(snapshot_bytes / SNAPSHOT_BYTES_PER_ENTRY)
}

#[cfg(test)]
mod tests;
