//! What each per-pixel augmentation costs per image, against the pipeline it runs in: one
//! sample through [`SampleMaker::make`] (JPEG header, region decode with DCT scaling, resize to
//! 224×224, flip), the baseline, measured in the same run. The ops run on a 224×224 image, the
//! output of that pipeline, with parameters in the middle of torchvision's usual ranges.
//!
//! `cargo bench -j2 --workspace --bench augment` (BENCHMARKS.md, "Per-pixel augmentations").
#![allow(missing_docs)] // criterion_group! generates an undocumented function.

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use stoker_pipeline::SampleMaker;
use stoker_pipeline::augment::{AugmentScratch, apply};
use stoker_plan::prng::SplitMix64;
use stoker_plan::transform::{AutoAugmentPolicy, PixelOp, Recipe, Transform, TransformSpec};
use turbojpeg::{Image, PixelFormat, Subsamp};

const SIDE: usize = 224;

/// A 500×375 JPEG (ImageNet's typical size) of a texture with noise, quality 90, 4:2:0.
fn jpeg() -> Vec<u8> {
    let (width, height) = (500usize, 375usize);
    let mut rng = SplitMix64::new(3);
    let pixels: Vec<u8> = (0..width * height * 3)
        .map(|i| {
            let (x, y) = ((i / 3) % width, (i / 3) / width);
            (128.0 + 60.0 * ((x as f64 * 0.07).sin() * (y as f64 * 0.05 + (i % 3) as f64).cos()) + rng.uniform(-20.0, 20.0)) as u8
        })
        .collect();
    let image = Image { pixels: pixels.as_slice(), width, pitch: width * 3, height, format: PixelFormat::RGB };
    let mut compressor = turbojpeg::Compressor::new().unwrap_or_else(|error| panic!("{error}"));
    compressor.set_quality(90).unwrap_or_else(|error| panic!("{error}"));
    compressor.set_subsamp(Subsamp::Sub2x2).unwrap_or_else(|error| panic!("{error}"));
    compressor.compress_to_vec(image).unwrap_or_else(|error| panic!("{error}"))
}

fn make_sample(c: &mut Criterion, name: &str, spec: &TransformSpec, data: &[u8]) {
    let recipe = Recipe::new(spec).unwrap_or_else(|error| panic!("{error}"));
    let mut maker = SampleMaker::new(recipe).unwrap_or_else(|error| panic!("{error}"));
    let mut slot = vec![0u8; recipe.sample_bytes()];
    let mut seed = 0u64;
    c.bench_function(name, |b| {
        b.iter(|| {
            seed += 1;
            black_box(maker.make(data, seed, &mut slot).unwrap_or_else(|error| panic!("{error}")));
        });
    });
}

fn augmentations(c: &mut Criterion) {
    let data = jpeg();
    let baseline = TransformSpec::imagenet_train(SIDE as u32);
    make_sample(c, "pipeline/decode_crop_flip_224 (baseline)", &baseline, &data);
    let mut augmented = baseline.clone();
    augmented.transforms.extend([
        Transform::ColorJitter {
            brightness: Some((0.6, 1.4)),
            contrast: Some((0.6, 1.4)),
            saturation: Some((0.6, 1.4)),
            hue: Some((-0.1, 0.1)),
        },
        Transform::RandomGrayscale { p: 0.1 },
        Transform::RandomErasing { p: 0.5, scale: (0.02, 0.33), ratio: (0.3, 3.3), value: Default::default() },
    ]);
    make_sample(c, "pipeline/decode_crop_flip_224 + ColorJitter(0.4, 0.4, 0.4, 0.1) + RandomGrayscale + RandomErasing", &augmented, &data);
    let mut rand_augment = baseline.clone();
    rand_augment.transforms.push(Transform::RandAugment { num_ops: 2, magnitude: 9, num_magnitude_bins: 31 });
    make_sample(c, "pipeline/decode_crop_flip_224 + RandAugment(2, 9)", &rand_augment, &data);
    let mut auto_augment = baseline.clone();
    auto_augment.transforms.push(Transform::AutoAugment { policy: AutoAugmentPolicy::Imagenet });
    make_sample(c, "pipeline/decode_crop_flip_224 + AutoAugment(imagenet)", &auto_augment, &data);

    let image: Vec<u8> = {
        let mut rng = SplitMix64::new(5);
        (0..SIDE * SIDE * 3).map(|_| rng.below(256) as u8).collect()
    };
    let ops: [(&str, PixelOp); 18] = [
        ("brightness", PixelOp::Brightness { factor: 1.2 }),
        ("contrast", PixelOp::Contrast { factor: 1.2 }),
        ("saturation", PixelOp::Saturation { factor: 1.2 }),
        ("hue", PixelOp::Hue { factor: 0.05 }),
        ("grayscale", PixelOp::Grayscale),
        ("erase_quarter", PixelOp::Erase { top: 50, left: 50, height: 112, width: 112, value: [0; 3] }),
        ("gaussian_blur_k9_sigma1.5", PixelOp::GaussianBlur { kernel_size: [9, 9], sigma: [1.5, 1.5] }),
        ("gaussian_blur_k23_sigma2", PixelOp::GaussianBlur { kernel_size: [23, 23], sigma: [2.0, 2.0] }),
        ("sharpness", PixelOp::Sharpness { factor: 1.5 }),
        ("posterize_4", PixelOp::Posterize { bits: 4 }),
        ("solarize_128", PixelOp::Solarize { threshold: 128.0 }),
        ("autocontrast", PixelOp::AutoContrast),
        ("equalize", PixelOp::Equalize),
        ("shear_x_0.3", PixelOp::Affine { angle: 0.0, translate: [0.0, 0.0], scale: 1.0, shear: [16.7, 0.0], center: Some([0.0, 0.0]) }),
        ("translate_x_20", PixelOp::Affine { angle: 0.0, translate: [20.0, 0.0], scale: 1.0, shear: [0.0, 0.0], center: None }),
        ("rotate_9", PixelOp::Rotate { angle: 9.0 }),
        (
            "affine_rotate_17_scale_1.3_shear_5",
            PixelOp::Affine { angle: 17.3, translate: [3.0, -2.0], scale: 1.3, shear: [5.5, -3.0], center: None },
        ),
        ("invert", PixelOp::Invert),
    ];
    let mut scratch = AugmentScratch::default();
    let mut pixels = image.clone();
    for (name, op) in ops {
        c.bench_function(&format!("augment_224/{name}"), |b| {
            b.iter(|| {
                pixels.copy_from_slice(&image);
                apply(black_box(&[op]), &mut pixels, SIDE, SIDE, &mut scratch);
            });
        });
    }
    c.bench_function("augment_224/copy_only (subtract from the above)", |b| b.iter(|| pixels.copy_from_slice(black_box(&image))));
}

criterion_group!(benches, augmentations);
criterion_main!(benches);
