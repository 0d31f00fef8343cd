//! Our RandomResizedCrop boxes are the boxes torchvision's own `get_params` picks for the same
//! random numbers (tests/compat/torchvision_rrc.py runs torchvision's code on our stream).

use serde_json::json;
use stoker_plan::augment_seed;
use stoker_plan::ids::Epoch;
use stoker_plan::prng::SplitMix64;
use stoker_plan::transform::{Interpolation, Recipe, Size, Transform, TransformSpec};

use crate::fixtures::run_compat;

#[test]
#[ignore = "needs STOKER_PYTHON (make test)"]
fn crop_boxes_equal_torchvision_for_the_same_random_numbers() {
    let mut sizes = SplitMix64::new(5);
    let mut cases = Vec::new();
    let mut ours = Vec::new();
    for i in 0..200u64 {
        // Ordinary photos, tiny images, and strips that force the centre-crop fallback.
        let (width, height) = match i % 10 {
            0 => (1 + sizes.below(8) as u32, 1 + sizes.below(8) as u32),
            1 => (2000 + sizes.below(2000) as u32, 3 + sizes.below(10) as u32),
            2 => (5 + sizes.below(10) as u32, 1500),
            _ => (100 + sizes.below(1900) as u32, 100 + sizes.below(1900) as u32),
        };
        let (scale, ratio) = if i % 4 == 3 { ((0.35, 0.9), (0.5, 2.0)) } else { ((0.08, 1.0), (3.0 / 4.0, 4.0 / 3.0)) };
        let seed = augment_seed(42, Epoch(i % 3), i);
        let spec = TransformSpec::new(vec![Transform::RandomResizedCrop {
            size: Size::square(224),
            scale,
            ratio,
            interpolation: Interpolation::Bilinear,
        }]);
        let p = Recipe::new(&spec).expect("valid").sample(width, height, seed).placement;
        ours.push(json!([p.src_top as u32, p.src_left as u32, p.src_height as u32, p.src_width as u32]));
        cases.push(json!({"width": width, "height": height, "seed": seed, "scale": [scale.0, scale.1], "ratio": [ratio.0, ratio.1]}));
    }
    let theirs = run_compat("torchvision_rrc.py", &json!(cases));
    let theirs = theirs.as_array().expect("list");
    assert_eq!(theirs.len(), 200);
    for (i, (a, b)) in ours.iter().zip(theirs).enumerate() {
        assert_eq!(a, b, "case {i}: {} -> ours [i, j, h, w] = {a}, torchvision {b}", cases[i]);
    }
}
