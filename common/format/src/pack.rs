//! `stoker pack`: an ImageFolder tree (one folder per class, images inside, torchvision's
//! convention) becomes WebDataset shards of `CLASS/STEM.jpg` + `CLASS/STEM.cls`, an index
//! beside each shard, and a `manifest.json` with the class names.
//!
//! Output is deterministic: classes and files are taken in byte order of their names, labels
//! are class positions in that order (as torchvision's `ImageFolder` assigns them), and tar
//! headers carry fixed metadata. The same input and seed always give the same bytes.
//!
//! Samples are written in a seeded random order by default ([`PackOptions::shuffle_seed`]):
//! in folder order every shard holds one or two classes, and a shuffle that reads a few shards
//! at a time (the default `window`) would give batches of a handful of classes.

use std::collections::HashMap;
use std::fs::File;
use std::io::BufWriter;
use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};

use rayon::prelude::*;

use super::manifest::{MANIFEST_FILE, Manifest, ManifestShard, PackedOrder};
use super::shard_file::{IndexPolicy, Shard};
use super::tar_writer::TarWriter;
use crate::error::ShardError;
use stoker_plan::permutation::Permutation;
use stoker_plan::prng::{SeedDomain, derive_seed};

/// Image extensions packed (torchvision's `IMG_EXTENSIONS`), compared case-insensitively.
pub const IMAGE_EXTENSIONS: [&str; 9] = ["jpg", "jpeg", "png", "ppm", "bmp", "pgm", "tif", "tiff", "webp"];

/// What to pack and how.
#[derive(Clone, Debug)]
pub struct PackOptions {
    /// The ImageFolder root.
    pub input: PathBuf,
    /// Folder for shards, indexes and the manifest (created if missing).
    pub output: PathBuf,
    /// A new shard is started before one would grow past this many bytes.
    pub shard_size: u64,
    /// Files read in parallel.
    pub threads: NonZeroUsize,
    /// Shard file names are `{prefix}-{000000}.tar`.
    pub prefix: String,
    /// Replace a dataset already in `output`.
    pub overwrite: bool,
    /// Applied to every `.jpg` before it is stored: `Some(bytes)` stores those bytes instead
    /// (the worker's lossless re-encoding with restart markers), `None` stores the file as
    /// it is. `None` here stores every file byte for byte.
    pub rewrite_jpeg: Option<RewriteJpeg>,
    /// Write samples in a random order drawn from this seed (recorded in the manifest), or in
    /// folder order (`None`: every shard then holds one or two classes).
    pub shuffle_seed: Option<u64>,
}

/// A lossless JPEG re-encoding applied while packing (see [`PackOptions::rewrite_jpeg`]).
pub type RewriteJpeg = fn(&[u8]) -> Option<Vec<u8>>;

/// How far packing has got.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PackProgress {
    /// Images written.
    pub files_done: u64,
    /// Images to write.
    pub files_total: u64,
    /// Bytes of image data written.
    pub bytes_done: u64,
    /// Shards finished.
    pub shards_done: u64,
}

/// The result of packing.
#[derive(Clone, Debug)]
pub struct PackSummary {
    /// The manifest written.
    pub manifest: Manifest,
    /// Where it was written.
    pub manifest_path: PathBuf,
    /// Files in class folders that are not images (skipped).
    pub skipped_files: u64,
    /// JPEGs stored as [`PackOptions::rewrite_jpeg`] rewrote them.
    pub rewritten_jpegs: u64,
    /// JPEGs the rewrite left as they were.
    pub verbatim_jpegs: u64,
}

/// One image to pack.
#[derive(Clone, Debug)]
struct ImageFile {
    path: PathBuf,
    label: usize,
    /// `CLASS/STEM` with dots in the stem replaced by `_` (a dot would end the WebDataset key).
    key: String,
    /// Lower-cased extension, `jpeg` spelled `jpg`.
    extension: String,
    size: u64,
}

/// An ImageFolder tree, scanned.
#[derive(Clone, Debug)]
struct ImageFolder {
    classes: Vec<String>,
    files: Vec<ImageFile>,
    skipped_files: u64,
}

