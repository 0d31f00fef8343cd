//! `stoker job ls|rm`.

use crate::flags::CoordinatorAddr;
use clap::Args;
use std::process::ExitCode;

use stoker_proto::expect_response;
use stoker_proto::{ControlRequest, JobStatus};

use super::remote::call;

#[derive(Debug, Args)]
pub(crate) struct JobRmArgs {
    /// The job's name (`stoker job ls` shows it).
    pub(crate) name: String,
    /// Remove it even though trainers of it are live: they fail at their next request.
    #[arg(long)]
    pub(crate) force: bool,
    #[command(flatten)]
    pub(crate) coordinator: CoordinatorAddr,
}

/// "3h 12m", "45s": an idle time at a glance.
fn duration(seconds: f64) -> String {
    let seconds = seconds.max(0.0) as u64;
    match seconds {
        0..60 => format!("{seconds}s"),
        60..3600 => format!("{}m {}s", seconds / 60, seconds % 60),
        3600..86400 => format!("{}h {}m", seconds / 3600, seconds % 3600 / 60),
        _ => format!("{}d {}h", seconds / 86400, seconds % 86400 / 3600),
    }
}

fn describe(job: &JobStatus) -> String {
    let plan = &job.spec.plan;
    let position = job
        .checkpoint
        .map_or_else(|| "not started".to_owned(), |checkpoint| format!("epoch {} position {}", checkpoint.epoch.0, checkpoint.position.0));
    format!(
        "{:<28} {:<8} {:<16} {:>3}x{:<5} {:<14} {:>4}/{:<4} {:<26} {}",
        job.spec.name,
        job.id.to_string(),
        job.spec.dataset,
        plan.world_size,
        plan.batch_size,
        plan.shuffle.to_string(),
        job.live_ranks.len(),
        plan.world_size,
        position,
        duration(job.idle_seconds)
    )
}

pub(crate) fn list(args: CoordinatorAddr) -> anyhow::Result<ExitCode> {
    let status = expect_response!(call(&args, ControlRequest::Status)?, Status { status })?;
    if status.jobs.is_empty() {
        println!("no jobs: a trainer that attaches creates its job");
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "{:<28} {:<8} {:<16} {:>3}x{:<5} {:<14} {:>9} {:<26} IDLE",
        "NAME", "ID", "DATASET", "W", "B", "SHUFFLE", "LIVE", "CHECKPOINT"
    );
    for job in &status.jobs {
        println!("{}", describe(job));
    }
    Ok(ExitCode::SUCCESS)
}

/// Remove the job named `args.name`: resolved to its id once, then removed by that id, so
/// that a request sent again across a fail-over never removes a newer job that took the name.
pub(crate) fn remove(args: JobRmArgs) -> anyhow::Result<ExitCode> {
    let status = expect_response!(call(&args.coordinator, ControlRequest::Status)?, Status { status })?;
    let Some(resolved) = status.jobs.iter().find(|job| job.spec.name == args.name) else {
        anyhow::bail!("no job named {:?}: `stoker job ls` lists them", args.name);
    };
    let request = ControlRequest::RemoveJob { name: args.name.clone(), job: resolved.id, force: args.force };
    let job = expect_response!(call(&args.coordinator, request)?, JobRemoved { job })?;
    println!("removed job {:?} ({job}) and its checkpoint", args.name);
    Ok(ExitCode::SUCCESS)
}
