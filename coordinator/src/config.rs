//! Coordinator configuration: defaults in one place, validated into typed fields.

use std::path::PathBuf;
use std::time::Duration;

use crate::error::CoordinatorError;

/// How a coordinator runs.
#[derive(Clone, Debug)]
pub struct CoordinatorConfig {
    /// Where datasets, jobs and checkpoints are kept.
    pub data_dir: PathBuf,
    /// A lease not renewed for this long expires; a worker silent this long is dead.
    pub lease_ttl: Duration,
    /// How often workers heartbeat (a third of the TTL or less is sensible).
    pub heartbeat: Duration,
    /// Steps per chunk of work.
    pub chunk_steps: u32,
    /// A chunk that failed to deliver waits this long before it is granted again.
    pub retry_delay: Duration,
    /// A rank's trainer silent this long (trainers report at least every second) is absent:
    /// its chunks wait for it instead of occupying workers.
    pub trainer_ttl: Duration,
}

impl CoordinatorConfig {
    /// Defaults for `data_dir`: 3 s leases, 500 ms heartbeats, 2-step chunks, 500 ms retry delay,
    /// 5 s trainer TTL.
    pub fn new(data_dir: PathBuf) -> Self {
        Self {
            data_dir,
            lease_ttl: Duration::from_secs(3),
            heartbeat: Duration::from_millis(500),
            chunk_steps: 2,
            retry_delay: Duration::from_millis(500),
            trainer_ttl: Duration::from_secs(5),
        }
    }

    /// Check the values fit together.
    pub fn validate(self) -> Result<Self, CoordinatorError> {
        if self.heartbeat.is_zero() || self.heartbeat >= self.lease_ttl {
            return Err(CoordinatorError::Config {
                message: format!("the heartbeat ({:?}) must be shorter than the lease TTL ({:?})", self.heartbeat, self.lease_ttl),
            });
        }
        if self.trainer_ttl <= Duration::from_secs(1) {
            return Err(CoordinatorError::Config {
                message: format!("the trainer TTL ({:?}) must be longer than the trainers' 1 s progress interval", self.trainer_ttl),
            });
        }
        if self.chunk_steps == 0 {
            return Err(CoordinatorError::Config { message: "chunk steps must be at least 1".to_owned() });
        }
        Ok(self)
    }
}
