//! What the pure core may not read itself, read here: the OS's randomness (an [`IdSource`])
//! and the wall clock.

use std::time::{SystemTime, UNIX_EPOCH};

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

/// Milliseconds since 1970 by the wall clock (1 if the clock is before 1970).
pub fn wall_millis() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(1, |elapsed| elapsed.as_millis() as u64)
}
