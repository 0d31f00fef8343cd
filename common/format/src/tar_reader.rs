//! Tar members over a byte slice (an mmapped shard), with no copying and no allocation beyond
//! a joined ustar `prefix/name`.
//!
//! Reads what Python's `tarfile` (ustar, GNU and PAX formats), the `webdataset` package's
//! `TarWriter` and GNU tar write: ustar `prefix`, GNU long names (`././@LongLink`, type `L`),
//! PAX extended headers (`x`, and `g` which is parsed and ignored), octal and base-256 sizes.
//! Only regular files are yielded; directories, links and devices are skipped. Every size is
//! checked against the slice before it is used, and extended headers have hard limits, so a
//! hostile shard gives an error, never a panic or a large allocation.

use std::borrow::Cow;

use crate::error::ShardError;

/// Tar block size.
pub const BLOCK: u64 = 512;
/// Largest PAX extended header accepted (real ones are a few hundred bytes).
pub const MAX_PAX_BYTES: u64 = 1 << 20;
/// Largest GNU long name accepted.
pub const MAX_LONG_NAME_BYTES: u64 = 64 << 10;

/// A regular file in the archive.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TarMember<'a> {
    /// Full member name (PAX `path`, GNU long name, or ustar `prefix/name`).
    pub name: Cow<'a, str>,
    /// Offset of the member's own header block.
    pub header_offset: u64,
    /// Offset of the first data byte.
    pub data_offset: u64,
    /// Data length in bytes.
    pub size: u64,
}

/// Iterator over the regular files of a tar archive held in memory. Stops after the first error.
pub struct TarMembers<'a> {
    bytes: &'a [u8],
    offset: u64,
    finished: bool,
    pending_name: Option<&'a str>,
    pending_size: Option<u64>,
}

impl<'a> TarMembers<'a> {
    /// Members of the archive `bytes`.
    pub fn new(bytes: &'a [u8]) -> Self {
        Self { bytes, offset: 0, finished: false, pending_name: None, pending_size: None }
    }

    fn shard_len(&self) -> u64 {
        self.bytes.len() as u64
    }

    /// The slice `offset..offset+len`, which the caller has checked lies inside the shard.
    fn slice(&self, offset: u64, len: u64) -> &'a [u8] {
        &self.bytes[offset as usize..(offset + len) as usize]
    }

    fn next_member(&mut self) -> Result<Option<TarMember<'a>>, ShardError> {
        loop {
            let header_offset = self.offset;
            let available = self.shard_len() - header_offset;
            if available == 0 {
                if header_offset == 0 {
                    return Err(ShardError::Truncated { what: "tar header", offset: 0, needed: BLOCK, available: 0 });
                }
                // No end-of-archive blocks; some writers omit them. Everything read was whole.
                return Ok(None);
            }
            if available < BLOCK {
                if self.slice(header_offset, available).iter().all(|&byte| byte == 0) {
                    return Ok(None);
                }
                return Err(ShardError::Truncated { what: "tar header", offset: header_offset, needed: BLOCK, available });
            }
            let header = self.slice(header_offset, BLOCK);
            if header.iter().all(|&byte| byte == 0) {
                return Ok(None);
            }
            verify_checksum(header, header_offset)?;
            let typeflag = header[156];
            let header_size = parse_numeric(&header[124..136], header_offset, "size")?;
            let size = match typeflag {
                b'0' | 0 | b'7' => self.pending_size.take().unwrap_or(header_size),
                _ => header_size,
            };
            match typeflag {
                b'L' => check_extended_size("GNU long name", header_offset, size, MAX_LONG_NAME_BYTES)?,
                b'x' | b'g' => check_extended_size("PAX", header_offset, size, MAX_PAX_BYTES)?,
                _ => {}
            }
            let data_offset = header_offset + BLOCK;
            let data_end = data_offset.checked_add(size).filter(|&end| end <= self.shard_len());
            let Some(data_end) = data_end else {
                let name = String::from_utf8_lossy(nul_terminated(&header[0..100])).into_owned();
                return Err(ShardError::MemberPastEnd { name, offset: data_offset, size, shard_len: self.shard_len() });
            };
            // The next header follows the data rounded up to a block; a missing final padding
            // is tolerated at the end of the file.
            self.offset = data_end.div_ceil(BLOCK).saturating_mul(BLOCK).min(self.shard_len());
            match typeflag {
                b'L' => {
                    let name = nul_terminated(self.slice(data_offset, size));
                    self.pending_name = Some(utf8(name, header_offset, "GNU long name")?);
                }
                b'x' => {
                    let records = parse_pax(self.slice(data_offset, size), header_offset)?;
                    if records.path.is_some() {
                        self.pending_name = records.path;
                    }
                    if records.size.is_some() {
                        self.pending_size = records.size;
                    }
                }
                b'g' => {
                    // Global headers carry defaults such as mtime or comments; none changes
                    // where a member is or what it is called. Parsed so garbage is reported.
                    parse_pax(self.slice(data_offset, size), header_offset)?;
                }
                b'0' | 0 | b'7' => {
                    let name = match self.pending_name.take() {
                        Some(long_name) => Cow::Borrowed(long_name),
                        None => ustar_name(header, header_offset)?,
                    };
                    return Ok(Some(TarMember { name, header_offset, data_offset, size }));
                }
                _ => {
                    // Directory, link, device, GNU long link name (`K`) and so on: not data.
                    if typeflag != b'K' {
                        self.pending_name = None;
                        self.pending_size = None;
                    }
                }
            }
        }
    }
}

