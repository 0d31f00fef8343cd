//! Declarative transform specs (DESIGN §8), shared by Rust and Python trainers so both state a
//! pipeline the same way, and the pure geometry behind them.
//!
//! * [`Transform`] and [`TransformSpec`] are what a job states (serde; JSON in the CLI and on
//!   the wire).
//! * [`Recipe`] is a validated spec: one geometric stage, an optional flip, an optional
//!   normalisation, and the output layout. The worker runs recipes, never raw lists.
//! * [`augment`] holds the per-pixel augmentations that follow the geometry (`ColorJitter`,
//!   `RandomGrayscale`, `RandomErasing`, `GaussianBlur`): their checked form and the draw of
//!   each sample's explicit parameters ([`PixelOp`]s) from its own seed stream.
//! * [`crop`] draws a sample's crop box from its augmentation seed exactly as torchvision's
//!   `RandomResizedCrop.get_params` does, and computes `Resize` + `CenterCrop` boxes. Those boxes
//!   are part of the determinism contract: a batch is a pure function of its inputs.

pub mod augment;
mod auto_augment;
pub mod crop;
pub mod json_text;
mod recipe;

use serde::{Deserialize, Serialize};

use crate::fields::Fields;

pub use self::augment::{Augmentation, Augmentations, ErasingValue, KernelSize, MAX_AUGMENTATIONS, PixelOp};
pub use self::crop::{CropBox, Placement};
pub use self::recipe::{Geometry, OutputDtype, Recipe, SampleGeometry};

/// An output size in pixels. JSON accepts `224` (square) or `[height, width]`, as torchvision
/// accepts an int or a pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(from = "SizeRepr", into = "SizeRepr")]
pub struct Size {
    /// Rows.
    pub height: u32,
    /// Columns.
    pub width: u32,
}

impl Size {
    /// A `side` × `side` square.
    pub const fn square(side: u32) -> Self {
        Self { height: side, width: side }
    }
}

#[derive(Clone, Copy, Serialize, Deserialize)]
#[serde(untagged)]
enum SizeRepr {
    Square(u32),
    HeightWidth([u32; 2]),
}

impl From<SizeRepr> for Size {
    fn from(repr: SizeRepr) -> Self {
        match repr {
            SizeRepr::Square(side) => Self::square(side),
            SizeRepr::HeightWidth([height, width]) => Self { height, width },
        }
    }
}

impl From<Size> for SizeRepr {
    fn from(size: Size) -> Self {
        if size.height == size.width { Self::Square(size.width) } else { Self::HeightWidth([size.height, size.width]) }
    }
}

/// Resampling filter of the resize. The names and kernels are Pillow's (which torchvision uses
/// for PIL images): bilinear and bicubic are antialiased convolutions.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Interpolation {
    /// Nearest neighbour.
    Nearest,
    /// Triangle filter, antialiased (torchvision's default).
    #[default]
    Bilinear,
    /// Catmull-Rom cubic (a = -0.5, as Pillow), antialiased.
    Bicubic,
}

/// Floating-point type of a normalised output.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FloatDtype {
    /// IEEE single precision, little-endian.
    #[default]
    F32,
    /// IEEE half precision, little-endian.
    F16,
}

/// Memory layout of a batch's images.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum OutputLayout {
    /// `[batch, height, width, channel]`: what decode produces; `channels_last` in torch.
    #[default]
    Nhwc,
    /// `[batch, channel, height, width]`: torch's default layout.
    Nchw,
}

/// What to do with a sample whose image cannot be decoded.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnError {
    /// Put a black image in its slot, flag it in the batch and count it (the default: one bad
    /// JPEG in a billion must not stop a training run).
    #[default]
    Replace,
    /// Stop with an error naming the shard and the key.
    Fail,
}

