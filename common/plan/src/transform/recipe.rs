//! A validated [`TransformSpec`]: what the worker runs for every sample.

use super::augment::{Augmentation, Augmentations};
use super::crop::{self, Placement};
use super::{FloatDtype, Interpolation, OnError, OutputLayout, Size, Transform, TransformSpec};
use crate::error::TransformError;
use crate::prng::SplitMix64;

/// Largest output side accepted (a sanity bound: 16384² RGB is already 768 MiB per sample).
const MAX_SIDE: u32 = 16_384;

/// The geometric stage: the only one that decides which source pixels are read.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Geometry {
    /// torchvision's RandomResizedCrop.
    RandomResizedCrop {
        /// Output size.
        size: Size,
        /// Area fraction range.
        scale: (f64, f64),
        /// Aspect ratio range.
        ratio: (f64, f64),
    },
    /// `CenterCrop(crop)`, optionally after `Resize(shorter_side)` (the evaluation pipeline).
    ResizeCenterCrop {
        /// `Resize`'s shorter side, if there is a `Resize`.
        shorter_side: Option<u32>,
        /// Output size.
        crop: Size,
    },
}

/// Element type of a batch's images.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum OutputDtype {
    /// Bytes 0–255 (no `Normalize`).
    U8,
    /// Normalised floats.
    Float(FloatDtype),
}

impl OutputDtype {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Self::U8 => 1,
            Self::Float(FloatDtype::F16) => 2,
            Self::Float(FloatDtype::F32) => 4,
        }
    }

    /// numpy's name for the type (`uint8`, `float16`, `float32`).
    pub fn name(self) -> &'static str {
        match self {
            Self::U8 => "uint8",
            Self::Float(FloatDtype::F16) => "float16",
            Self::Float(FloatDtype::F32) => "float32",
        }
    }
}

/// Per-channel normalisation: `(x / 255 - mean) / std`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Normalization {
    /// Mean, RGB, in `[0, 1]` units.
    pub mean: [f32; 3],
    /// Standard deviation, RGB.
    pub std: [f32; 3],
    /// Output type.
    pub dtype: FloatDtype,
}

/// A spec checked and reduced to the stages the worker runs, in this order: decode the
/// geometry's source region, resize it into the output, flip, the per-pixel augmentations in
/// the spec's order, normalise, lay out.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Recipe {
    /// Crop/resize stage.
    pub geometry: Geometry,
    /// Resampling filter of the resize.
    pub interpolation: Interpolation,
    /// Probability of a horizontal flip (0 when there is no flip).
    pub flip_p: f64,
    /// Per-pixel augmentations on the uint8 image, after the flip, in order.
    pub augmentations: Augmentations,
    /// Normalisation, if any (then the output is float).
    pub normalize: Option<Normalization>,
    /// Batch layout.
    pub layout: OutputLayout,
    /// Whether decode may scale in the DCT.
    pub dct_scaling: bool,
    /// Bad-image policy.
    pub on_error: OnError,
    /// Largest image accepted, in pixels.
    pub max_image_pixels: u64,
}

/// What one sample does: read `placement`'s source region, resize it into the output, and
/// mirror it if `flip`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SampleGeometry {
    /// Source region and where it lands.
    pub placement: Placement,
    /// Mirror left-right after resizing.
    pub flip: bool,
}

