//! torchvision v2's `TrivialAugmentWide`, `RandAugment` and `AutoAugment`: the op set, its magnitude tables
//! and the draws, in torchvision's order (op, magnitude bin, sign), with the ops' defaults
//! (nearest interpolation, fill 0). Each draw becomes explicit [`PixelOp`]s as
//! `_apply_image_or_video_transform` maps them (ShearX → `affine(shear=[degrees(atan(m)), 0],
//! center=[0, 0])`, Color → `adjust_saturation(1 + m)`, ...).

use super::AutoAugmentPolicy;
use super::augment::PixelOp;
use crate::prng::SplitMix64;

/// The ops, in the order of torchvision's `_AUGMENTATION_SPACE` (the index a draw picks).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum AutoOp {
    Identity,
    ShearX,
    ShearY,
    TranslateX,
    TranslateY,
    Rotate,
    Brightness,
    Color,
    Contrast,
    Sharpness,
    Posterize,
    Solarize,
    AutoContrast,
    Equalize,
    /// Only in `AutoAugment`'s policies.
    Invert,
}

const OPS: [AutoOp; 14] = [
    AutoOp::Identity,
    AutoOp::ShearX,
    AutoOp::ShearY,
    AutoOp::TranslateX,
    AutoOp::TranslateY,
    AutoOp::Rotate,
    AutoOp::Brightness,
    AutoOp::Color,
    AutoOp::Contrast,
    AutoOp::Sharpness,
    AutoOp::Posterize,
    AutoOp::Solarize,
    AutoOp::AutoContrast,
    AutoOp::Equalize,
];

/// Which policy's magnitude tables.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Policy {
    /// `TrivialAugmentWide`: one op per image, a random magnitude bin.
    TrivialAugmentWide,
    /// `RandAugment`: `num_ops` ops per image at one fixed magnitude bin.
    RandAugment,
}

/// `torch.linspace(start, end, steps)[index]`, computed exactly and rounded once to float32
/// (the float32 value torchvision passes on). torch's own kernel can be a unit in the last place
/// off, depending on the CPU's vector width (on AVX-512, bin 15 of `linspace(0, 32, 31)` is
/// 15.999999, so its TranslateX moves 15 pixels where Stoker moves 16): a magnitude table that
/// changed with the machine would break the determinism contract, so Stoker takes the exact one.
fn linspace(start: f64, end: f64, steps: u32, index: u32) -> f64 {
    if steps == 1 {
        return f64::from(start as f32);
    }
    f64::from((start + (end - start) * f64::from(index) / f64::from(steps - 1)) as f32)
}

/// The magnitude of `op` at `bin` of `bins` for a `width` × `height` image, and whether it is
/// signed; `None` for the ops without one.
fn magnitude(policy: Policy, op: AutoOp, bins: u32, bin: u32, width: u32, height: u32) -> Option<(f64, bool)> {
    let wide = policy == Policy::TrivialAugmentWide;
    let signed = |high: f64| Some((linspace(0.0, high, bins, bin), true));
    match op {
        AutoOp::Identity | AutoOp::AutoContrast | AutoOp::Equalize | AutoOp::Invert => None,
        AutoOp::ShearX | AutoOp::ShearY => signed(if wide { 0.99 } else { 0.3 }),
        AutoOp::TranslateX if !wide => signed(150.0 / 331.0 * f64::from(width)),
        AutoOp::TranslateY if !wide => signed(150.0 / 331.0 * f64::from(height)),
        AutoOp::TranslateX | AutoOp::TranslateY => signed(32.0),
        AutoOp::Rotate => signed(if wide { 135.0 } else { 30.0 }),
        AutoOp::Brightness | AutoOp::Color | AutoOp::Contrast | AutoOp::Sharpness => signed(if wide { 0.99 } else { 0.9 }),
        AutoOp::Posterize => {
            // `(8 - (arange(bins) / ((bins - 1) / k))).round().int()`, k = 6 (wide) or 4,
            // exactly (torch rounds halves to even).
            let k = if wide { 6.0 } else { 4.0 };
            let bits = (8.0 - f64::from(bin) * k / f64::from(bins - 1)).round_ties_even();
            Some((bits, false))
        }
        AutoOp::Solarize => Some((linspace(1.0, 0.0, bins, bin), false)),
    }
}

