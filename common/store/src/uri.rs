//! An object in a store: `s3://bucket/key`. Parsed once, at the edge; everything after works on
//! [`ObjectUri`].

use std::fmt;

use crate::error::StoreError;

/// The manifest's name in a dataset's folder or prefix (as `stoker_format::MANIFEST_FILE`,
/// which this crate does not depend on).
const MANIFEST_FILE: &str = "manifest.json";

/// An object in an S3-compatible store.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectUri {
    bucket: String,
    key: String,
}

impl ObjectUri {
    /// Parse `s3://bucket/key` (the key may be empty only where `allow_empty_key`: a prefix).
    fn parse_with(text: &str, allow_empty_key: bool) -> Result<Self, StoreError> {
        let bad = |reason: &str| StoreError::BadUri { uri: text.to_owned(), reason: reason.to_owned() };
        let rest = text.strip_prefix("s3://").ok_or_else(|| bad("object-store URIs are s3://bucket/key"))?;
        let (bucket, key) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() || bucket.contains(|c: char| c.is_whitespace() || c == '?' || c == '#') {
            return Err(bad("the bucket name is empty or has spaces, '?' or '#'"));
        }
        if key.is_empty() && !allow_empty_key {
            return Err(bad("object-store URIs are s3://bucket/key (the key is missing)"));
        }
        if key.split('/').any(|part| part == "." || part == "..") {
            return Err(bad("keys with '.' or '..' parts are refused"));
        }
        Ok(Self { bucket: bucket.to_owned(), key: key.to_owned() })
    }

    /// Parse `s3://bucket/key`.
    pub fn parse(text: &str) -> Result<Self, StoreError> {
        Self::parse_with(text, false)
    }

    /// Parse `s3://bucket` or `s3://bucket/prefix` (a folder-like prefix; may be empty).
    pub fn parse_prefix(text: &str) -> Result<Self, StoreError> {
        Self::parse_with(text, true)
    }

    /// Whether `text` is an object-store URI (`s3://`).
    pub fn is_object_uri(text: &str) -> bool {
        text.starts_with("s3://")
    }

    /// The bucket.
    pub fn bucket(&self) -> &str {
        &self.bucket
    }

    /// The key inside the bucket.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The manifest this URI names: `s3://b/dir/x.json` itself, `s3://b/dir` or `s3://b/dir/`
    /// (a last part without a '.') the `manifest.json` under it. `text` may be a prefix.
    pub fn manifest(text: &str) -> Result<Self, StoreError> {
        let given = Self::parse_prefix(text)?;
        if given.key.is_empty() || given.key.ends_with('/') || !given.file_name().contains('.') {
            given.join(MANIFEST_FILE)
        } else {
            Ok(given)
        }
    }

    /// The index beside this shard (`s3://b/x.tar.idx` of `s3://b/x.tar`).
    pub fn index(&self) -> Self {
        Self { bucket: self.bucket.clone(), key: format!("{}.idx", self.key) }
    }

    /// The object `name` under this prefix (`s3://b/dir` + `x.tar` = `s3://b/dir/x.tar`).
    pub fn join(&self, name: &str) -> Result<Self, StoreError> {
        let key = if self.key.is_empty() { name.to_owned() } else { format!("{}/{name}", self.key.trim_end_matches('/')) };
        Self::parse(&format!("s3://{}/{key}", self.bucket))
    }

    /// The prefix holding this object (`s3://b/dir/x.tar` is in `s3://b/dir`).
    pub fn parent(&self) -> Self {
        let key = self.key.rsplit_once('/').map_or("", |(parent, _)| parent);
        Self { bucket: self.bucket.clone(), key: key.to_owned() }
    }

    /// The last part of the key (`x.tar` of `s3://b/dir/x.tar`).
    pub fn file_name(&self) -> &str {
        self.key.rsplit('/').next().unwrap_or(&self.key)
    }

