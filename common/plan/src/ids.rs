//! Identifier newtypes. Bare integers are never passed where one of these is meant, so a
//! step cannot be handed to a function that wants a rank:
//!
//! ```compile_fail
//! use stoker_plan::ids::{Rank, Step};
//! fn wants_rank(_rank: Rank) {}
//! wants_rank(Step(3));
//! ```
//!
//! Nor can a step be taken for a sample position:
//!
//! ```compile_fail
//! use stoker_plan::ids::{Position, Step};
//! fn wants_position(_position: Position) {}
//! wants_position(Step(3));
//! ```

use std::fmt;

use serde::{Deserialize, Serialize};

macro_rules! id_newtype {
    ($(#[$doc:meta])* $name:ident($inner:ty), $prefix:literal) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(pub $inner);

        impl fmt::Display for $name {
            fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(formatter, concat!($prefix, "{}"), self.0)
            }
        }
    };
}

id_newtype!(
    /// Index of a shard in its manifest (manifest order, before any shuffle).
    ShardId(u32), "shard-"
);
id_newtype!(
    /// Training epoch number, as the trainer passes it to `set_epoch`.
    Epoch(u64), "epoch-"
);
id_newtype!(
    /// Step of one epoch (a step is one batch on every rank). Counted from 0.
    Step(u64), "step-"
);
id_newtype!(
    /// Data-parallel rank of a trainer process, `0..world_size`.
    Rank(u32), "rank-"
);
id_newtype!(
    /// Global position of a sample in an epoch's order (DESIGN §4): rank r's batch at step s
    /// of a run starting at `start` holds positions `start + s*W*B + r*B + i`. Not a step.
    Position(u64), "position-"
);

id_newtype!(
    /// A training job, numbered by the coordinator when its first trainer attaches.
    JobId(u64), "job-"
);
id_newtype!(
    /// A worker, numbered by the coordinator when it registers (again after a restart).
    WorkerId(u64), "worker-"
);
id_newtype!(
    /// One grant of a chunk to a worker; a chunk granted again gets a new lease.
    LeaseId(u64), "lease-"
);

id_newtype!(
    /// One attachment of a trainer to a rank of a job. A trainer that attaches again as the
    /// same rank (a restart) gets a new session, and the old one's requests are refused.
    SessionId(u64), "session-"
);
id_newtype!(
    /// One opening of a run by a trainer session, counted from 1 by the trainer. Every
    /// progress report names the pass it belongs to, so a report that arrives after the next
    /// opening (late, or sent again) is recognised as stale and ignored.
    Pass(u64), "pass-"
);

/// The SHA-256 of the public key of a peer's TLS certificate: who a worker or a trainer is, as
/// its certificate proves it. The coordinator records it when a worker registers and when a trainer attaches,
/// and hands it on, so a trainer only takes batches from the worker it was told of and a
/// worker only serves a rank's batches to the trainer that owns the rank's session.
/// [`CertKey::UNCHECKED`] where nothing is proven (`--insecure`).
///
/// It has no `Default`: a key is always one a peer proved or the explicit
/// [`CertKey::UNCHECKED`], never a value that appears when an owner is not known (issue 31,
/// item 7: an unknown owner refuses, it never admits).
///
/// ```compile_fail
/// let key: stoker_plan::ids::CertKey = Default::default();
/// ```
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct CertKey(pub [u8; 32]);

impl CertKey {
    /// No certificate: the peer runs `--insecure`. It matches only itself: under `--insecure`
    /// every peer is unchecked, so they match each other; a certified peer never matches it,
    /// and it never matches a certified peer.
    pub const UNCHECKED: Self = Self([0; 32]);

    /// Whether a peer proving `other` is the one this key names: the same key, nothing else.
    /// Where the owner is not known, callers hold no key at all (an `Option`), and refuse.
    pub fn admits(&self, other: &Self) -> bool {
        self == other
    }

    /// The key as 64 hex digits (as `stoker certs` prints it and the deny list holds it).
    pub fn hex(&self) -> String {
        self.0.iter().map(|byte| format!("{byte:02x}")).collect()
    }

    /// Parse 64 hex digits (colons between bytes allowed).
    pub fn from_hex(text: &str) -> Option<Self> {
        let digits: Vec<u8> = text.bytes().filter(|byte| *byte != b':').collect();
        if digits.len() != 64 {
            return None;
        }
        let mut key = [0u8; 32];
        for (byte, pair) in key.iter_mut().zip(digits.chunks(2)) {
            let text = std::str::from_utf8(pair).ok()?;
            *byte = u8::from_str_radix(text, 16).ok()?;
        }
        Some(Self(key))
    }
}

impl fmt::Debug for CertKey {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, formatter)
    }
}

impl fmt::Display for CertKey {
    /// The first 8 bytes, enough to tell certificates apart in a log.
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        if *self == Self::UNCHECKED { formatter.write_str("unchecked") } else { write!(formatter, "cert-{}", &self.hex()[..16]) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_display_with_their_kind() {
        assert_eq!(ShardId(7).to_string(), "shard-7");
        assert_eq!(Epoch(2).to_string(), "epoch-2");
        assert_eq!(Step(10).to_string(), "step-10");
        assert_eq!(Rank(3).to_string(), "rank-3");
        assert_eq!(JobId(1).to_string(), "job-1");
        assert_eq!(WorkerId(2).to_string(), "worker-2");
        assert_eq!(LeaseId(4).to_string(), "lease-4");
        assert_eq!(Position(9).to_string(), "position-9");
        assert_eq!(Pass(2).to_string(), "pass-2");
    }

    #[test]
    fn cert_keys_read_back_and_unchecked_admits_only_unchecked() {
        let key = CertKey([0xab; 32]);
        assert_eq!(CertKey::from_hex(&key.hex()), Some(key));
        assert_eq!(CertKey::from_hex("ab:cd"), None);
        assert_eq!(CertKey::from_hex(&"zz".repeat(32)), None);
        assert!(key.admits(&key));
        assert!(!key.admits(&CertKey([1; 32])));
        // Issue 31, item 7: "unchecked" is no wildcard; it matches only another unchecked peer
        // (both sides `--insecure`).
        assert!(!key.admits(&CertKey::UNCHECKED) && !CertKey::UNCHECKED.admits(&key));
        assert!(CertKey::UNCHECKED.admits(&CertKey::UNCHECKED));
        assert_eq!(key.to_string(), "cert-abababababababab");
    }

    #[test]
    fn ids_serialize_as_bare_numbers() {
        assert_eq!(serde_json::to_string(&Rank(3)).ok().as_deref(), Some("3"));
        let step: Step = serde_json::from_str("42").unwrap_or_default();
        assert_eq!(step, Step(42));
    }
}
