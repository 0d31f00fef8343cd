#![doc = include_str!("../README.md")]

/// Whose session a request may speak for.
pub mod authz;
/// The core's share of the coordinator's settings.
pub mod config;
/// [`Core`]: state, soft state and the one entry, `step`.
mod core;
/// What a job asks of the workers: its rate, its stall and the worker cores it needs.
pub mod demand;
/// Refusals as wire errors.
mod errors;
/// Events in, outcomes out.
pub mod event;
/// What status and metrics show.
pub mod figures;
/// Where unpredictable ids come from.
pub mod ids;
/// Each role's requests.
mod requests;
/// Leader-only soft state: runs, seats, leases, the worker registry.
pub mod scheduler;
/// Which shards a chunk, or the steps after it, read; the shards a worker holds.
mod shards;
/// The durable, replicated state machine: datasets, jobs, checkpoints, changed by commands.
pub mod state;
/// What the replicated state may hold: the bytes each job and dataset is charged.
pub mod state_budget;
/// Checks of job specs, limits and list lengths.
mod validate;

pub use self::config::CoreConfig;
pub use self::core::Core;
pub use self::event::{Event, Outcome, Then};
pub use self::figures::{Figures, JobFigures, RankTotals};
pub use self::ids::{CountingIds, IdSource, SeededIds};
pub use self::validate::MAX_BATCH_SIZE;
