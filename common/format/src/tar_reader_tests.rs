use super::*;
use crate::tar_writer::TarWriter;

fn archive(members: &[(&str, &[u8])]) -> Vec<u8> {
    let mut writer = TarWriter::new(Vec::new());
    for (name, data) in members {
        writer.append(name, data).unwrap_or_else(|error| panic!("{error}"));
    }
    writer.finish().unwrap_or_else(|error| panic!("{error}"))
}

fn read_all(bytes: &[u8]) -> Result<Vec<(String, u64, u64)>, ShardError> {
    TarMembers::new(bytes).map(|member| member.map(|member| (member.name.into_owned(), member.data_offset, member.size))).collect()
}

fn header_with(name: &str, size_field: &[u8], typeflag: u8) -> Vec<u8> {
    let mut header = vec![0u8; 512];
    header[..name.len()].copy_from_slice(name.as_bytes());
    header[124..124 + size_field.len()].copy_from_slice(size_field);
    header[156] = typeflag;
    header[257..263].copy_from_slice(b"ustar\0");
    fix_checksum(&mut header);
    header
}

fn fix_checksum(header: &mut [u8]) {
    header[148..156].copy_from_slice(b"        ");
    let sum: u32 = header[..512].iter().map(|&byte| u32::from(byte)).sum();
    header[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
}

#[test]
fn round_trip_of_short_and_long_names() {
    let long = format!("{}/{}.jpg", "d".repeat(80), "k".repeat(90));
    let bytes = archive(&[("a.jpg", b"jpeg"), (&long, b"x"), ("a.cls", b"7")]);
    let members = read_all(&bytes).unwrap_or_else(|error| panic!("{error}"));
    assert_eq!(members.len(), 3);
    assert_eq!(members[0], ("a.jpg".to_string(), 512, 4));
    assert_eq!(members[1].0, long);
    assert_eq!(&bytes[members[2].1 as usize..][..1], b"7");
}

#[test]
fn base256_sizes_and_gnu_long_names_read() {
    let mut long_name = header_with("././@LongLink", b"00000000007\0", b'L');
    let mut name_block = b"abc.jpg\0".to_vec();
    name_block.resize(512, 0);
    long_name.extend(name_block);
    let mut size = [0u8; 12];
    size[0] = 0x80;
    size[11] = 3;
    let mut file = header_with("short", &size, b'0');
    file.extend(b"xyz");
    file.resize(file.len() + 509, 0);
    long_name.extend(file);
    long_name.extend([0u8; 1024]);
    let members = read_all(&long_name).unwrap_or_else(|error| panic!("{error}"));
    assert_eq!(members, vec![("abc.jpg".to_string(), 1536, 3)]);
}

#[test]
fn empty_file_is_not_a_tar() {
    assert!(matches!(read_all(&[]), Err(ShardError::Truncated { .. })));
}

#[test]
fn directories_and_links_are_skipped_and_missing_end_blocks_tolerated() {
    let mut bytes = header_with("dir/", b"00000000000\0", b'5');
    bytes.extend(header_with("link", b"00000000000\0", b'2'));
    bytes.extend(header_with("f.txt", b"00000000000\0", b'0'));
    let members = read_all(&bytes).unwrap_or_else(|error| panic!("{error}"));
    assert_eq!(members, vec![("f.txt".to_string(), 1536, 0)]);
}

#[test]
fn flipped_header_byte_fails_the_checksum() {
    let mut bytes = archive(&[("a.jpg", b"data")]);
    bytes[10] ^= 0x41;
    assert!(matches!(read_all(&bytes), Err(ShardError::BadChecksum { offset: 0, .. })));
}

#[test]
fn truncated_member_is_reported_with_its_name() {
    let bytes = archive(&[("a.jpg", &[7u8; 2000])]);
    let error = read_all(&bytes[..1200]).err();
    assert!(matches!(&error, Some(ShardError::MemberPastEnd { name, size: 2000, .. }) if name == "a.jpg"), "{error:?}");
}

#[test]
fn truncated_header_is_reported() {
    let bytes = archive(&[("a.jpg", b"data"), ("b.jpg", b"more")]);
    assert!(matches!(read_all(&bytes[..1024 + 100]), Err(ShardError::Truncated { offset: 1024, .. })));
}

#[test]
fn size_past_the_end_is_reported() {
    let mut bytes = header_with("a.jpg", b"77777777777\0", b'0');
    bytes.extend([0u8; 1024]);
    assert!(matches!(read_all(&bytes), Err(ShardError::MemberPastEnd { .. })));
}

#[test]
fn huge_pax_header_is_refused_before_use() {
    let mut bytes = header_with("././@PaxHeader", b"77777777777\0", b'x');
    bytes.extend([0u8; 1024]);
    assert!(matches!(read_all(&bytes), Err(ShardError::ExtendedHeaderTooLarge { kind: "PAX", .. })));
}

#[test]
fn malformed_pax_records_are_reported() {
    for records in [&b"999 path=x\n"[..], b"abc path=x\n", b"12 pathx\n   ", b"5 a=b\n"] {
        let mut bytes = header_with("././@PaxHeader", format!("{:011o}\0", records.len()).as_bytes(), b'x');
        let mut data = records.to_vec();
        data.resize(512, 0);
        bytes.extend(data);
        bytes.extend(header_with("a.jpg", b"00000000000\0", b'0'));
        let result = read_all(&bytes);
        assert!(matches!(result, Err(ShardError::BadHeader { .. })), "{:?}: {result:?}", String::from_utf8_lossy(records));
    }
}

#[test]
fn garbage_size_field_is_reported() {
    let mut bytes = header_with("a.jpg", b"12x4\0\0\0\0\0\0\0\0", b'0');
    bytes.extend([0u8; 1024]);
    assert!(matches!(read_all(&bytes), Err(ShardError::BadHeader { .. })));
}

#[test]
fn random_bytes_never_panic() {
    let mut state = 1u64;
    for length in [0usize, 1, 511, 512, 513, 1024, 4096] {
        for _ in 0..50 {
            let bytes: Vec<u8> = (0..length)
                .map(|_| {
                    state = stoker_plan::prng::mix64(state);
                    state as u8
                })
                .collect();
            let _ = read_all(&bytes);
        }
    }
    // Valid archives with random corruption.
    let valid = archive(&[("a.jpg", &[1u8; 700]), (&"n".repeat(130), b"x")]);
    for position in 0..valid.len() {
        let mut corrupted = valid.clone();
        corrupted[position] ^= 0xA5;
        let _ = read_all(&corrupted);
        let _ = read_all(&valid[..position]);
    }
}
