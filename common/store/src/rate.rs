//! Limits on what a process asks of a store: requests per second and body bytes per second
//! (`--s3-max-requests-per-second`, `--s3-max-bandwidth`), each a token bucket of one second's
//! worth. A request waits for a token before it is sent; a body piece takes its bytes after it
//! arrived, and the next read waits until they are paid for, so that TCP's flow control holds the
//! rate at the socket. The bucket is pure (time is passed in); [`Limiter`] waits on tokio's clock.

use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;

/// A token bucket: `rate` tokens a second, holding at most one second's worth.
#[derive(Debug)]
pub(crate) struct Bucket {
    rate: f64,
    /// Tokens held at `at`; negative when spent ahead (a piece larger than what was held).
    tokens: f64,
    at: Instant,
}

impl Bucket {
    /// Full at `now`.
    pub(crate) fn new(rate: u64, now: Instant) -> Self {
        let rate = rate.max(1) as f64;
        Self { rate, tokens: rate, at: now }
    }

    /// Take `amount` tokens at `now` (going into debt if needed); how long the taker must wait
    /// before the bucket is out of debt (zero if it is not in debt).
    pub(crate) fn take(&mut self, amount: u64, now: Instant) -> Duration {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.rate).min(self.rate);
        self.at = self.at.max(now);
        self.tokens -= amount as f64;
        if self.tokens >= 0.0 { Duration::ZERO } else { Duration::from_secs_f64(-self.tokens / self.rate) }
    }
}

/// Request and bandwidth limits shared by every request of one [`crate::ObjectStores`].
#[derive(Debug, Default)]
pub(crate) struct Limiter {
    requests_opt: Option<Mutex<Bucket>>,
    bytes_opt: Option<Mutex<Bucket>>,
}

impl Limiter {
    /// At most `requests_per_second` requests and `bytes_per_second` body bytes a second (`None`:
    /// no limit).
    pub(crate) fn new(requests_per_second: Option<u64>, bytes_per_second: Option<u64>) -> Self {
        let now = Instant::now();
        Self {
            requests_opt: requests_per_second.map(|rate| Mutex::new(Bucket::new(rate, now))),
            bytes_opt: bytes_per_second.map(|rate| Mutex::new(Bucket::new(rate, now))),
        }
    }

    /// Wait until one more request may be sent.
    pub(crate) async fn request(&self) {
        if let Some(bucket) = &self.requests_opt {
            let wait = bucket.lock().take(1, Instant::now());
            if !wait.is_zero() {
                tokio::time::sleep(wait).await;
            }
        }
    }

    /// Pay for `bytes` of body that arrived: wait until they are within the rate.
    pub(crate) async fn received(&self, bytes: usize) {
        if let Some(bucket) = &self.bytes_opt {
            let wait = bucket.lock().take(bytes as u64, Instant::now());
            if !wait.is_zero() {
                tokio::time::sleep(wait).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn a_full_bucket_lets_one_seconds_worth_through_then_paces() {
        let start = Instant::now();
        let mut bucket = Bucket::new(10, start);
        for _ in 0..10 {
            assert_eq!(bucket.take(1, start), Duration::ZERO);
        }
        assert_eq!(bucket.take(1, start), Duration::from_millis(100), "the 11th waits a tenth of a second");
        assert_eq!(bucket.take(1, start + Duration::from_millis(200)), Duration::ZERO, "paid back after 0.1 s, 0.1 s more earned");
    }

    #[test]
    fn an_idle_bucket_holds_at_most_one_second() {
        let start = Instant::now();
        let mut bucket = Bucket::new(100, start);
        assert_eq!(bucket.take(100, start), Duration::ZERO);
        let later = start + Duration::from_secs(60);
        assert_eq!(bucket.take(100, later), Duration::ZERO);
        assert_eq!(bucket.take(50, later), Duration::from_millis(500), "a minute idle saved one second, not sixty");
    }

    /// On tokio's paused clock: 10 requests at 5 a second and 50,000 bytes at 10,000 a second
    /// take the time their rates say (the first second's worth at once).
    #[test]
    fn the_limiter_paces_requests_and_bytes_at_their_rates() {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_time().start_paused(true).build().expect("runtime");
        runtime.block_on(async {
            let limiter = Limiter::new(Some(5), Some(10_000));
            let start = Instant::now();
            for _ in 0..10 {
                limiter.request().await;
            }
            assert_eq!(start.elapsed().as_millis(), 1000, "5 at once, then 5 more at 5 a second");
            let start = Instant::now();
            for _ in 0..10 {
                limiter.received(5_000).await;
            }
            assert_eq!(start.elapsed().as_millis(), 4000, "10,000 at once, then 40,000 at 10,000 a second");
            let unlimited = Limiter::new(None, None);
            let start = Instant::now();
            unlimited.request().await;
            unlimited.received(1 << 30).await;
            assert_eq!(start.elapsed(), Duration::ZERO);
        });
    }

    proptest! {
        /// Whatever the sizes and the times they are taken at, a taker that waits as told has
        /// never had more than one second's burst plus `rate` per second once its wait is over.
        #[test]
        fn waiting_as_told_keeps_to_the_rate(rate in 1_u64..10_000, pieces in prop::collection::vec((1_u64..5_000, 0_u64..2_000), 1..200)) {
            let start = Instant::now();
            let mut bucket = Bucket::new(rate, start);
            let mut now = start;
            let mut taken = 0_u64;
            for (amount, gap_micros) in pieces {
                now += Duration::from_micros(gap_micros);
                let wait = bucket.take(amount, now);
                now += wait;
                taken += amount;
                let allowed = rate as f64 * (1.0 + now.duration_since(start).as_secs_f64());
                prop_assert!(taken as f64 <= allowed * (1.0 + 1e-9), "{taken} taken by {:?}, allowed {allowed}", now.duration_since(start));
            }
        }
    }
}
