#![doc = include_str!("../README.md")]

/// What each role may ask.
mod authz;
/// Configuration and its defaults.
pub mod config;
/// Serving a replicated coordinator: leader checks, commits through Raft, redirects.
mod driver;
/// Errors, and their wire codes.
pub mod error;
/// The single-node store of earlier versions, imported once into the Raft store.
pub mod legacy;
/// Metrics read from the state at scrape time.
mod metrics;
/// The composition root: `start` → `CoordinatorHandle`.
pub mod node;
/// Replication of the durable state: openraft's store, state machine and transport.
pub mod raft;
/// Leader-only soft state: runs, chunk queues, flow windows, leases, workers.
pub mod scheduler;
/// Request handling over the state and the scheduler.
pub mod service;
/// The durable state machine: datasets, jobs, checkpoints, changed by commands.
pub mod state;

pub use self::config::CoordinatorConfig;
pub use self::error::CoordinatorError;
pub use self::node::{CoordinatorHandle, start};
pub use self::service::{Coordinator, LocalCoordinator};
