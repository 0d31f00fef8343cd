//! An opened token dataset of any of the formats read, found by its file and header: where its
//! tokens are, and how it splits into documents.

use std::fmt;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::dtype::{TokenDtype, TokenSlice};
use super::error::TokenError;
use super::llmc::{check_llmc, has_llmc_magic};
use super::mapped::MappedFile;
use super::megatron::MegatronIndex;
use super::stats::TokenScan;

/// The layout of a token dataset's files.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TokenFormat {
    /// Megatron-LM's indexed dataset: `PREFIX.bin` + `PREFIX.idx`; documents are its sequences.
    Megatron,
    /// llm.c / modded-nanogpt shards: a 1 KiB header, then `uint16` (or `uint32`) tokens.
    Llmc,
    /// A headerless array of tokens of a declared dtype (nanoGPT's `train.bin`).
    Raw,
}

impl TokenFormat {
    /// What the format is, for people.
    pub fn describe(self) -> &'static str {
        match self {
            Self::Megatron => "Megatron-LM indexed dataset (.bin + .idx)",
            Self::Llmc => "llm.c token shard (256 × int32 header)",
            Self::Raw => "headerless token array (nanoGPT memmap)",
        }
    }
}

impl fmt::Display for TokenFormat {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str(match self {
            Self::Megatron => "megatron",
            Self::Llmc => "llmc",
            Self::Raw => "raw",
        })
    }
}

impl FromStr for TokenFormat {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "megatron" => Ok(Self::Megatron),
            "llmc" => Ok(Self::Llmc),
            "raw" => Ok(Self::Raw),
            _ => Err(format!("unknown token format {text:?}: megatron, llmc or raw")),
        }
    }
}

/// What the user says about a token file; everything else is read from it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TokenOptions {
    /// The format, when not to be told from the file (`None`: a `.idx` beside it means
    /// Megatron, llm.c's magic means llm.c, anything else needs `dtype` and is raw).
    pub format: Option<TokenFormat>,
    /// The token type of a raw file (llm.c and Megatron files say theirs).
    pub dtype: Option<TokenDtype>,
    /// The token that ends each document in llm.c and raw files (GPT-2's `<|endoftext|>` is
    /// 50256); without it the file is one document.
    pub eos: Option<i64>,
}

/// A token dataset, mapped and checked.
#[derive(Debug)]
pub struct TokenDataset {
    path: PathBuf,
    format: TokenFormat,
    dtype: TokenDtype,
    bin: MappedFile,
    layout: Layout,
}

#[derive(Debug)]
enum Layout {
    Megatron(MegatronIndex),
    /// One stream of tokens (these bytes of the file), split into documents after each `eos`.
    Stream {
        tokens: Range<usize>,
        eos: Option<i64>,
    },
}

/// The `.bin` and `.idx` of the Megatron dataset `path` names (the `.bin`, the `.idx` or the
/// prefix), when both exist.
pub fn megatron_paths(path: &Path) -> Option<(PathBuf, PathBuf)> {
    let extension = path.extension().and_then(|extension| extension.to_str());
    let (bin, idx) = match extension {
        Some("bin" | "idx") => (path.with_extension("bin"), path.with_extension("idx")),
        _ => {
            let with = |suffix: &str| {
                let mut name = path.as_os_str().to_owned();
                name.push(suffix);
                PathBuf::from(name)
            };
            (with(".bin"), with(".idx"))
        }
    };
    (bin.is_file() && idx.is_file()).then_some((bin, idx))
}

impl TokenDataset {
    /// Open the token dataset at `path` (for Megatron: the `.bin`, the `.idx` or the prefix).
    pub fn open(path: &Path, options: TokenOptions) -> Result<Self, TokenError> {
        let usage = |reason: String| TokenError::Usage { path: path.to_path_buf(), reason };
        let megatron_opt = megatron_paths(path);
        let format = match (options.format, &megatron_opt) {
            (Some(format), _) => format,
            (None, Some(_)) => TokenFormat::Megatron,
            (None, None) => Self::sniff(path, options)?,
        };
        if let Some(eos) = options.eos.filter(|_| format == TokenFormat::Megatron) {
            return Err(usage(format!(
                "--eos {eos}: a Megatron-LM dataset carries its documents (sequences) in its .idx; --eos is for llm.c and raw files"
            )));
        }
        match format {
            TokenFormat::Megatron => {
                let (bin_path, idx_path) = megatron_opt.ok_or_else(|| {
                    usage("a Megatron-LM dataset needs both PREFIX.bin and PREFIX.idx; one of them is missing".to_owned())
                })?;
                let bin = MappedFile::open(&bin_path)?;
                let index = MegatronIndex::open(&idx_path, bin.bytes().len() as u64)?;
                if let Some(dtype) = options.dtype.filter(|dtype| *dtype != index.dtype()) {
                    return Err(usage(format!("--dtype {dtype}, but its .idx says its tokens are {}", index.dtype())));
                }
                Ok(Self { path: bin_path, format, dtype: index.dtype(), bin, layout: Layout::Megatron(index) })
            }
            TokenFormat::Llmc => {
                let bin = MappedFile::open(path)?;
                let (dtype, tokens) = check_llmc(path, bin.bytes())?;
                if let Some(given) = options.dtype.filter(|given| *given != dtype) {
                    return Err(usage(format!("--dtype {given}, but its llm.c header says its tokens are {dtype}")));
                }
                Self::stream(path, format, dtype, bin, tokens, options.eos)
            }
            TokenFormat::Raw => {
                let dtype = options.dtype.ok_or_else(|| {
                    usage("a headerless token file does not say its token type: give it, e.g. --dtype uint16 (nanoGPT)".to_owned())
                })?;
                let bin = MappedFile::open(path)?;
                let len = bin.bytes().len();
                if !len.is_multiple_of(dtype.size()) {
                    return Err(TokenError::Invalid {
                        path: path.to_path_buf(),
                        offset: (len - len % dtype.size()) as u64,
                        reason: format!(
                            "{len} bytes is not a whole number of {dtype} tokens ({} bytes each): wrong --dtype, or the file is cut short",
                            dtype.size()
                        ),
                    });
                }
                Self::stream(path, format, dtype, bin, 0..len, options.eos)
            }
        }
    }

