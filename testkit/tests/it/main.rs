//! Whole-cluster tests: a coordinator, workers and trainer ranks on loopback.

mod common;
mod exactly_once;
mod faults;
mod restart;
mod resume;
mod wire;
