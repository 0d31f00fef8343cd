//! The per-pixel augmentations: what a spec may ask for ([`Augmentation`], checked), and what
//! one sample gets ([`PixelOp`]s with explicit parameters), drawn from the sample's seed.
//!
//! They run after the geometry and the flip, on the uint8 image, before `Normalize`. Each
//! augmentation draws from its own stream, `derive_seed(PixelAugment, [augment seed, index])`,
//! never from the crop's: adding one to a recipe changes neither the crop nor the flip, and
//! changes no other augmentation's draws when appended. The draws follow torchvision v2's
//! `make_params` step for step (the same quantities in the same order), with Stoker's
//! SplitMix64 instead of torch's generator.

use serde::{Deserialize, Serialize};

use super::{AngleRange, AutoAugmentPolicy, ShearRange, Transform, auto_augment};
use crate::error::TransformError;
use crate::prng::{SeedDomain, SplitMix64, derive_seed};

/// Most per-pixel augmentations one recipe holds (keeps [`super::Recipe`] `Copy`).
pub const MAX_AUGMENTATIONS: usize = 8;

/// Largest Gaussian kernel side accepted.
const MAX_KERNEL: u32 = 255;

/// A kernel size, `[width, height]` in pixels (torchvision's order); JSON `5` or `[5, 3]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(from = "KernelSizeRepr", into = "KernelSizeRepr")]
pub struct KernelSize {
    /// Columns (the horizontal pass).
    pub width: u32,
    /// Rows (the vertical pass).
    pub height: u32,
}

#[derive(Clone, Copy, Serialize, Deserialize)]
#[serde(untagged)]
enum KernelSizeRepr {
    Square(u32),
    WidthHeight([u32; 2]),
}

impl From<KernelSizeRepr> for KernelSize {
    fn from(repr: KernelSizeRepr) -> Self {
        match repr {
            KernelSizeRepr::Square(side) => Self { width: side, height: side },
            KernelSizeRepr::WidthHeight([width, height]) => Self { width, height },
        }
    }
}

impl From<KernelSize> for KernelSizeRepr {
    fn from(size: KernelSize) -> Self {
        if size.width == size.height { Self::Square(size.width) } else { Self::WidthHeight([size.width, size.height]) }
    }
}

/// The fill of `RandomErasing`, in uint8 pixel levels: JSON `0` (every channel) or `[r, g, b]`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(from = "ErasingValueRepr", into = "ErasingValueRepr")]
pub struct ErasingValue(pub [u8; 3]);

#[derive(Clone, Copy, Serialize, Deserialize)]
#[serde(untagged)]
enum ErasingValueRepr {
    Gray(u8),
    Rgb([u8; 3]),
}

impl From<ErasingValueRepr> for ErasingValue {
    fn from(repr: ErasingValueRepr) -> Self {
        match repr {
            ErasingValueRepr::Gray(level) => Self([level; 3]),
            ErasingValueRepr::Rgb(rgb) => Self(rgb),
        }
    }
}

impl From<ErasingValue> for ErasingValueRepr {
    fn from(value: ErasingValue) -> Self {
        let [r, g, b] = value.0;
        if r == g && g == b { Self::Gray(r) } else { Self::Rgb(value.0) }
    }
}

/// One checked per-pixel augmentation of a recipe.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Augmentation {
    /// torchvision v2's `ColorJitter`: each factor range, `None` where it is left alone.
    ColorJitter {
        /// Brightness factor range.
        brightness: Option<(f64, f64)>,
        /// Contrast factor range.
        contrast: Option<(f64, f64)>,
        /// Saturation factor range.
        saturation: Option<(f64, f64)>,
        /// Hue shift range, in turns.
        hue: Option<(f64, f64)>,
    },
    /// `RandomGrayscale(p)`.
    RandomGrayscale {
        /// Probability.
        p: f64,
    },
    /// `RandomErasing(p, scale, ratio, value)`.
    RandomErasing {
        /// Probability.
        p: f64,
        /// Area fraction range.
        scale: (f64, f64),
        /// Natural logarithms of the aspect ratio range (torchvision draws the log uniformly).
        log_ratio: (f64, f64),
        /// Fill.
        value: [u8; 3],
    },
    /// `GaussianBlur(kernel_size, sigma)`.
    GaussianBlur {
        /// Kernel size.
        kernel_size: KernelSize,
        /// Standard deviation range.
        sigma: (f64, f64),
    },
    /// `TrivialAugmentWide(num_magnitude_bins)`.
    TrivialAugmentWide {
        /// Magnitude bins.
        bins: u32,
    },
    /// `RandAugment(num_ops, magnitude, num_magnitude_bins)`.
    RandAugment {
        /// Ops per image.
        num_ops: u32,
        /// Magnitude bin.
        magnitude: u32,
        /// Magnitude bins.
        bins: u32,
    },
    /// `AutoAugment(policy)`.
    AutoAugment {
        /// The learned policy.
        policy: AutoAugmentPolicy,
    },
    /// `RandomRotation(degrees)`.
    RandomRotation {
        /// Angle range, degrees.
        degrees: (f64, f64),
    },
    /// `RandomAffine(degrees, translate, scale, shear)`.
    RandomAffine {
        /// Angle range, degrees.
        degrees: (f64, f64),
        /// Largest shift as fractions of the width and height.
        translate: Option<(f64, f64)>,
        /// Scale range.
        scale: Option<(f64, f64)>,
        /// Shear ranges, degrees: x, and y if drawn.
        shear: Option<ShearRange>,
    },
}

