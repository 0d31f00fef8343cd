//! Integration tests of stoker-common, in one binary (STYLE G13).

mod allocation_counter;
mod hostile_shards;
mod planner_memory;
mod tar_compat;
