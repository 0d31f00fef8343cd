//! `stoker pack`.

use std::num::NonZeroUsize;
use std::process::ExitCode;

use anyhow::Context;
use stoker_format::manifest::PackedOrder;
use stoker_format::pack::{PackOptions, PackSummary, RewriteJpeg, pack};

use crate::args::PackArgs;
use crate::progress;

pub(crate) fn run(args: PackArgs) -> anyhow::Result<ExitCode> {
    let threads =
        args.threads.and_then(NonZeroUsize::new).unwrap_or_else(|| std::thread::available_parallelism().unwrap_or(NonZeroUsize::MIN));
    let options = PackOptions {
        input: args.input,
        output: args.output,
        shard_size: args.shard_size,
        threads,
        prefix: args.prefix,
        overwrite: args.force,
        rewrite_jpeg: (!args.verbatim).then_some(stoker_worker::make_seekable_for_pack as RewriteJpeg),
        shuffle_seed: (!args.no_shuffle).then_some(args.seed),
    };
    let summary = pack_with_progress(&options)?;
    print_summary(&summary);
    Ok(ExitCode::SUCCESS)
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