impl Recipe {
    /// Check `spec` and reduce it. Accepted lists (a `RandomHorizontalFlip` may sit anywhere
    /// before the per-pixel augmentations, `Normalize` must be last): `[RandomResizedCrop]`, `[CenterCrop]`,
    /// `[Resize, CenterCrop]`, each followed by up to [`super::MAX_AUGMENTATIONS`] per-pixel
    /// augmentations (`ColorJitter`, `RandomGrayscale`, `RandomErasing`, `GaussianBlur`,
    /// `TrivialAugmentWide`, `RandAugment`).
    pub fn new(spec: &TransformSpec) -> Result<Self, TransformError> {
        spec.fields.validate()?;
        let mut flip_p = 0.0;
        let mut augmentations = Augmentations::default();
        let mut normalize = None;
        let mut geometric = Vec::new();
        let list = || format!("[{}]", spec.transforms.iter().map(Transform::name).collect::<Vec<_>>().join(", "));
        for (i, transform) in spec.transforms.iter().enumerate() {
            if normalize.is_some() {
                return Err(TransformError::UnsupportedOrder { found: list(), hint: "Normalize must be the last transform" });
            }
            match *transform {
                Transform::RandomHorizontalFlip { p } => {
                    if spec.transforms[..i].iter().any(|t| matches!(t, Transform::RandomHorizontalFlip { .. })) {
                        return Err(TransformError::UnsupportedOrder { found: list(), hint: "give RandomHorizontalFlip once" });
                    }
                    if !augmentations.is_empty() {
                        // The worker flips before the per-pixel augmentations; a flip written
                        // after a shear or an erasing box would not commute with it.
                        return Err(TransformError::UnsupportedOrder {
                            found: list(),
                            hint: "the flip runs before the per-pixel augmentations: put RandomHorizontalFlip before them",
                        });
                    }
                    if !(0.0..=1.0).contains(&p) {
                        return Err(bad("RandomHorizontalFlip", format!("p must be in [0, 1], got {p}")));
                    }
                    flip_p = p;
                }
                Transform::Normalize { mean, std, dtype } => {
                    if let Some(s) = std.iter().find(|s| !s.is_finite() || **s == 0.0) {
                        return Err(bad("Normalize", format!("std must be finite and non-zero, got {s}")));
                    }
                    if let Some(m) = mean.iter().find(|m| !m.is_finite()) {
                        return Err(bad("Normalize", format!("mean must be finite, got {m}")));
                    }
                    normalize = Some(Normalization { mean, std, dtype });
                }
                ref other => match Augmentation::from_transform(other)? {
                    Some(augmentation) => augmentations.push(augmentation)?,
                    None if !augmentations.is_empty() => {
                        return Err(TransformError::UnsupportedOrder {
                            found: list(),
                            hint: "the per-pixel augmentations (ColorJitter, RandAugment, ...) act on the cropped image: put them after the crop",
                        });
                    }
                    None => geometric.push(other),
                },
            }
        }
        let (geometry, interpolation) = match geometric.as_slice() {
            [Transform::RandomResizedCrop { size, scale, ratio, interpolation }] => {
                check_size("RandomResizedCrop", *size)?;
                check_range("RandomResizedCrop", "scale", *scale, 1.0)?;
                check_range("RandomResizedCrop", "ratio", *ratio, f64::INFINITY)?;
                (Geometry::RandomResizedCrop { size: *size, scale: *scale, ratio: *ratio }, *interpolation)
            }
            [Transform::CenterCrop { size }] => {
                check_size("CenterCrop", *size)?;
                (Geometry::ResizeCenterCrop { shorter_side: None, crop: *size }, Interpolation::default())
            }
            [Transform::Resize { shorter_side, interpolation }, Transform::CenterCrop { size }] => {
                check_size("CenterCrop", *size)?;
                if *shorter_side == 0 || *shorter_side > MAX_SIDE {
                    return Err(bad("Resize", format!("shorter_side must be in 1..={MAX_SIDE}, got {shorter_side}")));
                }
                (Geometry::ResizeCenterCrop { shorter_side: Some(*shorter_side), crop: *size }, *interpolation)
            }
            [Transform::Resize { .. }] => {
                return Err(TransformError::UnsupportedOrder {
                    found: list(),
                    hint: "Resize alone gives images of different sizes, which cannot share a batch; add CenterCrop after it",
                });
            }
            [] => {
                return Err(TransformError::UnsupportedOrder {
                    found: list(),
                    hint: "a batch needs one output size: add RandomResizedCrop (training) or Resize + CenterCrop (evaluation)",
                });
            }
            _ => {
                return Err(TransformError::UnsupportedOrder {
                    found: list(),
                    hint: "use one of [RandomResizedCrop], [CenterCrop] or [Resize, CenterCrop], plus optional RandomHorizontalFlip and a final Normalize",
                });
            }
        };
        if spec.max_image_pixels == 0 {
            return Err(bad("TransformSpec", "max_image_pixels must be at least 1".to_owned()));
        }
        Ok(Self {
            geometry,
            interpolation,
            flip_p,
            augmentations,
            normalize,
            layout: spec.layout,
            dct_scaling: spec.dct_scaling,
            on_error: spec.on_error,
            max_image_pixels: spec.max_image_pixels,
        })
    }

    /// Output size of every sample.
    pub fn output_size(&self) -> Size {
        match self.geometry {
            Geometry::RandomResizedCrop { size, .. } => size,
            Geometry::ResizeCenterCrop { crop, .. } => crop,
        }
    }

    /// Element type of the output.
    pub fn dtype(&self) -> OutputDtype {
        self.normalize.map_or(OutputDtype::U8, |n| OutputDtype::Float(n.dtype))
    }