/// The explicit operation `op` at `magnitude` is, as torchvision applies it.
fn pixel_op(op: AutoOp, magnitude: f64) -> Option<PixelOp> {
    let shear = magnitude.atan().to_degrees();
    Some(match op {
        AutoOp::Identity => return None,
        AutoOp::ShearX => PixelOp::Affine { angle: 0.0, translate: [0.0, 0.0], scale: 1.0, shear: [shear, 0.0], center: Some([0.0, 0.0]) },
        AutoOp::ShearY => PixelOp::Affine { angle: 0.0, translate: [0.0, 0.0], scale: 1.0, shear: [0.0, shear], center: Some([0.0, 0.0]) },
        // `int(magnitude)`: toward zero.
        AutoOp::TranslateX => {
            PixelOp::Affine { angle: 0.0, translate: [magnitude.trunc(), 0.0], scale: 1.0, shear: [0.0, 0.0], center: None }
        }
        AutoOp::TranslateY => {
            PixelOp::Affine { angle: 0.0, translate: [0.0, magnitude.trunc()], scale: 1.0, shear: [0.0, 0.0], center: None }
        }
        AutoOp::Rotate => PixelOp::Rotate { angle: magnitude },
        AutoOp::Brightness => PixelOp::Brightness { factor: 1.0 + magnitude },
        AutoOp::Color => PixelOp::Saturation { factor: 1.0 + magnitude },
        AutoOp::Contrast => PixelOp::Contrast { factor: 1.0 + magnitude },
        AutoOp::Sharpness => PixelOp::Sharpness { factor: 1.0 + magnitude },
        // Bits 0..=8 come from the table above.
        AutoOp::Posterize => PixelOp::Posterize { bits: magnitude.clamp(0.0, 8.0) as u8 },
        AutoOp::Solarize => PixelOp::Solarize { threshold: 255.0 * magnitude },
        AutoOp::AutoContrast => PixelOp::AutoContrast,
        AutoOp::Equalize => PixelOp::Equalize,
        AutoOp::Invert => PixelOp::Invert,
    })
}

/// One op of `policy`: uniform over the 14, its magnitude at `bin` (drawn by the caller),
/// negated with probability 1/2 where signed (`torch.rand(()) <= 0.5`).
fn draw_one(policy: Policy, rng: &mut SplitMix64, bins: u32, bin_opt: Option<u32>, width: u32, height: u32, ops: &mut Vec<PixelOp>) {
    let op = OPS[rng.below(OPS.len() as u64) as usize];
    let bin = bin_opt.unwrap_or_else(|| {
        // TrivialAugmentWide draws the bin only for ops with a magnitude.
        if magnitude(policy, op, bins, 0, width, height).is_some() { rng.below(u64::from(bins)) as u32 } else { 0 }
    });
    let drawn = match magnitude(policy, op, bins, bin, width, height) {
        Some((value, true)) if rng.next_f64() <= 0.5 => -value,
        Some((value, _)) => value,
        None => 0.0,
    };
    if let Some(pixel_op) = pixel_op(op, drawn) {
        ops.push(pixel_op);
    }
}

/// `TrivialAugmentWide(num_magnitude_bins=bins)`'s draw for one image.
pub(super) fn trivial_augment_wide(rng: &mut SplitMix64, bins: u32, width: u32, height: u32, ops: &mut Vec<PixelOp>) {
    draw_one(Policy::TrivialAugmentWide, rng, bins, None, width, height, ops);
}

/// `RandAugment(num_ops, magnitude, num_magnitude_bins=bins)`'s draw for one image.
pub(super) fn rand_augment(
    rng: &mut SplitMix64,
    num_ops: u32,
    magnitude_bin: u32,
    bins: u32,
    width: u32,
    height: u32,
    ops: &mut Vec<PixelOp>,
) {
    for _ in 0..num_ops {
        draw_one(Policy::RandAugment, rng, bins, Some(magnitude_bin), width, height, ops);
    }
}

/// One sub-policy of `AutoAugment`: two (op, probability, magnitude bin) steps.
type SubPolicy = [(AutoOp, f64, Option<u32>); 2];

/// The magnitude bins of `AutoAugment`'s tables (`magnitudes_fn(10, height, width)`).
const AUTO_AUGMENT_BINS: u32 = 10;

