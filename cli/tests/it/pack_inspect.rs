//! `stoker pack` / `index` / `inspect` as a user runs them: the real binary, real files.

use std::path::{Path, PathBuf};
use std::process::Command;

use stoker_format::{IndexPolicy, Shard};
use stoker_sample_data::{SampleDataSpec, write_image_folder};

use crate::support::{path_str, stoker, text};

fn packed_sample(dir: &Path, shard_size: &str) -> PathBuf {
    let images = dir.join("images");
    write_image_folder(&images, SampleDataSpec { classes: 3, images_per_class: 30, seed: 5 }).unwrap_or_else(|error| panic!("{error}"));
    let shards = dir.join("shards");
    let output =
        stoker(&["pack", "--input", path_str(&images), "--output", path_str(&shards), "--shard-size", shard_size, "--prefix", "train"]);
    assert!(output.status.success(), "pack failed: {}", text(&output));
    assert!(text(&output).contains("packed 90 images of 3 classes"), "{}", text(&output));
    shards
}

/// The done-criterion of the foundation issue: `stoker inspect --json` of packed shards agrees
/// with Python's tarfile (offsets and sizes), and webdataset's own reader yields the same keys
/// and bytes.
#[test]
#[ignore = "needs python with webdataset: run `make test`"]
fn inspect_json_of_packed_shards_agrees_with_tarfile_and_webdataset() {
    let python = std::env::var("STOKER_PYTHON").unwrap_or_else(|_| panic!("STOKER_PYTHON is not set: run `make test`"));
    let dir = tempfile::tempdir().unwrap_or_else(|error| panic!("{error}"));
    let shards = packed_sample(dir.path(), "256KiB");
    let mut checked = 0;
    for entry in std::fs::read_dir(&shards).unwrap_or_else(|error| panic!("{error}")) {
        let shard = entry.unwrap_or_else(|error| panic!("{error}")).path();
        if shard.extension().is_none_or(|extension| extension != "tar") {
            continue;
        }
        let inspect = stoker(&["inspect", "--json", path_str(&shard)]);
        assert!(inspect.status.success(), "{}", text(&inspect));
        let report = dir.path().join("report.json");
        std::fs::write(&report, &inspect.stdout).unwrap_or_else(|error| panic!("{error}"));
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/compat/check_inspect.py");
        let check = Command::new(&python).arg(script).arg(&shard).arg(&report).output().unwrap_or_else(|error| panic!("{error}"));
        assert!(check.status.success(), "{}: {}", shard.display(), text(&check));
        checked += 1;
    }
    assert!(checked >= 2, "expected several shards, checked {checked}");
}

/// Every `.jpg` member of the shards in `folder`, by key.
fn jpeg_members(folder: &Path) -> Vec<(String, Vec<u8>)> {
    let mut members = Vec::new();
    for entry in std::fs::read_dir(folder).unwrap_or_else(|error| panic!("{error}")) {
        let path = entry.unwrap_or_else(|error| panic!("{error}")).path();
        if path.extension().is_none_or(|extension| extension != "tar") {
            continue;
        }
        let shard = Shard::open(&path, IndexPolicy::LoadOrBuildInMemory).unwrap_or_else(|error| panic!("{error}"));
        for index in 0..shard.len() {
            let sample = shard.sample(index).unwrap_or_else(|| panic!("sample {index}"));
            if let Some(jpeg) = sample.member("jpg") {
                members.push((sample.key().to_owned(), jpeg.to_vec()));
            }
        }
    }
    members.sort();
    members
}

#[test]
fn pack_reencodes_jpegs_losslessly_and_verbatim_keeps_their_bytes() {
    let dir = tempfile::tempdir().unwrap_or_else(|error| panic!("{error}"));
    let images = dir.path().join("images");
    write_image_folder(&images, SampleDataSpec { classes: 2, images_per_class: 30, seed: 5 }).unwrap_or_else(|error| panic!("{error}"));
    let (seekable, verbatim) = (dir.path().join("seekable"), dir.path().join("verbatim"));
    let default = stoker(&["pack", "--input", path_str(&images), "--output", path_str(&seekable)]);
    assert!(default.status.success(), "{}", text(&default));
    // The sample generator writes every 25th image as a PNG: 58 JPEGs, 2 PNGs.
    assert!(text(&default).contains("58 JPEGs re-encoded losslessly with restart markers"), "{}", text(&default));
    let kept = stoker(&["pack", "--input", path_str(&images), "--output", path_str(&verbatim), "--verbatim"]);
    assert!(kept.status.success(), "{}", text(&kept));
    assert!(!text(&kept).contains("re-encoded"), "{}", text(&kept));

    let (seekable, verbatim) = (jpeg_members(&seekable), jpeg_members(&verbatim));
    assert_eq!(seekable.len(), 58);
    for ((key, reencoded), (same_key, original)) in seekable.iter().zip(&verbatim) {
        assert_eq!(key, same_key);
        let (class, stem) = key.split_once('/').unwrap_or_else(|| panic!("key {key}"));
        let file = std::fs::read(images.join(class).join(format!("{stem}.jpg"))).unwrap_or_else(|error| panic!("{error}"));
        assert!(original == &file, "{key}: --verbatim changed the bytes");
        assert!(reencoded != original, "{key}: not re-encoded");
        // A decoder other than libjpeg-turbo sees the same pixels: the DCT coefficients are kept.
        let decode = |bytes: &[u8]| image::load_from_memory(bytes).unwrap_or_else(|error| panic!("{key}: {error}")).to_rgb8();
        assert!(decode(reencoded) == decode(original), "{key}: pixels differ");
    }
}

