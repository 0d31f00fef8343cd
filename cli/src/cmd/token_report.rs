//! What `stoker inspect` and `stoker index` say of token datasets: one report, as text or JSON.

use std::path::Path;

use serde::Serialize;
use stoker_format::tokens::{TokenDataset, TokenDtype, TokenFormat, TokenScan, TokenStats};

use crate::cmd::token_packing::PackingReport;

/// One token file as found on disk.
#[derive(Serialize)]
pub(crate) struct FileReport {
    pub(crate) path: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) index_path: Option<String>,
    pub(crate) bytes: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) index_bytes: Option<u64>,
    pub(crate) tokens: u64,
    pub(crate) documents: u64,
    pub(crate) max_token: Option<i64>,
    /// Documents of a Megatron dataset's document index (its documents are its sequences).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) index_documents: Option<u64>,
}

/// A token dataset (one file, or a manifest's files) as found on disk.
#[derive(Serialize)]
pub(crate) struct TokenReport {
    pub(crate) kind: &'static str,
    pub(crate) path: String,
    pub(crate) format: TokenFormat,
    pub(crate) dtype: TokenDtype,
    pub(crate) eos: Option<i64>,
    #[serde(flatten)]
    pub(crate) stats: TokenStats,
    pub(crate) files: Vec<FileReport>,
    /// What packing into rows gives (`--seq-len`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) packing: Option<PackingReport>,
    pub(crate) problems: Vec<String>,
}

/// Scan `dataset` (every token read once): its report and its scan, to merge into a dataset's.
pub(crate) fn scan_file(dataset: &TokenDataset, shown: &dyn Fn(&Path) -> String) -> (FileReport, TokenScan) {
    let mut scan = TokenScan::new();
    dataset.scan_into(&mut scan);
    let report = FileReport {
        path: shown(dataset.path()),
        index_path: dataset.index_path().map(shown),
        bytes: dataset.file_bytes(),
        index_bytes: dataset.megatron().map(|index| index.file_bytes()),
        tokens: dataset.token_count(),
        documents: scan.documents_seen(),
        max_token: scan.max_token(),
        index_documents: dataset.megatron().map(|index| index.documents() as u64),
    };
    (report, scan)
}

impl TokenReport {
    /// Problems found in the stats themselves: negative tokens mean a wrong dtype.
    pub(crate) fn check_tokens(&mut self) {
        if let Some(min) = self.stats.min_token.filter(|min| *min < 0) {
            self.problems
                .push(format!("negative tokens (the smallest is {min}): the files are not {} tokens (wrong --dtype?)", self.dtype));
        }
    }

    /// Print as text, or as one JSON object.
    pub(crate) fn print(&self, json: bool) -> anyhow::Result<()> {
        if json {
            println!("{}", serde_json::to_string_pretty(self)?);
            return Ok(());
        }
        let stats = &self.stats;
        println!("tokens     {}", self.path);
        println!("format     {} ({})", self.format, self.format.describe());
        println!("dtype      {}", self.dtype);
        println!("files      {}", self.files.len());
        println!("tokens     {}", stats.tokens);
        let how = match (self.format, self.eos) {
            (TokenFormat::Megatron, _) => {
                let grouped: u64 = self.files.iter().filter_map(|file| file.index_documents).sum();
                format!("Megatron sequences; {grouped} documents in its document index")
            }
            (_, Some(eos)) => format!("each up to and including EOS {eos}"),
            (_, None) => "one per file: give --eos to split at an end-of-document token".to_owned(),
        };
        println!("documents  {} ({how})", stats.documents);
        match (stats.max_token, stats.vocab_at_least) {
            (Some(max), Some(vocab)) => println!("vocabulary at least {vocab} (the largest token is {max})"),
            _ => println!("vocabulary unknown (no tokens)"),
        }
        if let Some(lengths) = &stats.document_length {
            println!(
                "lengths    min {}, p50 {}, p90 {}, p99 {}, max {}, mean {:.1} tokens per document",
                lengths.min, lengths.p50, lengths.p90, lengths.p99, lengths.max, lengths.mean
            );
        }
        if let Some(packing) = &self.packing {
            packing.print();
        }
        for problem in &self.problems {
            println!("problem: {problem}");
        }
        Ok(())
    }
}