/// `AutoAugmentPolicy.IMAGENET`'s sub-policies: (op, probability, magnitude bin).
const IMAGENET: [SubPolicy; 25] = [
    [(AutoOp::Posterize, 0.4, Some(8)), (AutoOp::Rotate, 0.6, Some(9))],
    [(AutoOp::Solarize, 0.6, Some(5)), (AutoOp::AutoContrast, 0.6, None)],
    [(AutoOp::Equalize, 0.8, None), (AutoOp::Equalize, 0.6, None)],
    [(AutoOp::Posterize, 0.6, Some(7)), (AutoOp::Posterize, 0.6, Some(6))],
    [(AutoOp::Equalize, 0.4, None), (AutoOp::Solarize, 0.2, Some(4))],
    [(AutoOp::Equalize, 0.4, None), (AutoOp::Rotate, 0.8, Some(8))],
    [(AutoOp::Solarize, 0.6, Some(3)), (AutoOp::Equalize, 0.6, None)],
    [(AutoOp::Posterize, 0.8, Some(5)), (AutoOp::Equalize, 1.0, None)],
    [(AutoOp::Rotate, 0.2, Some(3)), (AutoOp::Solarize, 0.6, Some(8))],
    [(AutoOp::Equalize, 0.6, None), (AutoOp::Posterize, 0.4, Some(6))],
    [(AutoOp::Rotate, 0.8, Some(8)), (AutoOp::Color, 0.4, Some(0))],
    [(AutoOp::Rotate, 0.4, Some(9)), (AutoOp::Equalize, 0.6, None)],
    [(AutoOp::Equalize, 0.0, None), (AutoOp::Equalize, 0.8, None)],
    [(AutoOp::Invert, 0.6, None), (AutoOp::Equalize, 1.0, None)],
    [(AutoOp::Color, 0.6, Some(4)), (AutoOp::Contrast, 1.0, Some(8))],
    [(AutoOp::Rotate, 0.8, Some(8)), (AutoOp::Color, 1.0, Some(2))],
    [(AutoOp::Color, 0.8, Some(8)), (AutoOp::Solarize, 0.8, Some(7))],
    [(AutoOp::Sharpness, 0.4, Some(7)), (AutoOp::Invert, 0.6, None)],
    [(AutoOp::ShearX, 0.6, Some(5)), (AutoOp::Equalize, 1.0, None)],
    [(AutoOp::Color, 0.4, Some(0)), (AutoOp::Equalize, 0.6, None)],
    [(AutoOp::Equalize, 0.4, None), (AutoOp::Solarize, 0.2, Some(4))],
    [(AutoOp::Solarize, 0.6, Some(5)), (AutoOp::AutoContrast, 0.6, None)],
    [(AutoOp::Invert, 0.6, None), (AutoOp::Equalize, 1.0, None)],
    [(AutoOp::Color, 0.6, Some(4)), (AutoOp::Contrast, 1.0, Some(8))],
    [(AutoOp::Equalize, 0.8, None), (AutoOp::Equalize, 0.6, None)],
];

/// `AutoAugmentPolicy.CIFAR10`'s sub-policies: (op, probability, magnitude bin).
const CIFAR10: [SubPolicy; 25] = [
    [(AutoOp::Invert, 0.1, None), (AutoOp::Contrast, 0.2, Some(6))],
    [(AutoOp::Rotate, 0.7, Some(2)), (AutoOp::TranslateX, 0.3, Some(9))],
    [(AutoOp::Sharpness, 0.8, Some(1)), (AutoOp::Sharpness, 0.9, Some(3))],
    [(AutoOp::ShearY, 0.5, Some(8)), (AutoOp::TranslateY, 0.7, Some(9))],
    [(AutoOp::AutoContrast, 0.5, None), (AutoOp::Equalize, 0.9, None)],
    [(AutoOp::ShearY, 0.2, Some(7)), (AutoOp::Posterize, 0.3, Some(7))],
    [(AutoOp::Color, 0.4, Some(3)), (AutoOp::Brightness, 0.6, Some(7))],
    [(AutoOp::Sharpness, 0.3, Some(9)), (AutoOp::Brightness, 0.7, Some(9))],
    [(AutoOp::Equalize, 0.6, None), (AutoOp::Equalize, 0.5, None)],
    [(AutoOp::Contrast, 0.6, Some(7)), (AutoOp::Sharpness, 0.6, Some(5))],
    [(AutoOp::Color, 0.7, Some(7)), (AutoOp::TranslateX, 0.5, Some(8))],
    [(AutoOp::Equalize, 0.3, None), (AutoOp::AutoContrast, 0.4, None)],
    [(AutoOp::TranslateY, 0.4, Some(3)), (AutoOp::Sharpness, 0.2, Some(6))],
    [(AutoOp::Brightness, 0.9, Some(6)), (AutoOp::Color, 0.2, Some(8))],
    [(AutoOp::Solarize, 0.5, Some(2)), (AutoOp::Invert, 0.0, None)],
    [(AutoOp::Equalize, 0.2, None), (AutoOp::AutoContrast, 0.6, None)],
    [(AutoOp::Equalize, 0.2, None), (AutoOp::Equalize, 0.6, None)],
    [(AutoOp::Color, 0.9, Some(9)), (AutoOp::Equalize, 0.6, None)],
    [(AutoOp::AutoContrast, 0.8, None), (AutoOp::Solarize, 0.2, Some(8))],
    [(AutoOp::Brightness, 0.1, Some(3)), (AutoOp::Color, 0.7, Some(0))],
    [(AutoOp::Solarize, 0.4, Some(5)), (AutoOp::AutoContrast, 0.9, None)],
    [(AutoOp::TranslateY, 0.9, Some(9)), (AutoOp::TranslateY, 0.7, Some(9))],
    [(AutoOp::AutoContrast, 0.9, None), (AutoOp::Solarize, 0.8, Some(3))],
    [(AutoOp::Equalize, 0.8, None), (AutoOp::Invert, 0.1, None)],
    [(AutoOp::TranslateY, 0.7, Some(9)), (AutoOp::AutoContrast, 0.9, None)],
];

