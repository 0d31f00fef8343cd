//! Bad input never panics and never allocates without bound: corrupt and truncated JPEGs,
//! absurd header dimensions, empty members, garbage; bad samples are replaced or fail by policy.

use std::sync::Arc;

use stoker_format::DatasetRoots;
use stoker_pipeline::{BatchRequest, Dataset, DecodeError, Pipeline, PipelineConfig, PipelineError, SampleMaker};
use stoker_plan::ids::{Epoch, Rank, Step};
use stoker_plan::prng::SplitMix64;
use stoker_plan::transform::{OnError, Recipe, TransformSpec};
use stoker_plan::{EpochPlan, PlanSpec, Shuffle, Tail};
use turbojpeg::Subsamp;

use crate::fixtures::{jpeg, packed_dataset};

fn maker(max_pixels: u64) -> SampleMaker {
    let mut spec = TransformSpec::imagenet_train(32);
    spec.max_image_pixels = max_pixels;
    SampleMaker::new(Recipe::new(&spec).expect("valid")).expect("maker")
}

/// Set the SOF0 frame size of a baseline JPEG.
fn with_dimensions(mut bytes: Vec<u8>, width: u16, height: u16) -> Vec<u8> {
    let sof = bytes.windows(2).position(|w| w == [0xff, 0xc0]).expect("SOF0");
    bytes[sof + 5..sof + 7].copy_from_slice(&height.to_be_bytes());
    bytes[sof + 7..sof + 9].copy_from_slice(&width.to_be_bytes());
    bytes
}

#[test]
fn absurd_dimensions_are_refused_from_the_header() {
    let mut m = maker(stoker_plan::transform::DEFAULT_MAX_IMAGE_PIXELS);
    let mut slot = vec![0; 32 * 32 * 3];
    let huge = with_dimensions(jpeg(64, 48, 1, Subsamp::Sub2x2), 65000, 65000);
    let error = m.make(&huge, 0, &mut slot).expect_err("65000x65000");
    assert!(matches!(error, DecodeError::TooLarge { width: 65000, height: 65000, .. }), "{error}");
    assert!(error.to_string().contains("max_image_pixels"), "{error}");
    // The limit is configurable.
    let small = jpeg(100, 100, 2, Subsamp::Sub2x2);
    assert!(matches!(maker(5000).make(&small, 0, &mut slot), Err(DecodeError::TooLarge { pixels: 10000, .. })));
    assert!(maker(10000).make(&small, 0, &mut slot).is_ok());
}

#[test]
fn empty_garbage_and_every_truncation_are_errors_not_panics() {
    let mut m = maker(1 << 24);
    let mut slot = vec![0; 32 * 32 * 3];
    assert_eq!(m.make(&[], 0, &mut slot), Err(DecodeError::Empty));
    assert!(matches!(m.make(b"hello, not an image", 0, &mut slot), Err(DecodeError::UnknownFormat { .. })));
    let good = jpeg(200, 150, 3, Subsamp::Sub2x2);
    for len in 0..good.len() {
        let _ = m.make(&good[..len], len as u64, &mut slot);
    }
    // Random corruption: most flips still decode (with warnings), some fail; none may panic.
    let mut rng = SplitMix64::new(17);
    for round in 0..2000u64 {
        let mut bad = good.clone();
        for _ in 0..1 + rng.below(4) {
            let at = rng.below(bad.len() as u64) as usize;
            bad[at] = rng.next_u64() as u8;
        }
        let _ = m.make(&bad, round, &mut slot);
    }
    // Random bytes behind a JPEG magic.
    for round in 0..500u64 {
        let mut bytes = vec![0xff, 0xd8, 0xff];
        bytes.extend((0..rng.below(3000)).map(|_| rng.next_u64() as u8));
        let _ = m.make(&bytes, round, &mut slot);
    }
    // The maker still works afterwards.
    let after = m.make(&good, 1, &mut slot);
    assert!(after.is_ok(), "{after:?}");
}

