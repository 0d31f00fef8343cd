//! `stoker index` of token files: each opened and checked in place (never rewritten), its
//! tokens and documents counted, and `tokens.json` written to list them.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use rayon::prelude::*;
use stoker_format::brace;
use stoker_format::tokens::{TOKEN_MANIFEST_FILE, TokenDataset, TokenManifest, TokenManifestFile, TokenScan, megatron_paths};
use stoker_store::ObjectUri;

use crate::cmd::index::IndexArgs;
use crate::cmd::token_report::scan_file;

pub(crate) fn run(args: &IndexArgs) -> anyhow::Result<ExitCode> {
    let mut paths = Vec::new();
    let mut seen = BTreeSet::new();
    for pattern in &args.shards {
        anyhow::ensure!(
            !ObjectUri::is_object_uri(pattern),
            "{pattern}: token datasets in object stores are not read yet: index a local copy"
        );
        for path in brace::expand(pattern)?.into_iter().map(PathBuf::from) {
            // A Megatron dataset named by its .bin and its .idx is one dataset.
            let key = megatron_paths(&path).map_or_else(|| path.clone(), |(bin, _)| bin);
            if seen.insert(key.clone()) {
                paths.push(key);
            }
        }
    }
    let options = args.tokens.options();
    let opened: Vec<_> = paths.par_iter().map(|path| TokenDataset::open(path, options)).collect();
    let mut datasets = Vec::with_capacity(opened.len());
    for outcome in opened {
        datasets.push(outcome?);
    }
    let first = datasets.first().context("no token files given")?;
    let (format, dtype, eos) = (first.format(), first.dtype(), first.eos());
    for dataset in &datasets {
        anyhow::ensure!(
            (dataset.format(), dataset.dtype()) == (format, dtype),
            "{} is {} of {} but {} is {format} of {dtype}: a token dataset has one format and token type; index each in a run of its own",
            dataset.path().display(),
            dataset.format(),
            dataset.dtype(),
            first.path().display()
        );
    }
    let manifest_path = match &args.manifest {
        Some(path) => path.clone(),
        None => first.path().parent().map_or_else(|| PathBuf::from(TOKEN_MANIFEST_FILE), |folder| folder.join(TOKEN_MANIFEST_FILE)),
    };
    let manifest_dir = std::path::absolute(&manifest_path)?.parent().map(Path::to_path_buf).unwrap_or_default();
    let relative = |path: &Path| {
        let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
        absolute.strip_prefix(&manifest_dir).unwrap_or(&absolute).to_string_lossy().into_owned()
    };
    let scanned: Vec<_> = datasets.par_iter().map(|dataset| scan_file(dataset, &relative)).collect();
    let mut total = TokenScan::new();
    let mut files = Vec::with_capacity(scanned.len());
    for (report, scan) in scanned {
        total.merge(scan);
        files.push(TokenManifestFile {
            uri: report.path,
            bytes: report.bytes,
            index_uri: report.index_path,
            index_bytes: report.index_bytes,
            tokens: report.tokens,
            documents: report.documents,
            max_token: report.max_token,
        });
    }
    let stats = total.finish();
    let manifest = TokenManifest::new(format, dtype, eos, files);
    manifest.save(&manifest_path)?;
    println!(
        "indexed {} token files ({format}, {dtype}): {} tokens, {} documents, vocabulary at least {}",
        manifest.files.len(),
        stats.tokens,
        stats.documents,
        stats.vocab_at_least.map_or_else(|| "unknown".to_owned(), |vocab| vocab.to_string())
    );
    println!("manifest: {} (the token files are read in place, not rewritten)", manifest_path.display());
    Ok(ExitCode::SUCCESS)
}
