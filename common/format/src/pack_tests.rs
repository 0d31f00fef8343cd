use super::*;

fn options(input: &Path, output: &Path, shard_size: u64) -> PackOptions {
    PackOptions {
        input: input.to_path_buf(),
        output: output.to_path_buf(),
        shard_size,
        threads: NonZeroUsize::new(2).unwrap_or(NonZeroUsize::MIN),
        prefix: "train".into(),
        overwrite: false,
        rewrite_jpeg: None,
        shuffle_seed: None,
    }
}

fn write(path: &Path, bytes: &[u8]) {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).unwrap_or_else(|error| panic!("{error}"));
    }
    std::fs::write(path, bytes).unwrap_or_else(|error| panic!("{error}"));
}

fn image_folder(root: &Path) {
    write(&root.join("cat/b.jpg"), &[1u8; 3000]);
    write(&root.join("cat/a.JPEG"), &[2u8; 2000]);
    write(&root.join("cat/notes.txt"), b"not an image");
    write(&root.join("dog/x.y.png"), &[3u8; 100]);
    write(&root.join("stray.jpg"), b"outside any class");
}

#[test]
fn pack_writes_sorted_labelled_samples_and_a_manifest() {
    let dir = tempfile::tempdir().unwrap_or_else(|error| panic!("{error}"));
    let (input, output) = (dir.path().join("in"), dir.path().join("out"));
    image_folder(&input);
    let mut last = PackProgress::default();
    let summary = pack(&options(&input, &output, 1 << 20), &mut |progress| last = progress).unwrap_or_else(|error| panic!("{error}"));
    assert_eq!(summary.manifest.classes, vec!["cat", "dog"]);
    assert_eq!(summary.manifest.samples(), 3);
    assert_eq!(summary.skipped_files, 1);
    assert_eq!(last.files_done, 3);
    assert_eq!(last.shards_done, 1);
    let shard = Shard::open(&output.join("train-000000.tar"), IndexPolicy::LoadOrBuildInMemory).unwrap_or_else(|error| panic!("{error}"));
    assert_eq!(shard.index_status(), &crate::IndexStatus::Loaded);
    let keys: Vec<&str> = (0..shard.len()).filter_map(|index| shard.sample(index)).map(|sample| sample.key()).collect();
    assert_eq!(keys, vec!["cat/a", "cat/b", "dog/x_y"]);
    let dog = shard.sample(2).unwrap_or_else(|| panic!("no sample 2"));
    assert_eq!(dog.member("png"), Some(&[3u8; 100][..]));
    assert_eq!(dog.member("cls"), Some(&b"1"[..]));
    assert_eq!(shard.sample(0).and_then(|sample| sample.member("jpg")), Some(&[2u8; 2000][..]));
    assert_eq!(summary.manifest.shards[0].bytes, std::fs::metadata(shard.path()).map(|meta| meta.len()).unwrap_or(0));
}

#[test]
fn shards_split_at_the_size_limit_and_output_is_deterministic() {
    let dir = tempfile::tempdir().unwrap_or_else(|error| panic!("{error}"));
    let input = dir.path().join("in");
    for index in 0..10 {
        write(&input.join(format!("c{}/img{index}.jpg", index % 3)), &vec![index as u8; 1500]);
    }
    let first = pack(&options(&input, &dir.path().join("a"), 8 * 1024), &mut |_| {}).unwrap_or_else(|error| panic!("{error}"));
    let second = pack(&options(&input, &dir.path().join("b"), 8 * 1024), &mut |_| {}).unwrap_or_else(|error| panic!("{error}"));
    assert!(first.manifest.shards.len() > 1);
    assert!(first.manifest.shards.iter().all(|shard| shard.bytes <= 8 * 1024));
    assert_eq!(first.manifest.samples(), 10);
    assert_eq!(first.manifest, second.manifest);
    for shard in &first.manifest.shards {
        let read = |folder: &str| std::fs::read(dir.path().join(folder).join(&shard.uri)).unwrap_or_default();
        assert_eq!(read("a"), read("b"), "{} differs between runs", shard.uri);
    }
}

