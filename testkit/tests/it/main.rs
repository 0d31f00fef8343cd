//! Whole-cluster tests: a coordinator, workers and trainer ranks on loopback.

mod common;
mod delivery;
mod exactly_once;
mod faults;
mod restart;
mod resume;
mod wire;
