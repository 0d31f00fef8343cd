//! `stoker index` and `stoker inspect` of token datasets as a user runs them: the real binary
//! on files of each layout (Megatron-LM, llm.c, nanoGPT's headerless arrays).

use std::process::Command;

use serde_json::Value;
use stoker_format::tokens::TokenDtype;
use stoker_format::tokens::reference_writer::{write_llmc, write_megatron, write_raw};

use crate::support::{path_str, stoker, text};

const EOS: i64 = 50256;

/// `stoker inspect --json ARGS`, which must succeed: its report.
fn inspect_json(args: &[&str]) -> Value {
    let output = stoker(&[&["inspect", "--json"], args].concat());
    assert!(output.status.success(), "inspect {args:?}: {}", text(&output));
    serde_json::from_slice(&output.stdout).unwrap_or_else(|error| panic!("{error}: {}", text(&output)))
}

fn lengths(report: &Value) -> Vec<u64> {
    ["min", "p50", "p90", "p99", "max"].iter().filter_map(|key| report["document_length"][key].as_u64()).collect()
}

#[test]
fn megatron_datasets_are_indexed_in_place_and_inspected_by_file_folder_or_manifest() {
    let dir = tempfile::tempdir().unwrap_or_else(|error| panic!("{error}"));
    let folder = dir.path().join("megatron");
    std::fs::create_dir(&folder).unwrap_or_else(|error| panic!("{error}"));
    let sequences = vec![vec![1, 2, 3], vec![EOS], vec![4, 5, 6, 7, 8], vec![9, 10]];
    let (bin, idx) =
        write_megatron(&folder.join("corpus_text_document"), TokenDtype::Uint16, &sequences).unwrap_or_else(|error| panic!("{error}"));
    let before = std::fs::read(&bin).unwrap_or_else(|error| panic!("{error}"));
    // Named by both files: one dataset.
    let index = stoker(&["index", path_str(&bin), path_str(&idx)]);
    assert!(index.status.success(), "{}", text(&index));
    assert!(text(&index).contains("indexed 1 token files (megatron, uint16): 11 tokens, 4 documents"), "{}", text(&index));
    assert_eq!(std::fs::read(&bin).ok(), Some(before), "the tokens are not rewritten");
    let manifest = folder.join("tokens.json");
    for given in [path_str(&manifest), path_str(&folder), path_str(&idx)] {
        let report = inspect_json(&[given]);
        assert_eq!(
            (report["kind"].as_str(), report["format"].as_str(), report["dtype"].as_str()),
            (Some("tokens"), Some("megatron"), Some("uint16"))
        );
        assert_eq!(
            (report["tokens"].as_u64(), report["documents"].as_u64(), report["vocab_at_least"].as_u64()),
            (Some(11), Some(4), Some(50257))
        );
        assert_eq!(lengths(&report), vec![1, 2, 5, 5, 5], "{given}");
        assert_eq!(report["problems"].as_array().map(Vec::len), Some(0));
    }
    let shown = stoker(&["inspect", path_str(&folder)]);
    assert!(shown.status.success() && text(&shown).contains("min 1, p50 2, p90 5, p99 5, max 5"), "{}", text(&shown));
    // A lying .idx is refused, naming the file and the byte.
    let mut lying = std::fs::read(&idx).unwrap_or_else(|error| panic!("{error}"));
    lying[34 + 16 + 24..34 + 16 + 32].copy_from_slice(&1000i64.to_le_bytes());
    std::fs::write(&idx, lying).unwrap_or_else(|error| panic!("{error}"));
    let refused = stoker(&["inspect", path_str(&manifest)]);
    assert!(!refused.status.success(), "{}", text(&refused));
    assert!(
        text(&refused).contains("corpus_text_document.idx: at byte 74") && text(&refused).contains("past the end of the .bin"),
        "{}",
        text(&refused)
    );
}

