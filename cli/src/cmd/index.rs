//! `stoker index`.

use clap::Args;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use rayon::prelude::*;
use stoker_format::brace;
use stoker_format::{IndexPolicy, IndexStatus, Manifest, ManifestShard, Shard};

use crate::progress;

#[derive(Debug, Args)]
pub(crate) struct IndexArgs {
    /// Shard files; WebDataset brace patterns expand: 'train-{000000..000127}.tar'.
    #[arg(required = true)]
    pub(crate) shards: Vec<String>,
    /// Also write a manifest listing these shards (paths relative to the manifest's folder).
    #[arg(long, value_name = "OUT.json")]
    pub(crate) manifest: Option<PathBuf>,
    /// Rebuild indexes even when a valid one exists.
    #[arg(long)]
    pub(crate) force: bool,
}

/// What `stoker index` keeps of one shard once indexed.
struct Indexed {
    samples: u64,
    bytes: u64,
    status: IndexStatus,
}

pub(crate) fn run(args: IndexArgs) -> anyhow::Result<ExitCode> {
    let mut paths = Vec::new();
    for pattern in &args.shards {
        if stoker_store::ObjectUri::is_object_uri(pattern) {
            anyhow::bail!(
                "{}: stoker index does not read object stores yet: download the file (aws s3 cp) and index the copy; \
                 `stoker pack --output s3://...` writes indexes and the manifest beside the shards",
                pattern
            );
        }
        paths.extend(brace::expand(pattern)?.into_iter().map(PathBuf::from));
    }
    let policy = if args.force { IndexPolicy::Rebuild } else { IndexPolicy::LoadOrBuildAndWrite };
    let bar = progress::bar(paths.len() as u64, "indexing");
    // Shards are indexed in parallel (each is read and hashed on its own); results are
    // reported in the order given, and a shard's mapping is dropped as soon as it is counted.
    let outcomes: Vec<_> = paths
        .par_iter()
        .map(|path| {
            let outcome = Shard::open(path, policy).map(|shard| Indexed {
                samples: shard.len() as u64,
                bytes: shard.bytes().len() as u64,
                status: shard.index_status().clone(),
            });
            bar.inc(1);
            outcome
        })
        .collect();
    let (mut entries, mut failures, mut built) = (Vec::new(), 0usize, 0usize);
    for (path, outcome) in paths.iter().zip(outcomes) {
        match outcome {
            Ok(indexed) => {
                if let IndexStatus::Built { written, .. } = indexed.status {
                    built += 1;
                    if !written {
                        bar.suspend(|| eprintln!("warning: could not write the index of {} (read-only folder?)", path.display()));
                    }
                }
                entries.push((path.clone(), indexed.samples, indexed.bytes));
            }
            Err(error) => {
                failures += 1;
                bar.suspend(|| eprintln!("error: {error}"));
            }
        }
    }
    bar.finish_and_clear();
    let samples: u64 = entries.iter().map(|(_, samples, _)| samples).sum();
    println!("indexed {} shards, {samples} samples: {built} indexes built, {} already up to date", entries.len(), entries.len() - built);
    if failures > 0 {
        anyhow::bail!("{failures} of {} shards could not be indexed (see above); no manifest written", paths.len());
    }
    if let Some(manifest_path) = &args.manifest {
        write_manifest(manifest_path, &entries)?;
        println!("manifest: {}", manifest_path.display());
    }
    Ok(ExitCode::SUCCESS)
}

fn write_manifest(manifest_path: &Path, entries: &[(PathBuf, u64, u64)]) -> anyhow::Result<()> {
    let manifest_dir = std::path::absolute(manifest_path)?.parent().map(Path::to_path_buf).unwrap_or_default();
    let mut shards = Vec::with_capacity(entries.len());
    for (path, samples, bytes) in entries {
        let absolute = std::path::absolute(path)?;
        let uri = absolute.strip_prefix(&manifest_dir).unwrap_or(&absolute).to_string_lossy().into_owned();
        shards.push(ManifestShard { uri, samples: *samples, bytes: *bytes });
    }
    // Version 1: nothing of version 2 is in it, and older builds read it.
    let manifest = Manifest::new(shards, Vec::new(), None);
    manifest.save(manifest_path).with_context(|| format!("failed to write {}", manifest_path.display()))
}
