//! Integration tests of stoker-format, in one binary (STYLE G13).

mod hostile_shards;
mod tar_compat;
