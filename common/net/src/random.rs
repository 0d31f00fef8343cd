//! The one recipe for random ids and nonces (session ids, loader ids, certificate serials,
//! staging directory names): the operating system's source through ring.

use std::time::SystemTime;

use ring::rand::{SecureRandom, SystemRandom};

/// The operating system's random source failed (it fails only where nothing else would work).
#[derive(Debug, thiserror::Error)]
#[error("the operating system gave no randomness")]
pub struct NoRandomness;

/// Fill `bytes` from the operating system's random source.
pub fn fill(bytes: &mut [u8]) -> Result<(), NoRandomness> {
    SystemRandom::new().fill(bytes).map_err(|_| NoRandomness)
}

/// 64 random bits from the operating system (for ids a peer must not guess).
pub fn random_u64() -> u64 {
    let mut bytes = [0u8; 8];
    // The OS source fails only where nothing would work; then the clock at least varies.
    if fill(&mut bytes).is_err() {
        return SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(1, |elapsed| elapsed.as_nanos() as u64);
    }
    u64::from_le_bytes(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_ids_differ() {
        assert_ne!(random_u64(), random_u64());
    }
}
