//! `stoker status`: one table of the cluster.

use crate::flags::CoordinatorAddr;
use clap::Args;
use std::process::ExitCode;

use stoker_proto::expect_response;
use stoker_proto::{ClusterStatus, ControlRequest, JobDemand, JobStatus};

use super::remote::call;

#[derive(Debug, Args)]
pub(crate) struct StatusArgs {
    #[command(flatten)]
    pub(crate) coordinator: CoordinatorAddr,
    /// Print one JSON object.
    #[arg(long)]
    pub(crate) json: bool,
}

pub(crate) fn run(args: StatusArgs) -> anyhow::Result<ExitCode> {
    let status = expect_response!(call(&args.coordinator, ControlRequest::Status)?, Status { status })?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&json(&status))?);
        return Ok(ExitCode::SUCCESS);
    }
    println!("leader {}, {} datasets", status.coordinator, status.datasets);
    println!("\nCOORDINATOR  ADDRESS                ROLE         TERM   LAST LOG    APPLIED  LEADER");
    for node in &status.coordinators {
        println!(
            "{:<12} {:<22} {:<12} {:>4} {:>10} {:>10}  {}",
            node.id,
            node.addr,
            node.role,
            node.term,
            node.last_log,
            node.applied,
            node.leader.map_or_else(|| "-".to_owned(), |leader| leader.to_string())
        );
    }
    println!("\nWORKER                      ADDRESS                ALIVE  THREADS  CHUNKS  IMG/S  STUCK ON");
    for worker in &status.workers {
        let stuck: Vec<String> = worker.stuck_jobs.iter().map(|stuck| stuck.job.to_string()).collect();
        println!(
            "{:<27} {:<22} {:<6} {:>7} {:>7} {:>6.0}  {}",
            worker.info.id.to_string(),
            worker.info.addr.to_string(),
            if worker.alive { "yes" } else { "no" },
            worker.threads,
            worker.chunks_in_flight,
            worker.images_per_sec,
            if stuck.is_empty() { "-".to_owned() } else { stuck.join(",") }
        );
    }
    for worker in &status.workers {
        for stuck in &worker.stuck_jobs {
            println!("  {} makes nothing of {}: {}", worker.info.id, stuck.job, stuck.reason);
        }
    }
    if let Some(line) = cores_line(&status) {
        println!("{line}");
    }
    for job in live_first(&status.jobs) {
        let liveness = match job.live_ranks.len() {
            0 => format!("idle {:.0} s", job.idle_seconds),
            live => format!("{live} ranks live"),
        };
        println!(
            "\n{} {:?}: dataset {}, {} ranks x batch {}, steps queued {}, chunks leased {}, {liveness}",
            job.id,
            job.spec.name,
            job.spec.dataset,
            job.spec.plan.world_size,
            job.spec.plan.batch_size,
            job.steps_queued,
            job.chunks_leased
        );
        if let Some(demand) = &job.demand {
            println!("  {}", demand_line(demand));
        }
        println!("  RANK  EPOCH   STEP / STEPS   WAITED (s)");
        for rank in &job.ranks {
            println!("  {:>4} {:>6} {:>6} / {:<6} {:>10.2}", rank.rank.0, rank.epoch.0, rank.consumed.0, rank.steps, rank.wait_seconds);
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Worker cores alive, and what the jobs want of them: `None` while no job has figures.
fn cores_line(status: &ClusterStatus) -> Option<String> {
    let alive: u32 = status.workers.iter().filter(|worker| worker.alive).map(|worker| worker.threads).sum();
    let wanted: Vec<f64> = status.jobs.iter().filter_map(|job| job.demand.and_then(|demand| demand.worker_cores)).collect();
    if wanted.is_empty() {
        return None;
    }
    let wanted: f64 = wanted.iter().sum();
    let verdict = if wanted > f64::from(alive) {
        format!("add about {} to stop the data stalls", (wanted - f64::from(alive)).ceil())
    } else {
        format!("{:.0} to spare", f64::from(alive) - wanted)
    };
    Some(format!("worker cores: {alive} alive, the jobs want {wanted:.1}: {verdict}"))
}

/// One job's demand, in words.
fn demand_line(demand: &JobDemand) -> String {
    let cores = match demand.worker_cores {
        Some(cores) => format!("would take {cores:.1} worker cores to serve without stalls"),
        None => "the workers have not measured what a core makes yet".to_owned(),
    };
    format!("consumes {:.0} samples/s, waits {:.0}% of the time for data; {cores}", demand.samples_per_sec, demand.stall * 100.0)
}

/// Jobs with a live trainer first, then the rest from the most recently active: a restarted
/// run's old jobs (each torchrun launch has a run id of its own) sink below the live one.
fn live_first(jobs: &[JobStatus]) -> Vec<&JobStatus> {
    let mut ordered: Vec<&JobStatus> = jobs.iter().collect();
    ordered.sort_by(|left, right| {
        left.live_ranks.is_empty().cmp(&right.live_ranks.is_empty()).then(left.idle_seconds.total_cmp(&right.idle_seconds))
    });
    ordered
}

fn json(status: &ClusterStatus) -> serde_json::Value {
    serde_json::json!({
        "coordinator": status.coordinator,
        "coordinators": status.coordinators.iter().map(|c| serde_json::json!({
            "id": c.id, "addr": c.addr, "role": c.role, "term": c.term, "last_log": c.last_log, "applied": c.applied,
            "leader": c.leader,
        })).collect::<Vec<_>>(),
        "datasets": status.datasets,
        "workers": status.workers.iter().map(|w| serde_json::json!({
            "id": w.info.id.0, "addr": w.info.addr.to_string(), "alive": w.alive, "threads": w.threads,
            "chunks_in_flight": w.chunks_in_flight, "images_per_sec": w.images_per_sec, "images_per_core_sec": w.images_per_core_sec,
            "stuck_jobs": w.stuck_jobs.iter().map(|stuck| stuck.job.0).collect::<Vec<_>>(),
            "stuck_reasons": w.stuck_jobs.iter().map(|stuck| serde_json::json!({"job": stuck.job.0, "reason": stuck.reason})).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
        "jobs": live_first(&status.jobs).into_iter().map(|j| serde_json::json!({
            "id": j.id.0, "name": j.spec.name, "dataset": j.spec.dataset, "world_size": j.spec.plan.world_size.get(),
            "batch_size": j.spec.plan.batch_size.get(), "steps_queued": j.steps_queued, "chunks_leased": j.chunks_leased,
            "live_ranks": j.live_ranks.iter().map(|rank| rank.0).collect::<Vec<_>>(), "idle_seconds": j.idle_seconds,
            "demand": j.demand.map(|d| serde_json::json!({
                "samples_per_sec": d.samples_per_sec, "stall": d.stall, "worker_cores": d.worker_cores,
            })),
            "ranks": j.ranks.iter().map(|r| serde_json::json!({
                "rank": r.rank.0, "epoch": r.epoch.0, "step": r.consumed.0, "steps": r.steps, "wait_seconds": r.wait_seconds,
            })).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
    })
}
