//! The shard index `SHARD.tar.idx` (DESIGN §3): for each sample its key, and for each of its
//! members the extension, data offset and length. Reading a sample is then a slice of the mmap.
//!
//! Format version 1, all integers little-endian:
//!
//! | bytes | field |
//! |---|---|
//! | 8 | magic `STOKRIDX` |
//! | 4 | format version (1) |
//! | 4 | flags (0) |
//! | 8 | shard length in bytes |
//! | 8 | xxh3-64 of the shard's first and last 64 KiB (see [`region_hash`]) |
//! | 8 | sample count S |
//! | 8 | member count M |
//! | 8 | string table length L |
//! | S × 16 | per sample: key offset u32, key length u32, first member u32, member count u32 |
//! | M × 24 | per member: data offset u64, size u64, extension offset u32, extension length u32 |
//! | L | UTF-8 string table (keys, and each distinct extension once) |
//! | 8 | xxh3-64 of every byte before it |
//!
//! An index is trusted only after every check passes: magic, version, checksum, every range
//! inside the index and the shard, and the shard's length and region hash. A stale or corrupt
//! index is an error the caller answers by rebuilding, never by reading through it.

use std::collections::HashMap;
use std::ops::Deref;
use std::path::Path;

use memmap2::Mmap;
use xxhash_rust::xxh3::{Xxh3, xxh3_64};

use super::sample_key::split_member_name;
use super::tar_reader::TarMembers;
use crate::error::ShardError;

/// First bytes of every index file.
pub const INDEX_MAGIC: [u8; 8] = *b"STOKRIDX";
/// Format version written and read by this build. Bump when the layout changes.
pub const INDEX_VERSION: u32 = 1;
/// Bytes hashed at each end of the shard for the staleness check.
pub const REGION_BYTES: usize = 64 << 10;

const HEADER_LEN: usize = 56;
const SAMPLE_RECORD: usize = 16;
const MEMBER_RECORD: usize = 24;
const TRAILER_LEN: usize = 8;

/// Hash of the shard's "header region": its first and last [`REGION_BYTES`] bytes and its
/// length. The first region holds the first members' headers, the last the final headers and
/// end blocks, so a rewritten, appended or truncated shard is caught without reading it all.
/// (Hashing every member header would mean touching every page of a cold shard on each open.)
pub fn region_hash(shard: &[u8]) -> u64 {
    let mut hasher = Xxh3::new();
    hasher.update(&(shard.len() as u64).to_le_bytes());
    hasher.update(&shard[..shard.len().min(REGION_BYTES)]);
    hasher.update(&shard[shard.len().saturating_sub(REGION_BYTES)..]);
    hasher.digest()
}

/// Scan the tar `shard` and encode its index.
pub fn build_index(shard: &[u8]) -> Result<Vec<u8>, ShardError> {
    let mut samples: Vec<[u32; 4]> = Vec::new();
    let mut members: Vec<(u64, u64, u32, u32)> = Vec::new();
    let mut strings: Vec<u8> = Vec::new();
    let mut extensions: HashMap<String, (u32, u32)> = HashMap::new();
    let mut current_key: Option<String> = None;
    for member in TarMembers::new(shard) {
        let member = member?;
        let Some((key, extension)) = split_member_name(&member.name) else { continue };
        let extension = extension.to_lowercase();
        if current_key.as_deref() != Some(key) {
            let key_offset = checked_u32(strings.len(), "string bytes")?;
            strings.extend_from_slice(key.as_bytes());
            let first_member = checked_u32(members.len(), "members")?;
            samples.push([key_offset, checked_u32(key.len(), "string bytes")?, first_member, 0]);
            current_key = Some(key.to_string());
        }
        let Some(sample) = samples.last_mut() else { continue };
        let sample_members = &members[sample[2] as usize..];
        if let Some(duplicate) = sample_members.iter().find(|existing| string_at(&strings, existing.2, existing.3) == extension.as_bytes())
        {
            return Err(ShardError::DuplicateMember { key: key.to_string(), extension, first: duplicate.0, second: member.data_offset });
        }
        let extension_range = match extensions.get(&extension) {
            Some(&range) => range,
            None => {
                let range = (checked_u32(strings.len(), "string bytes")?, checked_u32(extension.len(), "string bytes")?);
                strings.extend_from_slice(extension.as_bytes());
                extensions.insert(extension, range);
                range
            }
        };
        members.push((member.data_offset, member.size, extension_range.0, extension_range.1));
        sample[3] += 1;
        checked_u32(members.len(), "members")?;
    }
    let mut out =
        Vec::with_capacity(HEADER_LEN + samples.len() * SAMPLE_RECORD + members.len() * MEMBER_RECORD + strings.len() + TRAILER_LEN);
    out.extend_from_slice(&INDEX_MAGIC);
    out.extend_from_slice(&INDEX_VERSION.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    for field in [shard.len() as u64, region_hash(shard), samples.len() as u64, members.len() as u64, strings.len() as u64] {
        out.extend_from_slice(&field.to_le_bytes());
    }
    for sample in &samples {
        for field in sample {
            out.extend_from_slice(&field.to_le_bytes());
        }
    }
    for &(offset, size, extension_offset, extension_len) in &members {
        out.extend_from_slice(&offset.to_le_bytes());
        out.extend_from_slice(&size.to_le_bytes());
        out.extend_from_slice(&extension_offset.to_le_bytes());
        out.extend_from_slice(&extension_len.to_le_bytes());
    }
    out.extend_from_slice(&strings);
    let checksum = xxh3_64(&out);
    out.extend_from_slice(&checksum.to_le_bytes());
    Ok(out)
}

fn checked_u32(value: usize, what: &'static str) -> Result<u32, ShardError> {
    u32::try_from(value).map_err(|_| ShardError::TooLarge { what, limit: u64::from(u32::MAX) })
}

fn string_at(strings: &[u8], offset: u32, len: u32) -> &[u8] {
    &strings[offset as usize..(offset + len) as usize]
}

/// Where an index's bytes live.
#[derive(Debug)]
pub enum IndexBytes {
    /// Memory-mapped from an `.idx` file.
    Mapped(Mmap),
    /// Built in memory.
    Owned(Vec<u8>),
}

impl Deref for IndexBytes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            Self::Mapped(map) => map,
            Self::Owned(bytes) => bytes,
        }
    }
}