/// One augmentation with the parameters drawn for one sample, applied as torchvision v2's
/// functional of the same name applies it to a uint8 tensor. Also the JSON `stoker augment`
/// reads, so tests can give explicit parameters.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum PixelOp {
    /// `adjust_brightness(factor)`: every value times `factor`.
    Brightness {
        /// Non-negative factor; 1 leaves the image alone.
        factor: f64,
    },
    /// `adjust_contrast(factor)`: blend with the image's mean gray level.
    Contrast {
        /// Non-negative factor; 1 leaves the image alone.
        factor: f64,
    },
    /// `adjust_saturation(factor)`: blend with each pixel's gray level.
    Saturation {
        /// Non-negative factor; 1 leaves the image alone, 0 makes it gray.
        factor: f64,
    },
    /// `adjust_hue(factor)`: turn the hue by `factor` turns (HSV).
    Hue {
        /// Shift in `[-0.5, 0.5]`.
        factor: f64,
    },
    /// `rgb_to_grayscale(num_output_channels=3)`.
    Grayscale,
    /// `erase(i=top, j=left, h=height, w=width, v=value)`.
    Erase {
        /// First row.
        top: u32,
        /// First column.
        left: u32,
        /// Rows.
        height: u32,
        /// Columns.
        width: u32,
        /// Fill, in pixel levels.
        value: [u8; 3],
    },
    /// `gaussian_blur(kernel_size=[width, height], sigma=[x, y])`.
    GaussianBlur {
        /// Kernel `[width, height]`, odd.
        kernel_size: [u32; 2],
        /// Standard deviation `[horizontal, vertical]`, positive.
        sigma: [f64; 2],
    },
    /// `adjust_sharpness(factor)`: blend the inner pixels with a 3×3 smoothing.
    Sharpness {
        /// Non-negative factor; 1 leaves the image alone.
        factor: f64,
    },
    /// `posterize(bits)`: keep the top `bits` bits of every value.
    Posterize {
        /// 0 to 8.
        bits: u8,
    },
    /// `solarize(threshold)`: invert values at or above `threshold`.
    Solarize {
        /// In levels, at most 255.
        threshold: f64,
    },
    /// `autocontrast`: stretch each channel to 0–255.
    AutoContrast,
    /// `equalize`: histogram equalisation per channel.
    Equalize,
    /// `affine(angle, translate, scale, shear, NEAREST, fill=0, center)`.
    Affine {
        /// Rotation, degrees, counter-clockwise.
        angle: f64,
        /// Translation `[x, y]`, pixels.
        translate: [f64; 2],
        /// Scale factor, positive (1 when absent).
        #[serde(default = "unit_scale")]
        scale: f64,
        /// Shear `[x, y]`, degrees.
        shear: [f64; 2],
        /// Centre in pixels from the top-left corner; `None`: the image centre.
        center: Option<[f64; 2]>,
    },
    /// `rotate(angle, NEAREST, expand=False, fill=0)` about the centre.
    Rotate {
        /// Degrees, counter-clockwise.
        angle: f64,
    },
    /// `invert`: every value `v` becomes `255 - v`.
    Invert,
}

fn unit_scale() -> f64 {
    1.0
}

