//! Transform specs from JSON (`TransformSpec`), checked into a `Recipe`, and the per-sample
//! geometry and per-pixel operations it draws for an arbitrary source size and seed: never a
//! panic or an overflow, boxes inside the source and the output, and drawn operations whose
//! parameters `PixelOp::check` accepts (what the worker applies without checking).
#![no_main]

use libfuzzer_sys::fuzz_target;
use stoker_plan::transform::{PixelOp, Recipe, TransformSpec};
use stoker_fuzz::transform_input;

fuzz_target!(|data: &[u8]| {
    let Some((width, height, seed, json)) = transform_input::decode(data) else { return };
    let Ok(spec) = serde_json::from_slice::<TransformSpec>(json) else { return };
    let Ok(recipe) = Recipe::new(&spec) else { return };
    let text = serde_json::to_string(&spec).expect("a spec serialises");
    let again: TransformSpec = serde_json::from_str(&text).unwrap_or_else(|error| panic!("{text} does not parse again: {error}"));
    assert_eq!(Recipe::new(&again).ok(), Some(recipe), "{text}");

    let size = recipe.output_size();
    let _ = (recipe.dtype().name(), recipe.sample_bytes());
    for samples in [0, 1, seed as u32, u32::MAX] {
        let shape = recipe.batch_shape(samples);
        assert_eq!(
            shape.iter().map(|&side| u64::from(side)).product::<u64>(),
            u64::from(samples) * recipe.sample_bytes() as u64 / recipe.dtype().size() as u64
        );
    }
    let geometry = recipe.sample(width, height, seed);
    assert_eq!(geometry, recipe.sample(width, height, seed), "not a pure function of the seed");
    let p = geometry.placement;
    let (w, h) = (f64::from(width), f64::from(height));
    let eps = 1e-6 * w.max(h).max(1.0);
    assert!(p.src_left >= 0.0 && p.src_top >= 0.0, "{p:?}");
    assert!(p.src_left + p.src_width <= w + eps && p.src_top + p.src_height <= h + eps, "{p:?} outside {width}x{height}");
    assert!(u64::from(p.dst_left) + u64::from(p.dst_width) <= u64::from(size.width), "{p:?} outside {size:?}");
    assert!(u64::from(p.dst_top) + u64::from(p.dst_height) <= u64::from(size.height), "{p:?} outside {size:?}");

    let mut ops = Vec::new();
    recipe.augmentations.draw(seed, size.width, size.height, &mut ops);
    let mut again = Vec::new();
    recipe.augmentations.draw(seed, size.width, size.height, &mut again);
    assert_eq!(ops, again, "not a pure function of the seed");
    for op in &ops {
        op.check().unwrap_or_else(|error| panic!("drawn {op:?}: {error}"));
        if let PixelOp::Erase { top, left, height, width, .. } = *op {
            assert!(top + height <= size.height && left + width <= size.width, "{op:?} outside {size:?}");
        }
    }
});
