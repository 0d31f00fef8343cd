//! Megatron-LM datasets written byte by byte per its layout, and hostile variants of them.

use std::path::{Path, PathBuf};

use super::reference_writer::write_megatron;
use super::*;

fn sequences() -> Vec<Vec<i64>> {
    vec![vec![1, 2, 3], vec![50256], vec![], vec![7, 8]]
}

fn written(dir: &Path) -> (PathBuf, PathBuf) {
    write_megatron(&dir.join("corpus_text_document"), TokenDtype::Uint16, &sequences()).unwrap_or_else(|error| panic!("{error}"))
}

fn open(path: &Path) -> Result<TokenDataset, TokenError> {
    TokenDataset::open(path, TokenOptions::default())
}

/// Write `idx` over the index and open the dataset: the error's text.
fn refusal(idx_path: &Path, bin_path: &Path, idx: &[u8]) -> String {
    std::fs::write(idx_path, idx).unwrap_or_else(|error| panic!("{error}"));
    let error = open(bin_path).expect_err("a hostile index is refused");
    let text = error.to_string();
    assert!(text.contains("corpus_text_document.idx"), "the error names the file: {text}");
    text
}

#[test]
fn a_megatron_dataset_opens_by_bin_idx_or_prefix_and_reads_its_sequences() {
    let dir = tempfile::tempdir().unwrap_or_else(|error| panic!("{error}"));
    let (bin, idx) = written(dir.path());
    for given in [bin.clone(), idx.clone(), dir.path().join("corpus_text_document")] {
        let dataset = open(&given).unwrap_or_else(|error| panic!("{}: {error}", given.display()));
        assert_eq!((dataset.format(), dataset.dtype(), dataset.path()), (TokenFormat::Megatron, TokenDtype::Uint16, bin.as_path()));
        assert_eq!(dataset.index_path(), Some(idx.as_path()));
    }
    let dataset = open(&bin).unwrap_or_else(|error| panic!("{error}"));
    let index = dataset.megatron().unwrap_or_else(|| panic!("a Megatron index"));
    assert_eq!((index.sequences(), index.documents(), index.tokens(), index.multimodal()), (4, 4, 6, false));
    for (number, expected) in sequences().iter().enumerate() {
        let slice = dataset.sequence(number).unwrap_or_else(|| panic!("sequence {number}"));
        let tokens: Vec<i64> = (0..slice.len()).filter_map(|at| slice.get(at)).collect();
        assert_eq!(&tokens, expected);
    }
    assert!(dataset.sequence(4).is_none());
    assert_eq!(index.document_sequences(3), Some(3..4));
    let mut scan = TokenScan::new();
    dataset.scan_into(&mut scan);
    let stats = scan.finish();
    assert_eq!((stats.tokens, stats.documents, stats.max_token, stats.vocab_at_least), (6, 4, Some(50256), Some(50257)));
    let lengths = stats.document_length.unwrap_or_else(|| panic!("lengths"));
    assert_eq!((lengths.min, lengths.p50, lengths.max), (0, 1, 3));
    let eos = TokenOptions { eos: Some(0), ..TokenOptions::default() };
    assert!(matches!(TokenDataset::open(&bin, eos), Err(TokenError::Usage { .. })));
}

#[test]
fn a_multimodal_index_with_a_mode_per_sequence_is_read() {
    let dir = tempfile::tempdir().unwrap_or_else(|error| panic!("{error}"));
    let (bin, idx_path) = written(dir.path());
    let mut idx = std::fs::read(&idx_path).unwrap_or_else(|error| panic!("{error}"));
    idx.extend_from_slice(&[0, 1, 0, 1]);
    std::fs::write(&idx_path, &idx).unwrap_or_else(|error| panic!("{error}"));
    let dataset = open(&bin).unwrap_or_else(|error| panic!("{error}"));
    assert!(dataset.megatron().is_some_and(|index| index.multimodal()));
    idx.push(0);
    assert!(refusal(&idx_path, &bin, &idx).contains("bytes follow the document index"));
}

#[test]
fn hostile_indexes_are_refused_with_the_offset_and_never_panic() {
    let dir = tempfile::tempdir().unwrap_or_else(|error| panic!("{error}"));
    let (bin, idx_path) = written(dir.path());
    let good = std::fs::read(&idx_path).unwrap_or_else(|error| panic!("{error}"));
    let with = |at: usize, bytes: &[u8]| {
        let mut idx = good.clone();
        idx[at..at + bytes.len()].copy_from_slice(bytes);
        idx
    };
    let (sizes_at, pointers_at, documents_at) = (34, 34 + 4 * 4, 34 + 12 * 4);
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (with(0, b"MMIDIDY"), "not MMIDIDX"),
        (with(9, &2u64.to_le_bytes()), "version 2"),
        (with(17, &[7]), "float"),
        (with(17, &[9]), "not one of Megatron-LM's"),
        (with(18, &(u64::MAX / 4).to_le_bytes()), "truncated"),
        (with(26, &u64::MAX.to_le_bytes()), "truncated"),
        (good[..good.len() - 1].to_vec(), "truncated"),
        (good[..20].to_vec(), "truncated"),
        (with(sizes_at + 4, &(-1i32).to_le_bytes()), "negative size"),
        (with(sizes_at, &i32::MAX.to_le_bytes()), "past the end of the .bin"),
        (with(pointers_at + 24, &100i64.to_le_bytes()), "past the end of the .bin"),
        (with(pointers_at + 8, &i64::MIN.to_le_bytes()), "negative pointer"),
        (with(documents_at, &1i64.to_le_bytes()), "starts at 1"),
        (with(documents_at + 16, &0i64.to_le_bytes()), "below the one before"),
        (with(documents_at + 32, &3i64.to_le_bytes()), "not at the sequence count"),
        (with(documents_at + 32, &9i64.to_le_bytes()), "past the sequence count"),
    ];
    for (idx, expected) in cases {
        let text = refusal(&idx_path, &bin, &idx);
        assert!(text.contains(expected), "expected {expected:?} in: {text}");
    }
    // The offset of the lying pointer is named.
    let text = refusal(&idx_path, &bin, &with(pointers_at + 24, &100i64.to_le_bytes()));
    assert!(text.contains(&format!("at byte {}", pointers_at + 24)), "{text}");
    // Every truncation and every flipped byte: refused or read, never a panic or a read past the end.
    for cut in 0..good.len() {
        std::fs::write(&idx_path, &good[..cut]).unwrap_or_else(|error| panic!("{error}"));
        assert!(open(&bin).is_err(), "cut at {cut}");
    }
    for (at, byte) in good.iter().enumerate() {
        std::fs::write(&idx_path, with(at, &[byte ^ 0xFF])).unwrap_or_else(|error| panic!("{error}"));
        if let Ok(dataset) = open(&bin) {
            dataset.scan_into(&mut TokenScan::new());
        }
    }
    // A .bin cut short no longer holds the last sequence.
    std::fs::write(&idx_path, &good).unwrap_or_else(|error| panic!("{error}"));
    let bin_bytes = std::fs::read(&bin).unwrap_or_else(|error| panic!("{error}"));
    std::fs::write(&bin, &bin_bytes[..bin_bytes.len() - 1]).unwrap_or_else(|error| panic!("{error}"));
    assert!(open(&bin).err().is_some_and(|error| error.to_string().contains("past the end of the .bin")));
}
