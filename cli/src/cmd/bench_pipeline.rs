//! `stoker bench pipeline`: the worker pipeline against the full-decode floor, in one run.

use std::num::NonZeroU32;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use stoker_format::MANIFEST_FILE;
use stoker_plan::ids::{Epoch, Rank, Step};
use stoker_plan::transform::{Recipe, TransformSpec};
use stoker_plan::{EpochPlan, PlanSpec, SampleRef, Shuffle, Tail};
use stoker_worker::metrics::{PipelineMetrics, register_pipeline_metrics};
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
    let config = PipelineConfig { threads, in_flight: threads + 2, batch_size: batch_size.get() as usize };
    let floor_source = match (&args.floor_data, args.no_floor) {
        (Some(other), false) => Some(floor_dataset(other, dataset.samples())?),
        _ => None,
    };
    let baseline_opt = match args.baseline_threads {
        Some(0) => bail!("--baseline-threads must be at least 1"),
        Some(base) if base == threads => bail!("--baseline-threads {base} is --threads itself: pass a different count to compare"),
        Some(base) => Some(PipelineConfig { threads: base, in_flight: base + 2, ..config }),
        None => None,
    };
    let rounds = args.rounds.max(1);
    let slice = Duration::from_secs_f64(args.seconds / f64::from(rounds));
    if !args.json {
        let floor = match (&args.floor_data, args.no_floor) {
            (_, true) => "no floor".to_owned(),
            (Some(other), false) => format!("floor: full decode of the images of {}", other.display()),
            (None, false) => "floor: full decode of the same images".to_owned(),
        };
        let baseline = baseline_opt.map_or(String::new(), |base| format!("; then the same with {} thread(s)", base.threads));
        eprintln!(
            "pipeline: {threads} thread(s), batches of {batch_size}, {} s in {rounds} rounds, each followed by as long of the {floor}{baseline} ...",
            args.seconds
        );
    }
    // Pipeline and floor (and the baseline thread count's) take turns, so that a slow spell of
    // a shared machine falls on all of them.
    // The pipeline times every sample and batch into metrics, as a worker's does.
    let metrics = register_pipeline_metrics(&stoker_obs::Metrics::new())?;
    let turns = Turns {
        dataset: &dataset,
        spec: &spec,
        plan_spec,
        slice,
        floor_source: floor_source.as_ref(),
        no_floor: args.no_floor,
        metrics: Some(metrics),
    };
    let (mut main, mut baseline, mut unobserved) = (Measured::default(), Measured::default(), Measured::default());
    let unobserved_turns = Turns { no_floor: true, metrics: None, ..turns.clone() };
    for _ in 0..rounds {
        turns.take(config, &mut main)?;
        if let Some(base_config) = baseline_opt {
            turns.take(base_config, &mut baseline)?;
        }
        if args.metrics_cost {
            unobserved_turns.take(config, &mut unobserved)?;
        }
    }
    let unobserved_rate =
        args.metrics_cost.then(|| unobserved.pipeline.images as f64 / unobserved.pipeline.elapsed.as_secs_f64().max(f64::MIN_POSITIVE));
    let Measured { pipeline: measured, floor: floor_total } = main;
    let Slice { images, elapsed, decoded, source, replaced, .. } = measured;
    if images == 0 {
        bail!("the pipeline made only one batch per round in {} s: use a longer --seconds or a smaller --batch-size", args.seconds);
    }
    let rate = images as f64 / elapsed.as_secs_f64();
    let out = recipe.output_size();
    let megapixels = rate * f64::from(out.width) * f64::from(out.height) / 1e6;
    let floor_result = floor_total;
    let floor_rate = floor_result.map(|f| f.images_per_sec());
    let ratio = floor_rate.map(|f| rate / f);
    let decoded_fraction = decoded as f64 / source.max(1) as f64;
    let scaling_opt = baseline_opt.map(|base| {
        let base_rate = baseline.pipeline.images as f64 / baseline.pipeline.elapsed.as_secs_f64().max(f64::MIN_POSITIVE);
        let base_floor = baseline.floor.map(|f| f.images_per_sec());
        Scaling {
            threads: base.threads,
            rate: base_rate,
            scaling: rate / base_rate,
            floor_scaling: floor_rate.zip(base_floor).map(|(f, b)| f / b),
        }
    });
    if args.json {
        let value = serde_json::json!({
            "images_per_sec": rate,
            "floor_images_per_sec": floor_rate,
            "ratio_to_floor": ratio,
            "unobserved_images_per_sec": unobserved_rate,
            "metrics_cost": unobserved_rate.map(|unobserved| 1.0 - rate / unobserved),
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
            "rounds": rounds,
            "floor_data": args.floor_data.as_ref().map_or(manifest.display().to_string(), |p| p.display().to_string()),
        });
        let mut value = value;
        if let Some(scaling) = &scaling_opt {
            value["baseline_threads"] = scaling.threads.into();
            value["baseline_images_per_sec"] = scaling.rate.into();
            value["scaling"] = scaling.scaling.into();
            value["floor_scaling"] = scaling.floor_scaling.into();
        }
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
        if let Some(unobserved) = unobserved_rate {
            println!(
                "untimed    {unobserved:>9.1} images/s without metrics timing; metrics cost {:+.2}%",
                100.0 * (1.0 - rate / unobserved)
            );
        }
        if let Some(Scaling { threads: base, rate: base_rate, scaling, floor_scaling }) = scaling_opt {
            let floor = floor_scaling.map_or(String::new(), |f| format!(" (the floor: {f:.2}x)"));
            println!("scaling    {scaling:>9.2}x {base} thread(s), which made {base_rate:.1} images/s{floor}");
        }
        if replaced > 0 {
            println!("replaced   {replaced} undecodable samples with black images (see the warnings above)");
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// How --threads compares with --baseline-threads.
struct Scaling {
    threads: usize,
    rate: f64,
    scaling: f64,
    floor_scaling: Option<f64>,
}

/// The pipeline's and the floor's turns at one thread count, summed.
#[derive(Default)]
struct Measured {
    pipeline: Slice,
    floor: Option<floor::FloorResult>,
}

/// What every turn shares.
#[derive(Clone)]
struct Turns<'a> {
    dataset: &'a Arc<Dataset>,
    spec: &'a TransformSpec,
    plan_spec: PlanSpec,
    slice: Duration,
    /// `--floor-data`: another dataset and all its samples.
    floor_source: Option<&'a (Arc<Dataset>, Arc<Vec<SampleRef>>)>,
    no_floor: bool,
    /// Where the pipeline times its samples and batches (`None`: untimed).
    metrics: Option<PipelineMetrics>,
}

impl Turns<'_> {
    /// One turn of the pipeline with `config`, continuing where `into`'s last stopped, then as
    /// long of the floor (over the images that turn saw, or all of `--floor-data`'s).
    fn take(&self, config: PipelineConfig, into: &mut Measured) -> anyhow::Result<()> {
        let round =
            pipeline_slice(self.dataset, self.spec, config, self.plan_spec, into.pipeline.batches, self.slice, self.metrics.clone())?;
        if !self.no_floor {
            let result = match self.floor_source {
                Some((other, samples)) => floor::full_decode(other, samples, config.threads, self.slice, self.spec.max_image_pixels)?,
                None => {
                    let seen = round.samples(self.dataset, self.plan_spec);
                    floor::full_decode(self.dataset, &Arc::new(seen), config.threads, self.slice, self.spec.max_image_pixels)?
                }
            };
            into.floor = Some(into.floor.map_or(result, |total| total.add(&result)));
        }
        into.pipeline.add(round);
        Ok(())
    }
}

