//! A keyed pseudo-random permutation of `0..n` evaluated one index at a time, in O(1) memory.
//!
//! This is how the planner shuffles without ever materialising a permutation (DESIGN §4: a
//! billion-sample dataset plans in memory proportional to one window). It is a balanced Feistel
//! network over the smallest even-bit power-of-two domain `>= n`, made a permutation of exactly
//! `0..n` by cycle walking (Black & Rogaway, "Ciphers with Arbitrary Finite Domains", 2002):
//! re-encrypt until the value falls inside `0..n`. For n ≥ 256 the domain is less than `4n`, so the expected
//! number of walks is below 4 (below 256/n for tiny n), and the walk always ends because the cycle through a value
//! `< n` returns to a value `< n`.
//!
//! Pinned: 8 rounds, halves of at least 4 bits; round `r` computes `mix64(right ^ round_key[r]) & half_mask` with
//! `round_key[r] = mix64(key + r * GAMMA)`. Part of the plan contract; golden-tested.

use super::prng::mix64;

const ROUNDS: usize = 8;
/// Smallest half width: a domain of at least 256 values.
const MIN_HALF_BITS: u32 = 4;
const ROUND_KEY_STEP: u64 = 0x9E37_79B9_7F4A_7C15;

/// A bijection of `0..len`, chosen by `key`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Permutation {
    len: u64,
    half_bits: u32,
    round_keys: [u64; ROUNDS],
}

impl Permutation {
    /// The permutation of `0..len` selected by `key`.
    pub fn new(len: u64, key: u64) -> Self {
        // Smallest b with 2^b >= len, rounded up to an even number, at least 8: tiny domains
        // have too few round functions to mix (a 4-element Feistel domain leaves most elements
        // in place), and walking a larger domain's permutation induces a uniform one on 0..len.
        let bits = if len <= 1 { 0 } else { 64 - (len - 1).leading_zeros() };
        let half_bits = bits.div_ceil(2).max(MIN_HALF_BITS);
        let mut round_keys = [0u64; ROUNDS];
        for (round, round_key) in round_keys.iter_mut().enumerate() {
            *round_key = mix64(key.wrapping_add((round as u64 + 1).wrapping_mul(ROUND_KEY_STEP)));
        }
        Self { len, half_bits, round_keys }
    }

    /// Number of elements permuted.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// True when the permutation is over an empty range.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Where `index` goes. `index` must be `< len`.
    pub fn apply(&self, index: u64) -> u64 {
        debug_assert!(index < self.len, "permutation index {index} out of 0..{}", self.len);
        if self.len <= 1 {
            return index;
        }
        let mut value = index;
        loop {
            value = self.encrypt(value);
            if value < self.len {
                return value;
            }
        }
    }

    fn encrypt(&self, value: u64) -> u64 {
        let half_mask = (1u64 << self.half_bits) - 1;
        let mut left = value >> self.half_bits;
        let mut right = value & half_mask;
        for round_key in self.round_keys {
            let next_right = left ^ (mix64(right ^ round_key) & half_mask);
            left = right;
            right = next_right;
        }
        (left << self.half_bits) | right
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn is_bijection(permutation: &Permutation) -> bool {
        let len = permutation.len() as usize;
        let mut seen = vec![false; len];
        for index in 0..permutation.len() {
            let image = permutation.apply(index) as usize;
            if image >= len || seen[image] {
                return false;
            }
            seen[image] = true;
        }
        true
    }

    proptest! {
        #[test]
        fn every_length_and_key_gives_a_bijection(len in 0u64..3000, key in any::<u64>()) {
            prop_assert!(is_bijection(&Permutation::new(len, key)));
        }
    }

    #[test]
    fn small_and_power_of_two_lengths_are_bijections() {
        for len in [0, 1, 2, 3, 4, 5, 15, 16, 17, 255, 256, 257, 1024] {
            assert!(is_bijection(&Permutation::new(len, 77)), "len {len}");
        }
    }

    /// Small lengths shuffle too: over many keys, each element lands in each place about
    /// equally often (a chi-square bound far looser than any real bias would pass).
    #[test]
    fn small_lengths_are_close_to_uniform() {
        for len in [2u64, 3, 4, 10] {
            let keys = 4000u64;
            let mut counts = vec![0u64; (len * len) as usize];
            for key in 0..keys {
                let permutation = Permutation::new(len, key);
                for index in 0..len {
                    counts[(index * len + permutation.apply(index)) as usize] += 1;
                }
            }
            let expected = keys as f64 / len as f64;
            let chi_square: f64 = counts.iter().map(|&count| (count as f64 - expected).powi(2) / expected).sum();
            let degrees = ((len - 1) * (len - 1)) as f64;
            assert!(chi_square < 3.0 * degrees + 30.0, "len {len}: chi-square {chi_square:.1} for {degrees} degrees");
        }
    }

    #[test]
    fn different_keys_give_different_orders() {
        let first: Vec<u64> = (0..100).map(|index| Permutation::new(100, 1).apply(index)).collect();
        let second: Vec<u64> = (0..100).map(|index| Permutation::new(100, 2).apply(index)).collect();
        assert_ne!(first, second);
    }

    #[test]
    fn permutation_moves_most_elements() {
        let permutation = Permutation::new(10_000, 3);
        let fixed_points = (0..10_000).filter(|&index| permutation.apply(index) == index).count();
        // A uniform random permutation has on average one fixed point.
        assert!(fixed_points < 10, "{fixed_points} fixed points");
    }

    /// Golden values: the contract. If this fails, every shuffled epoch changed.
    #[test]
    fn permutation_is_pinned() {
        let permutation = Permutation::new(10, 12_345);
        let order: Vec<u64> = (0..10).map(|index| permutation.apply(index)).collect();
        assert_eq!(order, GOLDEN_10_KEY_12345);
        let large = Permutation::new(1_000_000_007, 9);
        assert_eq!([large.apply(0), large.apply(1), large.apply(1_000_000_006)], GOLDEN_LARGE);
    }

    const GOLDEN_10_KEY_12345: [u64; 10] = [5, 4, 7, 9, 1, 2, 8, 6, 3, 0];
    const GOLDEN_LARGE: [u64; 3] = [853_837_115, 487_425_760, 129_998_360];
}