    /// Whether this object is `prefix` itself or under it, by whole key parts
    /// (`s3://b/train/x` is under `s3://b/train`, `s3://b/training/x` is not).
    pub fn is_under(&self, prefix: &Self) -> bool {
        if self.bucket != prefix.bucket {
            return false;
        }
        let folder = prefix.key.trim_end_matches('/');
        folder.is_empty() || self.key == folder || self.key.strip_prefix(folder).is_some_and(|rest| rest.starts_with('/'))
    }

    /// Where a manifest's shard `uri` points when the manifest is this object: `s3://` URIs
    /// as they are, relative names beside the manifest; local paths and `file://` are refused
    /// (a remote manifest naming this host's files would read whatever each worker has there).
    pub fn resolve_shard(&self, uri: &str) -> Result<Self, StoreError> {
        if Self::is_object_uri(uri) {
            return Self::parse(uri);
        }
        if uri.starts_with('/') || uri.contains("://") {
            return Err(StoreError::BadUri {
                uri: uri.to_owned(),
                reason: format!("a manifest in an object store ({self}) lists only s3:// URIs or names relative to it"),
            });
        }
        self.parent().join(uri)
    }
}

impl fmt::Display for ObjectUri {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(formatter, "s3://{}/{}", self.bucket, self.key)
    }
}

#[cfg(test)]
mod tests {
    use super::ObjectUri;

    fn uri(text: &str) -> ObjectUri {
        ObjectUri::parse_prefix(text).unwrap_or_else(|error| panic!("{error}"))
    }

    #[test]
    fn a_prefix_names_the_manifest_under_it_and_a_shard_its_index_beside_it() {
        let named = |text: &str| ObjectUri::manifest(text).unwrap_or_else(|error| panic!("{error}")).to_string();
        assert_eq!(named("s3://data/train"), "s3://data/train/manifest.json");
        assert_eq!(named("s3://data/train/"), "s3://data/train/manifest.json");
        assert_eq!(named("s3://data"), "s3://data/manifest.json");
        assert_eq!(named("s3://data/train/other.json"), "s3://data/train/other.json");
        assert_eq!(uri("s3://data/train/s-000.tar").index().to_string(), "s3://data/train/s-000.tar.idx");
    }

    #[test]
    fn uris_parse_join_and_resolve_shards_beside_their_manifest() {
        let manifest = uri("s3://data/sets/train/manifest.json");
        assert_eq!((manifest.bucket(), manifest.key(), manifest.file_name()), ("data", "sets/train/manifest.json", "manifest.json"));
        assert_eq!(manifest.resolve_shard("a-000.tar").ok(), Some(uri("s3://data/sets/train/a-000.tar")));
        assert_eq!(manifest.resolve_shard("s3://other/b.tar").ok(), Some(uri("s3://other/b.tar")));
        for refused in ["/etc/passwd", "file:///x.tar", "../up.tar", "gs://x/y"] {
            assert!(manifest.resolve_shard(refused).is_err(), "{refused}");
        }
        for bad in ["s3://", "s3:///key", "http://b/k", "s3://b/a/../k"] {
            assert!(ObjectUri::parse(bad).is_err(), "{bad}");
        }
        assert!(ObjectUri::parse("s3://bucket").is_err(), "an object needs a key");
        assert_eq!(uri("s3://b").join("x.tar").ok(), Some(uri("s3://b/x.tar")));
        assert_eq!(uri("s3://b/p/").join("x.tar").ok(), Some(uri("s3://b/p/x.tar")));
    }

    #[test]
    fn prefixes_match_whole_key_parts() {
        let train = uri("s3://b/train");
        assert!(uri("s3://b/train/x.tar").is_under(&train));
        assert!(!uri("s3://b/training/x.tar").is_under(&train));
        assert!(!uri("s3://c/train/x.tar").is_under(&train));
        assert!(uri("s3://b/anything").is_under(&uri("s3://b")));
    }
}
