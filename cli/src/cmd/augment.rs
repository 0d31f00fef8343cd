//! `stoker augment`: per-pixel augmentations with explicit parameters on a raw image, the same
//! code a worker runs after the crop ([`stoker_worker::augment::apply`]). The Python parity
//! tests (python/tests/test_augment_parity.py) give torchvision v2 the same image and
//! parameters and compare the pixels.

use std::io::{Read, Write};
use std::process::ExitCode;

use anyhow::{Context, ensure};
use clap::Args;
use stoker_plan::transform::PixelOp;
use stoker_worker::augment::{AugmentScratch, apply};

use crate::cmd::transform::parse_source_size;

#[derive(Debug, Args)]
pub(crate) struct AugmentArgs {
    /// The operations, a JSON list applied in order, e.g. `[{"op": "brightness", "factor":
    /// 1.3}, {"op": "gaussian_blur", "kernel_size": [5, 5], "sigma": [1.2, 1.2]}]`. Ops:
    /// brightness, contrast, saturation, hue (factor), grayscale, erase (top, left, height,
    /// width, value [r, g, b]), gaussian_blur (kernel_size [w, h], sigma [x, y]).
    #[arg(long, value_name = "JSON")]
    pub(crate) ops: String,
    /// The image's size; stdin holds exactly WIDTH × HEIGHT × 3 bytes (packed RGB, row by row).
    #[arg(long, value_name = "WIDTHxHEIGHT", value_parser = parse_source_size)]
    pub(crate) size: (u32, u32),
}

pub(crate) fn run(args: AugmentArgs) -> anyhow::Result<ExitCode> {
    let ops: Vec<PixelOp> = serde_json::from_str(&args.ops).context("--ops is not a JSON list of operations")?;
    for op in &ops {
        op.check().with_context(|| format!("--ops: {op:?}"))?;
    }
    let (width, height) = (args.size.0 as usize, args.size.1 as usize);
    let expected = width.checked_mul(height).and_then(|pixels| pixels.checked_mul(3)).context("--size is too large")?;
    let mut pixels = Vec::new();
    // Read one byte past the expected size, so a longer input is caught without reading it all.
    std::io::stdin().lock().take(expected as u64 + 1).read_to_end(&mut pixels).context("cannot read the image from stdin")?;
    let or_more = if pixels.len() > expected { " or more" } else { "" };
    ensure!(pixels.len() == expected, "stdin holds {} bytes{or_more}; a {width}x{height} RGB image is {expected}", pixels.len());
    apply(&ops, &mut pixels, width, height, &mut AugmentScratch::default());
    std::io::stdout().lock().write_all(&pixels).context("cannot write the image to stdout")?;
    Ok(ExitCode::SUCCESS)
}
