//! `stoker demo`: what this build can do, end to end on one machine — generate a sample
//! ImageFolder, pack it into indexed shards, inspect the manifest, then plan two epochs for two
//! ranks and check that every sample is planned exactly once per epoch.
//!
//! The distributed demo (coordinator, workers and trainer ranks over QUIC) replaces the last
//! step when the distributed core is built.

use std::collections::HashSet;
use std::num::{NonZeroU32, NonZeroUsize};
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use stoker_common::ids::{Epoch, Rank, Step};
use stoker_common::plan::{EpochPlan, PlanSpec, Shuffle, Tail};
use stoker_common::sample_data::{SampleDataSpec, write_image_folder};
use stoker_common::shard::pack::PackOptions;
use stoker_common::shard::{IndexPolicy, Manifest, Shard, ShardLocation, resolve_uri};
use stoker_common::transform::TransformSpec;

use crate::args::DemoArgs;
use crate::cmd::pack::{pack_with_progress, print_summary};

const WORLD_SIZE: u32 = 2;
const BATCH_SIZE: u32 = 16;

pub(crate) fn run(args: DemoArgs) -> anyhow::Result<ExitCode> {
    let images = match &args.data {
        Some(folder) => folder.clone(),
        None => generate(&args)?,
    };
    let shards_dir = args.workdir.join("shards");
    println!("== pack {} -> {}", images.display(), shards_dir.display());
    let options = PackOptions {
        input: images,
        output: shards_dir,
        shard_size: 4 << 20,
        threads: std::thread::available_parallelism().unwrap_or(NonZeroUsize::MIN),
        prefix: "demo".into(),
        overwrite: true,
    };
    let started = Instant::now();
    let summary = pack_with_progress(&options)?;
    print_summary(&summary);
    println!("packing took {:.2} s", started.elapsed().as_secs_f64());
    let manifest = &summary.manifest;
    let shards = open_shards(manifest, &summary.manifest_path)?;
    for (entry, shard) in manifest.shards.iter().zip(&shards) {
        let jpegs = (0..shard.len()).filter_map(|index| shard.sample(index)).filter(|sample| sample.member("jpg").is_some()).count();
        println!("  {:<18} {:>5} samples ({jpegs} jpg) {:>8.2} MiB", entry.uri, shard.len(), entry.bytes as f64 / 1048576.0);
    }
    println!("== plan: {WORLD_SIZE} ranks x batch {BATCH_SIZE}, window shuffle of 2 shards, tail=partial");
    let mut all_exactly_once = plan_and_verify(manifest, &shards)?;
    println!("== decode epoch 0 through the worker pipeline: RandomResizedCrop(224) + flip, uint8 NHWC");
    all_exactly_once &= decode_and_verify(&summary.manifest_path)?;
    println!("   (the coordinator, workers and trainers that run this over QUIC are not built yet)");
    if all_exactly_once {
        println!("verification: every sample planned exactly once in each epoch: OK");
        Ok(ExitCode::SUCCESS)
    } else {
        println!("verification: FAILED");
        Ok(ExitCode::FAILURE)
    }
}

fn generate(args: &DemoArgs) -> anyhow::Result<std::path::PathBuf> {
    let folder = args.workdir.join("images");
    let spec = SampleDataSpec { classes: args.classes, images_per_class: args.images_per_class, seed: 0 };
    let marker = folder.join(format!(".generated-{}x{}", spec.classes, spec.images_per_class));
    if marker.is_file() {
        println!("== sample images already in {}", folder.display());
        return Ok(folder);
    }
    if folder.exists() {
        std::fs::remove_dir_all(&folder).with_context(|| format!("failed to clear {}", folder.display()))?;
    }
    println!("== generating {} sample images ({} classes) in {}", spec.classes * spec.images_per_class, spec.classes, folder.display());
    let started = Instant::now();
    let bytes = write_image_folder(&folder, spec)?;
    std::fs::write(&marker, b"").with_context(|| format!("failed to write {}", marker.display()))?;
    println!("generated {:.1} MiB in {:.2} s", bytes as f64 / 1048576.0, started.elapsed().as_secs_f64());
    Ok(folder)
}

fn open_shards(manifest: &Manifest, manifest_path: &Path) -> anyhow::Result<Vec<Shard>> {
    let manifest_dir = manifest_path.parent().unwrap_or(Path::new("."));
    manifest
        .shards
        .iter()
        .map(|entry| match resolve_uri(&entry.uri, manifest_dir)? {
            ShardLocation::File(path) => Ok(Shard::open(&path, IndexPolicy::LoadOrBuildAndWrite)?),
            ShardLocation::S3 { .. } => anyhow::bail!("{}: object stores are not supported by this build", entry.uri),
        })
        .collect()
}

