//! Megatron-LM's indexed dataset (`megatron/core/datasets/indexed_dataset.py`): the tokens in
//! `PREFIX.bin`, and `PREFIX.idx` describing them. The `.idx` layout, all little-endian:
//!
//! | bytes | field |
//! |---|---|
//! | 9 | magic `MMIDIDX\0\0` |
//! | 8 | version, `u64`, 1 |
//! | 1 | dtype code, `u8` (1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 8 uint16; 6, 7 floats) |
//! | 8 | sequence count N, `u64` |
//! | 8 | document index length D, `u64` |
//! | 4·N | tokens of each sequence, `i32` |
//! | 8·N | byte offset of each sequence in the `.bin`, `i64` |
//! | 8·D | document index, `i64`: 0, then the sequence count at the end of each document |
//! | N (optional) | mode of each sequence, `i8` (multimodal datasets only) |
//!
//! Nothing is aligned (the sizes start at byte 34), so every field is read from its bytes.
//! Everything is checked when the index is opened: the counts against the file's length
//! (before anything is read), every sequence inside the `.bin`, the document index rising
//! from 0 to N.

use std::ops::Range;
use std::path::{Path, PathBuf};

use super::dtype::TokenDtype;
use super::error::TokenError;
use super::mapped::{MappedFile, array_at, i32_at, i64_at, u64_at};

/// The first 9 bytes of every `.idx`.
pub const MEGATRON_MAGIC: &[u8; 9] = b"MMIDIDX\x00\x00";
/// The only version Megatron-LM writes.
pub const MEGATRON_VERSION: u64 = 1;
/// Bytes before the sequence sizes: magic, version, dtype code, the two counts.
const HEADER_LEN: usize = 9 + 8 + 1 + 8 + 8;
const FORMAT: &str = "Megatron-LM .idx";

/// A validated Megatron-LM `.idx`, mapped.
#[derive(Debug)]
pub struct MegatronIndex {
    path: PathBuf,
    idx: MappedFile,
    dtype: TokenDtype,
    sequences: usize,
    index_entries: usize,
    multimodal: bool,
    tokens: u64,
}

impl MegatronIndex {
    /// Open and check the `.idx` at `path` against its `.bin` of `bin_len` bytes.
    pub fn open(path: &Path, bin_len: u64) -> Result<Self, TokenError> {
        let idx = MappedFile::open(path)?;
        let header = check_header(path, idx.bytes())?;
        let index = Self {
            path: path.to_path_buf(),
            dtype: header.dtype,
            sequences: header.sequences,
            index_entries: header.index_entries,
            multimodal: header.multimodal,
            tokens: 0,
            idx,
        };
        let tokens = index.check_sequences(bin_len)?;
        index.check_document_index()?;
        Ok(Self { tokens, ..index })
    }

    /// The `.idx` file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Bytes of the `.idx`.
    pub fn file_bytes(&self) -> u64 {
        self.idx.bytes().len() as u64
    }

    /// How each token is stored in the `.bin`.
    pub fn dtype(&self) -> TokenDtype {
        self.dtype
    }

    /// Sequences (Megatron's unit of training: one per tokenized document, usually).
    pub fn sequences(&self) -> usize {
        self.sequences
    }

    /// Documents of the document index (each a run of consecutive sequences).
    pub fn documents(&self) -> usize {
        self.index_entries.saturating_sub(1)
    }

    /// Whether the index carries a mode per sequence (Megatron's multimodal datasets).
    pub fn multimodal(&self) -> bool {
        self.multimodal
    }

    /// Tokens of all sequences.
    pub fn tokens(&self) -> u64 {
        self.tokens
    }

    /// The bytes of sequence `index` in the `.bin` (checked inside it when opened).
    pub fn sequence_bytes(&self, index: usize) -> Option<Range<usize>> {
        let (length, pointer) = self.raw_sequence(index)?;
        let start = usize::try_from(pointer).ok()?;
        let length = usize::try_from(length).ok()?;
        Some(start..start.checked_add(length.checked_mul(self.dtype.size())?)?)
    }

    /// The sequences of document `index` of the document index.
    pub fn document_sequences(&self, index: usize) -> Option<Range<usize>> {
        let start = self.index_entry(index)?;
        let end = self.index_entry(index.checked_add(1)?)?;
        Some(usize::try_from(start).ok()?..usize::try_from(end).ok()?)
    }

    /// Sequence `index`'s size (tokens) and pointer (bytes) as stored.
    fn raw_sequence(&self, index: usize) -> Option<(i32, i64)> {
        if index >= self.sequences {
            return None;
        }
        let bytes = self.idx.bytes();
        let length = i32_at(bytes, HEADER_LEN + 4 * index)?;
        let pointer = i64_at(bytes, HEADER_LEN + 4 * self.sequences + 8 * index)?;
        Some((length, pointer))
    }

    fn index_entry(&self, index: usize) -> Option<i64> {
        (index < self.index_entries).then_some(())?;
        i64_at(self.idx.bytes(), HEADER_LEN + 12 * self.sequences + 8 * index)
    }

