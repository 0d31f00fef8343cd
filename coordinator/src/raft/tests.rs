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