    /// Bytes of one sample's image in the batch (`height * width * 3 * element size`).
    pub fn sample_bytes(&self) -> usize {
        let size = self.output_size();
        size.height as usize * size.width as usize * 3 * self.dtype().size()
    }

    /// The shape of a batch of `samples` images in this recipe's layout.
    pub fn batch_shape(&self, samples: u32) -> [u32; 4] {
        let size = self.output_size();
        match self.layout {
            OutputLayout::Nhwc => [samples, size.height, size.width, 3],
            OutputLayout::Nchw => [samples, 3, size.height, size.width],
        }
    }

    /// Draw one sample's geometry for a `width` × `height` source from its augmentation seed
    /// (DESIGN §4.5). The draws come in a fixed order: the crop's, then the flip's.
    pub fn sample(&self, width: u32, height: u32, augment_seed: u64) -> SampleGeometry {
        let mut rng = SplitMix64::new(augment_seed);
        let placement = match self.geometry {
            Geometry::RandomResizedCrop { size, scale, ratio } => {
                let b = crop::random_resized_crop(width, height, scale, ratio, &mut rng);
                Placement {
                    src_left: f64::from(b.left),
                    src_top: f64::from(b.top),
                    src_width: f64::from(b.width),
                    src_height: f64::from(b.height),
                    dst_left: 0,
                    dst_top: 0,
                    dst_width: size.width,
                    dst_height: size.height,
                }
            }
            Geometry::ResizeCenterCrop { shorter_side, crop } => {
                crop::resize_center_crop(width, height, shorter_side, crop.width, crop.height)
            }
        };
        let flip = self.flip_p > 0.0 && rng.next_f64() < self.flip_p;
        SampleGeometry { placement, flip }
    }
}

fn bad(transform: &'static str, problem: String) -> TransformError {
    TransformError::BadParameter { transform, problem }
}

fn check_size(transform: &'static str, size: Size) -> Result<(), TransformError> {
    if size.width == 0 || size.height == 0 || size.width > MAX_SIDE || size.height > MAX_SIDE {
        return Err(bad(transform, format!("size must be in 1..={MAX_SIDE} on each side, got {}x{}", size.height, size.width)));
    }
    Ok(())
}

