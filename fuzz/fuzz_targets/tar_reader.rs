//! The tar reader (`stoker_format::tar_reader`) over arbitrary bytes: every member it
//! yields lies inside the shard, headers advance, and it never panics. The bytes are read as
//! they are, then with their header checksums fixed up (see `with_tar_checksums_fixed`).
#![no_main]

use libfuzzer_sys::fuzz_target;
use stoker_format::sample_key::split_member_name;
use stoker_format::tar_reader::{BLOCK, TarMembers};
use stoker_fuzz::with_tar_checksums_fixed;

fuzz_target!(|data: &[u8]| {
    members(data);
    members(&with_tar_checksums_fixed(data));
});

fn members(data: &[u8]) {
    let len = data.len() as u64;
    let mut last_header = None;
    for member in TarMembers::new(data) {
        let Ok(member) = member else { break };
        assert_eq!(member.header_offset % BLOCK, 0, "{member:?}");
        assert_eq!(member.data_offset, member.header_offset + BLOCK, "{member:?}");
        assert!(member.data_offset.checked_add(member.size).is_some_and(|end| end <= len), "{member:?} past {len}");
        assert!(last_header.is_none_or(|last| member.header_offset > last), "{member:?} after {last_header:?}");
        last_header = Some(member.header_offset);
        let bytes = &data[member.data_offset as usize..(member.data_offset + member.size) as usize];
        assert_eq!(bytes.len() as u64, member.size);
        if let Some((key, extension)) = split_member_name(&member.name) {
            assert!(!key.is_empty() && member.name.len() == key.len() + 1 + extension.len());
        }
    }
}