impl PixelOp {
    /// Check the explicit parameters (what torchvision's functionals refuse, refused here).
    pub fn check(&self) -> Result<(), TransformError> {
        let problem = match *self {
            Self::Brightness { factor } | Self::Contrast { factor } | Self::Saturation { factor } | Self::Sharpness { factor }
                if !(factor >= 0.0 && factor.is_finite()) =>
            {
                format!("factor must be finite and non-negative, got {factor}")
            }
            Self::Hue { factor } if !(-0.5..=0.5).contains(&factor) => format!("hue factor must be in [-0.5, 0.5], got {factor}"),
            Self::GaussianBlur { kernel_size, sigma }
                if kernel_size.iter().any(|&k| k % 2 == 0 || k > MAX_KERNEL) || sigma.iter().any(|&s| !(s > 0.0 && s.is_finite())) =>
            {
                format!("kernel sizes must be odd and at most {MAX_KERNEL}, sigmas positive; got {kernel_size:?}, {sigma:?}")
            }
            Self::Posterize { bits } if bits > 8 => format!("bits must be at most 8, got {bits}"),
            Self::Solarize { threshold } if !(threshold <= 255.0 && threshold.is_finite()) => {
                format!("threshold must be finite and at most 255, got {threshold}")
            }
            Self::Affine { angle, translate, scale, shear, center }
                if ![angle, translate[0], translate[1], scale, shear[0], shear[1]]
                    .iter()
                    .chain(center.iter().flatten())
                    .all(|v| v.is_finite())
                    || scale <= 0.0 =>
            {
                "affine parameters must be finite, the scale positive".to_owned()
            }
            Self::Rotate { angle } if !angle.is_finite() => format!("angle must be finite, got {angle}"),
            _ => return Ok(()),
        };
        Err(TransformError::BadParameter { transform: "PixelOp", problem })
    }
}

/// A recipe's per-pixel augmentations, in order: a bounded array, so the recipe stays `Copy`.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Augmentations {
    slots: [Option<Augmentation>; MAX_AUGMENTATIONS],
    len: usize,
}

impl Augmentations {
    /// Append one; refused past [`MAX_AUGMENTATIONS`].
    pub(super) fn push(&mut self, augmentation: Augmentation) -> Result<(), TransformError> {
        let Some(slot) = self.slots.get_mut(self.len) else {
            return Err(TransformError::BadParameter {
                transform: "TransformSpec",
                problem: format!("at most {MAX_AUGMENTATIONS} per-pixel augmentations, got more"),
            });
        };
        *slot = Some(augmentation);
        self.len += 1;
        Ok(())
    }

