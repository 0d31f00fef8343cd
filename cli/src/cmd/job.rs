//! `stoker job ls|rm`.

use std::process::ExitCode;

use stoker_proto::expect_response;
use stoker_proto::{ControlRequest, JobStatus};

use super::remote::call;
use crate::args::{CoordinatorAddr, JobRmArgs};

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

pub(crate) fn remove(args: JobRmArgs) -> anyhow::Result<ExitCode> {
    let request = ControlRequest::RemoveJob { name: args.name.clone(), force: args.force };
    let job = expect_response!(call(&args.coordinator, request)?, JobRemoved { job })?;
    println!("removed job {:?} ({job}) and its checkpoint", args.name);
    Ok(ExitCode::SUCCESS)
}
