//! Our pixels against Pillow's crop + bilinear resize of the same box (what torchvision does to
//! a PIL image): PSNR ≥ 38 dB with full-scale decode, ≥ 30 dB with DCT scaling.

use serde_json::json;
use stoker_pipeline::SampleMaker;
use stoker_plan::transform::{Interpolation, Recipe, Size, Transform, TransformSpec};

use crate::fixtures::{run_compat, varied_jpegs};

fn psnr_against_pillow(dct_scaling: bool) -> (Vec<f64>, usize) {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut spec = TransformSpec::new(vec![Transform::RandomResizedCrop {
        size: Size::square(224),
        scale: (0.08, 1.0),
        ratio: (3.0 / 4.0, 4.0 / 3.0),
        interpolation: Interpolation::Bilinear,
    }]);
    spec.dct_scaling = dct_scaling;
    let recipe = Recipe::new(&spec).expect("valid");
    let mut maker = SampleMaker::new(recipe).expect("maker");
    let mut slot = vec![0u8; recipe.sample_bytes()];
    let mut cases = Vec::new();
    let mut scaled = 0;
    for (i, (_, _, bytes)) in varied_jpegs(200).into_iter().enumerate() {
        let path = dir.path().join(format!("{i}.jpg"));
        std::fs::write(&path, &bytes).expect("write");
        let report = maker.make(&bytes, 1000 + i as u64, &mut slot).expect("decode");
        if report.scale_num < 8 {
            scaled += 1;
        }
        let output = dir.path().join(format!("{i}.rgb"));
        std::fs::write(&output, &slot).expect("write");
        let p = report.geometry.placement;
        cases.push(json!({"path": path, "box": [p.src_left, p.src_top, p.src_width, p.src_height], "size": [224, 224], "output": output}));
    }
    let psnr: Vec<f64> =
        run_compat("pillow_psnr.py", &json!(cases)).as_array().expect("list").iter().map(|v| v.as_f64().expect("number")).collect();
    assert_eq!(psnr.len(), 200);
    (psnr, scaled)
}

fn summary(psnr: &[f64]) -> String {
    let min = psnr.iter().copied().fold(f64::INFINITY, f64::min);
    let mean = psnr.iter().sum::<f64>() / psnr.len() as f64;
    format!("min {min:.1} dB, mean {mean:.1} dB")
}

#[test]
#[ignore = "needs STOKER_PYTHON (make test)"]
fn full_scale_decode_matches_pillow_within_38_db() {
    let (psnr, scaled) = psnr_against_pillow(false);
    assert_eq!(scaled, 0, "dct_scaling=false must never scale");
    for (i, value) in psnr.iter().enumerate() {
        assert!(*value >= 38.0, "image {i}: {value:.1} dB < 38 ({})", summary(&psnr));
    }
    eprintln!("full-scale decode vs Pillow: {}", summary(&psnr));
}

#[test]
#[ignore = "needs STOKER_PYTHON (make test)"]
fn dct_scaled_decode_matches_pillow_within_30_db() {
    let (psnr, scaled) = psnr_against_pillow(true);
    assert!(scaled >= 20, "only {scaled} of 200 images used DCT scaling: the test does not exercise it");
    for (i, value) in psnr.iter().enumerate() {
        assert!(*value >= 30.0, "image {i}: {value:.1} dB < 30 ({})", summary(&psnr));
    }
    eprintln!("DCT-scaled decode vs Pillow ({scaled} of 200 scaled): {}", summary(&psnr));
}
