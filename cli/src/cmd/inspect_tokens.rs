//! `stoker inspect` of token datasets: a token file, or a `tokens.json` and its files, each
//! read once to count documents and tokens, the largest token, and document lengths.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use stoker_format::tokens::{TokenDataset, TokenManifest, TokenOptions, TokenScan};
use stoker_format::{ShardLocation, resolve_uri};

use crate::cmd::token_packing::PackingArgs;
use crate::cmd::token_report::{TokenReport, scan_file};

/// Inspect the token file at `path`.
pub(crate) fn inspect_file(path: &Path, options: TokenOptions, packing: &PackingArgs, json: bool) -> anyhow::Result<ExitCode> {
    let dataset = TokenDataset::open(path, options)?;
    let shown = |path: &Path| path.display().to_string();
    let (file, scan) = scan_file(&dataset, &shown);
    let packing = packing.report(scan.document_lengths())?;
    let mut report = TokenReport {
        kind: "tokens",
        path: path.display().to_string(),
        format: dataset.format(),
        dtype: dataset.dtype(),
        eos: dataset.eos(),
        stats: scan.finish(),
        files: vec![file],
        packing,
        problems: Vec::new(),
    };
    report.check_tokens();
    report.print(json)?;
    Ok(if report.problems.is_empty() { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

/// Inspect the token manifest at `path`: every file opened, scanned and compared with what the
/// manifest says of it.
pub(crate) fn inspect_manifest(path: &Path, packing: &PackingArgs, json: bool) -> anyhow::Result<ExitCode> {
    let manifest = TokenManifest::load(path)?;
    let manifest_dir = path.parent().map(Path::to_path_buf).unwrap_or_else(|| PathBuf::from("."));
    let options = TokenOptions { format: Some(manifest.format), dtype: Some(manifest.dtype), eos: manifest.eos };
    let (mut files, mut problems, mut total) = (Vec::new(), Vec::new(), TokenScan::new());
    for entry in &manifest.files {
        let file_path = match resolve_uri(&entry.uri, &manifest_dir)? {
            ShardLocation::File(file_path) => file_path,
            ShardLocation::S3 { .. } => {
                problems.push(format!("{}: token datasets in object stores are not read yet", entry.uri));
                continue;
            }
        };
        let dataset = match TokenDataset::open(&file_path, options) {
            Ok(dataset) => dataset,
            Err(error) => {
                problems.push(error.to_string());
                continue;
            }
        };
        let shown = |_: &Path| entry.uri.clone();
        let (mut file, scan) = scan_file(&dataset, &shown);
        file.index_path = entry.index_uri.clone();
        let found = (file.bytes, file.index_bytes, file.tokens, file.documents);
        let listed = (entry.bytes, entry.index_bytes, entry.tokens, entry.documents);
        if found != listed {
            problems.push(format!(
                "{}: the manifest says {} bytes (index {:?}), {} tokens, {} documents; the file has {} bytes (index {:?}), {} tokens, {} \
                 documents: it changed since stoker index; index it again",
                entry.uri, listed.0, listed.1, listed.2, listed.3, found.0, found.1, found.2, found.3
            ));
        }
        total.merge(scan);
        files.push(file);
    }
    // Packing is planned over the files read; with a file missing the figures would mislead.
    let packing = if problems.is_empty() { packing.report(total.document_lengths())? } else { None };
    let mut report = TokenReport {
        kind: "tokens",
        path: path.display().to_string(),
        format: manifest.format,
        dtype: manifest.dtype,
        eos: manifest.eos,
        stats: total.finish(),
        files,
        packing,
        problems,
    };
    report.check_tokens();
    report.print(json)?;
    Ok(if report.problems.is_empty() { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}