#[test]
fn llmc_shards_split_at_eos_and_a_changed_shard_is_reported() {
    let dir = tempfile::tempdir().unwrap_or_else(|error| panic!("{error}"));
    let (first, second) = (dir.path().join("fineweb_train_000001.bin"), dir.path().join("fineweb_train_000002.bin"));
    // llm.c's layout: an EOS before each document.
    write_llmc(&first, TokenDtype::Uint16, &[EOS, 1, 2, 3, EOS, 4]).unwrap_or_else(|error| panic!("{error}"));
    write_llmc(&second, TokenDtype::Uint16, &[EOS, 7, 7, 7, 7, 7, 7, 7, 7]).unwrap_or_else(|error| panic!("{error}"));
    let pattern = dir.path().join("fineweb_train_{000001..000002}.bin");
    let index = stoker(&["index", "--eos", "50256", path_str(&pattern)]);
    assert!(index.status.success(), "{}", text(&index));
    let report = inspect_json(&[path_str(&dir.path().join("tokens.json"))]);
    assert_eq!((report["format"].as_str(), report["eos"].as_i64()), (Some("llmc"), Some(EOS)));
    // [EOS] [1 2 3 EOS] [4] [EOS] [7 × 8]
    assert_eq!((report["tokens"].as_u64(), report["documents"].as_u64()), (Some(15), Some(5)));
    assert_eq!(lengths(&report), vec![1, 1, 8, 8, 8]);
    let whole = inspect_json(&[path_str(&first)]);
    assert_eq!((whole["documents"].as_u64(), whole["eos"].as_i64()), (Some(1), None), "without --eos a shard is one document");
    write_llmc(&second, TokenDtype::Uint16, &[EOS, 7]).unwrap_or_else(|error| panic!("{error}"));
    let changed = stoker(&["inspect", path_str(dir.path())]);
    assert!(!changed.status.success() && text(&changed).contains("changed since stoker index"), "{}", text(&changed));
}

#[test]
fn headerless_files_need_their_dtype_and_hostile_headers_fail_cleanly() {
    let dir = tempfile::tempdir().unwrap_or_else(|error| panic!("{error}"));
    let train = dir.path().join("train.bin");
    // nanoGPT's layout: each document followed by EOS.
    write_raw(&train, TokenDtype::Uint16, &[5, 6, EOS, 7, EOS, 8]).unwrap_or_else(|error| panic!("{error}"));
    let refused = stoker(&["index", path_str(&train)]);
    assert!(!refused.status.success() && text(&refused).contains("--dtype uint16"), "{}", text(&refused));
    let index = stoker(&["index", "--dtype", "uint16", "--eos", "50256", path_str(&train)]);
    assert!(index.status.success(), "{}", text(&index));
    let report = inspect_json(&[path_str(dir.path())]);
    assert_eq!((report["format"].as_str(), report["tokens"].as_u64(), report["documents"].as_u64()), (Some("raw"), Some(6), Some(3)));
    assert_eq!(lengths(&report), vec![1, 2, 3, 3, 3]);
    // An llm.c header that promises more tokens than the file has.
    let shard = dir.path().join("shard.bin");
    write_llmc(&shard, TokenDtype::Uint16, &[1, 2, 3]).unwrap_or_else(|error| panic!("{error}"));
    let mut bytes = std::fs::read(&shard).unwrap_or_else(|error| panic!("{error}"));
    bytes[8..12].copy_from_slice(&1_000_000i32.to_le_bytes());
    std::fs::write(&shard, bytes).unwrap_or_else(|error| panic!("{error}"));
    let lying = stoker(&["inspect", path_str(&shard)]);
    assert!(!lying.status.success() && text(&lying).contains("shard.bin: truncated"), "{}", text(&lying));
}