/// Pack `options.input` into shards, calling `progress` after every image.
pub fn pack(options: &PackOptions, progress: &mut dyn FnMut(PackProgress)) -> Result<PackSummary, ShardError> {
    let mut folder = scan_image_folder(&options.input)?;
    if let Some(seed) = options.shuffle_seed {
        folder.files = shuffled(std::mem::take(&mut folder.files), seed);
    }
    prepare_output(&options.output, options.overwrite)?;
    let mut state = PackProgress { files_total: folder.files.len() as u64, ..PackProgress::default() };
    let mut shards = Vec::new();
    let mut writer: Option<(PathBuf, TarWriter<BufWriter<File>>)> = None;
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(options.threads.get())
        .thread_name(|index| format!("pack-{index}"))
        .build()
        .map_err(|source| ShardError::Threads { what: "pack", message: source.to_string() })?;
    let round_len = options.threads.get() * 16;
    let (mut rewritten_jpegs, mut verbatim_jpegs) = (0, 0);
    for round in folder.files.chunks(round_len) {
        let contents = read_parallel(round, &pool, options.rewrite_jpeg)?;
        for (file, (data, rewritten)) in round.iter().zip(contents) {
            if options.rewrite_jpeg.is_some() && file.extension == "jpg" {
                *if rewritten { &mut rewritten_jpegs } else { &mut verbatim_jpegs } += 1;
            }
            let label = file.label.to_string();
            let image_name = format!("{}.{}", file.key, file.extension);
            let label_name = format!("{}.cls", file.key);
            let sample_bytes = TarWriter::<File>::member_bytes(&image_name, data.len() as u64)
                + TarWriter::<File>::member_bytes(&label_name, label.len() as u64);
            let is_full =
                writer.as_ref().is_some_and(|(_, tar)| tar.written() > 0 && tar.written() + sample_bytes + 1024 > options.shard_size);
            if is_full && let Some(finished) = writer.take() {
                shards.push(finish_shard(finished, &options.output)?);
                state.shards_done += 1;
            }
            let (path, tar) = match &mut writer {
                Some(open) => open,
                None => writer.insert(create_shard(&options.output, &options.prefix, shards.len())?),
            };
            let write_error = |source| ShardError::io("failed to write shard", path.clone(), source);
            tar.append(&image_name, &data).map_err(write_error)?;
            tar.append(&label_name, label.as_bytes()).map_err(write_error)?;
            state.files_done += 1;
            state.bytes_done += data.len() as u64;
            progress(state);
        }
    }
    if let Some(finished) = writer.take() {
        shards.push(finish_shard(finished, &options.output)?);
        state.shards_done += 1;
        progress(state);
    }
    let packed = options.shuffle_seed.map_or(PackedOrder::Folder, |seed| PackedOrder::Shuffled { seed });
    let manifest = Manifest::new(shards, folder.classes, Some(packed));
    let manifest_path = options.output.join(MANIFEST_FILE);
    manifest.save(&manifest_path)?;
    Ok(PackSummary { manifest, manifest_path, skipped_files: folder.skipped_files, rewritten_jpegs, verbatim_jpegs })
}

/// `files` in the pinned random order of `seed` (the planner's permutation, so the order is the
/// same on every platform and release).
fn shuffled(files: Vec<ImageFile>, seed: u64) -> Vec<ImageFile> {
    let permutation = Permutation::new(files.len() as u64, derive_seed(SeedDomain::PackOrder, &[seed]));
    let mut slots: Vec<Option<ImageFile>> = files.into_iter().map(Some).collect();
    (0..slots.len() as u64).filter_map(|place| slots[permutation.apply(place) as usize].take()).collect()
}

fn scan_image_folder(root: &Path) -> Result<ImageFolder, ShardError> {
    let bad = |reason: String| ShardError::BadImageFolder { path: root.to_path_buf(), reason };
    let mut class_dirs = Vec::new();
    for entry in read_dir_sorted(root)? {
        if entry.is_dir() {
            class_dirs.push(entry);
        }
    }
    if class_dirs.is_empty() {
        return Err(bad("no class folders found: an ImageFolder has one sub-folder of images per class".into()));
    }
    let mut classes = Vec::with_capacity(class_dirs.len());
    let mut files = Vec::new();
    let mut skipped_files = 0;
    let mut keys: HashMap<String, PathBuf> = HashMap::new();
    for (label, class_dir) in class_dirs.iter().enumerate() {
        let class = file_name_utf8(class_dir)?;
        let first_file = files.len();
        for path in read_dir_sorted(class_dir)? {
            let Some((stem, extension)) = image_name_parts(&path)? else {
                skipped_files += 1;
                continue;
            };
            let key = format!("{class}/{}", stem.replace('.', "_"));
            if let Some(previous) = keys.insert(key.clone(), path.clone()) {
                return Err(bad(format!("{} and {} would both get sample key {key:?}: rename one", previous.display(), path.display())));
            }
            let size = std::fs::metadata(&path).map_err(|source| ShardError::io("failed to stat", &path, source))?.len();
            files.push(ImageFile { path, label, key, extension, size });
        }
        if files.len() == first_file {
            return Err(bad(format!("class folder {class:?} holds no images ({})", IMAGE_EXTENSIONS.join(", "))));
        }
        classes.push(class.to_string());
    }
    Ok(ImageFolder { classes, files, skipped_files })
}