#[test]
fn refuses_to_overwrite_without_force_and_names_bad_folders() {
    let dir = tempfile::tempdir().unwrap_or_else(|error| panic!("{error}"));
    let (input, output) = (dir.path().join("in"), dir.path().join("out"));
    image_folder(&input);
    pack(&options(&input, &output, 1 << 20), &mut |_| {}).unwrap_or_else(|error| panic!("{error}"));
    let again = pack(&options(&input, &output, 1 << 20), &mut |_| {});
    assert!(again.err().is_some_and(|error| error.to_string().contains("--force")));
    let forced = PackOptions { overwrite: true, ..options(&input, &output, 1 << 20) };
    assert!(pack(&forced, &mut |_| {}).is_ok());

    let missing = pack(&options(&dir.path().join("nope"), &output, 1 << 20), &mut |_| {});
    assert!(matches!(missing, Err(ShardError::Io { .. })));
    write(&dir.path().join("empty/cls/readme.txt"), b"x");
    let empty_class = pack(&options(&dir.path().join("empty"), &dir.path().join("o2"), 1 << 20), &mut |_| {});
    assert!(empty_class.err().is_some_and(|error| error.to_string().contains("holds no images")));
    let flat = pack(&options(&dir.path().join("empty/cls"), &dir.path().join("o3"), 1 << 20), &mut |_| {});
    assert!(flat.err().is_some_and(|error| error.to_string().contains("no class folders")));
}

#[test]
fn colliding_keys_are_refused() {
    let dir = tempfile::tempdir().unwrap_or_else(|error| panic!("{error}"));
    let input = dir.path().join("in");
    write(&input.join("c/a.b.jpg"), b"1");
    write(&input.join("c/a_b.jpg"), b"2");
    let result = pack(&options(&input, &dir.path().join("out"), 1 << 20), &mut |_| {});
    assert!(result.err().is_some_and(|error| error.to_string().contains("rename one")));
}

/// The keys of every shard of a packed dataset, in shard order.
fn keys_in_order(output: &Path, manifest: &Manifest) -> Vec<(String, String)> {
    let mut keys = Vec::new();
    for entry in &manifest.shards {
        let shard = Shard::open(&output.join(&entry.uri), IndexPolicy::LoadOrBuildInMemory).unwrap_or_else(|error| panic!("{error}"));
        for sample in (0..shard.len()).filter_map(|index| shard.sample(index)) {
            let label = String::from_utf8_lossy(sample.member("cls").unwrap_or_default()).into_owned();
            keys.push((sample.key().to_owned(), label));
        }
    }
    keys
}

#[test]
fn a_seeded_pack_shuffles_across_shards_deterministically_and_records_the_seed() {
    let dir = tempfile::tempdir().unwrap_or_else(|error| panic!("{error}"));
    let input = dir.path().join("in");
    for class in 0..4 {
        for index in 0..12 {
            write(&input.join(format!("c{class}/img{index:02}.jpg")), &[class as u8; 700]);
        }
    }
    let packed = |folder: &str, seed_opt: Option<u64>| {
        let output = dir.path().join(folder);
        let summary = pack(&PackOptions { shuffle_seed: seed_opt, ..options(&input, &output, 16 * 1024) }, &mut |_| {})
            .unwrap_or_else(|error| panic!("{error}"));
        (keys_in_order(&output, &summary.manifest), summary.manifest)
    };
    let (folder_order, folder_manifest) = packed("folder", None);
    let (first, first_manifest) = packed("a", Some(5));
    let (again, _) = packed("b", Some(5));
    let (other, _) = packed("c", Some(6));
    assert_eq!(folder_manifest.packed, Some(PackedOrder::Folder));
    assert_eq!(first_manifest.packed, Some(PackedOrder::Shuffled { seed: 5 }));
    assert_eq!(first, again, "the same seed, the same order");
    assert_ne!(first, other, "another seed, another order");
    assert_ne!(first, folder_order);
    let mut sorted = first.clone();
    sorted.sort();
    assert_eq!(sorted, folder_order, "the same samples with the same labels");
    // Folder order puts one class in each shard; shuffled, the first shard holds several.
    let shard_samples = first_manifest.shards[0].samples as usize;
    let classes_of =
        |keys: &[(String, String)]| keys.iter().map(|(_, label)| label.clone()).collect::<std::collections::BTreeSet<_>>().len();
    assert_eq!(classes_of(&folder_order[..shard_samples]), 1);
    assert!(classes_of(&first[..shard_samples]) >= 3, "{:?}", &first[..shard_samples]);
}