/// One transform, named and parameterised as in torchvision.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", deny_unknown_fields)]
pub enum Transform {
    /// Crop a random box of random area and aspect ratio, then resize it to `size`.
    RandomResizedCrop {
        /// Output size.
        size: Size,
        /// Range of the box's area as a fraction of the image's.
        #[serde(default = "default_scale")]
        scale: (f64, f64),
        /// Range of the box's aspect ratio (width / height).
        #[serde(default = "default_ratio")]
        ratio: (f64, f64),
        /// Resampling filter.
        #[serde(default)]
        interpolation: Interpolation,
    },
    /// Resize so that the shorter side is `shorter_side`, keeping the aspect ratio.
    Resize {
        /// Length of the shorter side after resizing.
        shorter_side: u32,
        /// Resampling filter.
        #[serde(default)]
        interpolation: Interpolation,
    },
    /// Crop the centre `size` (padding with black where the image is smaller, as torchvision).
    CenterCrop {
        /// Output size.
        size: Size,
    },
    /// Mirror left-right with probability `p`.
    RandomHorizontalFlip {
        /// Probability of a flip.
        #[serde(default = "default_flip_p")]
        p: f64,
    },
    /// Scale to `[0, 1]`, subtract `mean`, divide by `std` (torchvision's `ToTensor` then
    /// `Normalize`), and output floats.
    Normalize {
        /// Per-channel mean (RGB), in `[0, 1]` units.
        mean: [f32; 3],
        /// Per-channel standard deviation (RGB).
        std: [f32; 3],
        /// Output float type.
        #[serde(default)]
        dtype: FloatDtype,
    },
    /// Randomly change brightness, contrast, saturation and hue, in a random order (torchvision
    /// v2's `ColorJitter`). Each range is `[low, high]` (the Python class turns torchvision's
    /// single numbers into these ranges); an absent range leaves that property alone.
    ColorJitter {
        /// Brightness factor range (`0 ≤ low ≤ high`).
        #[serde(default)]
        brightness: Option<(f64, f64)>,
        /// Contrast factor range (`0 ≤ low ≤ high`).
        #[serde(default)]
        contrast: Option<(f64, f64)>,
        /// Saturation factor range (`0 ≤ low ≤ high`).
        #[serde(default)]
        saturation: Option<(f64, f64)>,
        /// Hue shift range, in turns (`-0.5 ≤ low ≤ high ≤ 0.5`).
        #[serde(default)]
        hue: Option<(f64, f64)>,
    },
    /// Make the image gray (three equal channels) with probability `p`.
    RandomGrayscale {
        /// Probability of graying.
        #[serde(default = "default_grayscale_p")]
        p: f64,
    },
    /// With probability `p`, fill a random box (area fraction `scale`, aspect ratio `ratio`)
    /// with `value` (torchvision's `RandomErasing`). It runs on the uint8 image, before any
    /// `Normalize`, so `value` is in pixel levels 0–255: see docs/transforms.md.
    RandomErasing {
        /// Probability of erasing.
        #[serde(default = "default_erasing_p")]
        p: f64,
        /// Range of the box's area as a fraction of the image's.
        #[serde(default = "default_erasing_scale")]
        scale: (f64, f64),
        /// Range of the box's aspect ratio (height / width, as torchvision).
        #[serde(default = "default_erasing_ratio")]
        ratio: (f64, f64),
        /// What the box is filled with.
        #[serde(default)]
        value: ErasingValue,
    },
    /// Blur with a Gaussian kernel of `kernel_size` and a standard deviation drawn uniformly
    /// from `sigma` (torchvision's `GaussianBlur`; reflected edges).
    GaussianBlur {
        /// Kernel size: `5` or `[width, height]` (torchvision's order), odd.
        kernel_size: KernelSize,
        /// Range of the standard deviation, in pixels.
        #[serde(default = "default_blur_sigma")]
        sigma: (f64, f64),
    },
    /// torchvision v2's `TrivialAugmentWide`: one op per image of Identity, ShearX/Y,
    /// TranslateX/Y, Rotate, Brightness, Color, Contrast, Sharpness, Posterize, Solarize,
    /// AutoContrast, Equalize, at a random magnitude bin (nearest interpolation, fill 0).
    TrivialAugmentWide {
        /// Number of magnitude bins.
        #[serde(default = "default_magnitude_bins")]
        num_magnitude_bins: u32,
    },
    /// torchvision v2's `RandAugment`: `num_ops` ops per image of the same set, at magnitude
    /// bin `magnitude` (nearest interpolation, fill 0).
    RandAugment {
        /// Ops per image.
        #[serde(default = "default_rand_augment_ops")]
        num_ops: u32,
        /// Magnitude bin, below `num_magnitude_bins`.
        #[serde(default = "default_rand_augment_magnitude")]
        magnitude: u32,
        /// Number of magnitude bins.
        #[serde(default = "default_magnitude_bins")]
        num_magnitude_bins: u32,
    },
    /// torchvision v2's `AutoAugment`: one of the policy's 25 sub-policies per image, each of
    /// two ops applied with its own probability at its own magnitude (nearest interpolation,
    /// fill 0).
    AutoAugment {
        /// Which learned policy.
        #[serde(default)]
        policy: AutoAugmentPolicy,
    },
    /// torchvision v2's `RandomRotation(degrees)`: counter-clockwise by an angle drawn
    /// uniformly from `degrees`, about the centre, nearest pixel, fill 0, same size.
    RandomRotation {
        /// `30` (for `[-30, 30]`) or `[low, high]`, degrees.
        degrees: AngleRange,
    },
    /// torchvision v2's `RandomAffine(degrees, translate, scale, shear)`: rotation, translation,
    /// scale and shear drawn per image, about the centre, nearest pixel, fill 0.
    RandomAffine {
        /// Rotation: `30` (for `[-30, 30]`) or `[low, high]`, degrees.
        degrees: AngleRange,
        /// Largest shift as fractions `[x, y]` of the width and height, each in `[0, 1]`.
        #[serde(default)]
        translate: Option<(f64, f64)>,
        /// Scale factor range `[low, high]`, positive.
        #[serde(default)]
        scale: Option<(f64, f64)>,
        /// Shear, degrees: `10` (x in `[-10, 10]`), `[x low, x high]`, or `[x low, x high, y
        /// low, y high]`.
        #[serde(default)]
        shear: Option<ShearRange>,
    },
}