/// Files written the way nanoGPT (`np.array(ids, dtype=np.uint16).tofile`) and llm.c
/// (`write_datafile`: a 256 × int32 header, then uint16 tokens) write them, with numpy.
#[test]
#[ignore = "needs STOKER_PYTHON with numpy (make test)"]
fn files_written_by_numpy_as_nanogpt_and_llmc_do_are_read() {
    let python = std::env::var("STOKER_PYTHON").unwrap_or_else(|_| panic!("STOKER_PYTHON is not set: run `make test`"));
    let dir = tempfile::tempdir().unwrap_or_else(|error| panic!("{error}"));
    let script = r#"
import sys, numpy as np
folder = sys.argv[1]
ids = [50256, 11, 22, 33, 50256, 44]
np.array(ids, dtype=np.uint16).tofile(folder + "/train.bin")
header = np.zeros(256, dtype=np.int32)
header[0], header[1], header[2] = 20240520, 1, len(ids)
with open(folder + "/fineweb_val_000000.bin", "wb") as f:
    f.write(header.tobytes())
    f.write(np.array(ids, dtype=np.uint16).tobytes())
"#;
    let written = Command::new(python).arg("-c").arg(script).arg(dir.path()).output().unwrap_or_else(|error| panic!("{error}"));
    assert!(written.status.success(), "{}", text(&written));
    let raw = inspect_json(&["--dtype", "uint16", "--eos", "50256", path_str(&dir.path().join("train.bin"))]);
    let llmc = inspect_json(&["--eos", "50256", path_str(&dir.path().join("fineweb_val_000000.bin"))]);
    assert_eq!((raw["format"].as_str(), llmc["format"].as_str()), (Some("raw"), Some("llmc")));
    for report in [&raw, &llmc] {
        assert_eq!((report["tokens"].as_u64(), report["documents"].as_u64(), report["max_token"].as_i64()), (Some(6), Some(3), Some(EOS)));
    }
}

/// `--seq-len` shows what packing gives, planned by the job's planner on the real document
/// lengths: rows, steps, the tail's left-out tokens, documents per row.
#[test]
fn packing_into_rows_is_shown_with_seq_len_and_refused_for_images() {
    let dir = tempfile::tempdir().unwrap_or_else(|error| panic!("{error}"));
    let train = dir.path().join("train.bin");
    // Documents of 3, 1, 5 and 2 tokens (each up to and including its EOS).
    write_raw(&train, TokenDtype::Uint16, &[1, 2, EOS, EOS, 3, 4, 5, 6, EOS, 7, EOS]).unwrap_or_else(|error| panic!("{error}"));
    let base = ["--dtype", "uint16", "--eos", "50256", "--seq-len", "4", "--token-shuffle", "none"];
    let drop = inspect_json(&[&base[..], &[path_str(&train)]].concat());
    let packing = &drop["packing"];
    // Rows [3 + 1] and [4 of 5]; the last 3 tokens do not fill a row.
    assert_eq!(
        (packing["rows"].as_u64(), packing["steps"].as_u64(), packing["tokens_read"].as_u64(), packing["tokens_left_out"].as_u64()),
        (Some(2), Some(2), Some(8), Some(3))
    );
    assert_eq!((packing["documents_per_row_mean"].as_f64(), packing["documents_per_row_max"].as_u64()), (Some(1.5), Some(2)));
    assert_eq!(
        (packing["rows_starting_inside_a_document"].as_f64(), packing["documents_longer_than_a_row"].as_u64()),
        (Some(0.0), Some(1))
    );
    let partial = inspect_json(&[&base[..], &["--tail", "partial", path_str(&train)]].concat());
    // A third, short row [the 5th token of the long document + the last document]: every token once.
    assert_eq!((partial["packing"]["rows"].as_u64(), partial["packing"]["tokens_read"].as_u64()), (Some(3), Some(11)));
    assert_eq!(partial["packing"]["tokens_left_out"].as_u64(), Some(0));
    let two_ranks = inspect_json(&[&base[..], &["--world-size", "2", "--batch-size", "2", path_str(&train)]].concat());
    assert_eq!((two_ranks["packing"]["steps"].as_u64(), two_ranks["packing"]["tokens_left_out"].as_u64()), (Some(0), Some(11)));
    let shown = stoker(&[&["inspect"], &base[..], &[path_str(&train)]].concat());
    assert!(text(&shown).contains("2 rows in 2 steps: 8 tokens read, 3 of the dataset's left out"), "{}", text(&shown));
    let typo = stoker(&[&["inspect"], &base[..6], &["--token-shuffle", "document", path_str(&train)]].concat());
    assert!(!typo.status.success() && text(&typo).contains("documents:K"), "{}", text(&typo));
    let image = stoker(&["inspect", "--seq-len", "4", path_str(&dir.path().join("shard.tar"))]);
    assert!(!image.status.success() && text(&image).contains("--seq-len packs the documents of a token dataset"), "{}", text(&image));
}
