//! `stoker consume`: one trainer rank without a model.

use std::process::ExitCode;

use anyhow::Context;
use stoker_client::LoaderConfig;
use stoker_obs::MetricsListen;
use stoker_plan::transform::TransformSpec;

use super::ranks::{Keys, consume};
use super::remote::resolve_coordinators;
use crate::args::ConsumeArgs;

pub(crate) fn run(args: ConsumeArgs) -> anyhow::Result<ExitCode> {
    let mut config = LoaderConfig::new(resolve_coordinators(&args.coordinator.coordinator)?, args.dataset.clone(), args.batch_size);
    config.rank = args.rank;
    config.world_size = args.world_size;
    config.seed = args.seed;
    config.shuffle = args.shuffle.parse()?;
    config.tail = args.tail.parse()?;
    config.prefetch = args.prefetch;
    config.job_name = args.job.clone();
    config.tls = args.coordinator.tls.source()?;
    config.batch_transport = args.batch_transport;
    config.transforms = match &args.transforms {
        Some(json) => serde_json::from_str::<TransformSpec>(json).context("--transforms is not a valid TransformSpec")?,
        None => TransformSpec::imagenet_train(args.size),
    };
    let (rank, world_size) = config.rank_and_world_size()?;
    if !args.json {
        eprintln!("rank {} of {world_size}: consuming {} epoch(s) of {:?} ...", rank.0, args.epochs, args.dataset);
    }
    let metrics_listen = match args.metrics_listen {
        MetricsListen::On(addr) => Some(addr),
        MetricsListen::Off => None,
    };
    let mut keys_file = match &args.keys_out {
        Some(path) => {
            Some(std::io::BufWriter::new(std::fs::File::create(path).with_context(|| format!("cannot create {}", path.display()))?))
        }
        None => None,
    };
    let keys = match &mut keys_file {
        Some(file) => Keys::Write(file),
        None => Keys::Drop,
    };
    let report = consume(&config, args.first_epoch, args.epochs, args.rate, keys, metrics_listen)?;
    let rate = report.images as f64 / report.seconds.max(1e-9);
    if args.json {
        let value = serde_json::json!({
            "rank": rank.0,
            "world_size": world_size.get(),
            "images": report.images,
            "batches": report.batches,
            "seconds": report.seconds,
            "images_per_sec": rate,
            "wait_seconds": report.wait_seconds,
            "wait_fraction": report.wait_fraction(),
            "first_batch_seconds": report.first_batch_seconds,
            "duplicates_dropped": report.duplicates,
        });
        println!("{value}");
    } else {
        println!(
            "rank {}: {} images in {} batches, {:.1} s: {rate:.0} images/s; waited {:.2} s ({:.0}%); first batch after {:.2} s",
            rank.0,
            report.images,
            report.batches,
            report.seconds,
            report.wait_seconds,
            100.0 * report.wait_fraction(),
            report.first_batch_seconds
        );
    }
    Ok(ExitCode::SUCCESS)
}