fn read_dir_sorted(dir: &Path) -> Result<Vec<PathBuf>, ShardError> {
    let entries = std::fs::read_dir(dir).map_err(|source| ShardError::io("failed to read folder", dir, source))?;
    let mut paths = Vec::new();
    for entry in entries {
        paths.push(entry.map_err(|source| ShardError::io("failed to read folder", dir, source))?.path());
    }
    paths.sort();
    Ok(paths)
}

fn file_name_utf8(path: &Path) -> Result<&str, ShardError> {
    path.file_name()
        .and_then(|name| name.to_str())
        .ok_or_else(|| ShardError::BadImageFolder { path: path.to_path_buf(), reason: "the name is not valid UTF-8; rename it".into() })
}

/// `(stem, normalised extension)` of an image file, `None` for anything else.
fn image_name_parts(path: &Path) -> Result<Option<(String, String)>, ShardError> {
    if !path.is_file() {
        return Ok(None);
    }
    let name = file_name_utf8(path)?;
    let Some((stem, extension)) = name.rsplit_once('.') else { return Ok(None) };
    let extension = extension.to_lowercase();
    if stem.is_empty() || !IMAGE_EXTENSIONS.contains(&extension.as_str()) {
        return Ok(None);
    }
    let extension = if extension == "jpeg" { "jpg".to_string() } else { extension };
    Ok(Some((stem.to_string(), extension)))
}

fn prepare_output(output: &Path, overwrite: bool) -> Result<(), ShardError> {
    std::fs::create_dir_all(output).map_err(|source| ShardError::io("failed to create output folder", output, source))?;
    let manifest = output.join(MANIFEST_FILE);
    if manifest.is_file() && !overwrite {
        return Err(ShardError::BadImageFolder {
            path: output.to_path_buf(),
            reason: "the output folder already holds a dataset (manifest.json); pass --force to replace it".into(),
        });
    }
    Ok(())
}

/// Read `files` on `pool`'s threads (rewriting JPEGs there), returning contents in order,
/// each with whether the rewrite replaced it. The shards are written from this order alone, so
/// the output does not depend on how the reads were spread over threads.
fn read_parallel(
    files: &[ImageFile],
    pool: &rayon::ThreadPool,
    rewrite_jpeg: Option<RewriteJpeg>,
) -> Result<Vec<(Vec<u8>, bool)>, ShardError> {
    pool.install(|| {
        files
            .par_iter()
            .map(|file| {
                let data = std::fs::read(&file.path).map_err(|source| ShardError::io("failed to read image", &file.path, source))?;
                if data.len() as u64 != file.size {
                    tracing::warn!(path = %file.path.display(), "image changed size while packing");
                }
                let rewritten = rewrite_jpeg.filter(|_| file.extension == "jpg").and_then(|rewrite| rewrite(&data));
                Ok(rewritten.map_or((data, false), |bytes| (bytes, true)))
            })
            .collect()
    })
}

fn create_shard(output: &Path, prefix: &str, number: usize) -> Result<(PathBuf, TarWriter<BufWriter<File>>), ShardError> {
    let path = output.join(format!("{prefix}-{number:06}.tar"));
    let file = File::create(&path).map_err(|source| ShardError::io("failed to create shard", &path, source))?;
    Ok((path.clone(), TarWriter::new(BufWriter::with_capacity(1 << 20, file))))
}

fn finish_shard((path, tar): (PathBuf, TarWriter<BufWriter<File>>), output: &Path) -> Result<ManifestShard, ShardError> {
    let bytes = tar.written() + 1024;
    let file = tar
        .finish()
        .and_then(|buffered| buffered.into_inner().map_err(std::io::IntoInnerError::into_error))
        .map_err(|source| ShardError::io("failed to write shard", &path, source))?;
    file.sync_all().map_err(|source| ShardError::io("failed to write shard", &path, source))?;
    // Index from the file just written: it is what readers will see.
    let shard = Shard::open(&path, IndexPolicy::Rebuild)?;
    let uri = path.strip_prefix(output).unwrap_or(&path).to_string_lossy().into_owned();
    Ok(ManifestShard { uri, samples: shard.len() as u64, bytes })
}

#[cfg(test)]
#[path = "pack_tests.rs"]
mod tests;