    /// The format of a file that has no `.idx` beside it: llm.c by its magic, raw when a dtype
    /// is given.
    fn sniff(path: &Path, options: TokenOptions) -> Result<TokenFormat, TokenError> {
        let mut magic = [0u8; 4];
        let file = crate::regular_file::open_regular(path).map_err(|source| TokenError::io("failed to open", path, source))?;
        let read = std::io::Read::read(&mut std::io::Read::take(file, 4), &mut magic)
            .map_err(|source| TokenError::io("failed to read", path, source))?;
        if has_llmc_magic(&magic[..read]) {
            return Ok(TokenFormat::Llmc);
        }
        if options.dtype.is_some() {
            return Ok(TokenFormat::Raw);
        }
        Err(TokenError::Usage {
            path: path.to_path_buf(),
            reason: "not a Megatron-LM dataset (no .idx beside it) nor an llm.c shard (no magic 20240520 or 20240801): if it is a \
                     headerless token array (nanoGPT's train.bin), give its token type: --dtype uint16"
                .to_owned(),
        })
    }

    fn stream(
        path: &Path,
        format: TokenFormat,
        dtype: TokenDtype,
        bin: MappedFile,
        tokens: Range<usize>,
        eos: Option<i64>,
    ) -> Result<Self, TokenError> {
        if let Some(eos) = eos.filter(|eos| !dtype.holds(*eos)) {
            return Err(TokenError::Usage { path: path.to_path_buf(), reason: format!("--eos {eos} cannot be a token of type {dtype}") });
        }
        Ok(Self { path: path.to_path_buf(), format, dtype, bin, layout: Layout::Stream { tokens, eos } })
    }

    /// The token file (a Megatron dataset's `.bin`).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A Megatron dataset's `.idx`.
    pub fn index_path(&self) -> Option<&Path> {
        self.megatron().map(MegatronIndex::path)
    }

    /// The Megatron index, of a Megatron dataset.
    pub fn megatron(&self) -> Option<&MegatronIndex> {
        match &self.layout {
            Layout::Megatron(index) => Some(index),
            Layout::Stream { .. } => None,
        }
    }

    /// The layout.
    pub fn format(&self) -> TokenFormat {
        self.format
    }

    /// How each token is stored.
    pub fn dtype(&self) -> TokenDtype {
        self.dtype
    }

    /// The token that ends documents (llm.c and raw files), if given.
    pub fn eos(&self) -> Option<i64> {
        match self.layout {
            Layout::Stream { eos, .. } => eos,
            Layout::Megatron(_) => None,
        }
    }

    /// Bytes of the token file.
    pub fn file_bytes(&self) -> u64 {
        self.bin.bytes().len() as u64
    }

    /// Tokens in the dataset (without reading them).
    pub fn token_count(&self) -> u64 {
        match &self.layout {
            Layout::Megatron(index) => index.tokens(),
            Layout::Stream { tokens, .. } => (tokens.len() / self.dtype.size()) as u64,
        }
    }

    /// The whole stream of tokens of an llm.c or raw file (zero-copy).
    pub fn stream_tokens(&self) -> Option<TokenSlice<'_>> {
        match &self.layout {
            Layout::Stream { tokens, .. } => TokenSlice::new(self.bin.bytes().get(tokens.clone())?, self.dtype),
            Layout::Megatron(_) => None,
        }
    }

    /// Sequence `index` of a Megatron dataset (zero-copy).
    pub fn sequence(&self, index: usize) -> Option<TokenSlice<'_>> {
        let range = self.megatron()?.sequence_bytes(index)?;
        TokenSlice::new(self.bin.bytes().get(range)?, self.dtype)
    }

    /// Read every token once: count them, their smallest and largest, and the length of every
    /// document (Megatron: each sequence; llm.c and raw: split after each EOS token, the tokens
    /// after the last one a document of their own; without an EOS, the whole file).
    pub fn scan_into(&self, scan: &mut TokenScan) {
        match &self.layout {
            Layout::Megatron(index) => {
                for sequence in 0..index.sequences() {
                    let slice = self.sequence(sequence);
                    let (count, min, max) = slice.map(min_max).unwrap_or((0, 0, 0));
                    scan.tokens(count, min, max);
                    scan.document(count);
                }
            }
            Layout::Stream { eos, .. } => {
                let Some(slice) = self.stream_tokens() else { return };
                let (count, min, max) = min_max(slice);
                scan.tokens(count, min, max);
                match *eos {
                    Some(eos) => {
                        let mut length = 0u64;
                        slice.for_each(|token| {
                            length += 1;
                            if token == eos {
                                scan.document(length);
                                length = 0;
                            }
                        });
                        if length > 0 {
                            scan.document(length);
                        }
                    }
                    None if count > 0 => scan.document(count),
                    None => {}
                }
            }
        }
    }
}

/// Count, smallest and largest token of `slice` (0, 0 when it is empty).
fn min_max(slice: TokenSlice<'_>) -> (u64, i64, i64) {
    let (mut min, mut max) = (i64::MAX, i64::MIN);
    slice.for_each(|token| {
        min = min.min(token);
        max = max.max(token);
    });
    if slice.is_empty() { (0, 0, 0) } else { (slice.len() as u64, min, max) }
}