#[test]
fn inspect_of_a_manifest_checks_every_shard() {
    let dir = tempfile::tempdir().unwrap_or_else(|error| panic!("{error}"));
    let shards = packed_sample(dir.path(), "256KiB");
    let report = stoker(&["inspect", "--json", path_str(&shards)]);
    assert!(report.status.success(), "{}", text(&report));
    let json: serde_json::Value = serde_json::from_slice(&report.stdout).unwrap_or_else(|error| panic!("{error}"));
    assert_eq!(json["samples"], 90);
    assert_eq!(json["classes"].as_array().map(Vec::len), Some(3));
    assert_eq!(json["problems"].as_array().map(Vec::len), Some(0));

    // A shard that lost samples is reported and the exit status says so.
    let first = shards.join("train-000000.tar");
    let bytes = std::fs::read(&first).unwrap_or_default();
    std::fs::write(&first, &bytes[..bytes.len() / 2]).unwrap_or_else(|error| panic!("{error}"));
    let broken = stoker(&["inspect", path_str(&shards)]);
    assert!(!broken.status.success());
    assert!(text(&broken).contains("problem:") && text(&broken).contains("train-000000.tar"), "{}", text(&broken));
}

#[test]
fn index_expands_brace_patterns_and_writes_a_manifest() {
    let dir = tempfile::tempdir().unwrap_or_else(|error| panic!("{error}"));
    let shards = packed_sample(dir.path(), "256KiB");
    let count = std::fs::read_dir(&shards)
        .map(|entries| {
            entries.filter_map(Result::ok).filter(|entry| entry.path().extension().is_some_and(|extension| extension == "tar")).count()
        })
        .unwrap_or(0);
    for index in 0..count {
        std::fs::remove_file(shards.join(format!("train-{index:06}.tar.idx"))).unwrap_or_else(|error| panic!("{error}"));
    }
    let pattern = format!("{}/train-{{000000..{:06}}}.tar", path_str(&shards), count - 1);
    let manifest = dir.path().join("other.json");
    let output = stoker(&["index", &pattern, "--manifest", path_str(&manifest)]);
    assert!(output.status.success(), "{}", text(&output));
    assert!(text(&output).contains(&format!("indexed {count} shards, 90 samples: {count} indexes built")), "{}", text(&output));
    let written: serde_json::Value = serde_json::from_slice(&std::fs::read(&manifest).unwrap_or_default()).unwrap_or_default();
    assert_eq!(written["shards"][0]["uri"], "shards/train-000000.tar");
    let again = stoker(&["index", &pattern]);
    assert!(text(&again).contains(&format!("0 indexes built, {count} already up to date")), "{}", text(&again));
}

#[test]
fn errors_name_the_file_and_exit_non_zero() {
    let dir = tempfile::tempdir().unwrap_or_else(|error| panic!("{error}"));
    let missing = stoker(&["pack", "--input", path_str(&dir.path().join("nope")), "--output", path_str(&dir.path().join("out"))]);
    assert!(!missing.status.success());
    assert!(text(&missing).contains("nope"), "{}", text(&missing));

    let not_tar = dir.path().join("notes.tar");
    std::fs::write(&not_tar, vec![b'x'; 2048]).unwrap_or_else(|error| panic!("{error}"));
    let inspect = stoker(&["inspect", path_str(&not_tar)]);
    assert!(!inspect.status.success());
    assert!(text(&inspect).contains("notes.tar") && text(&inspect).contains("checksum"), "{}", text(&inspect));

    let bad_pattern = stoker(&["index", "a-{3..1}.tar"]);
    assert!(!bad_pattern.status.success());
    assert!(text(&bad_pattern).contains("runs backwards"), "{}", text(&bad_pattern));

    let bad_size = stoker(&["pack", "--input", ".", "--output", "x", "--shard-size", "12 parsecs"]);
    assert!(!bad_size.status.success());
    assert!(text(&bad_size).contains("unknown size unit"), "{}", text(&bad_size));
}