/// The learned policies of `AutoAugment`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AutoAugmentPolicy {
    /// Learned on ImageNet (torchvision's default).
    #[default]
    Imagenet,
    /// Learned on CIFAR-10.
    Cifar10,
    /// Learned on SVHN.
    Svhn,
}

/// An angle range in degrees: JSON `30` (for `[-30, 30]`, as torchvision reads a number) or
/// `[low, high]`.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(from = "AngleRangeRepr", into = "AngleRangeRepr")]
pub struct AngleRange(pub f64, pub f64);

#[derive(Clone, Copy, Serialize, Deserialize)]
#[serde(untagged)]
enum AngleRangeRepr {
    Symmetric(f64),
    LowHigh([f64; 2]),
}

impl From<AngleRangeRepr> for AngleRange {
    fn from(repr: AngleRangeRepr) -> Self {
        match repr {
            AngleRangeRepr::Symmetric(degrees) => Self(-degrees, degrees),
            AngleRangeRepr::LowHigh([low, high]) => Self(low, high),
        }
    }
}

impl From<AngleRange> for AngleRangeRepr {
    fn from(range: AngleRange) -> Self {
        Self::LowHigh([range.0, range.1])
    }
}

/// `RandomAffine`'s shear, in degrees: JSON `10` (x in `[-10, 10]`), `[x low, x high]` or
/// `[x low, x high, y low, y high]`, as torchvision reads them.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(from = "ShearRangeRepr", into = "ShearRangeRepr")]
pub struct ShearRange {
    /// Horizontal shear range.
    pub x: (f64, f64),
    /// Vertical shear range, if drawn at all.
    pub y: Option<(f64, f64)>,
}

#[derive(Clone, Copy, Serialize, Deserialize)]
#[serde(untagged)]
enum ShearRangeRepr {
    Symmetric(f64),
    X([f64; 2]),
    XY([f64; 4]),
}

impl From<ShearRangeRepr> for ShearRange {
    fn from(repr: ShearRangeRepr) -> Self {
        match repr {
            ShearRangeRepr::Symmetric(degrees) => Self { x: (-degrees, degrees), y: None },
            ShearRangeRepr::X([low, high]) => Self { x: (low, high), y: None },
            ShearRangeRepr::XY([x_low, x_high, y_low, y_high]) => Self { x: (x_low, x_high), y: Some((y_low, y_high)) },
        }
    }
}

impl From<ShearRange> for ShearRangeRepr {
    fn from(range: ShearRange) -> Self {
        match range.y {
            None => Self::X([range.x.0, range.x.1]),
            Some(y) => Self::XY([range.x.0, range.x.1, y.0, y.1]),
        }
    }
}

fn default_magnitude_bins() -> u32 {
    31
}

fn default_rand_augment_ops() -> u32 {
    2
}

fn default_rand_augment_magnitude() -> u32 {
    9
}

fn default_grayscale_p() -> f64 {
    0.1
}