    /// The augmentations, in order.
    pub fn iter(&self) -> impl Iterator<Item = &Augmentation> {
        self.slots[..self.len].iter().flatten()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Draw one sample's operations for a `width` × `height` image (after the geometry) from
    /// its augmentation seed, replacing `ops`' content (a buffer the caller reuses).
    pub fn draw(&self, augment_seed: u64, width: u32, height: u32, ops: &mut Vec<PixelOp>) {
        ops.clear();
        for (index, augmentation) in self.iter().enumerate() {
            let mut rng = SplitMix64::new(derive_seed(SeedDomain::PixelAugment, &[augment_seed, index as u64]));
            augmentation.draw(&mut rng, width, height, ops);
        }
    }
}

impl Augmentation {
    /// The checked form of `transform`, or `None` if it is not a per-pixel augmentation.
    pub(super) fn from_transform(transform: &Transform) -> Result<Option<Self>, TransformError> {
        let augmentation = match *transform {
            Transform::ColorJitter { brightness, contrast, saturation, hue } => {
                for (name, range) in [("brightness", brightness), ("contrast", contrast), ("saturation", saturation)] {
                    check_factor_range(name, range, 0.0, f64::INFINITY)?;
                }
                check_factor_range("hue", hue, -0.5, 0.5)?;
                Self::ColorJitter { brightness, contrast, saturation, hue }
            }
            Transform::RandomGrayscale { p } => Self::RandomGrayscale { p: check_p("RandomGrayscale", p)? },
            Transform::RandomErasing { p, scale, ratio, value } => {
                let p = check_p("RandomErasing", p)?;
                if !(scale.0 >= 0.0 && scale.0 <= scale.1 && scale.1 <= 1.0) {
                    return Err(bad("RandomErasing", format!("scale must satisfy 0 ≤ low ≤ high ≤ 1, got ({}, {})", scale.0, scale.1)));
                }
                if !(ratio.0 > 0.0 && ratio.0 <= ratio.1 && ratio.1.is_finite()) {
                    return Err(bad("RandomErasing", format!("ratio must satisfy 0 < low ≤ high, got ({}, {})", ratio.0, ratio.1)));
                }
                Self::RandomErasing { p, scale, log_ratio: (ratio.0.ln(), ratio.1.ln()), value: value.0 }
            }
            Transform::GaussianBlur { kernel_size, sigma } => {
                for side in [kernel_size.width, kernel_size.height] {
                    if side % 2 == 0 || side > MAX_KERNEL {
                        return Err(bad("GaussianBlur", format!("kernel_size must be odd and at most {MAX_KERNEL}, got {side}")));
                    }
                }
                if !(sigma.0 > 0.0 && sigma.0 <= sigma.1 && sigma.1.is_finite()) {
                    return Err(bad("GaussianBlur", format!("sigma must satisfy 0 < low ≤ high, got ({}, {})", sigma.0, sigma.1)));
                }
                Self::GaussianBlur { kernel_size, sigma }
            }
            Transform::TrivialAugmentWide { num_magnitude_bins } => {
                Self::TrivialAugmentWide { bins: check_bins("TrivialAugmentWide", num_magnitude_bins)? }
            }
            Transform::RandAugment { num_ops, magnitude, num_magnitude_bins } => {
                let bins = check_bins("RandAugment", num_magnitude_bins)?;
                if magnitude >= bins {
                    return Err(bad("RandAugment", format!("magnitude must be below num_magnitude_bins ({bins}), got {magnitude}")));
                }
                if num_ops > MAX_AUTO_OPS {
                    return Err(bad("RandAugment", format!("num_ops must be at most {MAX_AUTO_OPS}, got {num_ops}")));
                }
                Self::RandAugment { num_ops, magnitude, bins }
            }
            Transform::AutoAugment { policy } => Self::AutoAugment { policy },
            Transform::RandomRotation { degrees } => Self::RandomRotation { degrees: check_degrees("RandomRotation", degrees)? },
            Transform::RandomAffine { degrees, translate, scale, shear } => {
                let degrees = check_degrees("RandomAffine", degrees)?;
                if let Some((x, y)) = translate
                    && !((0.0..=1.0).contains(&x) && (0.0..=1.0).contains(&y))
                {
                    return Err(bad("RandomAffine", format!("translate fractions must be in [0, 1], got ({x}, {y})")));
                }
                if let Some((low, high)) = scale
                    && !(low > 0.0 && low <= high && high.is_finite())
                {
                    return Err(bad("RandomAffine", format!("scale must satisfy 0 < low ≤ high, got ({low}, {high})")));
                }
                if let Some(ShearRange { x, y }) = shear {
                    for (low, high) in std::iter::once(x).chain(y) {
                        if !(low <= high && low.is_finite() && high.is_finite() && low > -90.0 && high < 90.0) {
                            return Err(bad(
                                "RandomAffine",
                                format!("shear ranges must satisfy -90 < low ≤ high < 90, got ({low}, {high})"),
                            ));
                        }
                    }
                }
                Self::RandomAffine { degrees, translate, scale, shear }
            }
            _ => return Ok(None),
        };
        Ok(Some(augmentation))
    }

