//! A deterministic tar writer: POSIX ustar headers with fixed metadata (mode 0644, uid/gid 0,
//! mtime 0, no user names), and a PAX `path` record for names longer than 100 bytes. The same
//! members in the same order always give the same bytes, which makes `stoker pack` reproducible.

use std::io::{self, Write};

use super::tar_reader::BLOCK;

const ZERO_BLOCK: [u8; BLOCK as usize] = [0; BLOCK as usize];
/// Largest size an 11-digit octal size field holds.
const MAX_OCTAL_SIZE: u64 = 0o77_777_777_777;

/// Writes members to `out`, counting bytes.
pub struct TarWriter<W: Write> {
    out: W,
    written: u64,
}

impl<W: Write> TarWriter<W> {
    /// A writer appending to `out`.
    pub fn new(out: W) -> Self {
        Self { out, written: 0 }
    }

    /// Bytes written so far.
    pub fn written(&self) -> u64 {
        self.written
    }

    /// Bytes that appending a member `name` of `size` bytes adds to the archive.
    pub fn member_bytes(name: &str, size: u64) -> u64 {
        let pax = if needs_pax(name, size) { BLOCK + (pax_records(name, size).len() as u64).div_ceil(BLOCK) * BLOCK } else { 0 };
        pax + BLOCK + size.div_ceil(BLOCK) * BLOCK
    }

    /// Append a regular file.
    pub fn append(&mut self, name: &str, data: &[u8]) -> io::Result<()> {
        let size = data.len() as u64;
        if needs_pax(name, size) {
            let records = pax_records(name, size);
            self.write_header("././@PaxHeader", records.len() as u64, b'x')?;
            self.write_padded(&records)?;
        }
        self.write_header(name, size, b'0')?;
        self.write_padded(data)
    }

    /// Write the end-of-archive marker (two zero blocks) and return the sink.
    pub fn finish(mut self) -> io::Result<W> {
        self.write_all(&ZERO_BLOCK)?;
        self.write_all(&ZERO_BLOCK)?;
        self.out.flush()?;
        Ok(self.out)
    }

    fn write_header(&mut self, name: &str, size: u64, typeflag: u8) -> io::Result<()> {
        let mut header = [0u8; BLOCK as usize];
        // A name that needs PAX gets a truncated (valid UTF-8) ustar name for old readers.
        let short_name = truncate_utf8(name, 100);
        header[..short_name.len()].copy_from_slice(short_name.as_bytes());
        header[100..108].copy_from_slice(b"0000644\0");
        header[108..116].copy_from_slice(b"0000000\0");
        header[116..124].copy_from_slice(b"0000000\0");
        let octal_size = format!("{:011o}\0", size.min(MAX_OCTAL_SIZE));
        header[124..136].copy_from_slice(octal_size.as_bytes());
        header[136..148].copy_from_slice(b"00000000000\0");
        header[156] = typeflag;
        header[257..263].copy_from_slice(b"ustar\0");
        header[263..265].copy_from_slice(b"00");
        header[148..156].copy_from_slice(b"        ");
        let checksum: u32 = header.iter().map(|&byte| u32::from(byte)).sum();
        header[148..156].copy_from_slice(format!("{checksum:06o}\0 ").as_bytes());
        self.write_all(&header)
    }

    fn write_padded(&mut self, data: &[u8]) -> io::Result<()> {
        self.write_all(data)?;
        let padding = (data.len() as u64).div_ceil(BLOCK) * BLOCK - data.len() as u64;
        self.write_all(&ZERO_BLOCK[..padding as usize])
    }

    fn write_all(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.out.write_all(bytes)?;
        self.written += bytes.len() as u64;
        Ok(())
    }
}

fn needs_pax(name: &str, size: u64) -> bool {
    name.len() > 100 || size > MAX_OCTAL_SIZE
}

fn truncate_utf8(text: &str, max_bytes: usize) -> &str {
    let mut end = text.len().min(max_bytes);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

fn pax_records(name: &str, size: u64) -> Vec<u8> {
    let mut records = Vec::new();
    records.extend(pax_record("path", name));
    if size > MAX_OCTAL_SIZE {
        records.extend(pax_record("size", &size.to_string()));
    }
    records
}

/// `"<len> key=value\n"` where `<len>` counts the whole record, its own digits included.
fn pax_record(key: &str, value: &str) -> Vec<u8> {
    let body_len = key.len() + value.len() + 3; // ' ', '=', '\n'
    let mut length = body_len + 1;
    while length != body_len + length.to_string().len() {
        length = body_len + length.to_string().len();
    }
    format!("{length} {key}={value}\n").into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pax_record_length_counts_itself() {
        assert_eq!(pax_record("path", "a"), b"9 path=a\n".to_vec());
        let long = "x".repeat(95);
        let record = pax_record("path", &long);
        assert_eq!(record.len().to_string(), String::from_utf8_lossy(&record[..3]));
    }

    #[test]
    fn member_bytes_matches_what_append_writes() {
        for (name, size) in [("a.jpg", 0usize), ("b.cls", 1), ("c.jpg", 512), ("d.jpg", 513), (&*"n".repeat(150), 700)] {
            let mut writer = TarWriter::new(Vec::new());
            writer.append(name, &vec![1u8; size]).unwrap_or_else(|error| panic!("{error}"));
            assert_eq!(writer.written(), TarWriter::<Vec<u8>>::member_bytes(name, size as u64), "{name}");
        }
    }

    #[test]
    fn truncation_keeps_utf8_valid() {
        let name = "é".repeat(60);
        assert!(truncate_utf8(&name, 100).len() <= 100);
        assert_eq!(truncate_utf8(&name, 101).len(), 100);
    }
}