    /// Every sequence's size is not negative and its bytes lie inside the `.bin`; returns the
    /// tokens of all sequences.
    fn check_sequences(&self, bin_len: u64) -> Result<u64, TokenError> {
        let size = self.dtype.size() as u64;
        let mut tokens = 0u64;
        for index in 0..self.sequences {
            let size_at = (HEADER_LEN + 4 * index) as u64;
            let pointer_at = (HEADER_LEN + 4 * self.sequences + 8 * index) as u64;
            let (length, pointer) = self.raw_sequence(index).ok_or_else(|| self.invalid(size_at, "the sequence table ends early"))?;
            let length = u64::try_from(length).map_err(|_| {
                self.invalid(size_at, format!("sequence {index} has a negative size ({length} tokens): the index is corrupt"))
            })?;
            let start = u64::try_from(pointer).map_err(|_| {
                self.invalid(pointer_at, format!("sequence {index} has a negative pointer ({pointer}): the index is corrupt"))
            })?;
            let end = length.checked_mul(size).and_then(|bytes| bytes.checked_add(start));
            if end.is_none_or(|end| end > bin_len) {
                let end = end.map_or_else(|| "past 2^64".to_owned(), |end| format!("at byte {end}"));
                return Err(self.invalid(
                    pointer_at,
                    format!(
                        "sequence {index} ({length} tokens of {} from byte {start}) ends {end}, past the end of the .bin ({bin_len} \
                         bytes): the .bin is truncated or belongs to another .idx",
                        self.dtype
                    ),
                ));
            }
            tokens = tokens.saturating_add(length);
        }
        Ok(tokens)
    }

    /// The document index starts at 0, never falls, and ends at the sequence count (as
    /// Megatron-LM asserts when it loads one).
    fn check_document_index(&self) -> Result<(), TokenError> {
        let index_at = (HEADER_LEN + 12 * self.sequences) as u64;
        if self.index_entries == 0 {
            return Err(self.invalid(26, "the document index is empty; Megatron-LM's writer always starts it with 0".to_owned()));
        }
        let mut previous = 0i64;
        for entry in 0..self.index_entries {
            let at = index_at + 8 * entry as u64;
            let value = self.index_entry(entry).ok_or_else(|| self.invalid(at, "the document index ends early"))?;
            let bad = match entry {
                0 if value != 0 => Some(format!("the document index starts at {value}, not 0")),
                _ if value < previous => Some(format!("document index entry {entry} ({value}) is below the one before ({previous})")),
                _ if value as u64 > self.sequences as u64 => {
                    Some(format!("document index entry {entry} ({value}) is past the sequence count ({})", self.sequences))
                }
                _ => None,
            };
            if let Some(reason) = bad {
                return Err(self.invalid(at, format!("{reason}: the index is corrupt")));
            }
            previous = value;
        }
        if previous as u64 != self.sequences as u64 {
            let at = index_at + 8 * (self.index_entries as u64 - 1);
            return Err(self.invalid(
                at,
                format!(
                    "the document index ends at sequence {previous}, not at the sequence count ({}): the index is corrupt",
                    self.sequences
                ),
            ));
        }
        Ok(())
    }

    fn invalid(&self, offset: u64, reason: impl Into<String>) -> TokenError {
        TokenError::Invalid { path: self.path.clone(), offset, reason: reason.into() }
    }
}

/// What the fixed header says, checked against the file's length.
struct Header {
    dtype: TokenDtype,
    sequences: usize,
    index_entries: usize,
    multimodal: bool,
}

fn check_header(path: &Path, bytes: &[u8]) -> Result<Header, TokenError> {
    let file_len = bytes.len() as u64;
    let invalid = |offset: u64, reason: String| TokenError::Invalid { path: path.to_path_buf(), offset, reason };
    let truncated = |what: &str, offset: usize, needed: u64| TokenError::truncated(path, FORMAT, what, (offset, needed), file_len);
    let magic: [u8; 9] = array_at(bytes, 0).ok_or_else(|| truncated("the header", 0, HEADER_LEN as u64))?;
    if &magic != MEGATRON_MAGIC {
        return Err(invalid(
            0,
            format!(
                "the magic is {magic:02x?}, not MMIDIDX\\0\\0: not a Megatron-LM indexed dataset index (the old lazy/cached formats are not read)"
            ),
        ));
    }
    if bytes.len() < HEADER_LEN {
        return Err(truncated("the header", 0, HEADER_LEN as u64));
    }
    let field = |offset: usize| u64_at(bytes, offset).ok_or_else(|| truncated("the header", 0, HEADER_LEN as u64));
    let version = field(9)?;
    if version != MEGATRON_VERSION {
        return Err(invalid(9, format!("version {version}; Megatron-LM writes (and Stoker reads) version {MEGATRON_VERSION}")));
    }
    let code = bytes[17];
    let dtype = TokenDtype::from_megatron_code(code).map_err(|reason| invalid(17, reason))?;
    let (sequences, index_entries) = (field(18)?, field(26)?);
    // Checked before anything is read: counts from a hostile header may overflow.
    let tables = sequences.checked_mul(12).and_then(|both| both.checked_add(index_entries.checked_mul(8)?));
    let needed = tables.and_then(|tables| tables.checked_add(HEADER_LEN as u64)).unwrap_or(u64::MAX);
    let what = format!("{sequences} sequences and a document index of {index_entries} entries");
    if needed > file_len {
        return Err(truncated(&what, HEADER_LEN, needed.saturating_sub(HEADER_LEN as u64)));
    }
    let multimodal = match file_len - needed {
        0 => false,
        extra if extra == sequences => true,
        extra => {
            return Err(invalid(
                needed,
                format!(
                    "{extra} bytes follow the document index, neither none nor one mode byte per sequence ({sequences}): the index is \
                     corrupt or its counts are wrong"
                ),
            ));
        }
    };
    // Both fit: the tables lie inside the mapped file.
    let (sequences, index_entries) = (sequences as usize, index_entries as usize);
    Ok(Header { dtype, sequences, index_entries, multimodal })
}