impl<'a> Iterator for TarMembers<'a> {
    type Item = Result<TarMember<'a>, ShardError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.finished {
            return None;
        }
        let result = self.next_member();
        if !matches!(result, Ok(Some(_))) {
            self.finished = true;
        }
        result.transpose()
    }
}

fn nul_terminated(field: &[u8]) -> &[u8] {
    let end = field.iter().position(|&byte| byte == 0).unwrap_or(field.len());
    &field[..end]
}

fn utf8<'a>(bytes: &'a [u8], offset: u64, what: &str) -> Result<&'a str, ShardError> {
    std::str::from_utf8(bytes).map_err(|_| ShardError::BadHeader { offset, reason: format!("{what} is not valid UTF-8") })
}

fn verify_checksum(header: &[u8], offset: u64) -> Result<(), ShardError> {
    let stored = parse_numeric(&header[148..156], offset, "checksum")?;
    let (mut unsigned, mut signed) = (0u64, 0i64);
    for (position, &byte) in header.iter().enumerate() {
        let byte = if (148..156).contains(&position) { b' ' } else { byte };
        unsigned += u64::from(byte);
        signed += i64::from(byte as i8);
    }
    // Historic writers summed signed chars; accept either, as GNU tar does.
    if stored == unsigned || i64::try_from(stored).is_ok_and(|stored| stored == signed) {
        return Ok(());
    }
    Err(ShardError::BadChecksum { offset, stored, computed: unsigned })
}

/// An octal field (leading spaces/NULs allowed) or a GNU base-256 field (high bit set).
fn parse_numeric(field: &[u8], offset: u64, what: &str) -> Result<u64, ShardError> {
    let bad = |reason: String| ShardError::BadHeader { offset, reason };
    if field.first().is_some_and(|&first| first & 0x80 != 0) {
        if field[0] == 0xFF {
            return Err(bad(format!("negative base-256 {what}")));
        }
        let mut value = u64::from(field[0] & 0x7F);
        for &byte in &field[1..] {
            value = value
                .checked_mul(256)
                .and_then(|shifted| shifted.checked_add(u64::from(byte)))
                .ok_or_else(|| bad(format!("base-256 {what} overflows 64 bits")))?;
        }
        return Ok(value);
    }
    let mut value = 0u64;
    let mut digits = field.iter().skip_while(|&&byte| byte == b' ' || byte == 0).peekable();
    while let Some(&byte) = digits.next_if(|&&byte| (b'0'..=b'7').contains(&byte)) {
        value = value
            .checked_mul(8)
            .and_then(|shifted| shifted.checked_add(u64::from(byte - b'0')))
            .ok_or_else(|| bad(format!("octal {what} overflows 64 bits")))?;
    }
    if digits.any(|&byte| byte != b' ' && byte != 0) {
        let text = String::from_utf8_lossy(field);
        return Err(bad(format!("{what} field {text:?} is not an octal number")));
    }
    Ok(value)
}

fn ustar_name(header: &[u8], offset: u64) -> Result<Cow<'_, str>, ShardError> {
    let name = utf8(nul_terminated(&header[0..100]), offset, "member name")?;
    // POSIX ustar (not GNU's "ustar  ") splits long names into prefix + "/" + name.
    let is_posix_ustar = &header[257..263] == b"ustar\0";
    let prefix = if is_posix_ustar { nul_terminated(&header[345..500]) } else { &[] };
    if prefix.is_empty() {
        return Ok(Cow::Borrowed(name));
    }
    let prefix = utf8(prefix, offset, "member name prefix")?;
    Ok(Cow::Owned(format!("{prefix}/{name}")))
}

fn check_extended_size(kind: &'static str, offset: u64, size: u64, limit: u64) -> Result<(), ShardError> {
    if size > limit {
        return Err(ShardError::ExtendedHeaderTooLarge { kind, offset, size, limit });
    }
    Ok(())
}

#[derive(Default)]
struct PaxRecords<'a> {
    path: Option<&'a str>,
    size: Option<u64>,
}

/// PAX records are `"<len> <key>=<value>\n"`, where `<len>` counts the whole record.
fn parse_pax(mut data: &[u8], offset: u64) -> Result<PaxRecords<'_>, ShardError> {
    let bad = |reason: &str| ShardError::BadHeader { offset, reason: format!("malformed PAX header: {reason}") };
    let mut records = PaxRecords::default();
    while !data.is_empty() && data[0] != 0 {
        let space = data.iter().position(|&byte| byte == b' ').ok_or_else(|| bad("record without a length"))?;
        let length: usize = std::str::from_utf8(&data[..space])
            .ok()
            .and_then(|text| text.parse().ok())
            .ok_or_else(|| bad("record length is not a number"))?;
        if length <= space + 1 || length > data.len() || data[length - 1] != b'\n' {
            return Err(bad("record length does not match its text"));
        }
        let record = &data[space + 1..length - 1];
        let equals = record.iter().position(|&byte| byte == b'=').ok_or_else(|| bad("record without '='"))?;
        let (key, value) = (&record[..equals], &record[equals + 1..]);
        match key {
            b"path" => records.path = Some(utf8(value, offset, "PAX path")?),
            b"size" => {
                let size = std::str::from_utf8(value).ok().and_then(|text| text.parse().ok());
                records.size = Some(size.ok_or_else(|| bad("size is not a number"))?);
            }
            _ => {}
        }
        data = &data[length..];
    }
    Ok(records)
}

#[cfg(test)]
#[path = "tar_reader_tests.rs"]
mod tests;
