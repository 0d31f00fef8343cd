//! Bounded waits (STYLE G13): every wait in a test polls a condition until a deadline, never a
//! bare sleep.

use std::time::{Duration, Instant};

use crate::TestkitError;

/// Poll `condition` every 20 ms until it holds or `timeout` passes.
pub fn wait_until(timeout: Duration, what: &str, condition: impl FnMut() -> bool) -> Result<(), TestkitError> {
    poll_until(timeout, Duration::from_millis(20), what, condition)
}

/// [`wait_until`] checking every `interval`: for states that last only milliseconds (a
/// worker holding a lease on a small chunk).
pub fn poll_until(timeout: Duration, interval: Duration, what: &str, mut condition: impl FnMut() -> bool) -> Result<(), TestkitError> {
    let deadline = Instant::now() + timeout;
    loop {
        if condition() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(format!("timed out after {timeout:?} waiting for: {what}"));
        }
        std::thread::park_timeout(interval);
    }
}