/// Plan two epochs and check, by sample key, that each holds every sample exactly once.
/// Run epoch 0 of both ranks through the real pipeline; check every key arrives exactly once
/// and every checksum matches its payload.
fn decode_and_verify(manifest_path: &Path) -> anyhow::Result<bool> {
    let dataset = Arc::new(stoker_worker::Dataset::open(manifest_path)?);
    let spec = demo_plan_spec()?;
    let plan = Arc::new(EpochPlan::new(dataset.table(), spec, Epoch(0)));
    let requests: Vec<_> = (0..plan.steps())
        .flat_map(|step| (0..WORLD_SIZE).map(move |rank| (rank, step)))
        .map(|(rank, step)| stoker_worker::BatchRequest { plan: Arc::clone(&plan), rank: Rank(rank), step: Step(step) })
        .collect();
    let threads = std::thread::available_parallelism().map_or(1, usize::from);
    let config = stoker_worker::PipelineConfig { threads, in_flight: threads + 2, batch_size: BATCH_SIZE as usize };
    let started = Instant::now();
    let pipeline = stoker_worker::Pipeline::start(Arc::clone(&dataset), &TransformSpec::imagenet_train(224), config, requests)?;
    let stats = pipeline.stats();
    let (mut keys, mut images, mut checksums_ok) = (HashSet::new(), 0u64, true);
    for batch in pipeline {
        let batch = batch?;
        checksums_ok &= xxhash_rust::xxh3::xxh3_64(batch.images()) == batch.checksum;
        images += batch.len() as u64;
        keys.extend(batch.keys().map(str::to_owned));
    }
    let elapsed = started.elapsed().as_secs_f64();
    let replaced = stats.replaced.load(std::sync::atomic::Ordering::Relaxed);
    let ok = checksums_ok && images == dataset.samples() && keys.len() as u64 == images;
    println!(
        "decoded {images} images in {:.2} s ({:.0} images/s on {threads} threads), {} distinct keys, {replaced} replaced, checksums {}",
        elapsed,
        images as f64 / elapsed,
        keys.len(),
        if checksums_ok { "OK" } else { "WRONG" }
    );
    Ok(ok)
}

fn demo_plan_spec() -> anyhow::Result<PlanSpec> {
    Ok(PlanSpec {
        seed: 0,
        world_size: NonZeroU32::new(WORLD_SIZE).context("world size")?,
        batch_size: NonZeroU32::new(BATCH_SIZE).context("batch size")?,
        shuffle: Shuffle::Window { shards: NonZeroU32::new(2).context("window")? },
        tail: Tail::Partial,
    })
}

fn plan_and_verify(manifest: &Manifest, shards: &[Shard]) -> anyhow::Result<bool> {
    let table = Arc::new(manifest.shard_table()?);
    let spec = demo_plan_spec()?;
    let mut all_ok = true;
    for epoch in 0..2 {
        let started = Instant::now();
        let plan = EpochPlan::new(table.clone(), spec, Epoch(epoch));
        let mut keys = HashSet::new();
        let mut planned = 0u64;
        for step in 0..plan.steps() {
            for rank in 0..WORLD_SIZE {
                for sample in plan.batch(Rank(rank), Step(step)) {
                    let key = shards
                        .get(sample.sample.shard.0 as usize)
                        .and_then(|shard| shard.sample(sample.sample.index as usize))
                        .map(|sample| sample.key());
                    keys.insert(key.context("planned a sample the shards do not have")?);
                    planned += 1;
                }
            }
        }
        let elapsed = started.elapsed().as_secs_f64();
        let first: Vec<&str> = plan
            .batch(Rank(0), Step(0))
            .take(3)
            .filter_map(|sample| {
                shards.get(sample.sample.shard.0 as usize)?.sample(sample.sample.index as usize).map(|sample| sample.key())
            })
            .collect();
        let ok = planned == manifest.samples() && keys.len() as u64 == planned;
        all_ok &= ok;
        println!(
            "epoch {epoch}: {} steps per rank, {planned} samples planned, {} distinct keys (planned and checked in {:.1} ms); rank 0 step 0 starts {first:?}",
            plan.steps(),
            keys.len(),
            elapsed * 1000.0
        );
    }
    Ok(all_ok)
}
