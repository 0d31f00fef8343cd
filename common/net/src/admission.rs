//! Which connections a node takes (DESIGN §10): at most a total number at once, and at most a
//! number from one IP address, counted from the first packet (handshakes in progress count)
//! and decided before the handshake, so a flood costs one refusal packet per attempt and no
//! cryptography. The coordinator and the workers' batch ports use it.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tracing::warn;

/// How often at most a refusal is logged (each is counted in the metrics).
const WARN_EVERY: Duration = Duration::from_secs(10);

/// [`Admission`]'s total by default (`--max-connections`).
pub const DEFAULT_MAX_CONNECTIONS: usize = 4_096;
/// [`Admission`]'s limit per address by default (`--max-connections-per-address`): a host of
/// 8 trainers and a worker uses about 10 (each process one, plus one while it reconnects).
pub const DEFAULT_MAX_CONNECTIONS_PER_ADDRESS: usize = 256;

/// Connections open now, by address.
#[derive(Debug)]
pub struct Admission {
    total: usize,
    per_address: usize,
    /// What the limits are called in a refusal: the total's and the per-address one's.
    names: (&'static str, &'static str),
    open: Mutex<Open>,
}

#[derive(Debug, Default)]
struct Open {
    total: usize,
    by_address: HashMap<IpAddr, usize>,
    warned_opt: Option<Instant>,
}

/// A connection taken; it counts until this is dropped.
#[derive(Debug)]
pub struct Admitted {
    admission: Arc<Admission>,
    address: IpAddr,
}

impl Admission {
    /// At most `total` connections, `per_address` from one address.
    pub fn new(total: usize, per_address: usize) -> Arc<Self> {
        Self::named(total, per_address, ("--max-connections", "--max-connections-per-address"))
    }

    /// At most `total` of something at once, `per_address` from one address, the limits
    /// called `names` in a refusal (bulk handshakes in progress, say).
    pub fn named(total: usize, per_address: usize, names: (&'static str, &'static str)) -> Arc<Self> {
        Arc::new(Self { total, per_address, names, open: Mutex::new(Open::default()) })
    }

    /// Take a connection from `address`, or say which limit it is over. IPv6 addresses count
    /// by their /64 (one host may hold a whole one).
    pub fn admit(self: &Arc<Self>, address: IpAddr) -> Result<Admitted, String> {
        let address = counted_as(address);
        let mut open = self.open.lock();
        let from_address = open.by_address.get(&address).copied().unwrap_or(0);
        let refusal_opt = if open.total >= self.total {
            Some(format!("{} connections are open, the limit ({} {})", open.total, self.names.0, self.total))
        } else if from_address >= self.per_address {
            Some(format!("{from_address} connections from {address} are open, the limit ({} {})", self.names.1, self.per_address))
        } else {
            None
        };
        if let Some(refusal) = refusal_opt {
            let now = Instant::now();
            if open.warned_opt.is_none_or(|warned| now.duration_since(warned) >= WARN_EVERY) {
                open.warned_opt = Some(now);
                warn!(%address, "refusing connections: {refusal} (logged at most every {WARN_EVERY:?}; all are counted)");
            }
            return Err(refusal);
        }
        open.total += 1;
        *open.by_address.entry(address).or_default() += 1;
        Ok(Admitted { admission: Arc::clone(self), address })
    }
}

/// The address a connection counts under: IPv4 as it is (also when mapped into IPv6), IPv6
/// by its /64 prefix.
fn counted_as(address: IpAddr) -> IpAddr {
    match address {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(std::net::Ipv6Addr::from(u128::from(v6) & !((1u128 << 64) - 1))),
        },
        v4 => v4,
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let mut open = self.admission.open.lock();
        open.total = open.total.saturating_sub(1);
        if let Some(count) = open.by_address.get_mut(&self.address) {
            *count -= 1;
            if *count == 0 {
                open.by_address.remove(&self.address);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;

    #[test]
    fn connections_are_limited_in_total_and_per_address_until_they_close() {
        let admission = Admission::new(3, 2);
        let (a, b, c) = (IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)), IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2)), IpAddr::V4(Ipv4Addr::LOCALHOST));
        let first = admission.admit(a).expect("first");
        let _second = admission.admit(a).expect("second");
        let refusal = admission.admit(a).expect_err("a third from one address");
        assert!(refusal.contains("--max-connections-per-address 2"), "{refusal}");
        let _other = admission.admit(b).expect("another address");
        let refusal = admission.admit(c).expect_err("over the total");
        assert!(refusal.contains("--max-connections 3"), "{refusal}");
        drop(first);
        assert!(admission.admit(a).is_ok(), "a closed connection frees its place");
        let v6 = Admission::new(10, 1);
        let (one, other): (IpAddr, IpAddr) = ("2001:db8::1".parse().expect("v6"), "2001:db8::ffff:1".parse().expect("v6"));
        let _held = v6.admit(one).expect("first of the /64");
        assert!(v6.admit(other).is_err(), "another address of the same /64 counts with it");
        assert!(v6.admit("2001:db8:0:1::1".parse().expect("v6")).is_ok(), "another /64 does not");
    }
}
