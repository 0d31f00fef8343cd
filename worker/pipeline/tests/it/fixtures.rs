//! Test images and datasets: textured JPEGs (sines plus noise, so that resampling errors show)
//! of many sizes and subsamplings, written with libjpeg-turbo, and packed datasets.

use std::path::{Path, PathBuf};
use std::process::Command;

use stoker_format::pack::{PackOptions, RewriteJpeg, pack};
use stoker_plan::prng::SplitMix64;
use turbojpeg::{Image, PixelFormat, Subsamp};

/// A textured RGB image.
pub(crate) fn texture(width: usize, height: usize, seed: u64) -> Vec<u8> {
    let mut rng = SplitMix64::new(seed);
    let (fx, fy) = (0.02 + rng.next_f64() * 0.2, 0.02 + rng.next_f64() * 0.2);
    let mut pixels = Vec::with_capacity(width * height * 3);
    for y in 0..height {
        for x in 0..width {
            for c in 0..3 {
                let phase = c as f64 * 2.1;
                let v = 128.0 + 70.0 * ((x as f64 * fx + phase).sin() * (y as f64 * fy - phase).cos()) + (rng.next_f64() - 0.5) * 40.0;
                pixels.push(v.clamp(0.0, 255.0) as u8);
            }
        }
    }
    pixels
}

/// A JPEG of `texture(width, height, seed)`.
pub(crate) fn jpeg(width: usize, height: usize, seed: u64, subsamp: Subsamp) -> Vec<u8> {
    let pixels = texture(width, height, seed);
    let image = Image { pixels: pixels.as_slice(), width, pitch: width * 3, height, format: PixelFormat::RGB };
    let mut compressor = turbojpeg::Compressor::new().expect("compressor");
    compressor.set_quality(90).expect("quality");
    compressor.set_subsamp(subsamp).expect("subsamp");
    compressor.compress_to_vec(image).expect("compress")
}

/// `count` JPEGs of varied sizes and subsamplings: a third large enough for DCT scaling.
pub(crate) fn varied_jpegs(count: usize) -> Vec<(usize, usize, Vec<u8>)> {
    let subsamplings = [Subsamp::Sub2x2, Subsamp::Sub2x1, Subsamp::None, Subsamp::Gray, Subsamp::Sub2x2];
    let mut rng = SplitMix64::new(99);
    (0..count)
        .map(|i| {
            let (width, height) = if i % 3 == 0 {
                (900 + rng.below(900) as usize, 700 + rng.below(900) as usize)
            } else {
                (64 + rng.below(500) as usize, 64 + rng.below(500) as usize)
            };
            (width, height, jpeg(width, height, i as u64, subsamplings[i % subsamplings.len()]))
        })
        .collect()
}

/// Write an ImageFolder of `classes` × `per_class` JPEGs (plus `extra` files by name) and pack
/// it into `dir/shards` as `stoker pack` does (JPEGs re-encoded with restart markers); returns
/// the manifest path.
pub(crate) fn packed_dataset(dir: &Path, classes: usize, per_class: usize, extra: &[(&str, &[u8])]) -> PathBuf {
    pack_dataset(dir, classes, per_class, extra, Some(stoker_pipeline::make_seekable_for_pack))
}

/// [`packed_dataset`] with every file stored byte for byte (`stoker pack --verbatim`).
pub(crate) fn packed_dataset_verbatim(dir: &Path, classes: usize, per_class: usize) -> PathBuf {
    pack_dataset(dir, classes, per_class, &[], None)
}

fn pack_dataset(dir: &Path, classes: usize, per_class: usize, extra: &[(&str, &[u8])], rewrite_jpeg: Option<RewriteJpeg>) -> PathBuf {
    let input = dir.join("images");
    for class in 0..classes {
        let folder = input.join(format!("class{class}"));
        std::fs::create_dir_all(&folder).expect("mkdir");
        for i in 0..per_class {
            let seed = (class * 1000 + i) as u64;
            let bytes = jpeg(120 + (seed as usize * 37) % 300, 100 + (seed as usize * 53) % 300, seed, Subsamp::Sub2x2);
            std::fs::write(folder.join(format!("img{i:04}.jpg")), bytes).expect("write");
        }
    }
    for (name, bytes) in extra {
        let path = input.join(name);
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        std::fs::write(path, bytes).expect("write");
    }
    let output = dir.join("shards");
    let options = PackOptions {
        input,
        output: output.clone(),
        shard_size: 200_000,
        threads: std::num::NonZeroUsize::MIN.saturating_add(1),
        prefix: "shard".to_owned(),
        overwrite: false,
        rewrite_jpeg,
        shuffle_seed: None,
    };
    pack(&options, &mut |_| {}).expect("pack");
    output.join("manifest.json")
}

/// The Python of `make test`.
pub(crate) fn python() -> PathBuf {
    let python = std::env::var_os("STOKER_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| panic!("STOKER_PYTHON is not set: run `make test`, or point it at a python with tests/compat/requirements.txt"));
    assert!(python.is_file(), "STOKER_PYTHON={} does not exist: run `make test`", python.display());
    python
}

/// Run `tests/compat/SCRIPT` with `input` on stdin; parse its stdout as JSON.
pub(crate) fn run_compat(script: &str, input: &serde_json::Value) -> serde_json::Value {
    use std::io::Write;
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/compat").join(script);
    let mut child = Command::new(python())
        .arg(&path)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("start python");
    child.stdin.take().expect("stdin").write_all(input.to_string().as_bytes()).expect("write stdin");
    let output = child.wait_with_output().expect("python");
    assert!(output.status.success(), "{script} failed: {}", output.status);
    serde_json::from_slice(&output.stdout).expect("json from python")
}