/// `AutoAugmentPolicy.SVHN`'s sub-policies: (op, probability, magnitude bin).
const SVHN: [SubPolicy; 25] = [
    [(AutoOp::ShearX, 0.9, Some(4)), (AutoOp::Invert, 0.2, None)],
    [(AutoOp::ShearY, 0.9, Some(8)), (AutoOp::Invert, 0.7, None)],
    [(AutoOp::Equalize, 0.6, None), (AutoOp::Solarize, 0.6, Some(6))],
    [(AutoOp::Invert, 0.9, None), (AutoOp::Equalize, 0.6, None)],
    [(AutoOp::Equalize, 0.6, None), (AutoOp::Rotate, 0.9, Some(3))],
    [(AutoOp::ShearX, 0.9, Some(4)), (AutoOp::AutoContrast, 0.8, None)],
    [(AutoOp::ShearY, 0.9, Some(8)), (AutoOp::Invert, 0.4, None)],
    [(AutoOp::ShearY, 0.9, Some(5)), (AutoOp::Solarize, 0.2, Some(6))],
    [(AutoOp::Invert, 0.9, None), (AutoOp::AutoContrast, 0.8, None)],
    [(AutoOp::Equalize, 0.6, None), (AutoOp::Rotate, 0.9, Some(3))],
    [(AutoOp::ShearX, 0.9, Some(4)), (AutoOp::Solarize, 0.3, Some(3))],
    [(AutoOp::ShearY, 0.8, Some(8)), (AutoOp::Invert, 0.7, None)],
    [(AutoOp::Equalize, 0.9, None), (AutoOp::TranslateY, 0.6, Some(6))],
    [(AutoOp::Invert, 0.9, None), (AutoOp::Equalize, 0.6, None)],
    [(AutoOp::Contrast, 0.3, Some(3)), (AutoOp::Rotate, 0.8, Some(4))],
    [(AutoOp::Invert, 0.8, None), (AutoOp::TranslateY, 0.0, Some(2))],
    [(AutoOp::ShearY, 0.7, Some(6)), (AutoOp::Solarize, 0.4, Some(8))],
    [(AutoOp::Invert, 0.6, None), (AutoOp::Rotate, 0.8, Some(4))],
    [(AutoOp::ShearY, 0.3, Some(7)), (AutoOp::TranslateX, 0.9, Some(3))],
    [(AutoOp::ShearX, 0.1, Some(6)), (AutoOp::Invert, 0.6, None)],
    [(AutoOp::Solarize, 0.7, Some(2)), (AutoOp::TranslateY, 0.6, Some(7))],
    [(AutoOp::ShearY, 0.8, Some(4)), (AutoOp::Invert, 0.8, None)],
    [(AutoOp::ShearX, 0.7, Some(9)), (AutoOp::TranslateY, 0.8, Some(3))],
    [(AutoOp::ShearY, 0.8, Some(5)), (AutoOp::AutoContrast, 0.7, None)],
    [(AutoOp::ShearX, 0.7, Some(2)), (AutoOp::Invert, 0.1, None)],
];

