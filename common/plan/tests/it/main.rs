//! Integration tests of stoker-plan, in one binary (STYLE G13).

mod allocation_counter;
mod planner_memory;
