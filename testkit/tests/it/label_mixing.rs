//! Issue 16, item 1: class-sorted folders. An ImageFolder of 100 classes, packed and read as a
//! user would, must give global batches holding about as many classes as a uniform random
//! batch of the same size; folder order read with the default window shuffle is the failure
//! this guards against, and the block shuffle mixes even that.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use stoker_client::Loader;
use stoker_plan::ids::Epoch;
use stoker_plan::prng::SplitMix64;
use stoker_plan::{Shuffle, Tail};
use stoker_sample_data::{SampleDataSpec, write_image_folder};

use crate::common::config_for;

const CLASSES: u32 = 100;
const PER_CLASS: u32 = 16;
const WORLD_SIZE: u32 = 2;
const BATCH_SIZE: u32 = 32;

/// Mean distinct labels per global batch of one epoch of `dataset` read with `shuffle` (the
/// loader's default when `None`).
fn distinct_per_global_batch(cluster: &stoker_testkit::TestCluster, dataset: &str, shuffle_opt: Option<Shuffle>) -> f64 {
    let handles: Vec<_> = (0..WORLD_SIZE)
        .map(|rank| {
            let mut config = config_for(&cluster.loader_config(dataset, BATCH_SIZE), rank, WORLD_SIZE);
            config.shuffle = shuffle_opt.unwrap_or_default();
            config.tail = Tail::Drop;
            std::thread::spawn(move || {
                let mut loader = Loader::attach(&config).expect("attach");
                loader.set_epoch(Epoch(0));
                (&mut loader).map(|batch| batch.expect("batch")).map(|batch| (batch.step().0, batch.labels().to_vec())).collect::<Vec<_>>()
            })
        })
        .collect();
    let mut steps: BTreeMap<u64, BTreeSet<i64>> = BTreeMap::new();
    for handle in handles {
        for (step, labels) in handle.join().expect("rank") {
            steps.entry(step).or_default().extend(labels);
        }
    }
    assert_eq!(steps.len() as u32, CLASSES * PER_CLASS / (WORLD_SIZE * BATCH_SIZE), "every step of the epoch");
    steps.values().map(BTreeSet::len).sum::<usize>() as f64 / steps.len() as f64
}

/// Mean distinct labels in uniform random global batches of the dataset's labels.
fn random_distinct() -> f64 {
    let labels: Vec<u32> = (0..CLASSES).flat_map(|class| std::iter::repeat_n(class, PER_CLASS as usize)).collect();
    let mut random = SplitMix64::new(16);
    let batches = 400;
    let total: usize = (0..batches)
        .map(|_| {
            let mut pool = labels.clone();
            let mut picked = BTreeSet::new();
            for _ in 0..WORLD_SIZE * BATCH_SIZE {
                let index = (random.next_u64() % pool.len() as u64) as usize;
                picked.insert(pool.swap_remove(index));
            }
            picked.len()
        })
        .sum();
    total as f64 / f64::from(batches)
}

#[test]
fn a_packed_class_sorted_image_folder_gives_batches_as_mixed_as_random_ones() {
    let dir = stoker_testkit::unique_temp_dir("stoker-it-mixing").expect("dir");
    let started = Instant::now();
    let images = dir.join("images");
    write_image_folder(&images, SampleDataSpec { classes: CLASSES, images_per_class: PER_CLASS, seed: 16 }).expect("images");
    let generated = started.elapsed();
    let packed = |folder: &str, seed_opt| stoker_testkit::pack_images(&images, &dir.join(folder), 64 << 10, seed_opt).expect("pack");
    let (shuffled, sorted) = (packed("shuffled", Some(0)), packed("sorted", None));
    let packed_at = started.elapsed();
    let cluster = stoker_testkit::TestCluster::start(stoker_testkit::ClusterConfig { workers: 2, ..Default::default() }).expect("cluster");
    cluster.add_dataset("shuffled", &shuffled).expect("dataset");
    cluster.add_dataset("sorted", &sorted).expect("dataset");
    cluster.wait_for_workers().expect("workers");
    let random = random_distinct();
    let defaults = distinct_per_global_batch(&cluster, "shuffled", None);
    let sorted_window = distinct_per_global_batch(&cluster, "sorted", None);
    let sorted_block = distinct_per_global_batch(&cluster, "sorted", Some(Shuffle::BLOCK_DEFAULT));
    eprintln!(
        "distinct classes per global batch of {}: random {random:.1}; default pack + default shuffle {defaults:.1} ({:.0}%); \
         folder order + window {sorted_window:.1} ({:.0}%); folder order + block {sorted_block:.1} ({:.0}%)",
        WORLD_SIZE * BATCH_SIZE,
        defaults / random * 100.0,
        sorted_window / random * 100.0,
        sorted_block / random * 100.0
    );
    eprintln!("images {generated:?}, packs {:?}, three epochs {:?}", packed_at - generated, started.elapsed() - packed_at);
    assert!(defaults >= 0.9 * random, "the defaults mix {defaults:.1} classes a batch against {random:.1} for random batches");
    assert!(sorted_block >= 0.9 * random, "block shuffle over folder order: {sorted_block:.1} against {random:.1}");
    assert!(sorted_window < 0.5 * random, "folder order read a window at a time is the defect guarded against: {sorted_window:.1}");
    let _ = std::fs::remove_dir_all(&dir);
}
