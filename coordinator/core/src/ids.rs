//! Where the core's unpredictable ids come from (lease ids, the low bits of trainer sessions):
//! an injected [`IdSource`], so that the core reads no OS randomness. The coordinator draws
//! them from the OS; the protocol model and tests from a seeded or counting source, so that a
//! schedule replays the same.

use stoker_plan::prng::SplitMix64;

/// A source of unpredictable 64-bit numbers.
pub trait IdSource: Send {
    /// The next number.
    fn next_u64(&mut self) -> u64;
}

/// Numbers from a seeded PRNG: unpredictable enough for a simulation, and the same for the
/// same seed.
#[derive(Clone, Debug)]
pub struct SeededIds(SplitMix64);

impl SeededIds {
    /// Numbers seeded by `seed`.
    pub fn new(seed: u64) -> Self {
        Self(SplitMix64::new(seed))
    }
}

impl IdSource for SeededIds {
    fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }
}

/// Numbers counted up from a start (unit tests that want to read the ids).
#[derive(Clone, Debug)]
pub struct CountingIds(u64);

impl CountingIds {
    /// Numbers from `start` on.
    pub fn new(start: u64) -> Self {
        Self(start)
    }
}

impl IdSource for CountingIds {
    fn next_u64(&mut self) -> u64 {
        let next = self.0;
        self.0 = self.0.wrapping_add(1);
        next
    }
}
