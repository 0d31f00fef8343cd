//! `stoker bench control-plane`: the coordinator core driven in process by simulated trainers
//! and workers (`stoker_coordinator::control_bench`), its cost per request kind reported.

use std::process::ExitCode;

use clap::Args;
use stoker_coordinator::control_bench::{self, ControlBenchConfig};

#[derive(Debug, Args)]
pub(crate) struct BenchControlArgs {
    /// Trainer ranks in all, split evenly over the jobs.
    #[arg(long, default_value_t = 10_000)]
    pub(crate) ranks: u32,
    /// Workers.
    #[arg(long, default_value_t = 1_000)]
    pub(crate) workers: u32,
    /// Jobs (all on one simulated dataset).
    #[arg(long, default_value_t = 8)]
    pub(crate) jobs: u32,
    /// Steps of the epoch each rank runs.
    #[arg(long, default_value_t = 16)]
    pub(crate) steps: u32,
    /// Steps per chunk (the coordinator's --chunk-steps).
    #[arg(long, default_value_t = 2)]
    pub(crate) chunk_steps: u32,
    /// Each job's flow window, in steps.
    #[arg(long, default_value_t = 8)]
    pub(crate) prefetch: u32,
    /// Chunks a worker asks for at a time.
    #[arg(long, default_value_t = 4)]
    pub(crate) pull_max: u32,
    /// Rounds (a pull by every worker each) before the run gives up.
    #[arg(long, default_value_t = 10_000)]
    pub(crate) max_rounds: u64,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    pub(crate) json: bool,
}

pub(crate) fn run(args: BenchControlArgs) -> anyhow::Result<ExitCode> {
    let config = ControlBenchConfig {
        ranks: args.ranks,
        workers: args.workers,
        jobs: args.jobs,
        steps: args.steps,
        chunk_steps: args.chunk_steps,
        prefetch: args.prefetch,
        pull_max: args.pull_max,
        max_rounds: args.max_rounds,
        ..ControlBenchConfig::default()
    };
    let report = control_bench::run(&config, &resident_bytes, &mut |line| eprintln!("bench: {line}"))?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "{} ranks ({} jobs), {} workers, {} steps, chunks of {} steps, flow window {}: {} chunks granted in {:.0} virtual s",
        args.ranks, args.jobs, args.workers, args.steps, args.chunk_steps, args.prefetch, report.grants, report.virtual_seconds
    );
    println!("{:<16} {:>10} {:>10} {:>10} {:>10} {:>10}", "request", "count", "total s", "p50 µs", "p99 µs", "max µs");
    for kind in &report.kinds {
        println!(
            "{:<16} {:>10} {:>10.3} {:>10.1} {:>10.1} {:>10.1}",
            kind.kind, kind.count, kind.total_seconds, kind.p50_micros, kind.p99_micros, kind.max_micros
        );
    }
    println!(
        "grants per core-second {:.0}; core time per 1,000 grants {:.1} ms; progress reports take {:.1}% of a core",
        report.grants_per_core_second,
        report.core_millis_per_1000_grants,
        100.0 * report.progress_core_share
    );
    println!(
        "replicated log: {:.1} entries/s, {:.0} bytes/s in the steady state; {} entries to set up",
        report.log_entries_per_second, report.log_bytes_per_second, report.setup_log_entries
    );
    if let (Some(rank), Some(worker)) = (report.memory_per_rank_bytes, report.memory_per_worker_bytes) {
        println!("memory (resident set growth): {rank:.0} bytes per rank, {worker:.0} bytes per worker");
    }
    for (error, count) in &report.errors {
        println!("error ×{count}: {error}");
    }
    Ok(if report.errors.is_empty() { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

/// The process's resident set, in bytes (Linux: `/proc/self/statm`, in pages of 4 KiB).
fn resident_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}
