//! A batch is a pure function of (dataset, spec, epoch, rank, step): the same bytes across runs,
//! thread counts and buffer counts (DESIGN §4.5).

use std::num::NonZeroU32;
use std::sync::Arc;

use stoker_pipeline::{BatchRequest, Dataset, Pipeline, PipelineConfig};
use stoker_plan::ids::{Epoch, Rank, Step};
use stoker_plan::transform::{ErasingValue, FloatDtype, Interpolation, KernelSize, OutputLayout, Size, Transform, TransformSpec};
use stoker_plan::{EpochPlan, PlanSpec, Shuffle, Tail};

use crate::fixtures::{packed_dataset, packed_dataset_verbatim};

/// (checksum, images, labels, keys, replaced) of every batch of 2 ranks × all steps of epoch 1.
type Digest = Vec<(u64, Vec<u8>, Vec<i64>, Vec<String>, Vec<u32>)>;

fn run(dataset: &Arc<Dataset>, spec: &TransformSpec, threads: usize, in_flight: usize) -> Digest {
    let plan_spec = PlanSpec {
        seed: 11,
        world_size: NonZeroU32::new(2).expect("2"),
        batch_size: NonZeroU32::new(7).expect("7"),
        shuffle: Shuffle::Full,
        tail: Tail::Partial,
    };
    let plan = Arc::new(EpochPlan::new(dataset.table(), plan_spec, Epoch(1)));
    let requests: Vec<BatchRequest> = (0..plan.steps())
        .flat_map(|step| (0..2).map(move |rank| (rank, step)))
        .map(|(rank, step)| BatchRequest { plan: Arc::clone(&plan), rank: Rank(rank), step: Step(step) })
        .collect();
    let config = PipelineConfig { threads, in_flight, batch_size: 7 };
    let pipeline = Pipeline::start(Arc::clone(dataset), spec, config, requests.clone()).expect("start");
    let batches: Digest = pipeline
        .map(|batch| {
            let batch = batch.expect("batch");
            assert_eq!(xxhash_rust::xxh3::xxh3_64(batch.images()), batch.checksum);
            (
                batch.checksum,
                batch.images().to_vec(),
                batch.labels().to_vec(),
                batch.keys().map(str::to_owned).collect(),
                batch.replaced().to_vec(),
            )
        })
        .collect();
    assert_eq!(batches.len(), requests.len(), "every requested batch arrives");
    batches
}

#[test]
fn batches_are_identical_across_runs_threads_and_buffers() {
    let dir = tempfile::tempdir().expect("tempdir");
    let manifest = packed_dataset(dir.path(), 3, 12, &[]);
    let dataset = Arc::new(Dataset::open(&manifest).expect("open"));
    let mut spec = TransformSpec::imagenet_train(64);
    let reference = run(&dataset, &spec, 1, 1);
    assert_eq!(run(&dataset, &spec, 1, 1), reference, "second run, same settings");
    assert_eq!(run(&dataset, &spec, 3, 2), reference, "3 threads");
    assert_eq!(run(&dataset, &spec, 2, 8), reference, "2 threads, 8 buffers");
    // Sanity: the digest depends on the spec, so the equalities above are not vacuous.
    spec.transforms.push(Transform::Normalize { mean: [0.5; 3], std: [0.25; 3], dtype: FloatDtype::F16 });
    spec.layout = OutputLayout::Nchw;
    let normalised = run(&dataset, &spec, 1, 1);
    assert_ne!(normalised[0].0, reference[0].0);
    assert_eq!(run(&dataset, &spec, 3, 3), normalised, "normalised NCHW f16, 3 threads");
    // Every sample of the epoch appears once over all batches (partial tail).
    let mut keys: Vec<&String> = reference.iter().flat_map(|b| &b.3).collect();
    keys.sort();
    let total = keys.len();
    keys.dedup();
    assert_eq!((keys.len(), total), (36, 36));
    assert!(reference.iter().all(|b| b.4.is_empty()), "no sample was replaced");
    assert!(reference.iter().flat_map(|b| &b.2).all(|l| (0..3).contains(l)), "labels are the class indexes");
}

