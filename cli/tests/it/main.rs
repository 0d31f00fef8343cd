//! Integration tests of the `stoker` binary, in one test binary (STYLE G13).

mod bench_delivery;
mod bench_pipeline;
mod certs;
mod jobs;
mod netns;
mod pack_inspect;
mod process_faults;
mod raft_processes;
mod s3_index_inspect;
mod s3_processes;
mod support;
mod token_index_inspect;
mod worker_memory;
