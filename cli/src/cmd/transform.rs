//! `stoker transform`: one image through a worker's sample pipeline ([`SampleMaker`]), once per
//! augmentation seed. It is how a user previews an augmentation, and how the Python parity tests
//! (python/tests/test_torchvision_parity.py) feed torchvision exactly the crop box and flip the
//! worker drew, then compare pixels.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Args;
use serde_json::json;
use stoker_plan::transform::{Recipe, SampleGeometry, TransformSpec};
use stoker_worker::SampleMaker;

#[derive(Debug, Args)]
pub(crate) struct TransformArgs {
    /// The JPEG to transform. Without it, --source-size gives the source's size and only the
    /// geometry is drawn.
    #[arg(required_unless_present = "source_size")]
    pub(crate) image: Option<PathBuf>,
    /// The TransformSpec, JSON (what `stoker.Loader` sends: {"transforms": [...], "layout":
    /// "NHWC", "dct_scaling": true}).
    #[arg(long, value_name = "JSON")]
    pub(crate) spec: String,
    /// Augmentation seeds: `N`, `A..B` (B excluded) or a comma-separated list of both.
    #[arg(long, default_value = "0", value_name = "SEEDS", value_parser = parse_seeds)]
    pub(crate) seeds: Seeds,
    /// Write each output to DIR/SEED.raw: the sample's bytes as they sit in a batch (the
    /// spec's layout and dtype, little-endian).
    #[arg(long, value_name = "DIR", conflicts_with = "source_size")]
    pub(crate) out: Option<PathBuf>,
    /// Draw only the geometry, for a source of WIDTHxHEIGHT pixels (no image is read).
    #[arg(long, value_name = "WIDTHxHEIGHT", value_parser = parse_source_size)]
    pub(crate) source_size: Option<(u32, u32)>,
}

/// The augmentation seeds of `stoker transform`.
#[derive(Clone, Debug)]
pub(crate) struct Seeds(pub(crate) Vec<u64>);

/// `7`, `0..100` or `1,5,10..20`: the seeds of `stoker transform`, at most a million.
pub(crate) fn parse_seeds(text: &str) -> Result<Seeds, String> {
    const MAX_SEEDS: u64 = 1_000_000;
    let mut seeds = Vec::new();
    for part in text.split(',') {
        let part = part.trim();
        let parse = |number: &str| number.trim().parse::<u64>().map_err(|error| format!("{number:?} is not a seed: {error}"));
        match part.split_once("..") {
            Some((start, end)) => {
                let (start, end) = (parse(start)?, parse(end)?);
                if end.saturating_sub(start) + seeds.len() as u64 > MAX_SEEDS {
                    return Err(format!("{part}: at most {MAX_SEEDS} seeds"));
                }
                seeds.extend(start..end);
            }
            None => seeds.push(parse(part)?),
        }
    }
    if seeds.is_empty() || seeds.len() as u64 > MAX_SEEDS {
        return Err(format!("give between 1 and {MAX_SEEDS} seeds"));
    }
    Ok(Seeds(seeds))
}

/// `640x480` → (640, 480).
pub(crate) fn parse_source_size(text: &str) -> Result<(u32, u32), String> {
    let parsed = text.split_once('x').and_then(|(width, height)| Some((width.parse::<u32>().ok()?, height.parse::<u32>().ok()?)));
    match parsed {
        Some((width, height)) if width > 0 && height > 0 => Ok((width, height)),
        _ => Err(format!("{text:?}: give WIDTHxHEIGHT, both positive, e.g. 640x480")),
    }
}

pub(crate) fn run(args: TransformArgs) -> anyhow::Result<ExitCode> {
    let spec: TransformSpec = serde_json::from_str(&args.spec).context("--spec is not a valid TransformSpec")?;
    let recipe = Recipe::new(&spec).context("--spec")?;
    let shape = recipe.batch_shape(1);
    let mut stdout = std::io::stdout().lock();
    let Some(image) = &args.image else {
        let (width, height) = args.source_size.context("give an image or --source-size")?;
        for &seed in &args.seeds.0 {
            let line =
                json!({ "seed": seed, "source_size": [width, height], "geometry": geometry_json(&recipe.sample(width, height, seed)) });
            writeln!(stdout, "{line}")?;
        }
        return Ok(ExitCode::SUCCESS);
    };
    let data = std::fs::read(image).with_context(|| format!("cannot read {}", image.display()))?;
    if let Some(out) = &args.out {
        std::fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))?;
    }
    let mut maker = SampleMaker::new(recipe).context("cannot make a decoder")?;
    let mut slot = vec![0u8; recipe.sample_bytes()];
    for &seed in &args.seeds.0 {
        let report = maker.make(&data, seed, &mut slot).with_context(|| format!("{}: cannot decode", image.display()))?;
        if let Some(out) = &args.out {
            let path = out.join(format!("{seed}.raw"));
            std::fs::write(&path, &slot).with_context(|| format!("cannot write {}", path.display()))?;
        }
        let line = json!({
            "seed": seed,
            "source_size": [report.source_size.0, report.source_size.1],
            "geometry": geometry_json(&report.geometry),
            "dct_scale": report.scale_num,
            "decoded_pixels": report.decoded_pixels,
            "warned": report.warned,
            "pixel_ops": maker.last_pixel_ops(),
            "shape": &shape[1..],
            "dtype": recipe.dtype().name(),
        });
        writeln!(stdout, "{line}")?;
    }
    Ok(ExitCode::SUCCESS)
}

/// The drawn geometry: the source region (fractional for `Resize` + `CenterCrop`, whole pixels
/// for a crop box), where it lands in the output, and the flip.
fn geometry_json(geometry: &SampleGeometry) -> serde_json::Value {
    let p = geometry.placement;
    json!({
        "src_left": p.src_left,
        "src_top": p.src_top,
        "src_width": p.src_width,
        "src_height": p.src_height,
        "dst_left": p.dst_left,
        "dst_top": p.dst_top,
        "dst_width": p.dst_width,
        "dst_height": p.dst_height,
        "flip": geometry.flip,
    })
}

#[cfg(test)]
mod tests {
    use super::{parse_seeds, parse_source_size};

    #[test]
    fn seeds_are_numbers_ranges_and_lists_of_them() {
        assert_eq!(parse_seeds("7").map(|seeds| seeds.0), Ok(vec![7]));
        assert_eq!(parse_seeds("0..3").map(|seeds| seeds.0), Ok(vec![0, 1, 2]));
        assert_eq!(parse_seeds("5, 1..3,9").map(|seeds| seeds.0), Ok(vec![5, 1, 2, 9]));
        for bad in ["", "x", "3..", "4..4", "0..2000000", "-1"] {
            assert!(parse_seeds(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn source_sizes_are_width_by_height() {
        assert_eq!(parse_source_size("640x480"), Ok((640, 480)));
        for bad in ["640", "0x5", "5x0", "ax5", "640x480x3"] {
            assert!(parse_source_size(bad).is_err(), "{bad:?}");
        }
    }
}
