//! What the pure core may not read itself, read here: the OS's randomness (an [`IdSource`]).

use stoker_coordinator_core::IdSource;
use stoker_net::random::random_u64;

/// Ids from the OS's randomness: a peer cannot guess another's lease or session.
#[derive(Clone, Copy, Debug, Default)]
pub struct OsIds;

impl IdSource for OsIds {
    fn next_u64(&mut self) -> u64 {
        random_u64()
    }
}