/// A validated index. Accessors read the records in place.
#[derive(Debug)]
pub struct ShardIndex {
    bytes: IndexBytes,
    samples: usize,
    members: usize,
    strings_start: usize,
    strings_len: usize,
}

/// One member of a sample, as the index records it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemberEntry<'a> {
    /// Lower-cased extension (`jpg`, `cls`, `seg.png`).
    pub extension: &'a str,
    /// Offset of the data in the shard.
    pub offset: u64,
    /// Data length.
    pub size: u64,
}

impl ShardIndex {
    /// Validate `bytes` as the index of `shard`. `path` names the index in errors.
    pub fn from_bytes(bytes: IndexBytes, shard: &[u8], path: &Path) -> Result<Self, ShardError> {
        let index = Self::parse(bytes, path)?;
        index.check_shard(shard, path)?;
        Ok(index)
    }

    /// Read and validate `path` as the index of `shard`.
    pub fn load(path: &Path, shard: &[u8]) -> Result<Self, ShardError> {
        // Only a regular file: a FIFO in the index's place would block the dataset's open.
        let file = crate::regular_file::open_regular(path).map_err(|source| ShardError::io("failed to open index", path, source))?;
        let len = file.metadata().map_err(|source| ShardError::io("failed to stat index", path, source))?.len();
        if len == 0 {
            return Err(ShardError::CorruptIndex { path: path.into(), reason: "the file is empty".into() });
        }
        // SAFETY: index files are written once by rename and never modified in place; a
        // concurrent truncation would be a broken deployment, and all reads are bounds-checked
        // against the length validated below.
        let map = unsafe { Mmap::map(&file) }.map_err(|source| ShardError::io("failed to map index", path, source))?;
        Self::from_bytes(IndexBytes::Mapped(map), shard, path)
    }

    fn parse(bytes: IndexBytes, path: &Path) -> Result<Self, ShardError> {
        let corrupt = |reason: String| ShardError::CorruptIndex { path: path.into(), reason };
        if bytes.len() < HEADER_LEN + TRAILER_LEN {
            return Err(corrupt(format!("{} bytes is shorter than any index", bytes.len())));
        }
        if bytes[..8] != INDEX_MAGIC {
            return Err(corrupt("wrong magic: not a Stoker index".into()));
        }
        let version = read_u32(&bytes, 8);
        if version != INDEX_VERSION {
            return Err(ShardError::UnsupportedIndexVersion { path: path.into(), found: version, supported: INDEX_VERSION });
        }
        let body_len = bytes.len() - TRAILER_LEN;
        if xxh3_64(&bytes[..body_len]) != read_u64(&bytes, body_len) {
            return Err(corrupt("checksum mismatch".into()));
        }
        let (samples, members, strings_len) = (read_u64(&bytes, 32), read_u64(&bytes, 40), read_u64(&bytes, 48));
        let expected = samples
            .checked_mul(SAMPLE_RECORD as u64)
            .and_then(|total| total.checked_add(members.checked_mul(MEMBER_RECORD as u64)?))
            .and_then(|total| total.checked_add(strings_len))
            .and_then(|total| total.checked_add((HEADER_LEN + TRAILER_LEN) as u64));
        if expected != Some(bytes.len() as u64) {
            return Err(corrupt(format!(
                "{samples} samples, {members} members and {strings_len} string bytes do not fit {} bytes",
                bytes.len()
            )));
        }
        let (samples, members) = (samples as usize, members as usize);
        let strings_start = HEADER_LEN + samples * SAMPLE_RECORD + members * MEMBER_RECORD;
        let index = Self { bytes, samples, members, strings_start, strings_len: strings_len as usize };
        index.check_records(path)?;
        Ok(index)
    }

