//! Manifests (`Manifest::parse`), shard URIs (`resolve_uri`) and brace patterns
//! (`brace::expand`) from arbitrary text. A manifest that parses must save and parse back to
//! itself; a pattern must expand within the limits.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use stoker_format::brace::{self, MAX_EXPANSION, MAX_EXPANSION_BYTES};
use stoker_format::{Manifest, ShardLocation, resolve_uri};

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let path = Path::new("/data/set/manifest.json");
    if let Ok(manifest) = Manifest::parse(&text, path) {
        let _ = (manifest.samples(), manifest.bytes(), manifest.shard_table().is_ok());
        for shard in &manifest.shards {
            resolve_uri(&shard.uri, Path::new("/data/set")).expect("parse checked every URI");
        }
        let json = serde_json::to_string_pretty(&manifest).expect("a manifest serialises");
        let again = Manifest::parse(&json, path).unwrap_or_else(|error| panic!("{json} does not parse again: {error}"));
        assert_eq!(again, manifest);
    }
    if let Ok(ShardLocation::S3 { bucket, key }) = resolve_uri(&text, Path::new("/data/set")) {
        assert!(!bucket.is_empty() && !key.is_empty());
    }
    if let Ok(names) = brace::expand(&text) {
        assert!(!names.is_empty() && names.len() <= MAX_EXPANSION);
        assert!(names.iter().map(String::len).sum::<usize>() <= MAX_EXPANSION_BYTES);
        if !text.contains(['{', '}']) {
            assert_eq!(names, [text.as_ref()]);
        }
    }
});
