use std::sync::Arc;

use openraft::StorageError;
use openraft::testing::{StoreBuilder, Suite};

use super::*;

struct Builder;

impl StoreBuilder<TypeConfig, LogStore, StateMachine, tempfile::TempDir> for Builder {
    async fn build(&self) -> Result<(tempfile::TempDir, LogStore, StateMachine), StorageError<u64>> {
        let dir = tempfile::tempdir().map_err(|error| openraft::StorageIOError::write(&error))?;
        let file = StoreFile::open(dir.path()).map_err(|error| openraft::StorageIOError::write(&error))?;
        let machine =
            StateMachine::open(file.clone(), Arc::new(PlainReplica::default())).map_err(|error| openraft::StorageIOError::write(&error))?;
        Ok((dir, LogStore::new(file), machine))
    }
}

/// STYLE G12 tier 2: openraft's storage conformance suite on the redb store.
#[test]
fn the_store_passes_openrafts_storage_suite() {
    Suite::test_all(Builder).unwrap_or_else(|error| panic!("{error}"));
}

/// Issue 31, item 4: an entry carrying `Import` replaces the whole state only on a single node
/// at its first start; on a cluster of several members it is refused and the state stays.
#[test]
fn import_applies_only_on_a_single_node_at_first_start() {
    use std::collections::{BTreeMap, BTreeSet};

    use openraft::storage::RaftStateMachine;
    use openraft::{BasicNode, CommittedLeaderId, Entry, EntryPayload, LogId, Membership};

    use crate::state::{Applied, ClusterState, Command};

    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let mut imported = ClusterState::new();
    imported.next_job = 42;
    let import = |index: u64| Entry::<TypeConfig> {
        log_id: LogId::new(CommittedLeaderId::new(1, 1), index),
        payload: EntryPayload::Normal(Command::Import { state: Box::new(imported.clone()) }),
    };
    let membership = |voters: &[u64], learners: &[u64]| {
        let nodes: BTreeMap<u64, BasicNode> = voters.iter().chain(learners).map(|id| (*id, BasicNode::new(format!("n{id}")))).collect();
        Entry::<TypeConfig> {
            log_id: LogId::new(CommittedLeaderId::new(1, 1), 1),
            payload: EntryPayload::Membership(Membership::new(vec![voters.iter().copied().collect::<BTreeSet<_>>()], nodes)),
        }
    };
    let run = |entries: Vec<Entry<TypeConfig>>| {
        runtime.block_on(async {
            let dir = tempfile::tempdir().expect("dir");
            let file = StoreFile::open(dir.path()).expect("store");
            let replica = Arc::new(PlainReplica::default());
            let mut machine = StateMachine::open(file, replica.clone()).expect("machine");
            let applied = machine.apply(entries).await.expect("apply");
            (applied.last().cloned(), replica.snapshot())
        })
    };

    let (applied, state) = run(vec![membership(&[1], &[]), import(2)]);
    assert_eq!(applied, Some(Applied::Done));
    assert_eq!(state.next_job, 42, "a single node at its first start imports");

    for (voters, learners) in [(&[1u64, 2, 3][..], &[][..]), (&[1][..], &[2][..])] {
        let (applied, state) = run(vec![membership(voters, learners), import(2)]);
        assert!(matches!(applied, Some(Applied::Refused(_))), "{voters:?} {learners:?}: {applied:?}");
        assert_eq!(state, ClusterState::new(), "{voters:?} {learners:?}: the state is left as it was");
    }

    let (applied, state) = run(vec![membership(&[1], &[]), import(2), import(3)]);
    assert!(matches!(applied, Some(Applied::Refused(_))), "a second import: {applied:?}");
    assert_eq!(state.next_job, 42);
}

/// Issue 31, item 2: over a history of N entries each adding a session record (160 B) to the
/// state, the snapshots written take bytes linear in N; a snapshot every 1,000 entries took
/// N² / 1,000.
#[test]
fn snapshots_cost_bytes_linear_in_the_history() {
    const ENTRIES: u64 = 200_000;
    const GROWTH: u64 = 160;
    let written = |due: &dyn Fn(u64, u64) -> bool| {
        let (mut since, mut last, mut written, mut snapshots) = (0, 0, 0, 0u64);
        for entry in 1..=ENTRIES {
            since += 1;
            if due(since, last) {
                last = entry * GROWTH;
                written += last;
                since = 0;
                snapshots += 1;
            }
        }
        (written, snapshots)
    };
    let (ours, ours_count) = written(&snapshot_due);
    let (every_1000, every_count) = written(&|since, _| since >= SNAPSHOT_EVERY);
    eprintln!("{ENTRIES} entries: {ours} snapshot bytes in {ours_count} snapshots; every 1,000 entries: {every_1000} in {every_count}");
    assert!(ours <= 2 * ENTRIES * GROWTH, "{ours} bytes of snapshots for {} bytes of state", ENTRIES * GROWTH);
    assert!(every_1000 > 20 * ours, "the old policy wrote {every_1000}, this one {ours}");
    assert!(snapshot_due(SNAPSHOT_EVERY, 0) && !snapshot_due(SNAPSHOT_EVERY - 1, 0), "at least 1,000 entries apart");
    assert!(!snapshot_due(SNAPSHOT_EVERY, 1 << 30) && snapshot_due((1 << 30) / SNAPSHOT_BYTES_PER_ENTRY, 1 << 30));
}
