//! Whole-cluster tests: a coordinator, workers and trainer ranks on loopback.

mod bad_data;
mod bulk;
mod common;
mod dataset_binding;
mod delivery;
mod docs;
mod exactly_once;
mod faults;
mod job_removal;
mod label_mixing;
mod layering;
mod limits;
mod loss_paths;
mod metrics;
mod next_epoch;
mod object_store;
mod object_store_bench;
mod protocol_model;
mod raft;
mod raft_bench;
mod restart;
mod resume;
mod security;
mod state_bound;
mod wedged;
mod wire;
