#![doc = include_str!("../README.md")]

/// Configuration and its defaults.
pub mod config;
/// Errors, and their wire codes.
pub mod error;
/// The composition root: `start` → `CoordinatorHandle`.
pub mod node;
/// Leader-only soft state: runs, chunk queues, flow windows, leases, workers.
pub mod scheduler;
/// Request handling over the state and the scheduler.
pub mod service;
/// The durable state machine: datasets, jobs, checkpoints, changed by commands.
pub mod state;
/// The single-node command log and snapshot in `--data-dir`.
pub mod store;

pub use self::config::CoordinatorConfig;
pub use self::error::CoordinatorError;
pub use self::node::{CoordinatorHandle, start};
pub use self::service::{Coordinator, LocalCoordinator};
