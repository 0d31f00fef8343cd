//! Deterministic sample datasets: generated ImageFolders packed into shards as `stoker pack`
//! writes them, in fresh temporary folders.

use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};

use stoker_format::pack::{PackOptions, pack};
use stoker_sample_data::{SampleDataSpec, write_image_folder};

use crate::TestkitError;

/// A fresh folder under the system's temporary directory.
pub fn unique_temp_dir(prefix: &str) -> Result<PathBuf, TestkitError> {
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let serial = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("{prefix}-{}-{serial}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|error| format!("cannot create {}: {error}", dir.display()))?;
    Ok(dir)
}

/// Generate `classes × per_class` small JPEGs with unique keys and pack them into shards of
/// about `shard_bytes`, shuffled as `stoker pack` does by default; returns the manifest path.
pub fn sample_dataset(dir: &Path, classes: u32, per_class: u32, shard_bytes: u64) -> Result<PathBuf, TestkitError> {
    sample_dataset_ordered(dir, classes, per_class, shard_bytes, Some(0))
}

/// As [`sample_dataset`], with the pack order's seed, or folder order (`None`: class-sorted
/// shards, as `stoker pack --no-shuffle` writes them).
pub fn sample_dataset_ordered(
    dir: &Path,
    classes: u32,
    per_class: u32,
    shard_bytes: u64,
    shuffle_seed: Option<u64>,
) -> Result<PathBuf, TestkitError> {
    let images = dir.join("images");
    write_image_folder(&images, SampleDataSpec { classes, images_per_class: per_class, seed: 7 }).map_err(|error| error.to_string())?;
    pack_images(&images, &dir.join("shards"), shard_bytes, shuffle_seed)
}

/// Pack the ImageFolder `images` into `output` as `stoker pack` does (JPEGs re-encoded with
/// restart markers), in the order of `shuffle_seed` (`None`: folder order); returns the
/// manifest path.
pub fn pack_images(images: &Path, output: &Path, shard_bytes: u64, shuffle_seed: Option<u64>) -> Result<PathBuf, TestkitError> {
    let options = PackOptions {
        input: images.to_path_buf(),
        output: output.to_path_buf(),
        shard_size: shard_bytes,
        threads: NonZeroUsize::MIN.saturating_add(1),
        prefix: "shard".to_owned(),
        overwrite: true,
        rewrite_jpeg: Some(stoker_worker::make_seekable_for_pack),
        shuffle_seed,
    };
    pack(&options, &mut |_| {}).map_err(|error| error.to_string())?;
    Ok(output.join("manifest.json"))
}
