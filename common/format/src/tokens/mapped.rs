//! A token file mapped read-only (an empty file has no mapping), and little-endian reads of
//! its header fields that return `None` past the end instead of panicking.

use std::path::Path;

use memmap2::Mmap;

use super::error::TokenError;

/// The bytes of a mapped file.
#[derive(Debug)]
pub(crate) enum MappedFile {
    Mapped(Mmap),
    Empty,
}

impl MappedFile {
    /// Map `path` (a regular file only: a FIFO or a device is refused, not waited on).
    pub(crate) fn open(path: &Path) -> Result<Self, TokenError> {
        let file = crate::regular_file::open_regular(path).map_err(|source| TokenError::io("failed to open", path, source))?;
        let len = file.metadata().map_err(|source| TokenError::io("failed to stat", path, source))?.len();
        if len == 0 {
            return Ok(Self::Empty);
        }
        // SAFETY: token datasets are immutable once written, like shards (DESIGN §3). If another
        // process truncates one while it is mapped, reads past the new end fault (SIGBUS): a
        // broken deployment; the manifest's byte counts catch rewrites between opens.
        let map = unsafe { Mmap::map(&file) }.map_err(|source| TokenError::io("failed to map", path, source))?;
        Ok(Self::Mapped(map))
    }

    /// The whole file.
    pub(crate) fn bytes(&self) -> &[u8] {
        match self {
            Self::Mapped(map) => map,
            Self::Empty => &[],
        }
    }
}

/// `N` bytes at `offset`, or `None` past the end.
pub(crate) fn array_at<const N: usize>(bytes: &[u8], offset: usize) -> Option<[u8; N]> {
    let slice = bytes.get(offset..offset.checked_add(N)?)?;
    let mut array = [0u8; N];
    array.copy_from_slice(slice);
    Some(array)
}

/// The little-endian `i32` at `offset`.
pub(crate) fn i32_at(bytes: &[u8], offset: usize) -> Option<i32> {
    array_at(bytes, offset).map(i32::from_le_bytes)
}

/// The little-endian `i64` at `offset`.
pub(crate) fn i64_at(bytes: &[u8], offset: usize) -> Option<i64> {
    array_at(bytes, offset).map(i64::from_le_bytes)
}

/// The little-endian `u64` at `offset`.
pub(crate) fn u64_at(bytes: &[u8], offset: usize) -> Option<u64> {
    array_at(bytes, offset).map(u64::from_le_bytes)
}
