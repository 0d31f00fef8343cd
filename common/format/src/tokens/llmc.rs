//! llm.c's (and modded-nanogpt's) token shards (`dev/data/data_common.py`): a header of 256
//! little-endian `i32` (magic, version, token count, the rest zero), then the tokens. GPT-2
//! shards: magic 20240520, version 1, `uint16` tokens; Llama 3 shards: magic 20240801,
//! version 7, `uint32` tokens. llm.c's loader wants the file to be exactly header + tokens;
//! so does Stoker.

use std::ops::Range;
use std::path::Path;

use super::dtype::TokenDtype;
use super::error::TokenError;
use super::mapped::i32_at;

/// Bytes of the header: 256 `i32`.
pub const LLMC_HEADER_BYTES: usize = 256 * 4;
/// The (magic, version, token type) of each kind of shard llm.c writes.
pub const LLMC_KINDS: [(i32, i32, TokenDtype); 2] = [(20_240_520, 1, TokenDtype::Uint16), (20_240_801, 7, TokenDtype::Uint32)];
const FORMAT: &str = "llm.c .bin shard";

/// Whether `bytes` start with one of llm.c's magics (the rest is checked by [`check_llmc`]).
pub fn has_llmc_magic(bytes: &[u8]) -> bool {
    i32_at(bytes, 0).is_some_and(|magic| LLMC_KINDS.iter().any(|(known, _, _)| *known == magic))
}

/// Check the llm.c shard `bytes` read from `path`: its token type and where its tokens are.
pub fn check_llmc(path: &Path, bytes: &[u8]) -> Result<(TokenDtype, Range<usize>), TokenError> {
    let invalid = |offset: u64, reason: String| TokenError::Invalid { path: path.to_path_buf(), offset, reason };
    let file_len = bytes.len() as u64;
    let truncated = |what: &str, offset: usize, needed: u64| TokenError::truncated(path, FORMAT, what, (offset, needed), file_len);
    let field = |index: usize| i32_at(bytes, 4 * index).ok_or_else(|| truncated("the 256 × int32 header", 0, LLMC_HEADER_BYTES as u64));
    let magic = field(0)?;
    let known = LLMC_KINDS.iter().find(|(known, _, _)| *known == magic).ok_or_else(|| {
        invalid(0, format!("the magic is {magic}, not llm.c's 20240520 (GPT-2) or 20240801 (Llama 3): not an llm.c token shard"))
    })?;
    if bytes.len() < LLMC_HEADER_BYTES {
        return Err(truncated("the 256 × int32 header", 0, LLMC_HEADER_BYTES as u64));
    }
    let version = field(1)?;
    if version != known.1 {
        return Err(invalid(4, format!("version {version}; llm.c shards with magic {magic} have version {}", known.1)));
    }
    let count = field(2)?;
    let tokens = u64::try_from(count).map_err(|_| invalid(8, format!("the token count is negative ({count}): the header is corrupt")))?;
    let dtype = known.2;
    // At most 2^31 tokens of at most 4 bytes: no overflow in u64.
    let needed = tokens * dtype.size() as u64;
    let available = file_len - LLMC_HEADER_BYTES as u64;
    if needed > available {
        return Err(truncated(&format!("{tokens} tokens of {dtype} (header[2])"), LLMC_HEADER_BYTES, needed));
    }
    if needed < available {
        return Err(invalid(
            8,
            format!(
                "the header says {tokens} tokens of {dtype} ({needed} bytes) but {available} bytes follow it: the header lies or the \
                 file has trailing data (llm.c refuses it too)"
            ),
        ));
    }
    Ok((dtype, LLMC_HEADER_BYTES..bytes.len()))
}