/// Every per-pixel augmentation draws from the sample's seed alone: the same bytes across runs,
/// thread counts and buffers, and the crop underneath is the plain spec's (an augmentation
/// changes pixels, never which samples or boxes a batch holds).
#[test]
fn augmented_batches_are_identical_across_runs_threads_and_buffers() {
    let dir = tempfile::tempdir().expect("tempdir");
    let manifest = packed_dataset(dir.path(), 3, 12, &[]);
    let dataset = Arc::new(Dataset::open(&manifest).expect("open"));
    let plain = TransformSpec::imagenet_train(48);
    let mut spec = plain.clone();
    spec.transforms.extend([
        Transform::ColorJitter {
            brightness: Some((0.6, 1.4)),
            contrast: Some((0.6, 1.4)),
            saturation: Some((0.6, 1.4)),
            hue: Some((-0.1, 0.1)),
        },
        Transform::RandomGrayscale { p: 0.2 },
        Transform::GaussianBlur { kernel_size: KernelSize { width: 5, height: 3 }, sigma: (0.1, 2.0) },
        Transform::RandAugment { num_ops: 2, magnitude: 9, num_magnitude_bins: 31 },
        Transform::TrivialAugmentWide { num_magnitude_bins: 31 },
        Transform::RandomErasing { p: 0.5, scale: (0.02, 0.33), ratio: (0.3, 3.3), value: ErasingValue([124, 116, 104]) },
    ]);
    let reference = run(&dataset, &spec, 1, 1);
    assert_eq!(run(&dataset, &spec, 3, 2), reference, "3 threads");
    assert_eq!(run(&dataset, &spec, 2, 8), reference, "2 threads, 8 buffers");
    let unaugmented = run(&dataset, &plain, 2, 2);
    assert!(reference.iter().zip(&unaugmented).all(|(a, b)| a.3 == b.3 && a.2 == b.2), "the same samples and labels in every batch");
    assert!(reference.iter().zip(&unaugmented).all(|(a, b)| a.1 != b.1), "the augmentations changed every batch's pixels");
    spec.transforms.push(Transform::Normalize { mean: [0.5; 3], std: [0.25; 3], dtype: FloatDtype::F32 });
    assert_eq!(run(&dataset, &spec, 3, 3), run(&dataset, &spec, 1, 1), "normalised, 3 threads");
}

#[test]
fn restart_markers_change_no_byte_of_any_batch() {
    // `stoker pack` re-encodes JPEGs with restart markers and workers then decode only the
    // intervals a crop covers; the batches must equal those of the files stored as they are.
    let (seekable, verbatim) = (tempfile::tempdir().expect("tempdir"), tempfile::tempdir().expect("tempdir"));
    let seekable = Arc::new(Dataset::open(&packed_dataset(seekable.path(), 3, 12, &[])).expect("open"));
    let verbatim = Arc::new(Dataset::open(&packed_dataset_verbatim(verbatim.path(), 3, 12)).expect("open"));
    for size in [64, 160] {
        for dct_scaling in [true, false] {
            let mut spec = TransformSpec::imagenet_train(size);
            spec.dct_scaling = dct_scaling;
            let expected = run(&verbatim, &spec, 2, 2);
            assert!(run(&seekable, &spec, 2, 2) == expected, "size {size}, dct_scaling {dct_scaling}: batches differ");
        }
    }
    let spec = TransformSpec::new(vec![
        Transform::Resize { shorter_side: 72, interpolation: Interpolation::Bilinear },
        Transform::CenterCrop { size: Size { height: 64, width: 64 } },
    ]);
    assert!(run(&seekable, &spec, 1, 1) == run(&verbatim, &spec, 1, 1), "Resize + CenterCrop: batches differ");
}

#[test]
fn a_slow_consumer_holds_the_pipeline_at_its_buffer_count() {
    let dir = tempfile::tempdir().expect("tempdir");
    let manifest = packed_dataset(dir.path(), 2, 10, &[]);
    let dataset = Arc::new(Dataset::open(&manifest).expect("open"));
    let spec = TransformSpec::imagenet_train(32);
    let plan_spec = PlanSpec {
        seed: 1,
        world_size: NonZeroU32::MIN,
        batch_size: NonZeroU32::new(2).expect("2"),
        shuffle: Shuffle::None,
        tail: Tail::Drop,
    };
    let plan = Arc::new(EpochPlan::new(dataset.table(), plan_spec, Epoch(0)));
    let requests: Vec<BatchRequest> =
        (0..plan.steps()).map(|s| BatchRequest { plan: Arc::clone(&plan), rank: Rank(0), step: Step(s) }).collect();
    let mut pipeline =
        Pipeline::start(Arc::clone(&dataset), &spec, PipelineConfig { threads: 2, in_flight: 3, batch_size: 2 }, requests).expect("start");
    let stats = pipeline.stats();
    // Hold three batches: all buffers are taken, so no more samples can be made.
    let held: Vec<_> = (0..3).map(|_| pipeline.next().expect("batch").expect("ok")).collect();
    let made = stats.samples.load(std::sync::atomic::Ordering::SeqCst);
    for _ in 0..20 {
        std::thread::sleep(std::time::Duration::from_millis(10));
        assert_eq!(stats.samples.load(std::sync::atomic::Ordering::SeqCst), made, "the pipeline ran past its buffers");
    }
    assert_eq!(made, 6);
    drop(held);
    assert_eq!(pipeline.count(), 7, "the job resumes when the consumer lets go (10 steps in all)");
}
