//! Shards written by the tools users have — the `webdataset` package, Python's `tarfile` in PAX,
//! GNU and ustar formats (keys over 100 characters, non-ASCII names, directories, links), and GNU
//! tar in gnu and posix formats — index to exactly what `tarfile` lists, grouped by webdataset's
//! own rule: same samples, keys, extensions, data offsets and sizes.
//!
//! Needs a Python with `webdataset` (`make test` creates `.venv` and sets `STOKER_PYTHON`).

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;
use stoker_format::{IndexPolicy, Shard};

fn python() -> PathBuf {
    let python = std::env::var_os("STOKER_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| panic!("STOKER_PYTHON is not set: run `make test`, or point it at a python with `pip install webdataset`"));
    assert!(python.is_file(), "STOKER_PYTHON={} does not exist: run `make test`", python.display());
    python
}

fn compat_script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/compat").join(name)
}

fn ours(shard: &Shard) -> Value {
    let samples: Vec<Value> = (0..shard.len())
        .map(|sample| {
            let members: Vec<Value> = shard
                .index()
                .sample_members(sample)
                .map(|member| serde_json::json!({"extension": member.extension, "offset": member.offset, "size": member.size}))
                .collect();
            serde_json::json!({"key": shard.index().key(sample), "members": members})
        })
        .collect();
    Value::Array(samples)
}

#[test]
#[ignore = "needs python with webdataset: run `make test`"]
fn index_agrees_with_python_tarfile_for_every_writer() {
    let dir = tempfile::tempdir().unwrap_or_else(|error| panic!("{error}"));
    let output =
        Command::new(python()).arg(compat_script("make_shards.py")).arg(dir.path()).output().unwrap_or_else(|error| panic!("{error}"));
    assert!(output.status.success(), "make_shards.py failed: {}", String::from_utf8_lossy(&output.stderr));
    let shards: Vec<PathBuf> = String::from_utf8_lossy(&output.stdout).lines().map(PathBuf::from).collect();
    assert_eq!(shards.len(), 6, "expected six shards, got {shards:?}");
    for path in shards {
        let expected_path = path.with_extension("expected.json");
        let expected: Value = serde_json::from_slice(&std::fs::read(&expected_path).unwrap_or_default()).unwrap_or(Value::Null);
        assert!(expected.as_array().is_some_and(|samples| samples.len() >= 5), "{}: too few samples", expected_path.display());
        let shard = Shard::open(&path, IndexPolicy::LoadOrBuildAndWrite).unwrap_or_else(|error| panic!("{}: {error}", path.display()));
        let ours = ours(&shard);
        if ours != expected {
            let (ours, theirs) = (ours.as_array().cloned().unwrap_or_default(), expected.as_array().cloned().unwrap_or_default());
            let difference = ours.iter().zip(&theirs).find(|(a, b)| a != b);
            panic!(
                "{}: index differs from tarfile ({} vs {} samples); first difference: {difference:?}",
                path.display(),
                ours.len(),
                theirs.len()
            );
        }
        // The written index loads and says the same.
        let reopened = Shard::open(&path, IndexPolicy::LoadOrBuildInMemory).unwrap_or_else(|error| panic!("{error}"));
        assert_eq!(reopened.index_status(), &stoker_format::IndexStatus::Loaded);
        assert_eq!(self::ours(&reopened), expected);
    }
}
