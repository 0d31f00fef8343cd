//! llm.c shards and headerless (nanoGPT) files written byte by byte per their layouts, split
//! into documents at an EOS, and hostile variants of them.

use std::path::Path;

use super::reference_writer::{write_llmc, write_raw};
use super::*;

const EOS: i64 = 50256;

/// llm.c's layout of documents: each one after an EOS.
fn tokens() -> Vec<i64> {
    vec![EOS, 1, 2, 3, EOS, 4, 5]
}

fn options(dtype: Option<TokenDtype>, eos: Option<i64>) -> TokenOptions {
    TokenOptions { format: None, dtype, eos }
}

fn stats_of(path: &Path, options: TokenOptions) -> TokenStats {
    let dataset = TokenDataset::open(path, options).unwrap_or_else(|error| panic!("{error}"));
    let mut scan = TokenScan::new();
    dataset.scan_into(&mut scan);
    scan.finish()
}

fn lengths(stats: &TokenStats) -> (u64, u64, u64) {
    stats.document_length.as_ref().map_or((0, 0, 0), |lengths| (lengths.min, lengths.p50, lengths.max))
}

#[test]
fn llmc_shards_are_found_by_their_magic_and_split_after_each_eos() {
    let dir = tempfile::tempdir().unwrap_or_else(|error| panic!("{error}"));
    let path = dir.path().join("fineweb_train_000001.bin");
    write_llmc(&path, TokenDtype::Uint16, &tokens()).unwrap_or_else(|error| panic!("{error}"));
    assert_eq!(std::fs::metadata(&path).map(|metadata| metadata.len()).ok(), Some(1024 + 14));
    let dataset = TokenDataset::open(&path, options(None, Some(EOS))).unwrap_or_else(|error| panic!("{error}"));
    assert_eq!(
        (dataset.format(), dataset.dtype(), dataset.token_count(), dataset.eos()),
        (TokenFormat::Llmc, TokenDtype::Uint16, 7, Some(EOS))
    );
    let stream = dataset.stream_tokens().unwrap_or_else(|| panic!("a stream"));
    assert_eq!((stream.get(0), stream.get(6), stream.bytes().len()), (Some(EOS), Some(5), 14));
    // [EOS] [1 2 3 EOS] [4 5]: every token in exactly one document.
    let split = stats_of(&path, options(None, Some(EOS)));
    assert_eq!((split.tokens, split.documents, lengths(&split)), (7, 3, (1, 2, 4)));
    let whole = stats_of(&path, options(None, None));
    assert_eq!((whole.documents, lengths(&whole), whole.vocab_at_least), (1, (7, 7, 7), Some(50257)));
    // Llama 3's shards: uint32 tokens.
    let llama = dir.path().join("llama.bin");
    write_llmc(&llama, TokenDtype::Uint32, &[128_000, 9, 128_001]).unwrap_or_else(|error| panic!("{error}"));
    let stats = stats_of(&llama, options(None, Some(128_001)));
    assert_eq!((stats.tokens, stats.documents, stats.max_token), (3, 1, Some(128_001)));
    let wrong_dtype = TokenDataset::open(&path, options(Some(TokenDtype::Int32), None));
    assert!(matches!(wrong_dtype, Err(TokenError::Usage { .. })));
}

#[test]
fn hostile_llmc_headers_are_refused_and_never_panic() {
    let dir = tempfile::tempdir().unwrap_or_else(|error| panic!("{error}"));
    let path = dir.path().join("shard.bin");
    write_llmc(&path, TokenDtype::Uint16, &tokens()).unwrap_or_else(|error| panic!("{error}"));
    let good = std::fs::read(&path).unwrap_or_else(|error| panic!("{error}"));
    let with = |at: usize, value: i32| {
        let mut bytes = good.clone();
        bytes[at..at + 4].copy_from_slice(&value.to_le_bytes());
        bytes
    };
    let forced = TokenOptions { format: Some(TokenFormat::Llmc), ..TokenOptions::default() };
    let mut trailing = good.clone();
    trailing.push(0);
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (with(0, 20_240_521), "not llm.c's"),
        (with(4, 2), "version 2"),
        (with(8, -5), "negative"),
        (with(8, i32::MAX), "truncated"),
        (with(8, 8), "truncated"),
        (with(8, 6), "the header lies"),
        (trailing, "the header lies"),
        (good[..1000].to_vec(), "truncated"),
        (good[..good.len() - 1].to_vec(), "truncated"),
    ];
    for (bytes, expected) in cases {
        std::fs::write(&path, &bytes).unwrap_or_else(|error| panic!("{error}"));
        let text = TokenDataset::open(&path, forced).expect_err("refused").to_string();
        assert!(text.contains(expected) && text.contains("shard.bin"), "expected {expected:?} and the file in: {text}");
    }
    let text = {
        std::fs::write(&path, with(8, i32::MAX)).unwrap_or_else(|error| panic!("{error}"));
        TokenDataset::open(&path, forced).expect_err("refused").to_string()
    };
    assert!(text.contains("from byte 1024"), "{text}");
    for cut in 0..good.len() {
        std::fs::write(&path, &good[..cut]).unwrap_or_else(|error| panic!("{error}"));
        assert!(TokenDataset::open(&path, forced).is_err(), "cut at {cut}");
        // Not told it is llm.c: a cut header is not taken for one (no --dtype: refused).
        assert!(TokenDataset::open(&path, TokenOptions::default()).is_err(), "cut at {cut}");
    }
}

#[test]
fn headerless_files_need_a_dtype_and_a_whole_number_of_tokens() {
    let dir = tempfile::tempdir().unwrap_or_else(|error| panic!("{error}"));
    let path = dir.path().join("train.bin");
    // nanoGPT's layout: each document followed by EOS.
    write_raw(&path, TokenDtype::Uint16, &[1, 2, EOS, 3, EOS]).unwrap_or_else(|error| panic!("{error}"));
    let refused = TokenDataset::open(&path, TokenOptions::default()).expect_err("no dtype");
    assert!(refused.to_string().contains("--dtype uint16"), "{refused}");
    let uint16 = Some(TokenDtype::Uint16);
    let dataset = TokenDataset::open(&path, options(uint16, Some(EOS))).unwrap_or_else(|error| panic!("{error}"));
    assert_eq!((dataset.format(), dataset.token_count()), (TokenFormat::Raw, 5));
    let stats = stats_of(&path, options(uint16, Some(EOS)));
    assert_eq!((stats.documents, lengths(&stats)), (2, (2, 2, 3)));
    // 10 bytes are not a whole number of int32: the wrong dtype is caught.
    assert!(TokenDataset::open(&path, options(Some(TokenDtype::Int32), None)).is_err());
    std::fs::write(&path, [1u8, 0, 2]).unwrap_or_else(|error| panic!("{error}"));
    let odd = TokenDataset::open(&path, options(uint16, None)).expect_err("a half token");
    assert!(odd.to_string().contains("not a whole number of uint16 tokens") && odd.to_string().contains("at byte 2"), "{odd}");
    let out_of_range = TokenDataset::open(&path, options(Some(TokenDtype::Uint8), Some(EOS)));
    assert!(matches!(out_of_range, Err(TokenError::Usage { .. })));
    std::fs::write(&path, []).unwrap_or_else(|error| panic!("{error}"));
    let empty = stats_of(&path, options(uint16, Some(EOS)));
    assert_eq!((empty.tokens, empty.documents), (0, 0));
}
