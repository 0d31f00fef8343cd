//! The WebDataset rule for grouping tar members into samples.
//!
//! A member `dir/n0144_10026.seg.png` belongs to sample key `dir/n0144_10026` with extension
//! `seg.png`: the key is the path up to the first dot of the basename (webdataset's
//! `base_plus_ext`, regex `^((?:.*/|)[^.]+)[.]([^/]*)$`). Extensions are lower-cased, as
//! webdataset's `group_by_keys` does. Members whose basename has no dot, or starts with one,
//! belong to no sample and are skipped.

/// `(key, extension)` of a member name, or `None` when the member is not part of a sample.
pub fn split_member_name(name: &str) -> Option<(&str, &str)> {
    let basename_start = name.rfind('/').map_or(0, |slash| slash + 1);
    let dot = name[basename_start..].find('.')?;
    if dot == 0 {
        return None;
    }
    let key_end = basename_start + dot;
    Some((&name[..key_end], &name[key_end + 1..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_is_the_path_up_to_the_first_dot_of_the_basename() {
        assert_eq!(split_member_name("n0144_10026.jpg"), Some(("n0144_10026", "jpg")));
        assert_eq!(split_member_name("a.b/c/d.seg.png"), Some(("a.b/c/d", "seg.png")));
        assert_eq!(split_member_name("x."), Some(("x", "")));
        assert_eq!(split_member_name("dir/.hidden"), None);
        assert_eq!(split_member_name("README"), None);
        assert_eq!(split_member_name("dir.d/README"), None);
    }
}
