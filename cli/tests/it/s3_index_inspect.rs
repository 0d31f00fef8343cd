//! `stoker index` and `stoker inspect` on shards in an object store (moto): a folder of bare
//! shards in a bucket gets its indexes and a manifest, both kinds of manifest are checked
//! without downloading the shards, a shard is inspected, and a missing object is named.

use stoker_format::{Manifest, ManifestShard};
use stoker_testkit::moto::MotoServer;

use crate::support::{path_str, stoker, text};

/// Run `stoker ARGS --s3-endpoint ENDPOINT`; its output, which must be a success.
fn stoker_ok(args: &[&str], endpoint: &str) -> String {
    let output = stoker(&[args, &["--s3-endpoint", endpoint]].concat());
    assert!(output.status.success(), "stoker {args:?}: {}", text(&output));
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// The JSON `stoker inspect --json` printed.
fn json(stdout: &str) -> serde_json::Value {
    serde_json::from_str(stdout).unwrap_or_else(|error| panic!("{error}: {stdout}"))
}

#[test]
#[ignore = "needs STOKER_PYTHON with moto[server] (make test)"]
fn index_and_inspect_read_shards_in_an_object_store() {
    let dir = stoker_testkit::unique_temp_dir("stoker-s3-index").expect("temp dir");
    let packed = stoker_testkit::sample_dataset(&dir, 4, 15, 48 << 10).expect("dataset");
    let manifest = Manifest::load(&packed).expect("manifest");
    let shards = manifest.shards.len();
    assert!(shards >= 3, "several shards: {shards}");
    // Only the shards, as a WebDataset user has them: no indexes, no manifest.
    let bare = dir.join("bare");
    std::fs::create_dir_all(&bare).expect("folder");
    for shard in &manifest.shards {
        let from = packed.parent().expect("folder").join(&shard.uri);
        std::fs::copy(&from, bare.join(&shard.uri)).expect("copy");
    }
    let moto = MotoServer::start(33, false).expect("moto");
    moto.create_bucket("data").expect("bucket");
    moto.upload_folder(&bare, "s3://data/wds").expect("upload");
    let endpoint = moto.endpoint();
    let names: Vec<&str> = manifest.shards.iter().map(|shard| shard.uri.as_str()).collect();
    let pattern = format!("s3://data/wds/{{{}}}", names.join(","));

    let indexed = stoker_ok(&["index", &pattern, "--manifest", "s3://data/wds/manifest.json"], &endpoint);
    let samples = manifest.samples();
    assert!(indexed.contains(&format!("indexed {shards} shards, {samples} samples: {shards} indexes built and uploaded")), "{indexed}");
    let again = stoker_ok(&["index", &pattern], &endpoint);
    assert!(again.contains(&format!("0 indexes built and uploaded, {shards} already up to date")), "the stored indexes are used: {again}");

    // The manifest in the store (by its prefix): every shard there, with its index, by size.
    let remote = json(&stoker_ok(&["inspect", "s3://data/wds", "--json"], &endpoint));
    assert_eq!(remote["kind"], "manifest");
    assert_eq!(remote["path"], "s3://data/wds/manifest.json");
    assert_eq!((remote["shards"].as_u64(), remote["samples"].as_u64()), (Some(shards as u64), Some(samples)));
    assert_eq!(remote["problems"], serde_json::json!([]));
    let details = remote["shard_details"].as_array().expect("details");
    assert!(details.iter().all(|shard| shard["status"].as_str().is_some_and(|status| status.contains("index beside it"))), "{details:?}");
    assert_eq!(details[0]["uri"], names[0], "shards under the manifest's prefix are listed by relative name");

    let text_report = stoker_ok(&["inspect", "s3://data/wds/manifest.json"], &endpoint);
    assert!(text_report.contains("every shard is present") && text_report.contains("mixing   not measured"), "{text_report}");

    // A manifest on local disk may not list shards in a store (dataset add refuses it): index
    // says so before downloading anything, and inspect names it as a problem.
    let local = dir.join("remote-shards.json");
    let refused = stoker(&["index", &pattern, "--manifest", path_str(&local), "--s3-endpoint", &endpoint]);
    assert!(!refused.status.success() && text(&refused).contains("--manifest s3://data/wds/manifest.json"), "{}", text(&refused));
    let listing = manifest.shards.iter().map(|shard| ManifestShard { uri: format!("s3://data/wds/{}", shard.uri), ..shard.clone() });
    Manifest::new(listing.collect(), Vec::new(), None).save(&local).expect("save");
    let problem = stoker(&["inspect", path_str(&local), "--s3-endpoint", &endpoint]);
    assert!(!problem.status.success() && text(&problem).contains("may not list s3:// shards"), "{}", text(&problem));

    // One shard: downloaded and read as a local one.
    let first = format!("s3://data/wds/{}", names[0]);
    let shard = json(&stoker_ok(&["inspect", &first, "--json"], &endpoint));
    assert_eq!((shard["kind"].as_str(), shard["path"].as_str()), (Some("shard"), Some(first.as_str())));
    assert_eq!(shard["samples"].as_u64(), Some(manifest.shards[0].samples));
    assert_eq!(shard["index"], "loaded", "the index beside it in the store");

    // A shard whose key has no '.' is a shard, not a prefix holding manifest.json.
    let dotless = dir.join("dotless");
    std::fs::create_dir_all(&dotless).expect("folder");
    std::fs::copy(bare.join(names[0]), dotless.join("shard-000")).expect("copy");
    moto.upload_folder(&dotless, "s3://data/plain").expect("upload");
    let plain = json(&stoker_ok(&["inspect", "s3://data/plain/shard-000", "--json"], &endpoint));
    assert_eq!((plain["kind"].as_str(), plain["samples"].as_u64()), (Some("shard"), Some(manifest.shards[0].samples)), "{plain}");

    // What is missing is named.
    let missing = stoker(&["inspect", "s3://data/wds/not-there.tar", "--s3-endpoint", &endpoint]);
    assert!(!missing.status.success());
    assert!(text(&missing).contains("s3://data/wds/not-there.tar"), "{}", text(&missing));
    let unindexed = stoker(&["index", "s3://data/wds/not-there.tar", "--s3-endpoint", &endpoint]);
    assert!(!unindexed.status.success() && text(&unindexed).contains("s3://data/wds/not-there.tar"), "{}", text(&unindexed));
    let mixed = stoker(&["index", &first, path_str(&bare.join(names[0])), "--s3-endpoint", &endpoint]);
    assert!(!mixed.status.success() && text(&mixed).contains("not both"), "{}", text(&mixed));
}
