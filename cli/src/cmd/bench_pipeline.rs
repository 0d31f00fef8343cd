//! `stoker bench pipeline`: the worker pipeline against the full-decode floor, in one run.

use std::num::NonZeroU32;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use stoker_common::ids::{Epoch, Rank, Step};
use stoker_common::plan::{EpochPlan, PlanSpec, SampleRef, Shuffle, Tail};
use stoker_common::shard::MANIFEST_FILE;
use stoker_common::transform::{Recipe, TransformSpec};
use stoker_worker::{BatchRequest, Dataset, Pipeline, PipelineConfig, floor};

use crate::args::BenchPipelineArgs;

pub(crate) fn run(args: BenchPipelineArgs) -> anyhow::Result<ExitCode> {
    let manifest = if args.data.is_dir() { args.data.join(MANIFEST_FILE) } else { args.data.clone() };
    let threads = args.threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, usize::from)).max(1);
    let batch_size = NonZeroU32::new(args.batch_size).context("--batch-size must be at least 1")?;
    if !(args.seconds > 0.0 && args.seconds.is_finite()) {
        bail!("--seconds must be a positive number");
    }
    let mut spec = match &args.transforms {
        Some(json) => serde_json::from_str::<TransformSpec>(json).context("--transforms is not a valid TransformSpec")?,
        None => TransformSpec::imagenet_train(args.size),
    };
    if args.no_dct_scaling {
        spec.dct_scaling = false;
    }
    let recipe = Recipe::new(&spec)?;
    let dataset = Arc::new(Dataset::open(&manifest).with_context(|| format!("cannot open dataset {}", manifest.display()))?);
    if dataset.samples() == 0 {
        bail!("{} has no samples", manifest.display());
    }
    if !args.json {
        eprintln!("reading {} samples from {} shards into the page cache ...", dataset.samples(), dataset.shards().len());
    }
    let checksum = warm_page_cache(&dataset);
    tracing::debug!(checksum, "page cache warmed");

    let plan_spec = PlanSpec { seed: args.seed, world_size: NonZeroU32::MIN, batch_size, shuffle: Shuffle::default(), tail: Tail::Partial };
    let table = dataset.table();
    let requests = (0u64..).flat_map(move |epoch| {
        let plan = Arc::new(EpochPlan::new(Arc::clone(&table), plan_spec, Epoch(epoch)));
        (0..plan.steps()).map(move |step| BatchRequest { plan: Arc::clone(&plan), rank: Rank(0), step: Step(step) })
    });
    let config = PipelineConfig { threads, in_flight: threads + 2, batch_size: batch_size.get() as usize };
    if !args.json {
        eprintln!("pipeline: {threads} thread(s), batches of {batch_size}, {} s ...", args.seconds);
    }
    let mut pipeline = Pipeline::start(Arc::clone(&dataset), &spec, config, requests)?;
    let stats = pipeline.stats();
    let duration = Duration::from_secs_f64(args.seconds);
    let mut seen: Vec<SampleRef> = Vec::new();
    let (mut images, mut started) = (0u64, None::<Instant>);
    let mut counted_from = (0u64, 0u64);
    let mut plan = EpochPlan::new(dataset.table(), plan_spec, Epoch(0));
    for batch in pipeline.by_ref() {
        let batch = batch?;
        // One plan per epoch, not per batch: this loop is the consumer the pipeline waits on.
        if plan.epoch() != batch.epoch {
            plan = EpochPlan::new(dataset.table(), plan_spec, batch.epoch);
        }
        seen.extend(plan.batch(batch.rank, batch.step).map(|p| p.sample));
        // The clock starts at the first batch, so buffer allocation and thread start-up do not count.
        let Some(start) = started else {
            started = Some(Instant::now());
            counted_from = (
                stats.decoded_pixels.load(std::sync::atomic::Ordering::Relaxed),
                stats.source_pixels.load(std::sync::atomic::Ordering::Relaxed),
            );
            continue;
        };
        images += batch.len() as u64;
        if start.elapsed() >= duration {
            break;
        }
    }
    let elapsed = started.map_or(Duration::ZERO, |s| s.elapsed());
    let decoded = stats.decoded_pixels.load(std::sync::atomic::Ordering::Relaxed) - counted_from.0;
    let source = stats.source_pixels.load(std::sync::atomic::Ordering::Relaxed) - counted_from.1;
    let replaced = stats.replaced.load(std::sync::atomic::Ordering::Relaxed);
    drop(pipeline);
    if images == 0 {
        bail!("the pipeline made only one batch in {} s: use a longer --seconds or a smaller --batch-size", args.seconds);
    }
    let rate = images as f64 / elapsed.as_secs_f64();
    let out = recipe.output_size();
    let megapixels = rate * f64::from(out.width) * f64::from(out.height) / 1e6;

    let floor_result = match (&args.floor_data, args.no_floor) {
        (_, true) => None,
        (Some(other), false) => {
            let (floor_dataset, samples) = floor_dataset(other, dataset.samples())?;
            if !args.json {
                eprintln!(
                    "floor: full decode of the {} images of {}, {threads} thread(s), {} s ...",
                    samples.len(),
                    other.display(),
                    args.seconds
                );
            }
            Some(floor::full_decode(&floor_dataset, &Arc::new(samples), threads, duration)?)
        }
        (None, false) => {
            if !args.json {
                eprintln!("floor: full decode of the same {} images, {threads} thread(s), {} s ...", seen.len(), args.seconds);
            }
            Some(floor::full_decode(&dataset, &Arc::new(seen), threads, duration)?)
        }
    };
    let floor_rate = floor_result.map(|f| f.images_per_sec());
    let ratio = floor_rate.map(|f| rate / f);
    let decoded_fraction = decoded as f64 / source.max(1) as f64;
    if args.json {
        let value = serde_json::json!({
            "images_per_sec": rate,
            "floor_images_per_sec": floor_rate,
            "ratio_to_floor": ratio,
            "threads": threads,
            "images": images,
            "replaced_samples": replaced,
            "megapixels_per_sec": megapixels,
            "images_per_sec_per_thread": rate / threads as f64,
            "decoded_pixel_fraction": decoded_fraction,
            "seconds": elapsed.as_secs_f64(),
            "batch_size": batch_size.get(),
            "output": [out.height, out.width],
            "dct_scaling": spec.dct_scaling,
            "floor_data": args.floor_data.as_ref().map_or(manifest.display().to_string(), |p| p.display().to_string()),
        });
        println!("{value}");
    } else {
        println!(
            "pipeline   {rate:>9.1} images/s  ({:.1} per thread, {megapixels:.1} output MP/s, {images} images in {:.1} s)",
            rate / threads as f64,
            elapsed.as_secs_f64()
        );
        println!("           decoded {:.1}% of the source pixels (crop region + DCT scaling)", 100.0 * decoded_fraction);
        if let (Some(floor), Some(floor_rate), Some(ratio)) = (floor_result, floor_rate, ratio) {
            println!(
                "full decode{floor_rate:>9.1} images/s  ({:.1} per thread, {} images, {} not JPEG)",
                floor_rate / threads as f64,
                floor.images,
                floor.failed
            );
            println!("ratio      {ratio:>9.2}x the full-decode floor");
        }
        if replaced > 0 {
            println!("replaced   {replaced} undecodable samples with black images (see the warnings above)");
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The dataset `--floor-data` names, in the page cache, and all its samples in order. It must
/// hold as many samples as the benchmarked one (the same images, stored another way).
fn floor_dataset(path: &std::path::Path, expected: u64) -> anyhow::Result<(Arc<Dataset>, Vec<SampleRef>)> {
    let manifest = if path.is_dir() { path.join(MANIFEST_FILE) } else { path.to_path_buf() };
    let dataset = Dataset::open(&manifest).with_context(|| format!("cannot open --floor-data {}", manifest.display()))?;
    if dataset.samples() != expected {
        bail!(
            "--floor-data {} has {} samples and --data has {expected}: pass the same images stored another way",
            manifest.display(),
            dataset.samples()
        );
    }
    warm_page_cache(&dataset);
    let table = dataset.table();
    let samples = (0..dataset.samples()).map(|i| table.locate(i)).collect();
    Ok((Arc::new(dataset), samples))
}

/// Read every shard once so that neither run pays for the disk.
fn warm_page_cache(dataset: &Dataset) -> u64 {
    dataset.shards().iter().fold(0, |acc, shard| acc ^ xxhash_rust::xxh3::xxh3_64(shard.bytes()))
}
