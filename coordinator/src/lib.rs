#![doc = include_str!("../README.md")]

/// What each role may ask.
mod authz;
/// Configuration and its defaults.
pub mod config;
/// The control-plane benchmark: the core driven by simulated trainers and workers.
pub mod control_bench;
/// Serving a replicated coordinator: leader checks, commits through Raft, redirects.
mod driver;
/// Errors, and their wire codes.
pub mod error;
/// The single-node store of earlier versions, imported once into the Raft store.
pub mod legacy;
/// Local mode: commits applied at once, in memory.
pub mod local;
/// Reading a dataset's manifest, within the dataset roots.
mod manifests;
/// Metrics read from the state at scrape time.
mod metrics;
/// The composition root: `start` → `CoordinatorHandle`.
pub mod node;
/// Other coordinators: addresses and their status.
mod peers;
/// Replication of the durable state: openraft's store, state machine and transport.
pub mod raft;
/// The core under its lock, and the drive loop of both modes.
pub mod runtime;
/// The OS's randomness and the wall clock, for the core.
pub mod sources;

/// Leader-only soft state: runs, seats, leases, the worker registry.
pub use stoker_coordinator_core::scheduler;
/// The durable state machine: datasets, jobs, checkpoints, changed by commands.
pub use stoker_coordinator_core::state;
/// What the replicated state may hold: the bytes each job and dataset is charged.
pub use stoker_coordinator_core::state_budget;

pub use self::config::CoordinatorConfig;
pub use self::error::CoordinatorError;
pub use self::local::LocalCoordinator;
pub use self::node::{CoordinatorHandle, start};
pub use self::runtime::{Committer, Coordinator};
