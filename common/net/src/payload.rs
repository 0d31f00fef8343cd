//! Batch payload buffers that go back to a pool when the trainer drops them.
//!
//! A batch is tens of megabytes. In a fresh allocation (glibc maps anything this large with
//! `mmap`) every 4 KiB page faults on its first write and the whole mapping is unmapped again
//! when the batch is freed; on the receive side that costs about as much CPU as QUIC itself
//! (BENCHMARKS.md, "QUIC delivery"). A [`PayloadPool`] keeps a few freed buffers and hands
//! them to the next batches, so in steady state no payload memory is mapped, faulted or
//! unmapped.

use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Mutex, PoisonError, Weak};

/// Freed payload buffers, at most `keep` of them.
#[derive(Clone, Debug)]
pub struct PayloadPool {
    inner: Arc<PoolInner>,
}

#[derive(Debug)]
struct PoolInner {
    free: Mutex<Vec<Vec<u8>>>,
    keep: usize,
}

impl PayloadPool {
    /// A pool that keeps up to `keep` freed buffers (0 keeps none: every payload is a fresh
    /// allocation, as without a pool).
    pub fn new(keep: usize) -> Self {
        Self { inner: Arc::new(PoolInner { free: Mutex::new(Vec::with_capacity(keep)), keep }) }
    }

    /// A buffer of `len` bytes: a freed one large enough if there is one, else a new zeroed
    /// one. Its contents are unspecified; the caller overwrites all of it.
    pub fn take(&self, len: usize) -> Payload {
        let reused_opt = {
            let mut free = self.inner.free.lock().unwrap_or_else(PoisonError::into_inner);
            // The smallest buffer that fits, so one short final batch does not pin a big one.
            let best_opt = free.iter().enumerate().filter(|(_, bytes)| bytes.len() >= len).min_by_key(|(_, bytes)| bytes.len());
            best_opt.map(|(index, _)| index).map(|index| free.swap_remove(index))
        };
        let bytes = reused_opt.unwrap_or_else(|| vec![0u8; len]);
        Payload { bytes, len, home: Arc::downgrade(&self.inner) }
    }

    /// Buffers waiting to be reused.
    pub fn free_buffers(&self) -> usize {
        self.inner.free.lock().unwrap_or_else(PoisonError::into_inner).len()
    }
}

/// One batch's bytes. Dropping it returns the buffer to its pool (if the pool still exists
/// and has room).
#[derive(Debug)]
pub struct Payload {
    bytes: Vec<u8>,
    len: usize,
    home: Weak<PoolInner>,
}

impl Payload {
    /// A payload that belongs to no pool.
    pub fn from_vec(bytes: Vec<u8>) -> Self {
        let len = bytes.len();
        Self { bytes, len, home: Weak::new() }
    }
}

impl Deref for Payload {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

impl DerefMut for Payload {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.bytes[..self.len]
    }
}

impl Drop for Payload {
    fn drop(&mut self) {
        let Some(pool) = self.home.upgrade() else { return };
        let mut free = pool.free.lock().unwrap_or_else(PoisonError::into_inner);
        if free.len() < pool.keep {
            free.push(std::mem::take(&mut self.bytes));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dropped_payload_is_reused_for_the_next_one() {
        let pool = PayloadPool::new(2);
        let mut first = pool.take(1000);
        first.fill(7);
        let address = first.as_ptr();
        drop(first);
        assert_eq!(pool.free_buffers(), 1);
        let second = pool.take(600);
        assert_eq!(second.as_ptr(), address, "the freed buffer comes back");
        assert_eq!(second.len(), 600);
        assert_eq!(pool.free_buffers(), 0);
    }

    #[test]
    fn the_pool_keeps_no_more_than_asked_and_prefers_the_smallest_fit() {
        let pool = PayloadPool::new(2);
        let [small, large, extra] = [pool.take(100), pool.take(300), pool.take(200)];
        let (small_at, large_at) = (small.as_ptr(), large.as_ptr());
        drop((small, large, extra));
        assert_eq!(pool.free_buffers(), 2, "the third freed buffer is released");
        let fit = pool.take(90);
        assert_eq!((fit.as_ptr(), fit.len()), (small_at, 90), "the smallest buffer that fits");
        let big = pool.take(250);
        assert_eq!((big.as_ptr(), big.len()), (large_at, 250));
        assert_eq!(pool.free_buffers(), 0);
        let fresh = pool.take(5000);
        assert_eq!(fresh.len(), 5000, "nothing free: a new buffer");
    }

    #[test]
    fn payloads_outlive_their_pool() {
        let pool = PayloadPool::new(1);
        let payload = pool.take(10);
        drop(pool);
        assert_eq!(payload.len(), 10);
        drop(payload);
        assert_eq!(&*Payload::from_vec(vec![1, 2]), &[1, 2]);
    }
}
