//! `stoker index`.

use clap::Args;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use rayon::prelude::*;
use stoker_format::brace;
use stoker_format::{IndexPolicy, IndexStatus, Manifest, ManifestShard, Shard, index_path};
use stoker_store::{ObjectStores, ObjectUri};
use tokio::runtime::Runtime;

use crate::cmd::object_files::download_shard;
use crate::flags::{ObjectStoreArgs, TokenFileArgs, is_token_path};
use crate::progress;

#[derive(Debug, Args)]
pub(crate) struct IndexArgs {
    /// Shard files, or shards in an object store (s3://bucket/key: each is downloaded into
    /// TMPDIR, indexed there, and its index uploaded beside it); WebDataset brace patterns
    /// expand: 'train-{000000..000127}.tar'. Or token files (.bin, .idx, a Megatron prefix):
    /// checked and counted in place, never rewritten, and listed in tokens.json.
    #[arg(required = true)]
    pub(crate) shards: Vec<String>,
    /// Also write a manifest listing these shards (paths relative to the manifest's folder). Of
    /// token files: where to write their tokens.json (default: beside the first).
    /// Of shards in an object store: an s3:// URI, uploaded (shards under its prefix listed by
    /// relative name, others by s3:// URI).
    #[arg(long, value_name = "OUT.json")]
    pub(crate) manifest: Option<PathBuf>,
    /// Rebuild indexes even when a valid one exists.
    #[arg(long)]
    pub(crate) force: bool,
    #[command(flatten)]
    pub(crate) object_store: ObjectStoreArgs,
    #[command(flatten)]
    pub(crate) tokens: TokenFileArgs,
}

/// What `stoker index` keeps of one shard once indexed.
struct Indexed {
    samples: u64,
    bytes: u64,
    status: IndexStatus,
}

pub(crate) fn run(args: IndexArgs) -> anyhow::Result<ExitCode> {
    if args.tokens.given() || args.shards.iter().any(|pattern| is_token_path(Path::new(pattern))) {
        return super::index_tokens::run(&args);
    }
    let remote = args.shards.iter().filter(|pattern| ObjectUri::is_object_uri(pattern)).count();
    if remote == args.shards.len() {
        return index_objects(&args);
    }
    if remote > 0 {
        anyhow::bail!("give either local shard files or s3:// URIs, not both: index each kind in a run of its own");
    }
    let mut paths = Vec::new();
    for pattern in &args.shards {
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

/// `stoker index` of shards in an object store: one at a time (each is downloaded whole), the
/// index uploaded beside each shard whose index was missing or stale.
fn index_objects(args: &IndexArgs) -> anyhow::Result<ExitCode> {
    let mut uris = Vec::new();
    for pattern in &args.shards {
        for text in brace::expand(pattern)? {
            uris.push(ObjectUri::parse(&text)?);
        }
    }
    // Checked before any download: a manifest on local disk may not list s3:// shards.
    let manifest_opt = match &args.manifest {
        Some(target) => {
            let text = target.to_string_lossy();
            anyhow::ensure!(
                ObjectUri::is_object_uri(&text),
                "--manifest {text}: the manifest of shards in an object store goes into the store beside them (a manifest on \
                 local disk may not list s3:// shards): give an s3:// URI, e.g. --manifest {}",
                uris[0].parent().join(stoker_format::MANIFEST_FILE)?
            );
            Some(ObjectUri::parse(&text)?)
        }
        None => None,
    };
    let stores = args.object_store.stores()?;
    let runtime = super::remote::runtime()?;
    let policy = if args.force { IndexPolicy::Rebuild } else { IndexPolicy::LoadOrBuildAndWrite };
    let bar = progress::bar(uris.len() as u64, "indexing");
    let (mut entries, mut failures, mut built) = (Vec::new(), 0usize, 0usize);
    for uri in &uris {
        match index_object(&runtime, &stores, uri, policy) {
            Ok(indexed) => {
                built += usize::from(matches!(indexed.status, IndexStatus::Built { .. }));
                entries.push((uri.clone(), indexed.samples, indexed.bytes));
            }
            Err(error) => {
                failures += 1;
                bar.suspend(|| eprintln!("error: {error:#}"));
            }
        }
        bar.inc(1);
    }
    bar.finish_and_clear();
    let samples: u64 = entries.iter().map(|(_, samples, _)| samples).sum();
    println!(
        "indexed {} shards, {samples} samples: {built} indexes built and uploaded, {} already up to date",
        entries.len(),
        entries.len() - built
    );
    if failures > 0 {
        anyhow::bail!("{failures} of {} shards could not be indexed (see above); no manifest written", uris.len());
    }
    if let Some(manifest_uri) = &manifest_opt {
        write_object_manifest(&runtime, &stores, manifest_uri, &entries)?;
        println!("manifest: {manifest_uri}; add it with: stoker dataset add NAME {manifest_uri}");
    }
    Ok(ExitCode::SUCCESS)
}

/// Download `uri` (with its index unless rebuilding), index it, and upload the index if it was
/// built.
fn index_object(runtime: &Runtime, stores: &ObjectStores, uri: &ObjectUri, policy: IndexPolicy) -> anyhow::Result<Indexed> {
    let copy = download_shard(runtime, stores, uri, policy != IndexPolicy::Rebuild)?;
    let shard = Shard::open(&copy.shard, policy).with_context(|| format!("{uri}"))?;
    let indexed = Indexed { samples: shard.len() as u64, bytes: shard.bytes().len() as u64, status: shard.index_status().clone() };
    drop(shard);
    if let IndexStatus::Built { written, .. } = indexed.status {
        anyhow::ensure!(written, "{uri}: the index was built but could not be written in the temporary folder (TMPDIR full?)");
        runtime.block_on(stores.upload(&index_path(&copy.shard), &uri.index()))?;
    }
    Ok(indexed)
}

/// Upload the manifest of shards in an object store to `target`: shards under its prefix by
/// relative name (the dataset can move as a whole), others by s3:// URI.
fn write_object_manifest(
    runtime: &Runtime,
    stores: &ObjectStores,
    target: &ObjectUri,
    entries: &[(ObjectUri, u64, u64)],
) -> anyhow::Result<()> {
    let folder = target.parent();
    let shards = entries
        .iter()
        .map(|(uri, samples, bytes)| {
            let relative_opt = Some(&folder)
                .filter(|folder| uri.is_under(folder))
                .and_then(|folder| uri.key().strip_prefix(folder.key().trim_end_matches('/')))
                .map(|rest| rest.trim_start_matches('/').to_owned());
            ManifestShard { uri: relative_opt.unwrap_or_else(|| uri.to_string()), samples: *samples, bytes: *bytes }
        })
        .collect();
    let body = Manifest::new(shards, Vec::new(), None).to_text(Path::new(&target.to_string()))?;
    runtime.block_on(stores.put(target, bytes::Bytes::from(body)))?;
    Ok(())
}
