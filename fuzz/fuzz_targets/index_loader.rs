//! The shard index (`stoker_format::index`): `ShardIndex::from_bytes` on arbitrary index
//! and shard bytes (optionally with the shard fields and checksum fixed up, to reach the record
//! checks), every accessor of an index it accepts, and `build_index` on the shard bytes, whose
//! output must load and agree with the tar reader. The shard's tar header checksums are fixed
//! up first (see `with_tar_checksums_fixed`).
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use stoker_format::index::{IndexBytes, ShardIndex, build_index, region_hash};
use stoker_format::sample_key::split_member_name;
use stoker_format::tar_reader::TarMembers;
use stoker_fuzz::index_input::{self, FIX_CHECKSUM, FIX_SHARD};
use stoker_fuzz::with_tar_checksums_fixed;
use xxhash_rust::xxh3::xxh3_64;

fuzz_target!(|data: &[u8]| {
    let Some((flags, index, shard)) = index_input::decode(data) else { return };
    let shard = &with_tar_checksums_fixed(shard)[..];
    let mut index = index.to_vec();
    if flags & FIX_SHARD != 0 && index.len() >= 32 {
        index[16..24].copy_from_slice(&(shard.len() as u64).to_le_bytes());
        index[24..32].copy_from_slice(&region_hash(shard).to_le_bytes());
    }
    if flags & FIX_CHECKSUM != 0 && index.len() >= 8 {
        let body = index.len() - 8;
        let checksum = xxh3_64(&index[..body]);
        index[body..].copy_from_slice(&checksum.to_le_bytes());
    }
    let path = Path::new("fuzz.tar.idx");
    if let Ok(loaded) = ShardIndex::from_bytes(IndexBytes::Owned(index), shard, path) {
        touch(&loaded, shard);
    }

    let Ok(built) = build_index(shard) else { return };
    let loaded = ShardIndex::from_bytes(IndexBytes::Owned(built.clone()), shard, path)
        .unwrap_or_else(|error| panic!("build_index wrote an index that does not load: {error}"));
    assert_eq!(build_index(shard).ok().as_deref(), Some(built.as_slice()), "build_index is not deterministic");
    touch(&loaded, shard);
    // Every member of a sample, in tar order, and nothing else.
    let members: Vec<_> = TarMembers::new(shard)
        .map(|member| member.expect("build_index read the whole shard"))
        .filter(|member| split_member_name(&member.name).is_some())
        .collect();
    assert_eq!(loaded.members(), members.len());
    let indexed = (0..loaded.samples()).flat_map(|sample| loaded.sample_members(sample).map(move |entry| (sample, entry)));
    for ((sample, entry), member) in indexed.zip(&members) {
        let (key, extension) = split_member_name(&member.name).expect("filtered");
        assert_eq!((loaded.key(sample), entry.extension), (key, extension.to_lowercase().as_str()));
        assert_eq!((entry.offset, entry.size), (member.data_offset, member.size));
    }
});

/// Every accessor of an accepted index, checking that what it says lies inside the shard.
fn touch(index: &ShardIndex, shard: &[u8]) {
    for sample in 0..index.samples() {
        let _ = index.key(sample).len();
        for entry in index.sample_members(sample) {
            let end = entry.offset.checked_add(entry.size).expect("checked by from_bytes");
            assert!(end <= shard.len() as u64, "{entry:?} past the shard's {} bytes", shard.len());
            let _ = entry.extension.len();
        }
    }
    let _ = index.as_bytes().len();
}