/// `AutoAugment(policy)`'s draw for one image: a sub-policy uniformly, then each of its two
/// steps with its probability (`torch.rand(()) <= p`), at its magnitude bin of the same tables as
/// `RandAugment`'s (10 bins), negated half the time where signed.
pub(super) fn auto_augment(rng: &mut SplitMix64, policy: AutoAugmentPolicy, width: u32, height: u32, ops: &mut Vec<PixelOp>) {
    let policies: &[SubPolicy] = match policy {
        AutoAugmentPolicy::Imagenet => &IMAGENET,
        AutoAugmentPolicy::Cifar10 => &CIFAR10,
        AutoAugmentPolicy::Svhn => &SVHN,
    };
    let chosen = policies[rng.below(policies.len() as u64) as usize];
    for (op, probability, bin_opt) in chosen {
        if rng.next_f64() > probability {
            continue;
        }
        let drawn = match bin_opt.and_then(|bin| magnitude(Policy::RandAugment, op, AUTO_AUGMENT_BINS, bin, width, height)) {
            Some((value, true)) if rng.next_f64() <= 0.5 => -value,
            Some((value, _)) => value,
            None => 0.0,
        };
        if let Some(pixel_op) = pixel_op(op, drawn) {
            ops.push(pixel_op);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn magnitude_tables_are_torchvisions() {
        // RandAugment(magnitude=9) of 31 bins: 9/30 of each range.
        let at9 = |op| magnitude(Policy::RandAugment, op, 31, 9, 224, 224).map(|(value, _)| value);
        assert!((at9(AutoOp::Rotate).unwrap_or_default() - 9.0).abs() < 1e-5);
        assert!((at9(AutoOp::ShearX).unwrap_or_default() - 0.09).abs() < 1e-6);
        assert!((at9(AutoOp::TranslateX).unwrap_or_default() - 150.0 / 331.0 * 224.0 * 0.3).abs() < 1e-4);
        assert_eq!(at9(AutoOp::Posterize), Some(7.0), "8 - 9/7.5 = 6.8, rounded");
        assert!((at9(AutoOp::Solarize).unwrap_or_default() - 0.7).abs() < 1e-6);
        assert_eq!(at9(AutoOp::Equalize), None);
        // TrivialAugmentWide's posterize bits run from 8 down to 2, its translation to 32 px.
        let wide = |op, bin| magnitude(Policy::TrivialAugmentWide, op, 31, bin, 224, 224).map(|(value, _)| value);
        assert_eq!((wide(AutoOp::Posterize, 0), wide(AutoOp::Posterize, 30)), (Some(8.0), Some(2.0)));
        assert_eq!(wide(AutoOp::TranslateX, 30), Some(32.0));
        assert_eq!(wide(AutoOp::TranslateX, 15), Some(16.0), "exact, whatever the CPU");
        assert_eq!(wide(AutoOp::Rotate, 20), Some(90.0));
    }

    #[test]
    fn ops_map_as_torchvision_applies_them() {
        assert_eq!(pixel_op(AutoOp::Color, -0.25), Some(PixelOp::Saturation { factor: 0.75 }));
        assert_eq!(pixel_op(AutoOp::Solarize, 0.5), Some(PixelOp::Solarize { threshold: 127.5 }));
        assert_eq!(
            pixel_op(AutoOp::TranslateY, -7.9),
            Some(PixelOp::Affine { angle: 0.0, translate: [0.0, -7.0], scale: 1.0, shear: [0.0, 0.0], center: None })
        );
        let Some(PixelOp::Affine { shear, center: Some([0.0, 0.0]), .. }) = pixel_op(AutoOp::ShearX, 1.0) else { panic!("a shear") };
        assert!((shear[0] - 45.0).abs() < 1e-9 && shear[1] == 0.0);
        assert_eq!(pixel_op(AutoOp::Identity, 0.0), None);
    }

    #[test]
    fn every_op_and_both_signs_are_drawn() {
        let mut seen = std::collections::HashSet::new();
        let (mut negative, mut positive) = (0, 0);
        let mut ops = Vec::new();
        for seed in 0..3000 {
            ops.clear();
            rand_augment(&mut SplitMix64::new(seed), 2, 9, 31, 224, 224, &mut ops);
            assert!(ops.len() <= 2);
            for op in &ops {
                seen.insert(std::mem::discriminant(op));
                match *op {
                    PixelOp::Rotate { angle } if angle < 0.0 => negative += 1,
                    PixelOp::Rotate { .. } => positive += 1,
                    _ => {}
                }
            }
        }
        // Affine, rotate, brightness, saturation, contrast, sharpness, posterize, solarize,
        // autocontrast, equalize.
        assert_eq!(seen.len(), 10);
        assert!(negative > 100 && positive > 100, "{negative} negative, {positive} positive rotations");
    }
}
