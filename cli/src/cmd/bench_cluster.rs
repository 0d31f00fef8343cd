//! `stoker bench cluster`: a whole cluster in this process over real data, against the
//! pipeline rate of the same workers measured in the same run.

use std::process::{Command, ExitCode};
use std::time::Instant;

use anyhow::{Context, bail};
use stoker_format::MANIFEST_FILE;
use stoker_plan::Tail;
use stoker_plan::transform::TransformSpec;
use stoker_testkit::{ClusterConfig, TestCluster};

use super::ranks::{consume_ranks, peak_rss_mib};
use crate::args::BenchClusterArgs;

pub(crate) fn run(args: BenchClusterArgs) -> anyhow::Result<ExitCode> {
    let manifest = if args.data.is_dir() { args.data.join(MANIFEST_FILE) } else { args.data.clone() };
    let manifest = std::path::absolute(&manifest)?;
    if args.workers == 0 || args.ranks == 0 || args.epochs == 0 {
        bail!("--workers, --ranks and --epochs must be at least 1");
    }
    let pipeline_rate = match args.pipeline_seconds {
        Some(seconds) => Some(pipeline_rate(&args, &manifest, seconds)?),
        None => None,
    };
    if !args.json {
        eprintln!("cluster: {} worker(s) x {} thread(s), {} rank(s), {} epoch(s) ...", args.workers, args.threads, args.ranks, args.epochs);
    }
    let cluster = TestCluster::start(ClusterConfig {
        workers: args.workers,
        threads_per_worker: args.threads,
        time_samples: args.metrics == "on",
        insecure: args.mutual_tls == "off",
        ..ClusterConfig::default()
    })
    .map_err(anyhow::Error::msg)?;
    cluster.add_dataset("bench", &manifest).map_err(anyhow::Error::msg)?;
    cluster.wait_for_workers().map_err(anyhow::Error::msg)?;
    let mut base = cluster.loader_config("bench", args.batch_size);
    base.transforms = TransformSpec::imagenet_train(args.size);
    base.tail = Tail::Drop;
    base.shuffle = args.shuffle;
    let started = Instant::now();
    let reports = consume_ranks(&base, args.ranks, args.epochs, false)?;
    let elapsed = started.elapsed().as_secs_f64();
    let images: u64 = reports.iter().map(|report| report.images).sum();
    // Throughput from the first batch on: attach and start-up are reported separately.
    let steady_seconds = reports.iter().map(|report| report.seconds).fold(0.0, f64::max);
    let rate = images as f64 / steady_seconds.max(1e-9);
    let first_batch = reports.iter().map(|report| report.first_batch_seconds).fold(0.0, f64::max);
    let wait: Vec<f64> = reports.iter().map(|report| report.wait_fraction()).collect();
    let ratio = pipeline_rate.map(|pipeline| rate / (pipeline * args.workers as f64));
    let peak = peak_rss_mib();
    if args.json {
        let value = serde_json::json!({
            "images_per_sec": rate,
            "wait_fraction": wait,
            "first_batch_seconds": first_batch,
            "images": images,
            "seconds": elapsed,
            "workers": args.workers,
            "threads_per_worker": args.threads,
            "ranks": args.ranks,
            "shuffle": args.shuffle.to_string(),
            "pipeline_images_per_sec": pipeline_rate,
            "ratio_to_pipeline_sum": ratio,
            "peak_rss_mib": peak,
            "metrics": args.metrics,
            "mutual_tls": args.mutual_tls,
        });
        println!("{value}");
    } else {
        println!("cluster    {rate:>9.1} images/s  ({images} images, {:.1} s from first batch, {elapsed:.1} s in all)", steady_seconds);
        if let (Some(pipeline), Some(ratio)) = (pipeline_rate, ratio) {
            println!("pipeline   {pipeline:>9.1} images/s per worker alone; cluster / (workers x pipeline) = {ratio:.2}");
        }
        for report in &reports {
            println!(
                "rank {:<4} waited {:.0}% of its time; first batch after {:.2} s",
                report.rank,
                100.0 * report.wait_fraction(),
                report.first_batch_seconds
            );
        }
        println!("peak RSS   {:.0} MiB (this process: coordinator, workers and trainers)", peak.unwrap_or(f64::NAN));
    }
    Ok(ExitCode::SUCCESS)
}

/// `stoker bench pipeline` of one worker's threads, run now as a child process.
fn pipeline_rate(args: &BenchClusterArgs, manifest: &std::path::Path, seconds: f64) -> anyhow::Result<f64> {
    let exe = std::env::current_exe().context("cannot find this executable")?;
    if !args.json {
        eprintln!("pipeline alone: {} thread(s), {seconds} s ...", args.threads);
    }
    let output = Command::new(exe)
        .args(["bench", "pipeline", "--json", "--no-floor", "--data"])
        .arg(manifest)
        .args(["--threads", &args.threads.to_string(), "--seconds", &seconds.to_string()])
        .args(["--batch-size", &args.batch_size.to_string(), "--size", &args.size.to_string()])
        .output()
        .context("cannot run bench pipeline")?;
    if !output.status.success() {
        bail!("bench pipeline failed: {}", String::from_utf8_lossy(&output.stderr));
    }
    let value: serde_json::Value = serde_json::from_slice(&output.stdout).context("bench pipeline printed no JSON")?;
    value["images_per_sec"].as_f64().context("bench pipeline reported no rate")
}