    fn check_records(&self, path: &Path) -> Result<(), ShardError> {
        let corrupt = |reason: String| ShardError::CorruptIndex { path: path.into(), reason };
        let strings = std::str::from_utf8(&self.bytes[self.strings_start..self.strings_start + self.strings_len])
            .map_err(|_| corrupt("string table is not UTF-8".into()))?;
        let in_strings = |offset: u32, len: u32| strings.get(offset as usize..offset as usize + len as usize).is_some();
        for sample in 0..self.samples {
            let [key_offset, key_len, first, count] = self.sample_record(sample);
            if !in_strings(key_offset, key_len) {
                return Err(corrupt(format!("sample {sample} key is outside the string table")));
            }
            if u64::from(first) + u64::from(count) > self.members as u64 {
                return Err(corrupt(format!("sample {sample} members are outside the member table")));
            }
        }
        for member in 0..self.members {
            let (_, _, extension_offset, extension_len) = self.member_record(member);
            if !in_strings(extension_offset, extension_len) {
                return Err(corrupt(format!("member {member} extension is outside the string table")));
            }
        }
        Ok(())
    }

    fn check_shard(&self, shard: &[u8], path: &Path) -> Result<(), ShardError> {
        let stale = |reason: String| ShardError::StaleIndex { path: path.into(), reason };
        let recorded_len = read_u64(&self.bytes, 16);
        if recorded_len != shard.len() as u64 {
            return Err(stale(format!("it describes a shard of {recorded_len} bytes; the shard has {}", shard.len())));
        }
        if read_u64(&self.bytes, 24) != region_hash(shard) {
            return Err(stale("the shard's content changed since it was indexed".into()));
        }
        for member in 0..self.members {
            let (offset, size, _, _) = self.member_record(member);
            if offset.checked_add(size).is_none_or(|end| end > recorded_len) {
                return Err(ShardError::CorruptIndex {
                    path: path.into(),
                    reason: format!("member {member} lies past the end of the shard"),
                });
            }
        }
        Ok(())
    }

    fn sample_record(&self, sample: usize) -> [u32; 4] {
        let base = HEADER_LEN + sample * SAMPLE_RECORD;
        [0, 4, 8, 12].map(|field| read_u32(&self.bytes, base + field))
    }

    fn member_record(&self, member: usize) -> (u64, u64, u32, u32) {
        let base = HEADER_LEN + self.samples * SAMPLE_RECORD + member * MEMBER_RECORD;
        (read_u64(&self.bytes, base), read_u64(&self.bytes, base + 8), read_u32(&self.bytes, base + 16), read_u32(&self.bytes, base + 20))
    }

    fn string(&self, offset: u32, len: u32) -> &str {
        let start = self.strings_start + offset as usize;
        // Validated UTF-8 on char boundaries in `check_records`.
        std::str::from_utf8(&self.bytes[start..start + len as usize]).unwrap_or_default()
    }

    /// Number of samples.
    pub fn samples(&self) -> usize {
        self.samples
    }

    /// Number of members in all samples.
    pub fn members(&self) -> usize {
        self.members
    }

    /// Key of sample `sample` (`< samples()`).
    pub fn key(&self, sample: usize) -> &str {
        let [key_offset, key_len, _, _] = self.sample_record(sample);
        self.string(key_offset, key_len)
    }

    /// Members of sample `sample` (`< samples()`), in tar order.
    pub fn sample_members(&self, sample: usize) -> impl ExactSizeIterator<Item = MemberEntry<'_>> + '_ {
        let [_, _, first, count] = self.sample_record(sample);
        (first as usize..first as usize + count as usize).map(move |member| {
            let (offset, size, extension_offset, extension_len) = self.member_record(member);
            MemberEntry { extension: self.string(extension_offset, extension_len), offset, size }
        })
    }

    /// The encoded index.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes
    }
}

fn read_u32(bytes: &[u8], offset: usize) -> u32 {
    let mut field = [0u8; 4];
    field.copy_from_slice(&bytes[offset..offset + 4]);
    u32::from_le_bytes(field)
}

fn read_u64(bytes: &[u8], offset: usize) -> u64 {
    let mut field = [0u8; 8];
    field.copy_from_slice(&bytes[offset..offset + 8]);
    u64::from_le_bytes(field)
}

#[cfg(test)]
#[path = "index_tests.rs"]
mod tests;