/// What one turn of the pipeline made.
#[derive(Default)]
struct Slice {
    /// Batches taken (where the next turn starts).
    batches: u64,
    images: u64,
    elapsed: Duration,
    decoded: u64,
    source: u64,
    replaced: u64,
    /// The batches taken, for the floor (their samples are looked up after the clock stops:
    /// planning on the consumer thread would compete with the decode threads).
    taken: Vec<(Epoch, Step)>,
}

impl Slice {
    /// The samples of the batches this turn took, in order.
    fn samples(&self, dataset: &Dataset, plan_spec: PlanSpec) -> Vec<SampleRef> {
        let mut plan_opt: Option<EpochPlan> = None;
        let mut samples = Vec::with_capacity(self.taken.len() * plan_spec.batch_size.get() as usize);
        for &(epoch, step) in &self.taken {
            let plan = match plan_opt.take() {
                Some(plan) if plan.epoch() == epoch => plan,
                _ => EpochPlan::new(dataset.table(), plan_spec, epoch),
            };
            samples.extend(plan.batch(Rank(0), step).map(|p| p.sample));
            plan_opt = Some(plan);
        }
        samples
    }

    fn add(&mut self, other: Self) {
        self.batches += other.batches;
        self.images += other.images;
        self.elapsed += other.elapsed;
        self.decoded += other.decoded;
        self.source += other.source;
        self.replaced += other.replaced;
    }
}

