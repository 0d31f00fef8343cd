//! Writers of each token layout, byte by byte after its published description (the module docs
//! of `megatron` and `llmc`): the files that tests read, and small datasets for trying Stoker.
//! They hold everything in memory; they are not for converting large corpora.

use std::io;
use std::path::{Path, PathBuf};

use super::dtype::TokenDtype;
use super::llmc::{LLMC_HEADER_BYTES, LLMC_KINDS};
use super::megatron::{MEGATRON_MAGIC, MEGATRON_VERSION};

fn invalid(reason: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, reason)
}

fn encode_all(dtype: TokenDtype, tokens: &[i64], out: &mut Vec<u8>) -> io::Result<()> {
    for &token in tokens {
        if !dtype.holds(token) {
            return Err(invalid(format!("token {token} cannot be stored as {dtype}")));
        }
        dtype.encode(token, out);
    }
    Ok(())
}

/// Write Megatron-LM's `PREFIX.bin` and `PREFIX.idx` of `sequences` (each one document, as
/// Megatron's preprocessing writes them), returning both paths.
pub fn write_megatron(prefix: &Path, dtype: TokenDtype, sequences: &[Vec<i64>]) -> io::Result<(PathBuf, PathBuf)> {
    let code = dtype.megatron_code().ok_or_else(|| invalid(format!("Megatron-LM has no dtype code for {dtype}")))?;
    let mut bin = Vec::new();
    let (mut sizes, mut pointers) = (Vec::new(), Vec::new());
    for sequence in sequences {
        let size = i32::try_from(sequence.len()).map_err(|_| invalid("a sequence longer than i32::MAX tokens".to_owned()))?;
        pointers.extend_from_slice(&(bin.len() as i64).to_le_bytes());
        sizes.extend_from_slice(&size.to_le_bytes());
        encode_all(dtype, sequence, &mut bin)?;
    }
    let count = sequences.len() as u64;
    let mut idx = Vec::new();
    idx.extend_from_slice(MEGATRON_MAGIC);
    idx.extend_from_slice(&MEGATRON_VERSION.to_le_bytes());
    idx.push(code);
    idx.extend_from_slice(&count.to_le_bytes());
    // The document index: 0, then the end of each document (one sequence each).
    idx.extend_from_slice(&(count + 1).to_le_bytes());
    idx.extend_from_slice(&sizes);
    idx.extend_from_slice(&pointers);
    for end in 0..=count {
        idx.extend_from_slice(&(end as i64).to_le_bytes());
    }
    let with = |suffix: &str| {
        let mut name = prefix.as_os_str().to_owned();
        name.push(suffix);
        PathBuf::from(name)
    };
    let (bin_path, idx_path) = (with(".bin"), with(".idx"));
    std::fs::write(&bin_path, bin)?;
    std::fs::write(&idx_path, idx)?;
    Ok((bin_path, idx_path))
}

/// Write an llm.c shard of `tokens` as `dtype` (`uint16`: GPT-2's magic and version;
/// `uint32`: Llama 3's).
pub fn write_llmc(path: &Path, dtype: TokenDtype, tokens: &[i64]) -> io::Result<()> {
    let (magic, version, _) = LLMC_KINDS
        .iter()
        .find(|(_, _, kind)| *kind == dtype)
        .ok_or_else(|| invalid(format!("llm.c shards hold uint16 or uint32 tokens, not {dtype}")))?;
    let count = i32::try_from(tokens.len()).map_err(|_| invalid("llm.c shards hold fewer than 2^31 tokens".to_owned()))?;
    let mut bytes = Vec::with_capacity(LLMC_HEADER_BYTES + tokens.len() * dtype.size());
    for field in [*magic, *version, count] {
        bytes.extend_from_slice(&field.to_le_bytes());
    }
    bytes.resize(LLMC_HEADER_BYTES, 0);
    encode_all(dtype, tokens, &mut bytes)?;
    std::fs::write(path, bytes)
}

/// Write `tokens` as a headerless array of `dtype` (nanoGPT's `train.bin`).
pub fn write_raw(path: &Path, dtype: TokenDtype, tokens: &[i64]) -> io::Result<()> {
    let mut bytes = Vec::with_capacity(tokens.len() * dtype.size());
    encode_all(dtype, tokens, &mut bytes)?;
    std::fs::write(path, bytes)
}