fn default_erasing_p() -> f64 {
    0.5
}

fn default_erasing_scale() -> (f64, f64) {
    (0.02, 0.33)
}

fn default_erasing_ratio() -> (f64, f64) {
    (0.3, 3.3)
}

fn default_blur_sigma() -> (f64, f64) {
    (0.1, 2.0)
}

fn default_scale() -> (f64, f64) {
    (0.08, 1.0)
}

fn default_ratio() -> (f64, f64) {
    (3.0 / 4.0, 4.0 / 3.0)
}

fn default_flip_p() -> f64 {
    0.5
}

impl Transform {
    /// torchvision's `RandomResizedCrop(size)` with its defaults.
    pub fn random_resized_crop(size: u32) -> Self {
        Self::RandomResizedCrop {
            size: Size::square(size),
            scale: default_scale(),
            ratio: default_ratio(),
            interpolation: Interpolation::default(),
        }
    }

    /// The transform's torchvision name.
    pub fn name(&self) -> &'static str {
        match self {
            Self::RandomResizedCrop { .. } => "RandomResizedCrop",
            Self::Resize { .. } => "Resize",
            Self::CenterCrop { .. } => "CenterCrop",
            Self::RandomHorizontalFlip { .. } => "RandomHorizontalFlip",
            Self::Normalize { .. } => "Normalize",
            Self::ColorJitter { .. } => "ColorJitter",
            Self::RandomGrayscale { .. } => "RandomGrayscale",
            Self::RandomErasing { .. } => "RandomErasing",
            Self::GaussianBlur { .. } => "GaussianBlur",
            Self::TrivialAugmentWide { .. } => "TrivialAugmentWide",
            Self::RandAugment { .. } => "RandAugment",
            Self::AutoAugment { .. } => "AutoAugment",
            Self::RandomRotation { .. } => "RandomRotation",
            Self::RandomAffine { .. } => "RandomAffine",
        }
    }
}

/// The transforms of a job and how the worker runs them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TransformSpec {
    /// The transforms, in order.
    pub transforms: Vec<Transform>,
    /// Batch layout.
    #[serde(default)]
    pub layout: OutputLayout,
    /// Let JPEG decoding scale by M/8 in the DCT when the crop stays at least the output size
    /// (faster; slightly different pixels from a full decode). On by default.
    #[serde(default = "default_true")]
    pub dct_scaling: bool,
    /// What to do with an undecodable image.
    #[serde(default)]
    pub on_error: OnError,
    /// Refuse images with more pixels than this, before allocating anything for them.
    /// Default: Pillow's decompression-bomb threshold, 89,478,485 (a quarter GiB as RGB).
    #[serde(default = "default_max_pixels")]
    pub max_image_pixels: u64,
    /// The sample's fields (issue 32); empty, and absent from the JSON text, means today's
    /// image + `.cls` label, so specs without fields keep their exact bytes.
    #[serde(default, skip_serializing_if = "Fields::is_empty")]
    pub fields: Fields,
}

/// Specs hold no NaN, so equality is total: JSON (their form on the wire) cannot carry one, and
/// [`Recipe::new`], which every job's spec passes before anything makes it, refuses non-finite
/// values.
impl Eq for TransformSpec {}

fn default_true() -> bool {
    true
}

/// Default for [`TransformSpec::max_image_pixels`]: Pillow's `Image.MAX_IMAGE_PIXELS`.
pub const DEFAULT_MAX_IMAGE_PIXELS: u64 = 89_478_485;

fn default_max_pixels() -> u64 {
    DEFAULT_MAX_IMAGE_PIXELS
}

impl TransformSpec {
    /// A spec with these transforms and every other setting at its default.
    pub fn new(transforms: Vec<Transform>) -> Self {
        Self {
            transforms,
            layout: OutputLayout::default(),
            dct_scaling: true,
            on_error: OnError::default(),
            max_image_pixels: DEFAULT_MAX_IMAGE_PIXELS,
            fields: Fields::default(),
        }
    }

    /// ImageNet training augmentation: `RandomResizedCrop(size)` + `RandomHorizontalFlip()`,
    /// uint8 NHWC output (normalise on the GPU).
    pub fn imagenet_train(size: u32) -> Self {
        Self::new(vec![Transform::random_resized_crop(size), Transform::RandomHorizontalFlip { p: 0.5 }])
    }
}