#[test]
fn grayscale_cmyk_and_png_become_rgb() {
    let mut m = maker(1 << 24);
    let mut slot = vec![0; 32 * 32 * 3];
    let gray = jpeg(120, 90, 4, Subsamp::Gray);
    m.make(&gray, 0, &mut slot).expect("gray JPEG");
    assert!(slot.chunks_exact(3).all(|p| p[0] == p[1] && p[1] == p[2]), "gray becomes equal RGB channels");

    let pixels = crate::fixtures::texture(120, 90, 5);
    let mut png = Vec::new();
    image::codecs::png::PngEncoder::new(&mut png);
    image::ImageEncoder::write_image(image::codecs::png::PngEncoder::new(&mut png), &pixels, 120, 90, image::ExtendedColorType::Rgb8)
        .expect("png");
    let report = m.make(&png, 0, &mut slot).expect("PNG through the fallback");
    assert_eq!(report.source_size, (120, 90));

    // CMYK: libjpeg-turbo encodes a CMYK buffer; we must come back with RGB.
    let cmyk: Vec<u8> = pixels.chunks_exact(3).flat_map(|p| [p[0], p[1], p[2], 255]).collect();
    let image = turbojpeg::Image { pixels: cmyk.as_slice(), width: 120, pitch: 480, height: 90, format: turbojpeg::PixelFormat::CMYK };
    let mut compressor = turbojpeg::Compressor::new().expect("compressor");
    compressor.set_subsamp(Subsamp::None).expect("subsamp");
    let bytes = compressor.compress_to_vec(image).expect("CMYK JPEG");
    let report = m.make(&bytes, 0, &mut slot).expect("CMYK JPEG decodes");
    assert_eq!(report.source_size, (120, 90));
}

fn run_with_policy(policy: OnError, manifest: &std::path::Path) -> Vec<Result<stoker_pipeline::Batch, PipelineError>> {
    let mut spec = TransformSpec::imagenet_train(16);
    spec.on_error = policy;
    run_spec(spec, manifest)
}

/// Every batch of epoch 0 of `manifest` (batches of 4, in order) made with `spec`.
fn run_spec(spec: TransformSpec, manifest: &std::path::Path) -> Vec<Result<stoker_pipeline::Batch, PipelineError>> {
    let dataset = Arc::new(Dataset::open(manifest).expect("open"));
    let plan_spec = PlanSpec {
        seed: 0,
        world_size: std::num::NonZeroU32::MIN,
        batch_size: std::num::NonZeroU32::new(4).expect("4"),
        shuffle: Shuffle::None,
        tail: Tail::Partial,
    };
    let plan = Arc::new(EpochPlan::new(dataset.table(), plan_spec, Epoch(0)));
    let requests: Vec<BatchRequest> =
        (0..plan.steps()).map(|s| BatchRequest { plan: Arc::clone(&plan), rank: Rank(0), step: Step(s) }).collect();
    Pipeline::start(dataset, &spec, PipelineConfig { threads: 2, in_flight: 2, batch_size: 4 }, requests).expect("start").collect()
}

#[test]
fn bad_samples_are_replaced_and_flagged_or_fail_by_policy() {
    let dir = tempfile::tempdir().expect("tempdir");
    let truncated = jpeg(100, 80, 9, Subsamp::Sub2x2)[..40].to_vec();
    let manifest = packed_dataset(dir.path(), 1, 6, &[("class0/zz_empty.jpg", b""), ("class0/zz_truncated.jpg", &truncated)]);

    let batches: Vec<_> = run_with_policy(OnError::Replace, &manifest).into_iter().map(|b| b.expect("replace never fails")).collect();
    let mut replaced_keys = Vec::new();
    for batch in &batches {
        for &slot in batch.replaced() {
            replaced_keys.push(batch.key(slot as usize).expect("key").to_owned());
            let start = slot as usize * 16 * 16 * 3;
            assert!(batch.images()[start..start + 16 * 16 * 3].iter().all(|&v| v == 0), "replaced sample is black");
            assert_eq!(batch.labels()[slot as usize], 0, "the label survives");
        }
    }
    replaced_keys.sort();
    assert_eq!(replaced_keys, ["class0/zz_empty", "class0/zz_truncated"]);
    assert_eq!(batches.iter().map(|b| b.len()).sum::<usize>(), 8);

    let results = run_with_policy(OnError::Fail, &manifest);
    let error = results.into_iter().find_map(Result::err).expect("on_error=fail stops");
    let text = error.to_string();
    assert!(text.contains("class0/zz_") && text.contains("shard-000000.tar"), "{text}");
}

