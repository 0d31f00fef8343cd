//! What the core's decisions depend on: timing, and the limits on what a cluster keeps. The
//! coordinator's `CoordinatorConfig` (validated there) gives it.

use std::time::Duration;

pub use crate::scheduler::SchedulerConfig;

/// The core's share of the coordinator's settings.
#[derive(Clone, Debug)]
pub struct CoreConfig {
    /// Leases, workers and trainers.
    pub scheduler: SchedulerConfig,
    /// How often workers heartbeat (told to each at registration).
    pub heartbeat: Duration,
    /// A job no trainer was heard from for this long is removed (`None`: kept until removed).
    pub job_ttl: Option<Duration>,
    /// The largest batch a new job may have, in bytes.
    pub max_batch_bytes: u64,
    /// The most ranks a new job may have.
    pub max_world_size: u32,
    /// The largest flow window a new job may ask for, in steps.
    pub max_prefetch: u32,
    /// The most jobs kept.
    pub max_jobs: usize,
    /// The most datasets kept.
    pub max_datasets: usize,
    /// The most jobs one certificate's attaches may have created among those kept.
    pub max_jobs_per_certificate: usize,
    /// The most bytes the replicated state may hold, as charged by `state_budget` (every job
    /// with a session record for each of its ranks): what a snapshot may take.
    pub max_state_bytes: u64,
}
