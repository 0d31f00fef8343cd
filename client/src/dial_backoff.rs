//! When a trainer may dial a worker's address again (pure: time and randomness are
//! parameters). The coordinator lists workers by id, and a worker certificate may register
//! several at one address, or at addresses where nothing listens; dialling each listed worker
//! once a second would make every trainer a flood against those addresses (issue 31, item 6).
//! So dials are counted per address: one at a time, and after each failure the next waits
//! twice as long (from 0.5 s up to 10 s), give or take half, so that trainers do not dial in
//! step.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// The wait after the first failed dial of an address.
const FIRST_DELAY: Duration = Duration::from_millis(500);
/// The longest wait between dials of an address.
const MAX_DELAY: Duration = Duration::from_secs(10);
/// How long a dial under way holds its address (a dial gives up well before).
const DIAL_HOLD: Duration = Duration::from_secs(30);

/// Dials by address.
#[derive(Debug, Default)]
pub(crate) struct DialBackoff {
    addresses: HashMap<SocketAddr, AddressDials>,
}

#[derive(Debug)]
struct AddressDials {
    failures: u32,
    /// No dial of the address starts before this.
    not_before: Instant,
}

impl DialBackoff {
    /// Whether a dial of `addr` may start at `now`; if so, it is counted as under way.
    pub(crate) fn start(&mut self, addr: SocketAddr, now: Instant) -> bool {
        match self.addresses.get_mut(&addr) {
            Some(dials) if dials.not_before > now => false,
            Some(dials) => {
                dials.not_before = now + DIAL_HOLD;
                true
            }
            None => {
                self.addresses.insert(addr, AddressDials { failures: 0, not_before: now + DIAL_HOLD });
                true
            }
        }
    }

    /// The dial of `addr` connected: the next may start at once.
    pub(crate) fn connected(&mut self, addr: SocketAddr) {
        self.addresses.remove(&addr);
    }

    /// The dial of `addr` failed at `now`: the next waits, `random` giving the jitter.
    pub(crate) fn failed(&mut self, addr: SocketAddr, now: Instant, random: u64) {
        let dials = self.addresses.entry(addr).or_insert(AddressDials { failures: 0, not_before: now });
        dials.failures = dials.failures.saturating_add(1);
        dials.not_before = now + delay(dials.failures, random);
    }
}

/// The wait after `failures` failed dials in a row: doubling from [`FIRST_DELAY`] up to
/// [`MAX_DELAY`], times a factor from 0.5 to 1.5 drawn from `random`.
fn delay(failures: u32, random: u64) -> Duration {
    let doubled = FIRST_DELAY.saturating_mul(1u32 << failures.saturating_sub(1).min(16)).min(MAX_DELAY);
    let factor = 0.5 + (random >> 11) as f64 / (1u64 << 53) as f64;
    doubled.mul_f64(factor)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wait_doubles_up_to_a_bound_with_jitter() {
        assert_eq!(delay(1, 1 << 63), FIRST_DELAY);
        assert_eq!(delay(2, 1 << 63), FIRST_DELAY * 2);
        assert_eq!(delay(40, 1 << 63), MAX_DELAY);
        assert_eq!(delay(1, 0), FIRST_DELAY / 2);
        assert!(delay(1, u64::MAX) <= FIRST_DELAY * 3 / 2 && delay(1, u64::MAX) > FIRST_DELAY * 14 / 10);
    }

    /// Issue 31, item 6: 100 workers registered at one address where nothing listens, listed
    /// to a trainer that would dial each listed worker every second for a minute (6,000 dials):
    /// one dial at a time per address, spaced out after failures, about 8 in all.
    #[test]
    fn fake_registrations_at_one_address_do_not_multiply_dials() {
        let start = Instant::now();
        let addr: SocketAddr = "10.0.0.1:7500".parse().expect("addr");
        let mut backoff = DialBackoff::default();
        let mut dials = 0;
        let mut random = 0x9e37_79b9_7f4a_7c15_u64;
        for second in 0..60 {
            let now = start + Duration::from_secs(second);
            for _worker in 0..100 {
                if backoff.start(addr, now) {
                    dials += 1;
                    random = random.rotate_left(17).wrapping_mul(0x2545_f491_4f6c_dd1d);
                    // Nothing listens: the dial fails a moment later.
                    backoff.failed(addr, now + Duration::from_millis(100), random);
                }
            }
        }
        assert!(dials <= 12, "{dials} dials of one address in a minute");
        // Another address is not held back, and a connection clears the wait.
        let other: SocketAddr = "10.0.0.2:7500".parse().expect("addr");
        assert!(backoff.start(other, start));
        assert!(!backoff.start(other, start), "one dial at a time");
        backoff.connected(other);
        assert!(backoff.start(other, start));
    }
}
