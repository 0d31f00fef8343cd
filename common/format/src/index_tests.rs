use std::path::PathBuf;

use super::*;
use crate::tar_writer::TarWriter;

fn shard(members: &[(&str, &[u8])]) -> Vec<u8> {
    let mut writer = TarWriter::new(Vec::new());
    for (name, data) in members {
        writer.append(name, data).unwrap_or_else(|error| panic!("{error}"));
    }
    writer.finish().unwrap_or_else(|error| panic!("{error}"))
}

fn sample_shard() -> Vec<u8> {
    shard(&[
        ("a/k1.jpg", b"J1"),
        ("a/k1.cls", b"3"),
        ("a/k2.JPG", b"J2J2"),
        ("a/k2.cls", b"4"),
        ("README", b"skip me"),
        ("k3.seg.png", b"P"),
    ])
}

fn path() -> PathBuf {
    PathBuf::from("test.tar.idx")
}

fn load(index: Vec<u8>, shard: &[u8]) -> Result<ShardIndex, ShardError> {
    ShardIndex::from_bytes(IndexBytes::Owned(index), shard, &path())
}

#[test]
fn index_lists_samples_members_offsets_and_sizes() {
    let bytes = sample_shard();
    let index = load(build_index(&bytes).unwrap_or_default(), &bytes).unwrap_or_else(|error| panic!("{error}"));
    assert_eq!(index.samples(), 3);
    assert_eq!(index.members(), 5);
    assert_eq!(index.key(0), "a/k1");
    assert_eq!(index.key(2), "k3");
    let second: Vec<MemberEntry<'_>> = index.sample_members(1).collect();
    assert_eq!(second[0].extension, "jpg", "extensions are lower-cased");
    assert_eq!(&bytes[second[0].offset as usize..][..second[0].size as usize], b"J2J2");
    assert_eq!(second[1].extension, "cls");
    let third: Vec<MemberEntry<'_>> = index.sample_members(2).collect();
    assert_eq!(third[0].extension, "seg.png");
}

#[test]
fn index_encoding_is_deterministic() {
    let bytes = sample_shard();
    assert_eq!(build_index(&bytes).ok(), build_index(&bytes).ok());
}

#[test]
fn duplicate_extension_in_a_sample_is_an_error() {
    let bytes = shard(&[("k.jpg", b"1"), ("k.JPG", b"2")]);
    assert!(matches!(build_index(&bytes), Err(ShardError::DuplicateMember { .. })));
}

#[test]
fn repeated_key_after_another_sample_starts_a_new_sample() {
    let bytes = shard(&[("k.jpg", b"1"), ("j.jpg", b"2"), ("k.cls", b"3")]);
    let index = load(build_index(&bytes).unwrap_or_default(), &bytes).unwrap_or_else(|error| panic!("{error}"));
    assert_eq!(index.samples(), 3);
}

#[test]
fn index_of_another_shard_is_stale() {
    let bytes = sample_shard();
    let other = shard(&[("x.jpg", b"other")]);
    let error = load(build_index(&other).unwrap_or_default(), &bytes).err();
    assert!(matches!(error, Some(ShardError::StaleIndex { .. })), "{error:?}");
}

#[test]
fn rewritten_shard_of_the_same_length_is_stale() {
    let bytes = sample_shard();
    let index = build_index(&bytes).unwrap_or_default();
    let mut changed = bytes.clone();
    changed[513] ^= 1;
    assert!(matches!(load(index, &changed), Err(ShardError::StaleIndex { .. })));
}

#[test]
fn flipped_index_byte_is_corrupt() {
    let bytes = sample_shard();
    let index = build_index(&bytes).unwrap_or_default();
    for position in [0, 9, 20, 60, 100, index.len() - 1] {
        let mut damaged = index.clone();
        damaged[position] ^= 0x10;
        let result = load(damaged, &bytes);
        assert!(
            matches!(result, Err(ShardError::CorruptIndex { .. } | ShardError::UnsupportedIndexVersion { .. })),
            "byte {position}: {result:?}"
        );
    }
}

#[test]
fn truncated_or_garbage_index_never_panics() {
    let bytes = sample_shard();
    let index = build_index(&bytes).unwrap_or_default();
    for length in 0..index.len() {
        assert!(load(index[..length].to_vec(), &bytes).is_err());
    }
    // Checksum recomputed over garbage: the structural checks must still hold.
    let mut state = 3u64;
    for _ in 0..2000 {
        let mut damaged = index.clone();
        state = stoker_plan::prng::mix64(state);
        let position = 16 + (state as usize) % (damaged.len() - 24);
        damaged[position] = (state >> 32) as u8;
        let body = damaged.len() - 8;
        let checksum = xxh3_64(&damaged[..body]);
        damaged[body..].copy_from_slice(&checksum.to_le_bytes());
        if let Ok(loaded) = load(damaged, &bytes) {
            for sample in 0..loaded.samples() {
                let _ = loaded.key(sample);
                for member in loaded.sample_members(sample) {
                    assert!(member.offset + member.size <= bytes.len() as u64);
                }
            }
        }
    }
}

#[test]
fn future_version_is_reported_as_such() {
    let bytes = sample_shard();
    let mut index = build_index(&bytes).unwrap_or_default();
    index[8] = 9;
    let body = index.len() - 8;
    let checksum = xxh3_64(&index[..body]);
    index[body..].copy_from_slice(&checksum.to_le_bytes());
    assert!(matches!(load(index, &bytes), Err(ShardError::UnsupportedIndexVersion { found: 9, .. })));
}
