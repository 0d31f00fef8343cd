//! Broken and hostile shard files on disk: a clear error naming the file every time, no panic;
//! stale or corrupt indexes are rebuilt, never trusted.

use std::path::Path;

use stoker_format::error::ShardError;
use stoker_format::tar_writer::TarWriter;
use stoker_format::{IndexPolicy, IndexStatus, Shard, index_path};

fn write_shard(path: &Path, members: &[(&str, &[u8])]) -> Vec<u8> {
    let mut writer = TarWriter::new(Vec::new());
    for (name, data) in members {
        writer.append(name, data).unwrap_or_else(|error| panic!("{error}"));
    }
    let bytes = writer.finish().unwrap_or_else(|error| panic!("{error}"));
    std::fs::write(path, &bytes).unwrap_or_else(|error| panic!("{error}"));
    bytes
}

fn open(path: &Path) -> Result<Shard, ShardError> {
    Shard::open(path, IndexPolicy::LoadOrBuildAndWrite)
}

#[test]
fn truncated_shard_error_names_the_file_and_the_member() {
    let dir = tempfile::tempdir().unwrap_or_else(|error| panic!("{error}"));
    let path = dir.path().join("broken.tar");
    let bytes = write_shard(&path, &[("a.jpg", &[1u8; 5000]), ("a.cls", b"1")]);
    std::fs::write(&path, &bytes[..3000]).unwrap_or_else(|error| panic!("{error}"));
    let message = open(&path).err().map(|error| error.to_string()).unwrap_or_default();
    assert!(message.contains("broken.tar") && message.contains("a.jpg") && message.contains("truncated"), "{message}");
}

#[test]
fn empty_file_and_missing_file_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap_or_else(|error| panic!("{error}"));
    let empty = dir.path().join("empty.tar");
    std::fs::write(&empty, b"").unwrap_or_else(|error| panic!("{error}"));
    let message = open(&empty).err().map(|error| error.to_string()).unwrap_or_default();
    assert!(message.contains("empty.tar") && message.contains("truncated"), "{message}");
    let missing = open(&dir.path().join("nope.tar")).err().map(|error| error.to_string()).unwrap_or_default();
    assert!(missing.contains("failed to open shard") && missing.contains("nope.tar"), "{missing}");
}

#[test]
fn flipped_header_byte_is_a_checksum_error_naming_the_shard() {
    let dir = tempfile::tempdir().unwrap_or_else(|error| panic!("{error}"));
    let path = dir.path().join("flipped.tar");
    let mut bytes = write_shard(&path, &[("a.jpg", b"x"), ("b.jpg", b"y")]);
    bytes[1024 + 3] ^= 0x20;
    std::fs::write(&path, &bytes).unwrap_or_else(|error| panic!("{error}"));
    let message = open(&path).err().map(|error| error.to_string()).unwrap_or_default();
    assert!(message.contains("flipped.tar") && message.contains("checksum"), "{message}");
}

#[test]
fn index_of_another_shard_is_detected_and_rebuilt() {
    let dir = tempfile::tempdir().unwrap_or_else(|error| panic!("{error}"));
    let (first, second) = (dir.path().join("first.tar"), dir.path().join("second.tar"));
    write_shard(&first, &[("a.jpg", b"1"), ("b.jpg", b"2")]);
    write_shard(&second, &[("c.jpg", b"3")]);
    open(&first).unwrap_or_else(|error| panic!("{error}"));
    std::fs::copy(index_path(&first), index_path(&second)).unwrap_or_else(|error| panic!("{error}"));
    let shard = open(&second).unwrap_or_else(|error| panic!("{error}"));
    assert!(
        matches!(shard.index_status(), IndexStatus::Built { reason, written: true } if reason.contains("stale")),
        "{:?}",
        shard.index_status()
    );
    assert_eq!(shard.len(), 1);
    assert_eq!(shard.sample(0).map(|sample| sample.key()), Some("c"));
    assert_eq!(open(&second).map(|shard| shard.index_status().clone()).ok(), Some(IndexStatus::Loaded));
}

#[test]
fn rewritten_shard_invalidates_its_index() {
    let dir = tempfile::tempdir().unwrap_or_else(|error| panic!("{error}"));
    let path = dir.path().join("s.tar");
    write_shard(&path, &[("a.jpg", b"1111")]);
    open(&path).unwrap_or_else(|error| panic!("{error}"));
    write_shard(&path, &[("b.jpg", b"2222")]);
    let shard = open(&path).unwrap_or_else(|error| panic!("{error}"));
    assert!(matches!(shard.index_status(), IndexStatus::Built { .. }));
    assert_eq!(shard.sample(0).map(|sample| sample.key()), Some("b"));
}

#[test]
fn garbage_index_file_is_rebuilt_not_trusted() {
    let dir = tempfile::tempdir().unwrap_or_else(|error| panic!("{error}"));
    let path = dir.path().join("s.tar");
    write_shard(&path, &[("a.jpg", b"1111")]);
    for garbage in [&b""[..], b"STOKRIDX", &[0xFFu8; 200]] {
        std::fs::write(index_path(&path), garbage).unwrap_or_else(|error| panic!("{error}"));
        let shard = open(&path).unwrap_or_else(|error| panic!("{error}"));
        assert!(
            matches!(shard.index_status(), IndexStatus::Built { reason, .. } if reason.contains("corrupt")),
            "{:?}",
            shard.index_status()
        );
        assert_eq!(shard.sample(0).and_then(|sample| sample.member("jpg")), Some(&b"1111"[..]));
    }
}

#[test]
fn huge_pax_length_is_refused() {
    let dir = tempfile::tempdir().unwrap_or_else(|error| panic!("{error}"));
    let path = dir.path().join("pax.tar");
    let mut header = vec![0u8; 512];
    header[..14].copy_from_slice(b"././@PaxHeader");
    header[124..136].copy_from_slice(b"77777777777\0");
    header[156] = b'x';
    header[257..263].copy_from_slice(b"ustar\0");
    header[148..156].copy_from_slice(b"        ");
    let sum: u32 = header.iter().map(|&byte| u32::from(byte)).sum();
    header[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
    header.extend([0u8; 1024]);
    std::fs::write(&path, &header).unwrap_or_else(|error| panic!("{error}"));
    let message = open(&path).err().map(|error| error.to_string()).unwrap_or_default();
    assert!(message.contains("PAX header") && message.contains("limit"), "{message}");
}
