//! `stoker demo`: the whole system on one machine. Generate a sample ImageFolder, pack it
//! into indexed shards, then run a coordinator, two workers and two trainer ranks on loopback
//! (over QUIC, as a cluster would) for two epochs, and check by key that every sample arrived
//! exactly once per epoch.

use std::collections::HashMap;
use std::num::{NonZeroU32, NonZeroUsize};
use std::path::Path;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::Context;
use stoker_format::pack::PackOptions;
use stoker_format::{IndexPolicy, Manifest, Shard, ShardLocation, resolve_uri};
use stoker_plan::{Shuffle, Tail};
use stoker_sample_data::{SampleDataSpec, write_image_folder};
use stoker_testkit::{ClusterConfig, TestCluster};

use super::ranks::{RankReport, consume_ranks, peak_rss_mib};
use crate::args::DemoArgs;
use crate::cmd::pack::{pack_with_progress, print_summary};

const WORLD_SIZE: u32 = 2;
const WORKERS: usize = 2;
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
        rewrite_jpeg: Some(stoker_worker::make_seekable_for_pack),
        shuffle_seed: Some(0),
    };
    let started = Instant::now();
    let summary = pack_with_progress(&options)?;
    print_summary(&summary);
    println!("packing took {:.2} s", started.elapsed().as_secs_f64());
    let manifest = &summary.manifest;
    let shards = open_shards(manifest, &summary.manifest_path)?;
    for (entry, shard) in manifest.shards.iter().zip(&shards) {
        println!("  {:<18} {:>5} samples {:>8.2} MiB", entry.uri, shard.len(), entry.bytes as f64 / 1048576.0);
    }

    println!("== cluster on loopback: 1 coordinator, {WORKERS} workers (1 decode thread each), {WORLD_SIZE} trainer ranks");
    let cluster = TestCluster::start(ClusterConfig { workers: WORKERS, threads_per_worker: 1, ..ClusterConfig::default() })
        .map_err(anyhow::Error::msg)?;
    println!("coordinator {}", cluster.coordinator_addr());
    let manifest_path = std::path::absolute(&summary.manifest_path)?;
    let dataset = cluster.add_dataset("demo", &manifest_path).map_err(anyhow::Error::msg)?;
    println!("dataset \"demo\": {} samples in {} shards", dataset.shard_counts.iter().sum::<u64>(), dataset.shard_counts.len());
    cluster.wait_for_workers().map_err(anyhow::Error::msg)?;

    println!(
        "== {} epochs, {WORLD_SIZE} ranks x batch {BATCH_SIZE}, RandomResizedCrop(224) + flip, window shuffle of 2 shards, tail=partial",
        args.epochs
    );
    let mut base = cluster.loader_config("demo", BATCH_SIZE);
    base.shuffle = Shuffle::Window { shards: NonZeroU32::new(2).context("window")? };
    base.tail = Tail::Partial;
    let started = Instant::now();
    let reports = consume_ranks(&base, WORLD_SIZE, args.epochs, true)?;
    let elapsed = started.elapsed().as_secs_f64();
    let images: u64 = reports.iter().map(|report| report.images).sum();
    for report in &reports {
        println!(
            "rank {}: {} batches, {} images, waited {:.2} s for data ({:.0}% of its time), first batch after {:.2} s, {} duplicates dropped",
            report.rank,
            report.batches,
            report.images,
            report.wait_seconds,
            100.0 * report.wait_fraction(),
            report.first_batch_seconds,
            report.duplicates
        );
    }
    println!(
        "cluster: {images} images in {elapsed:.2} s = {:.0} images/s; peak memory {:.0} MiB",
        images as f64 / elapsed,
        peak_rss_mib().unwrap_or(f64::NAN)
    );
    let verified = verify(&reports, manifest.samples(), args.epochs);
    if verified {
        println!("verification: every sample arrived exactly once in each epoch, every step in order: OK");
        Ok(ExitCode::SUCCESS)
    } else {
        println!("verification: FAILED");
        Ok(ExitCode::FAILURE)
    }
}

/// Per epoch: every key exactly once over the ranks; per rank: steps 0, 1, 2, ... in order.
fn verify(reports: &[RankReport], samples: u64, epochs: u64) -> bool {
    let mut ok = true;
    for epoch in 0..epochs {
        let mut counts: HashMap<&str, u32> = HashMap::new();
        for report in reports {
            let steps: Vec<u64> = report.keys.iter().filter(|(e, _, _)| *e == epoch).map(|(_, step, _)| *step).collect();
            if steps.iter().enumerate().any(|(index, step)| *step != index as u64) {
                println!("epoch {epoch}: rank {} got steps out of order: {steps:?}", report.rank);
                ok = false;
            }
            for (_, _, keys) in report.keys.iter().filter(|(e, _, _)| *e == epoch) {
                for key in keys {
                    *counts.entry(key.as_str()).or_default() += 1;
                }
            }
        }
        let repeated = counts.values().filter(|count| **count > 1).count();
        let epoch_ok = counts.len() as u64 == samples && repeated == 0;
        println!(
            "epoch {epoch}: {} distinct keys of {samples}, {repeated} repeated: {}",
            counts.len(),
            if epoch_ok { "OK" } else { "WRONG" }
        );
        ok &= epoch_ok;
    }
    ok
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