    /// Append this augmentation's operations for one sample, drawn as torchvision v2's
    /// `make_params` draws them.
    fn draw(&self, rng: &mut SplitMix64, width: u32, height: u32, ops: &mut Vec<PixelOp>) {
        match *self {
            Self::ColorJitter { brightness, contrast, saturation, hue } => {
                // `torch.randperm(4)`, then one uniform per range that is set, in this order.
                let mut order = [0usize, 1, 2, 3];
                for last in (1..order.len()).rev() {
                    let pick = rng.below(last as u64 + 1) as usize;
                    order.swap(last, pick);
                }
                let mut draw = |range: Option<(f64, f64)>| range.map(|(low, high)| rng.uniform(low, high));
                let factors = [draw(brightness), draw(contrast), draw(saturation), draw(hue)];
                for which in order {
                    let Some(factor) = factors[which] else { continue };
                    ops.push(match which {
                        0 => PixelOp::Brightness { factor },
                        1 => PixelOp::Contrast { factor },
                        2 => PixelOp::Saturation { factor },
                        _ => PixelOp::Hue { factor },
                    });
                }
            }
            Self::RandomGrayscale { p } => {
                if rng.next_f64() < p {
                    ops.push(PixelOp::Grayscale);
                }
            }
            Self::RandomErasing { p, scale, log_ratio, value } => {
                if rng.next_f64() >= p {
                    return;
                }
                if let Some(op) = erasing_box(rng, width, height, scale, log_ratio, value) {
                    ops.push(op);
                }
            }
            Self::TrivialAugmentWide { bins } => auto_augment::trivial_augment_wide(rng, bins, width, height, ops),
            Self::RandAugment { num_ops, magnitude, bins } => auto_augment::rand_augment(rng, num_ops, magnitude, bins, width, height, ops),
            Self::AutoAugment { policy } => auto_augment::auto_augment(rng, policy, width, height, ops),
            Self::RandomRotation { degrees } => ops.push(PixelOp::Rotate { angle: rng.uniform(degrees.0, degrees.1) }),
            Self::RandomAffine { degrees, translate, scale, shear } => {
                // `RandomAffine.make_params`: angle, then tx and ty (`int(round(...))`: halves to
                // even), scale, shear x, shear y, each drawn only where asked for.
                let angle = rng.uniform(degrees.0, degrees.1);
                let translate = translate.map_or([0.0, 0.0], |(x, y)| {
                    let (max_dx, max_dy) = (x * f64::from(width), y * f64::from(height));
                    let dx = rng.uniform(-max_dx, max_dx).round_ties_even();
                    [dx, rng.uniform(-max_dy, max_dy).round_ties_even()]
                });
                let scale = scale.map_or(1.0, |(low, high)| rng.uniform(low, high));
                let shear = shear.map_or([0.0, 0.0], |ShearRange { x, y }| {
                    let shear_x = rng.uniform(x.0, x.1);
                    [shear_x, y.map_or(0.0, |(low, high)| rng.uniform(low, high))]
                });
                ops.push(PixelOp::Affine { angle, translate, scale, shear, center: None });
            }
            Self::GaussianBlur { kernel_size, sigma } => {
                let drawn = rng.uniform(sigma.0, sigma.1);
                ops.push(PixelOp::GaussianBlur { kernel_size: [kernel_size.width, kernel_size.height], sigma: [drawn, drawn] });
            }
        }
    }
}

/// torchvision v2 `RandomErasing.make_params`: ten tries at a box of random area and log-uniform
/// aspect ratio that fits strictly inside the image; none (no erasing) if all ten miss.
fn erasing_box(rng: &mut SplitMix64, width: u32, height: u32, scale: (f64, f64), log_ratio: (f64, f64), value: [u8; 3]) -> Option<PixelOp> {
    let area = f64::from(width) * f64::from(height);
    for _ in 0..10 {
        let erase_area = area * rng.uniform(scale.0, scale.1);
        let aspect_ratio = rng.uniform(log_ratio.0, log_ratio.1).exp();
        // Python's `round` rounds halves to even.
        let box_height = (erase_area * aspect_ratio).sqrt().round_ties_even();
        let box_width = (erase_area / aspect_ratio).sqrt().round_ties_even();
        if !(box_height < f64::from(height) && box_width < f64::from(width)) {
            continue;
        }
        // Both are below a u32 side, so the conversions are exact.
        let (box_height, box_width) = (box_height as u32, box_width as u32);
        let top = rng.below(u64::from(height - box_height) + 1) as u32;
        let left = rng.below(u64::from(width - box_width) + 1) as u32;
        return Some(PixelOp::Erase { top, left, height: box_height, width: box_width, value });
    }
    None
}

fn bad(transform: &'static str, problem: String) -> TransformError {
    TransformError::BadParameter { transform, problem }
}

/// Most magnitude bins and `RandAugment` ops accepted (sanity bounds).
const MAX_BINS: u32 = 1_000;
const MAX_AUTO_OPS: u32 = 16;

fn check_bins(transform: &'static str, bins: u32) -> Result<u32, TransformError> {
    if !(2..=MAX_BINS).contains(&bins) {
        return Err(bad(transform, format!("num_magnitude_bins must be in 2..={MAX_BINS}, got {bins}")));
    }
    Ok(bins)
}

/// An angle range as torchvision's `_setup_angle` accepts it: finite, low ≤ high (a number
/// `d` is `[-d, d]`, so it must not be negative).
fn check_degrees(transform: &'static str, AngleRange(low, high): AngleRange) -> Result<(f64, f64), TransformError> {
    if !(low <= high && low.is_finite() && high.is_finite()) {
        return Err(bad(transform, format!("degrees must be a non-negative number or [low, high] with low ≤ high, got ({low}, {high})")));
    }
    Ok((low, high))
}

fn check_p(transform: &'static str, p: f64) -> Result<f64, TransformError> {
    if !(0.0..=1.0).contains(&p) {
        return Err(bad(transform, format!("p must be in [0, 1], got {p}")));
    }
    Ok(p)
}

fn check_factor_range(name: &str, range: Option<(f64, f64)>, min: f64, max: f64) -> Result<(), TransformError> {
    let Some((low, high)) = range else { return Ok(()) };
    if !(min <= low && low <= high && high <= max && high.is_finite()) {
        return Err(bad("ColorJitter", format!("{name} must be a range [low, high] with {min} ≤ low ≤ high ≤ {max}, got [{low}, {high}]")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn augmentations(transforms: &[Transform]) -> Augmentations {
        let mut all = Augmentations::default();
        for transform in transforms {
            let augmentation = Augmentation::from_transform(transform).expect("valid").expect("an augmentation");
            all.push(augmentation).expect("room");
        }
        all
    }

    fn jitter() -> Transform {
        Transform::ColorJitter {
            brightness: Some((0.6, 1.4)),
            contrast: Some((0.6, 1.4)),
            saturation: Some((0.6, 1.4)),
            hue: Some((-0.1, 0.1)),
        }
    }

    fn draw(all: &Augmentations, seed: u64) -> Vec<PixelOp> {
        let mut ops = Vec::new();
        all.draw(seed, 64, 48, &mut ops);
        ops
    }

    #[test]
    fn draws_are_a_pure_function_of_the_seed_and_each_augmentation_has_its_own_stream() {
        let one = augmentations(&[jitter()]);
        assert_eq!(draw(&one, 7), draw(&one, 7));
        assert_ne!(draw(&one, 7), draw(&one, 8));
        // Appending an augmentation leaves the earlier ones' draws as they were.
        let blur = Transform::GaussianBlur { kernel_size: KernelSize { width: 5, height: 5 }, sigma: (0.1, 2.0) };
        let two = augmentations(&[jitter(), blur]);
        for seed in 0..50 {
            let (first, both) = (draw(&one, seed), draw(&two, seed));
            assert_eq!(both[..first.len()], first[..], "seed {seed}");
            assert!(matches!(both[first.len()..], [PixelOp::GaussianBlur { .. }]), "seed {seed}: {both:?}");
        }
    }

    #[test]
    fn color_jitter_draws_every_permutation_with_factors_in_range() {
        let all = augmentations(&[jitter()]);
        let mut orders = std::collections::HashSet::new();
        for seed in 0..2000 {
            let ops = draw(&all, seed);
            assert_eq!(ops.len(), 4);
            let order: Vec<u8> = ops
                .iter()
                .map(|op| match *op {
                    PixelOp::Brightness { factor } | PixelOp::Contrast { factor } | PixelOp::Saturation { factor } => {
                        assert!((0.6..1.4).contains(&factor), "{op:?}");
                        b'b' + u8::from(matches!(op, PixelOp::Contrast { .. })) + 2 * u8::from(matches!(op, PixelOp::Saturation { .. }))
                    }
                    PixelOp::Hue { factor } => {
                        assert!((-0.1..0.1).contains(&factor), "{op:?}");
                        b'h'
                    }
                    other => panic!("{other:?}"),
                })
                .collect();
            orders.insert(order);
        }
        assert_eq!(orders.len(), 24, "all 4! orders appear");
        // Only the ranges given are drawn.
        let brightness_only =
            augmentations(&[Transform::ColorJitter { brightness: Some((0.5, 0.5)), contrast: None, saturation: None, hue: None }]);
        assert_eq!(draw(&brightness_only, 3), vec![PixelOp::Brightness { factor: 0.5 }]);
    }

    #[test]
    fn grayscale_and_erasing_happen_with_their_probability_and_boxes_fit() {
        let all = augmentations(&[
            Transform::RandomGrayscale { p: 0.25 },
            Transform::RandomErasing { p: 0.5, scale: (0.02, 0.33), ratio: (0.3, 3.3), value: ErasingValue([1, 2, 3]) },
        ]);
        let (mut grays, mut erasures) = (0, 0);
        for seed in 0..2000 {
            for op in draw(&all, seed) {
                match op {
                    PixelOp::Grayscale => grays += 1,
                    PixelOp::Erase { top, left, height, width, value } => {
                        erasures += 1;
                        assert!(height >= 1 && width >= 1 && top + height <= 48 && left + width <= 64, "{op:?}");
                        assert!(height < 48 && width < 64);
                        assert_eq!(value, [1, 2, 3]);
                    }
                    other => panic!("{other:?}"),
                }
            }
        }
        assert!((400..600).contains(&grays), "{grays} of 2000 at p = 0.25");
        assert!((900..1100).contains(&erasures), "{erasures} of 2000 at p = 0.5");
    }

    #[test]
    fn bad_parameters_are_refused() {
        let refused = [
            Transform::ColorJitter { brightness: Some((-0.1, 1.0)), contrast: None, saturation: None, hue: None },
            Transform::ColorJitter { brightness: None, contrast: None, saturation: None, hue: Some((-0.6, 0.0)) },
            Transform::RandomGrayscale { p: 1.5 },
            Transform::RandomErasing { p: 0.5, scale: (0.5, 0.1), ratio: (0.3, 3.3), value: ErasingValue::default() },
            Transform::GaussianBlur { kernel_size: KernelSize { width: 4, height: 5 }, sigma: (0.1, 2.0) },
            Transform::GaussianBlur { kernel_size: KernelSize { width: 5, height: 5 }, sigma: (0.0, 2.0) },
        ];
        for transform in refused {
            assert!(Augmentation::from_transform(&transform).is_err(), "{transform:?}");
        }
        let mut all = Augmentations::default();
        for _ in 0..MAX_AUGMENTATIONS {
            all.push(Augmentation::RandomGrayscale { p: 0.5 }).expect("room");
        }
        assert!(all.push(Augmentation::RandomGrayscale { p: 0.5 }).is_err());
        assert!(PixelOp::Hue { factor: 0.7 }.check().is_err());
        assert!(PixelOp::GaussianBlur { kernel_size: [3, 2], sigma: [1.0, 1.0] }.check().is_err());
        assert!(PixelOp::Brightness { factor: 1.2 }.check().is_ok());
    }

    #[test]
    fn json_forms_follow_torchvision() {
        let transform: Transform =
            serde_json::from_str(r#"{"type": "GaussianBlur", "kernel_size": [5, 3]}"#).expect("a kernel [width, height]");
        assert_eq!(transform, Transform::GaussianBlur { kernel_size: KernelSize { width: 5, height: 3 }, sigma: (0.1, 2.0) });
        let erasing: Transform = serde_json::from_str(r#"{"type": "RandomErasing", "value": [124, 116, 104]}"#).expect("defaults");
        assert_eq!(
            erasing,
            Transform::RandomErasing { p: 0.5, scale: (0.02, 0.33), ratio: (0.3, 3.3), value: ErasingValue([124, 116, 104]) }
        );
        let op: PixelOp = serde_json::from_str(r#"{"op": "erase", "top": 1, "left": 2, "height": 3, "width": 4, "value": [0, 0, 0]}"#)
            .expect("an explicit erase");
        assert_eq!(op, PixelOp::Erase { top: 1, left: 2, height: 3, width: 4, value: [0; 3] });
    }

    fn parsed(json: &str) -> Result<Option<Augmentation>, TransformError> {
        let transform: Transform = serde_json::from_str(json).unwrap_or_else(|error| panic!("{json}: {error}"));
        Augmentation::from_transform(&transform)
    }

    #[test]
    fn rotation_and_affine_specs_read_as_torchvision_reads_its_arguments() {
        let rotation = parsed(r#"{"type": "RandomRotation", "degrees": 30}"#).expect("valid");
        assert_eq!(rotation, Some(Augmentation::RandomRotation { degrees: (-30.0, 30.0) }));
        let affine = parsed(r#"{"type": "RandomAffine", "degrees": [0, 90], "translate": [0.1, 0.2], "scale": [0.8, 1.2], "shear": 10}"#);
        let shear = Some(ShearRange { x: (-10.0, 10.0), y: None });
        let expected = Augmentation::RandomAffine { degrees: (0.0, 90.0), translate: Some((0.1, 0.2)), scale: Some((0.8, 1.2)), shear };
        assert_eq!(affine.expect("valid"), Some(expected));
        let both = parsed(r#"{"type": "RandomAffine", "degrees": 0, "shear": [-5, 5, 1, 2]}"#).expect("valid");
        assert!(matches!(both, Some(Augmentation::RandomAffine { shear: Some(ShearRange { y: Some((1.0, 2.0)), .. }), .. })), "{both:?}");
        for bad in [
            r#"{"type": "RandomRotation", "degrees": -5}"#,
            r#"{"type": "RandomAffine", "degrees": 0, "translate": [1.5, 0]}"#,
            r#"{"type": "RandomAffine", "degrees": 0, "scale": [0, 1]}"#,
            r#"{"type": "RandomAffine", "degrees": 0, "shear": [-95, 0]}"#,
        ] {
            assert!(parsed(bad).is_err(), "{bad} is refused");
        }
        assert_eq!(
            parsed(r#"{"type": "AutoAugment"}"#).expect("valid"),
            Some(Augmentation::AutoAugment { policy: AutoAugmentPolicy::Imagenet })
        );
        let transform: Result<Transform, _> = serde_json::from_str(r#"{"type": "AutoAugment", "policy": "coco"}"#);
        assert!(transform.is_err(), "an unknown policy is refused");
    }

    #[test]
    fn affine_draws_stay_in_their_ranges_and_translations_are_whole_pixels() {
        let all = augmentations(&[Transform::RandomAffine {
            degrees: AngleRange(-20.0, 20.0),
            translate: Some((0.25, 0.1)),
            scale: Some((0.5, 1.5)),
            shear: Some(ShearRange { x: (-10.0, 10.0), y: Some((3.0, 4.0)) }),
        }]);
        let (mut widest, mut smallest) = (0.0f64, f64::MAX);
        for seed in 0..2000 {
            let ops = draw(&all, seed);
            let [PixelOp::Affine { angle, translate: [tx, ty], scale, shear: [sx, sy], center: None }] = ops[..] else { panic!("{ops:?}") };
            assert!((-20.0..20.0).contains(&angle) && (0.5..1.5).contains(&scale), "{ops:?}");
            // 64 × 48: up to 16 pixels across, 4.8 (so 5 after rounding) down.
            assert!(tx.fract() == 0.0 && ty.fract() == 0.0 && tx.abs() <= 16.0 && ty.abs() <= 5.0, "{ops:?}");
            assert!((-10.0..10.0).contains(&sx) && (3.0..4.0).contains(&sy), "{ops:?}");
            widest = widest.max(tx.abs());
            smallest = smallest.min(scale);
        }
        assert!(widest >= 15.0 && smallest < 0.55, "the ranges are covered: {widest}, {smallest}");
        let plain = augmentations(&[Transform::RandomAffine { degrees: AngleRange(5.0, 5.0), translate: None, scale: None, shear: None }]);
        let unit = PixelOp::Affine { angle: 5.0, translate: [0.0, 0.0], scale: 1.0, shear: [0.0, 0.0], center: None };
        assert_eq!(draw(&plain, 3), vec![unit]);
    }

    #[test]
    fn auto_augment_draws_every_sub_policy_step_as_often_as_its_probability() {
        let all = augmentations(&[Transform::AutoAugment { policy: AutoAugmentPolicy::Imagenet }]);
        let draws = 20_000u32;
        let (mut inverted, mut rotated, mut none) = (0u32, 0u32, 0u32);
        for seed in 0..u64::from(draws) {
            let ops = draw(&all, seed);
            assert!(ops.len() <= 2, "{ops:?}");
            none += u32::from(ops.is_empty());
            inverted += ops.iter().filter(|op| matches!(op, PixelOp::Invert)).count() as u32;
            for op in &ops {
                if let PixelOp::Rotate { angle } = op {
                    // Bins 3, 8 and 9 of linspace(0, 30, 10): 10, 26.67 and 30 degrees, either way.
                    assert!([10.0f64, 80.0 / 3.0, 30.0].iter().any(|bin| (angle.abs() - bin).abs() < 1e-4), "{angle}");
                    rotated += 1;
                }
            }
        }
        // Invert: 3 of the 25 sub-policies (the 14th, 18th and 23rd), each with p = 0.6.
        let expected_inverted = f64::from(draws) * 3.0 / 25.0 * 0.6;
        assert!((f64::from(inverted) - expected_inverted).abs() < 0.1 * expected_inverted, "{inverted} against {expected_inverted}");
        // Rotate: 0.6 + 0.8 + 0.2 + 0.8 + 0.4 + 0.8 over 25.
        let expected_rotated = f64::from(draws) * 3.6 / 25.0;
        assert!((f64::from(rotated) - expected_rotated).abs() < 0.1 * expected_rotated, "{rotated} against {expected_rotated}");
        assert!(none > 0, "some images get no op (both steps skipped)");
    }
}