/// Issue 15, item 9: a JPEG whose data is damaged mid-stream decodes with a libjpeg warning
/// (here a premature end: the rows after it are gray). It was delivered unflagged; now it is
/// kept as decoded and flagged `corrupt` under on_error=replace, and fails the job (naming
/// shard and key) under on_error=fail.
#[test]
fn a_jpeg_that_decodes_only_with_warnings_is_flagged_or_fails_by_policy() {
    let dir = tempfile::tempdir().expect("tempdir");
    let good = jpeg(100, 80, 9, Subsamp::Sub2x2);
    let damaged = good[..good.len() * 2 / 3].to_vec();
    {
        // The whole image is decoded (Resize to the shorter side it has, then CenterCrop of
        // it), so the decode always reaches the damage.
        let spec = TransformSpec::new(vec![
            stoker_plan::transform::Transform::Resize { shorter_side: 80, interpolation: Default::default() },
            stoker_plan::transform::Transform::CenterCrop { size: stoker_plan::transform::Size::square(80) },
        ]);
        let mut m = SampleMaker::new(Recipe::new(&spec).expect("valid")).expect("maker");
        let mut slot = vec![0; 80 * 80 * 3];
        let report = m.make(&damaged, 0, &mut slot).expect("decodes, with a warning");
        assert!(report.warned, "libjpeg warned");
        assert!(m.last_warning().to_lowercase().contains("premature end"), "{}", m.last_warning());
        assert!(!m.make(&good, 0, &mut slot).expect("decodes").warned, "the intact file decodes cleanly");
    }
    let manifest = packed_dataset(dir.path(), 1, 3, &[("class0/zz_damaged.jpg", &damaged)]);
    let run = |policy: OnError| {
        let mut spec = TransformSpec::new(vec![
            stoker_plan::transform::Transform::Resize { shorter_side: 80, interpolation: Default::default() },
            stoker_plan::transform::Transform::CenterCrop { size: stoker_plan::transform::Size::square(64) },
        ]);
        spec.on_error = policy;
        run_spec(spec, &manifest)
    };
    let batches: Vec<_> = run(OnError::Replace).into_iter().map(|batch| batch.expect("replace never fails")).collect();
    let corrupt: Vec<String> =
        batches.iter().flat_map(|batch| batch.corrupt().iter().map(|&slot| batch.key(slot as usize).expect("key").to_owned())).collect();
    assert_eq!(corrupt, ["class0/zz_damaged"], "flagged");
    assert!(batches.iter().all(|batch| batch.replaced().is_empty()), "kept as decoded, not replaced");
    let error = run(OnError::Fail).into_iter().find_map(Result::err).expect("on_error=fail stops");
    let text = error.to_string();
    assert!(text.contains("class0/zz_damaged") && text.contains("corrupt JPEG data"), "{text}");
}

/// Issue 19: the full-decode floor of `stoker bench pipeline` decoded whatever a header
/// claimed (one 65000×65000 header took the bench to 12 GB); it refuses what the pipeline
/// refuses, counting the image as failed.
#[test]
fn the_full_decode_floor_refuses_an_image_over_the_pixel_limit() {
    let dir = tempfile::tempdir().expect("tempdir");
    let huge = with_dimensions(jpeg(64, 48, 1, Subsamp::Sub2x2), 65000, 65000);
    let manifest = packed_dataset(dir.path(), 1, 3, &[("class0/zz_huge.jpg", &huge)]);
    let dataset = Arc::new(Dataset::open(&manifest).expect("open"));
    let table = dataset.table();
    let samples = Arc::new((0..dataset.samples()).map(|index| table.locate(index)).collect::<Vec<_>>());
    let limit = TransformSpec::imagenet_train(32).max_image_pixels;
    let floor = stoker_pipeline::floor::full_decode(&dataset, &samples, 1, std::time::Duration::from_millis(300), limit).expect("floor");
    assert!(floor.failed > 0, "the huge header is refused: {floor:?}");
    assert!(floor.images > 0, "the others decode: {floor:?}");
}

/// Issue 19: with `--dataset-root`, a worker opens a manifest and shards only inside the
/// roots (symlinks resolved); outside them nothing is read and the error names the flag.
#[test]
fn a_worker_confined_to_dataset_roots_opens_nothing_outside_them() {
    let (root, outside) = (tempfile::tempdir().expect("tempdir"), tempfile::tempdir().expect("tempdir"));
    let inside = packed_dataset(root.path(), 1, 3, &[]);
    let elsewhere = packed_dataset(outside.path(), 1, 3, &[]);
    let roots = DatasetRoots::new([root.path().to_path_buf()]).expect("roots");
    assert!(Dataset::open_confined(&inside, 0, &roots).is_ok(), "a dataset inside the root opens");
    let error = Dataset::open_confined(&elsewhere, 0, &roots).expect_err("outside the root");
    assert!(error.to_string().contains("outside every --dataset-root"), "{error}");

    // A manifest inside the root whose shard is a link to one outside it.
    let shards = std::fs::read_dir(elsewhere.parent().expect("folder")).expect("list").filter_map(Result::ok);
    let shard = shards.map(|entry| entry.path()).find(|path| path.extension().is_some_and(|ext| ext == "tar")).expect("a shard");
    let linked = root.path().join("linked");
    std::fs::create_dir(&linked).expect("mkdir");
    std::fs::copy(&elsewhere, linked.join("manifest.json")).expect("copy manifest");
    std::os::unix::fs::symlink(&shard, linked.join(shard.file_name().expect("name"))).expect("symlink");
    let error = Dataset::open_confined(&linked.join("manifest.json"), 0, &roots).expect_err("a shard linked from outside");
    assert!(error.to_string().contains("outside every --dataset-root"), "{error}");
    assert!(Dataset::open(&linked.join("manifest.json")).is_ok(), "unconfined, the link is followed");
}
