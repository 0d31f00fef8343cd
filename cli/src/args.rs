//! Command-line arguments. Help text is written once, here, in the doc comments.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

/// Stoker: a distributed data loader for deep-learning training.
///
/// Available now: turning an ImageFolder into indexed WebDataset shards (`pack`), indexing
/// existing shards (`index`), looking inside them (`inspect`), measuring the worker's decode
/// pipeline (`bench pipeline`) and a local `demo`. The coordinator, the worker service, the
/// trainer client and the Python package are not built yet.
#[derive(Debug, Parser)]
#[command(name = "stoker", version, propagate_version = true)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Pack an ImageFolder (one folder of images per class) into WebDataset tar shards, with an
    /// index beside each shard and a manifest.json. Output is deterministic.
    Pack(PackArgs),
    /// Index existing WebDataset shards (writes SHARD.tar.idx beside each) and optionally write
    /// a manifest for them.
    Index(IndexArgs),
    /// Show what a shard or a dataset manifest holds: samples, members by extension, sizes.
    Inspect(InspectArgs),
    /// Generate a sample dataset, pack it, inspect it and plan an epoch over it.
    Demo(DemoArgs),
    /// Measure throughput on real data.
    #[command(subcommand)]
    Bench(BenchCommand),
}

#[derive(Debug, Subcommand)]
pub(crate) enum BenchCommand {
    /// Run the worker pipeline (decode + RandomResizedCrop + flip by default) over a dataset
    /// for a while, then, in the same run, plain full JPEG decode of the same images with the
    /// same threads (the floor), and report both and their ratio.
    Pipeline(BenchPipelineArgs),
}

#[derive(Debug, Args)]
pub(crate) struct BenchPipelineArgs {
    /// The dataset: a manifest.json, or the folder holding one.
    #[arg(long, value_name = "MANIFEST")]
    pub(crate) data: PathBuf,
    /// Decode threads [default: number of CPUs].
    #[arg(long)]
    pub(crate) threads: Option<usize>,
    /// Samples per batch.
    #[arg(long, default_value_t = 256)]
    pub(crate) batch_size: u32,
    /// Output side of RandomResizedCrop (ignored with --transforms).
    #[arg(long, default_value_t = 224)]
    pub(crate) size: u32,
    /// Seconds to run the pipeline; the floor runs as long.
    #[arg(long, default_value_t = 10.0)]
    pub(crate) seconds: f64,
    /// A TransformSpec as JSON instead of RandomResizedCrop(size) + RandomHorizontalFlip, e.g.
    /// '{"transforms": [{"type": "Resize", "shorter_side": 256}, {"type": "CenterCrop", "size": 224}]}'.
    #[arg(long, value_name = "JSON")]
    pub(crate) transforms: Option<String>,
    /// Decode at full scale even when the crop would allow M/8 DCT scaling.
    #[arg(long)]
    pub(crate) no_dct_scaling: bool,
    /// Plan seed.
    #[arg(long, default_value_t = 0)]
    pub(crate) seed: u64,
    /// Skip the full-decode floor (the ratio is then not reported).
    #[arg(long)]
    pub(crate) no_floor: bool,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Debug, Args)]
pub(crate) struct PackArgs {
    /// ImageFolder root: class folders holding images (jpg, jpeg, png, ppm, bmp, pgm, tif, tiff, webp).
    #[arg(long)]
    pub(crate) input: PathBuf,
    /// Folder for the shards, their indexes and manifest.json (created if missing).
    #[arg(long)]
    pub(crate) output: PathBuf,
    /// Largest shard size, e.g. 256MiB, 1GB, 500000 (bytes). Samples are never split.
    #[arg(long, default_value = "256MiB", value_parser = parse_byte_size)]
    pub(crate) shard_size: u64,
    /// Threads reading image files [default: number of CPUs].
    #[arg(long)]
    pub(crate) threads: Option<usize>,
    /// Shard file names are PREFIX-000000.tar, PREFIX-000001.tar, ...
    #[arg(long, default_value = "shard")]
    pub(crate) prefix: String,
    /// Replace a dataset already in the output folder.
    #[arg(long)]
    pub(crate) force: bool,
}

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

#[derive(Debug, Args)]
pub(crate) struct InspectArgs {
    /// A shard (.tar), a manifest (.json), or a folder holding manifest.json.
    pub(crate) path: PathBuf,
    /// Print one JSON object (for scripts); for a shard it lists every member's offset and size.
    #[arg(long)]
    pub(crate) json: bool,
    /// Samples listed in the text output of a shard.
    #[arg(long, default_value_t = 5)]
    pub(crate) show: usize,
}

#[derive(Debug, Args)]
pub(crate) struct DemoArgs {
    /// An ImageFolder to use instead of the generated sample.
    #[arg(long)]
    pub(crate) data: Option<PathBuf>,
    /// Working folder for the generated images and shards.
    #[arg(long, default_value = "demo-data")]
    pub(crate) workdir: PathBuf,
    /// Classes in the generated sample.
    #[arg(long, default_value_t = 10)]
    pub(crate) classes: u32,
    /// Images per class in the generated sample.
    #[arg(long, default_value_t = 60)]
    pub(crate) images_per_class: u32,
}

/// `256MiB`, `1GB`, `4k`, `1000`: a byte count with an optional decimal or binary unit.
pub(crate) fn parse_byte_size(text: &str) -> Result<u64, String> {
    let trimmed = text.trim();
    let split = trimmed.find(|character: char| !character.is_ascii_digit() && character != '.').unwrap_or(trimmed.len());
    let (number, unit) = trimmed.split_at(split);
    let value: f64 = number.parse().map_err(|_| format!("{text:?} is not a size like 256MiB"))?;
    let multiplier: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" => 1000,
        "kib" => 1 << 10,
        "m" | "mb" => 1_000_000,
        "mib" => 1 << 20,
        "g" | "gb" => 1_000_000_000,
        "gib" => 1 << 30,
        other => return Err(format!("unknown size unit {other:?} (use B, KB, KiB, MB, MiB, GB, GiB)")),
    };
    let bytes = value * multiplier as f64;
    if bytes < 4096.0 {
        return Err(format!("{text:?} is too small for a shard (at least 4KiB)"));
    }
    Ok(bytes as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_sizes_parse_with_units() {
        assert_eq!(parse_byte_size("256MiB"), Ok(256 << 20));
        assert_eq!(parse_byte_size("1GB"), Ok(1_000_000_000));
        assert_eq!(parse_byte_size("8192"), Ok(8192));
        assert_eq!(parse_byte_size("1.5 KiB").ok(), None, "below the 4KiB floor");
        assert!(parse_byte_size("12 parsecs").is_err());
        assert!(parse_byte_size("MiB").is_err());
    }

    #[test]
    fn cli_definition_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