fn check_range(transform: &'static str, name: &str, (low, high): (f64, f64), max: f64) -> Result<(), TransformError> {
    if !(low > 0.0 && low <= high && high <= max && high.is_finite()) {
        let limit = if max.is_finite() { format!(" ≤ {max}") } else { String::new() };
        return Err(bad(transform, format!("{name} must satisfy 0 < low ≤ high{limit}, got ({low}, {high})")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transform::{FloatDtype, Transform};

    fn spec(json: &str) -> TransformSpec {
        serde_json::from_str(json).unwrap_or_else(|e| panic!("{json}: {e}"))
    }

    #[test]
    fn json_spec_with_defaults() {
        let s = spec(r#"{"transforms": [{"type": "RandomResizedCrop", "size": 224}, {"type": "RandomHorizontalFlip"}]}"#);
        assert_eq!(s, TransformSpec::imagenet_train(224));
        let r = Recipe::new(&s).expect("valid");
        assert_eq!(r.flip_p, 0.5);
        assert_eq!(r.dtype(), OutputDtype::U8);
        assert_eq!(r.sample_bytes(), 224 * 224 * 3);
        assert_eq!(r.batch_shape(8), [8, 224, 224, 3]);
    }

    #[test]
    fn eval_spec_normalised_nchw_half() {
        let s = spec(
            r#"{"transforms": [{"type": "Resize", "shorter_side": 256}, {"type": "CenterCrop", "size": [224, 200]},
                {"type": "Normalize", "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225], "dtype": "f16"}],
                "layout": "NCHW"}"#,
        );
        let r = Recipe::new(&s).expect("valid");
        assert_eq!(r.dtype(), OutputDtype::Float(FloatDtype::F16));
        assert_eq!(r.batch_shape(2), [2, 3, 224, 200]);
        assert_eq!(r.sample_bytes(), 224 * 200 * 3 * 2);
        let back: TransformSpec = serde_json::from_str(&serde_json::to_string(&s).expect("serialise")).expect("parse");
        assert_eq!(back, s);
    }

    #[test]
    fn unknown_fields_and_types_are_refused() {
        assert!(serde_json::from_str::<TransformSpec>(r#"{"transforms": [{"type": "RandomCrop", "size": 3}]}"#).is_err());
        assert!(serde_json::from_str::<TransformSpec>(r#"{"transforms": [{"type": "CenterCrop", "size": 3, "x": 1}]}"#).is_err());
    }

    #[test]
    fn bad_lists_explain_what_to_write() {
        let cases: &[(&str, &str)] = &[
            (r#"[]"#, "add RandomResizedCrop"),
            (r#"[{"type": "Resize", "shorter_side": 256}]"#, "add CenterCrop"),
            (r#"[{"type": "Normalize", "mean": [0,0,0], "std": [1,1,1]}, {"type": "CenterCrop", "size": 3}]"#, "last"),
            (r#"[{"type": "CenterCrop", "size": 3}, {"type": "RandomResizedCrop", "size": 3}]"#, "one of"),
            (r#"[{"type": "RandomResizedCrop", "size": 0}]"#, "size must be"),
            (r#"[{"type": "RandomResizedCrop", "size": 4, "scale": [0.5, 0.1]}]"#, "scale must"),
            (r#"[{"type": "CenterCrop", "size": 4}, {"type": "RandomHorizontalFlip", "p": 2}]"#, "p must"),
            (r#"[{"type": "CenterCrop", "size": 4}, {"type": "Normalize", "mean": [0,0,0], "std": [1,0,1]}]"#, "std must"),
        ];
        for (list, expected) in cases {
            let error = Recipe::new(&spec(&format!(r#"{{"transforms": {list}}}"#))).expect_err(list).to_string();
            assert!(error.contains(expected), "{list}: {error}");
        }
    }

    #[test]
    fn specs_parse_floats_exactly_and_round_trip_through_json() {
        // Found by the `transform_spec` fuzz target: serde_json's default float parsing is not
        // correctly rounded, and read the 17 digits it wrote for this ratio one ulp off, so a
        // spec written and read again drew other crops. Its `float_roundtrip` parses exactly.
        let json = r#"{"transforms": [{"type": "RandomResizedCrop", "size": 32, "ratio": [0.75, 1.3366666666666666]}]}"#;
        let s = spec(json);
        let Transform::RandomResizedCrop { ratio, .. } = s.transforms[0] else { panic!("{s:?}") };
        assert_eq!(ratio.1, 1.3366666666666667);
        let back = spec(&serde_json::to_string(&s).expect("serialise"));
        assert_eq!(Recipe::new(&back).ok(), Recipe::new(&s).ok());
        // torchvision's default ratio as Python writes it is read as exactly 4/3.
        let default = spec(r#"{"transforms": [{"type": "RandomResizedCrop", "size": 32, "ratio": [0.75, 1.3333333333333333]}]}"#);
        assert_eq!(default, TransformSpec::new(vec![Transform::random_resized_crop(32)]));
    }

    #[test]
    fn augmentations_follow_the_crop_and_leave_its_draws_alone() {
        let plain = Recipe::new(&TransformSpec::imagenet_train(224)).expect("valid");
        let augmented = Recipe::new(&spec(
            r#"{"transforms": [{"type": "RandomResizedCrop", "size": 224}, {"type": "RandomHorizontalFlip"},
                {"type": "ColorJitter", "brightness": [0.6, 1.4]}, {"type": "RandomErasing"},
                {"type": "Normalize", "mean": [0.5, 0.5, 0.5], "std": [0.5, 0.5, 0.5]}]}"#,
        ))
        .expect("valid");
        assert_eq!(augmented.augmentations.iter().count(), 2);
        for seed in 0..100 {
            assert_eq!(plain.sample(500, 375, seed), augmented.sample(500, 375, seed), "seed {seed}");
        }
        let before_crop = r#"{"transforms": [{"type": "GaussianBlur", "kernel_size": 3}, {"type": "CenterCrop", "size": 8}]}"#;
        let error = Recipe::new(&spec(before_crop)).expect_err("blur before the crop").to_string();
        assert!(error.contains("after the crop"), "{error}");
        let flip_after =
            r#"{"transforms": [{"type": "CenterCrop", "size": 8}, {"type": "RandAugment"}, {"type": "RandomHorizontalFlip"}]}"#;
        let error = Recipe::new(&spec(flip_after)).expect_err("a flip after RandAugment").to_string();
        assert!(error.contains("before them"), "{error}");
    }

    #[test]
    fn a_sample_is_a_pure_function_of_its_seed() {
        let r = Recipe::new(&TransformSpec::imagenet_train(224)).expect("valid");
        assert_eq!(r.sample(500, 375, 42), r.sample(500, 375, 42));
        let flips = (0..1000).filter(|&seed| r.sample(500, 375, seed).flip).count();
        assert!((400..600).contains(&flips), "{flips} flips in 1000 at p = 0.5");
    }
}
