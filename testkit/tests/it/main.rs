//! Whole-cluster tests: a coordinator, workers and trainer ranks on loopback.

mod bad_data;
mod common;
mod delivery;
mod exactly_once;
mod faults;
mod protocol_model;
mod restart;
mod resume;
mod wire;