/// Run a fresh pipeline from batch `first_batch` of the endless sequence of epochs for
/// `duration`, counting from its first batch (so thread start-up and buffer allocation do not
/// count), then stop it.
fn pipeline_slice(
    dataset: &Arc<Dataset>,
    spec: &TransformSpec,
    config: PipelineConfig,
    plan_spec: PlanSpec,
    first_batch: u64,
    duration: Duration,
    metrics: Option<PipelineMetrics>,
) -> anyhow::Result<Slice> {
    let table = dataset.table();
    let requests = (0u64..)
        .flat_map(move |epoch| {
            let plan = Arc::new(EpochPlan::new(Arc::clone(&table), plan_spec, Epoch(epoch)));
            (0..plan.steps()).map(move |step| BatchRequest { plan: Arc::clone(&plan), rank: Rank(0), step: Step(step) })
        })
        .skip(first_batch as usize);
    let mut pipeline = Pipeline::start_observed(Arc::clone(dataset), spec, config, requests, metrics)?;
    let stats = pipeline.stats();
    let mut slice = Slice::default();
    let (mut started, mut counted_from) = (None::<Instant>, (0u64, 0u64));
    for batch in pipeline.by_ref() {
        let batch = batch?;
        slice.batches += 1;
        slice.taken.push((batch.epoch, batch.step));
        let Some(start) = started else {
            started = Some(Instant::now());
            counted_from = (stats.decoded_pixels.load(Ordering::Relaxed), stats.source_pixels.load(Ordering::Relaxed));
            continue;
        };
        slice.images += batch.len() as u64;
        if start.elapsed() >= duration {
            break;
        }
    }
    slice.elapsed = started.map_or(Duration::ZERO, |s| s.elapsed());
    slice.decoded = stats.decoded_pixels.load(Ordering::Relaxed) - counted_from.0;
    slice.source = stats.source_pixels.load(Ordering::Relaxed) - counted_from.1;
    slice.replaced = stats.replaced.load(Ordering::Relaxed);
    Ok(slice)
}

/// The dataset `--floor-data` names, in the page cache, and all its samples in order. It must
/// hold as many samples as the benchmarked one (the same images, stored another way).
fn floor_dataset(path: &std::path::Path, expected: u64) -> anyhow::Result<(Arc<Dataset>, Arc<Vec<SampleRef>>)> {
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
    Ok((Arc::new(dataset), Arc::new(samples)))
}

/// Read every shard once so that neither run pays for the disk.
fn warm_page_cache(dataset: &Dataset) -> u64 {
    dataset.shards().iter().fold(0, |acc, shard| acc ^ xxhash_rust::xxh3::xxh3_64(shard.bytes()))
}
