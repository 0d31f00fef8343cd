//! `stoker pack`.

use clap::Args;
use std::num::NonZeroUsize;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use stoker_format::manifest::PackedOrder;
use stoker_format::pack::{PackOptions, PackSummary, RewriteJpeg, pack};

use crate::flags::ObjectStoreArgs;
use crate::progress;

#[derive(Debug, Args)]
pub(crate) struct PackArgs {
    /// ImageFolder root: class folders holding images (jpg, jpeg, png, ppm, bmp, pgm, tif, tiff, webp).
    #[arg(long)]
    pub(crate) input: PathBuf,
    /// Folder for the shards, their indexes and manifest.json (created if missing); or
    /// `s3://bucket/prefix`: packed into a temporary folder (it needs the dataset's size in
    /// free space there, $TMPDIR), then uploaded (multipart), manifest.json last.
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
    /// Store every image file byte for byte. By default each JPEG is re-encoded losslessly
    /// (same DCT coefficients, so the same pixels) with a restart marker per MCU and optimized
    /// Huffman tables, which lets workers entropy-decode only the part a crop covers; files
    /// that cannot be re-encoded exactly are stored as they are.
    #[arg(long)]
    pub(crate) verbatim: bool,
    /// Write samples in folder order (sorted classes, sorted files). By default they are
    /// shuffled across shards: in folder order each shard holds one or two classes, and the
    /// default `window` shuffle, which reads a few shards at a time, would then give batches
    /// of a handful of classes. Data kept in folder order needs `shuffle=block` or `full`.
    #[arg(long)]
    pub(crate) no_shuffle: bool,
    /// Seed of the order samples are written in (recorded in manifest.json).
    #[arg(long, default_value_t = 0, conflicts_with = "no_shuffle")]
    pub(crate) seed: u64,
    #[command(flatten)]
    pub(crate) object_store: ObjectStoreArgs,
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

pub(crate) fn run(args: PackArgs) -> anyhow::Result<ExitCode> {
    let output_text = args.output.to_string_lossy().into_owned();
    let (output, upload_to) = if stoker_store::ObjectUri::is_object_uri(&output_text) {
        let prefix = stoker_store::ObjectUri::parse_prefix(&output_text)?;
        let staging = tempfile::Builder::new().prefix("stoker-pack-").tempdir().context("cannot make a temporary folder to pack into")?;
        (staging.path().join("shards"), Some((prefix, staging)))
    } else {
        (args.output.clone(), None)
    };
    let threads =
        args.threads.and_then(NonZeroUsize::new).unwrap_or_else(|| std::thread::available_parallelism().unwrap_or(NonZeroUsize::MIN));
    let options = PackOptions {
        input: args.input,
        output,
        shard_size: args.shard_size,
        threads,
        prefix: args.prefix,
        overwrite: args.force,
        rewrite_jpeg: (!args.verbatim).then_some(stoker_worker::make_seekable_for_pack as RewriteJpeg),
        shuffle_seed: (!args.no_shuffle).then_some(args.seed),
    };
    let summary = pack_with_progress(&options)?;
    print_summary(&summary);
    if let Some((prefix, _staging)) = upload_to {
        upload(&args.object_store, &options.output, &prefix)?;
    }
    Ok(ExitCode::SUCCESS)
}

/// Upload what pack wrote in `folder` under `prefix`: shards and indexes, then manifest.json
/// (whose shard names are relative, so they resolve beside it), so that a manifest is only
/// ever seen with its shards in place.
fn upload(store_args: &ObjectStoreArgs, folder: &std::path::Path, prefix: &stoker_store::ObjectUri) -> anyhow::Result<()> {
    let stores = store_args.stores()?;
    let mut files: Vec<PathBuf> = std::fs::read_dir(folder)
        .with_context(|| format!("cannot list {}", folder.display()))?
        .map(|entry| entry.map(|entry| entry.path()))
        .collect::<Result<_, _>>()?;
    files.retain(|path| path.is_file());
    // The manifest last.
    files.sort_by_key(|path| (path.file_name().is_some_and(|name| name == stoker_format::MANIFEST_FILE), path.clone()));
    let runtime = super::remote::runtime()?;
    let bar = progress::bar(files.len() as u64, "uploading");
    let mut bytes = 0;
    for path in &files {
        let name = path.file_name().map(|name| name.to_string_lossy().into_owned()).unwrap_or_default();
        let uri = prefix.join(&name)?;
        bytes += runtime.block_on(stores.upload(path, &uri))?;
        bar.inc(1);
    }
    bar.finish_and_clear();
    println!(
        "uploaded {} files ({:.1} MiB) to {prefix}; add it with: stoker dataset add NAME {}",
        files.len(),
        bytes as f64 / 1048576.0,
        prefix.join(stoker_format::MANIFEST_FILE)?
    );
    Ok(())
}

/// Pack with a progress bar on stderr.
pub(crate) fn pack_with_progress(options: &PackOptions) -> anyhow::Result<PackSummary> {
    let bar = progress::bar(0, "packing");
    let summary = pack(options, &mut |state| {
        bar.set_length(state.files_total);
        bar.set_position(state.files_done);
        bar.set_prefix(format!("{:.1} MiB, {} shards", state.bytes_done as f64 / 1048576.0, state.shards_done));
    })
    .with_context(|| format!("failed to pack {}", options.input.display()))?;
    bar.finish_and_clear();
    Ok(summary)
}

/// The one-line result of packing, and skipped files if any.
pub(crate) fn print_summary(summary: &PackSummary) {
    let manifest = &summary.manifest;
    println!(
        "packed {} images of {} classes into {} shards ({:.1} MiB); manifest: {}",
        manifest.samples(),
        manifest.classes.len(),
        manifest.shards.len(),
        manifest.bytes() as f64 / 1048576.0,
        summary.manifest_path.display()
    );
    if summary.rewritten_jpegs + summary.verbatim_jpegs > 0 {
        println!(
            "{} JPEGs re-encoded losslessly with restart markers (workers decode only a crop's part of them); {} stored as they are (progressive-only features, damaged, or not baseline-transformable)",
            summary.rewritten_jpegs, summary.verbatim_jpegs
        );
    }
    match manifest.packed {
        Some(PackedOrder::Shuffled { seed }) => println!("samples shuffled across shards (seed {seed})"),
        Some(PackedOrder::Folder) => println!(
            "samples in folder order (--no-shuffle): each shard holds few classes; train with shuffle=block or full, not the default window"
        ),
        None => {}
    }
    if summary.skipped_files > 0 {
        println!("skipped {} files in class folders that are not images", summary.skipped_files);
    }
}

#[cfg(test)]
mod tests {
    use super::parse_byte_size;

    #[test]
    fn byte_sizes_parse_with_units() {
        assert_eq!(parse_byte_size("256MiB"), Ok(256 << 20));
        assert_eq!(parse_byte_size("1GB"), Ok(1_000_000_000));
        assert_eq!(parse_byte_size("8192"), Ok(8192));
        assert_eq!(parse_byte_size("1.5 KiB").ok(), None, "below the 4KiB floor");
        assert!(parse_byte_size("12 parsecs").is_err());
        assert!(parse_byte_size("MiB").is_err());
    }
}
