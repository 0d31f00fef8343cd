//! Crop boxes. [`random_resized_crop`] is torchvision's `RandomResizedCrop.get_params`
//! transcribed line for line (torchvision 0.20, `transforms/transforms.py`), with torch's random
//! calls replaced by draws from the sample's [`SplitMix64`] stream:
//!
//! | torchvision                                         | here                              |
//! |-----------------------------------------------------|-----------------------------------|
//! | `torch.empty(1).uniform_(a, b).item()`              | `rng.uniform(a, b)` = a + (b−a)·u |
//! | `torch.exp(torch.empty(1).uniform_(la, lb)).item()` | `rng.uniform(la, lb).exp()`       |
//! | `torch.randint(0, n, size=(1,)).item()`             | `rng.below(n)`                    |
//! | Python's `round` (half to even)                     | `f64::round_ties_even`            |
//!
//! Everything is `f64`, as Python floats are. `tests/compat/torchvision_rrc.py` runs
//! torchvision's own function text against the same draws, and the worker's tests compare.

use crate::prng::SplitMix64;

/// A crop in source pixels: rows `top..top + height`, columns `left..left + width`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CropBox {
    /// First row (torchvision's `i`).
    pub top: u32,
    /// First column (`j`).
    pub left: u32,
    /// Rows (`h`).
    pub height: u32,
    /// Columns (`w`).
    pub width: u32,
}

/// Where a resized source region lands in the output, for the geometry that is not a plain
/// "crop box → whole output" (`Resize` + `CenterCrop`, which can pad).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Placement {
    /// Source region, in source pixels; fractional because a resize scales it.
    pub src_left: f64,
    /// See `src_left`.
    pub src_top: f64,
    /// See `src_left`.
    pub src_width: f64,
    /// See `src_left`.
    pub src_height: f64,
    /// Output rectangle the region is resized into; the rest of the output is black.
    pub dst_left: u32,
    /// See `dst_left`.
    pub dst_top: u32,
    /// See `dst_left`.
    pub dst_width: u32,
    /// See `dst_left`.
    pub dst_height: u32,
}

/// torchvision's `RandomResizedCrop.get_params(img, scale, ratio)` for an image of `width` ×
/// `height` (both > 0), drawing from `rng`: up to 10 attempts at a random area and log-uniform
/// aspect ratio, then the centre-crop fallback.
pub fn random_resized_crop(width: u32, height: u32, scale: (f64, f64), ratio: (f64, f64), rng: &mut SplitMix64) -> CropBox {
    let (width_f, height_f) = (f64::from(width), f64::from(height));
    let area = height_f * width_f;
    let log_ratio = (ratio.0.ln(), ratio.1.ln());
    for _ in 0..10 {
        let target_area = area * rng.uniform(scale.0, scale.1);
        let aspect_ratio = rng.uniform(log_ratio.0, log_ratio.1).exp();
        let w = (target_area * aspect_ratio).sqrt().round_ties_even();
        let h = (target_area / aspect_ratio).sqrt().round_ties_even();
        if 0.0 < w && w <= width_f && 0.0 < h && h <= height_f {
            // In range by the test above, so the casts are exact.
            let (w, h) = (w as u32, h as u32);
            let top = rng.below(u64::from(height - h + 1)) as u32;
            let left = rng.below(u64::from(width - w + 1)) as u32;
            return CropBox { top, left, height: h, width: w };
        }
    }
    // Fallback to central crop.
    let in_ratio = width_f / height_f;
    let (min_ratio, max_ratio) = (ratio.0.min(ratio.1), ratio.0.max(ratio.1));
    let (w, h) = if in_ratio < min_ratio {
        (width, clamp_to(width_f / min_ratio, height))
    } else if in_ratio > max_ratio {
        (clamp_to(height_f * max_ratio, width), height)
    } else {
        (width, height)
    };
    CropBox { top: (height - h) / 2, left: (width - w) / 2, height: h, width: w }
}

/// `int(round(value))` held to `1..=limit` (the clamp only matters for degenerate ratios).
fn clamp_to(value: f64, limit: u32) -> u32 {
    (value.round_ties_even() as u32).clamp(1, limit)
}

/// torchvision's `Resize(shorter_side)` output size for a `width` × `height` image: the shorter
/// side becomes `shorter_side`, the longer `int(shorter_side * long / short)`.
pub fn resized_size(width: u32, height: u32, shorter_side: u32) -> (u32, u32) {
    let (short, long) = (width.min(height), width.max(height));
    let new_long = (u64::from(shorter_side) * u64::from(long) / u64::from(short.max(1))).min(u64::from(u32::MAX)) as u32;
    if width <= height { (shorter_side, new_long) } else { (new_long, shorter_side) }
}

/// Where the output of `[Resize(shorter_side)], CenterCrop(crop)` comes from in a `width` ×
/// `height` source, following torchvision: `crop_top = int(round((h - ch) / 2))`, and padding
/// with black (image centred at `(ch - h) // 2`) where the crop is larger than the image.
pub fn resize_center_crop(width: u32, height: u32, shorter_side: Option<u32>, crop_width: u32, crop_height: u32) -> Placement {
    let (resized_w, resized_h) = shorter_side.map_or((width, height), |side| resized_size(width, height, side));
    let (dst_left, src_left_r, len_x) = center_axis(resized_w, crop_width);
    let (dst_top, src_top_r, len_y) = center_axis(resized_h, crop_height);
    let scale_x = f64::from(width) / f64::from(resized_w.max(1));
    let scale_y = f64::from(height) / f64::from(resized_h.max(1));
    Placement {
        src_left: f64::from(src_left_r) * scale_x,
        src_top: f64::from(src_top_r) * scale_y,
        src_width: f64::from(len_x) * scale_x,
        src_height: f64::from(len_y) * scale_y,
        dst_left,
        dst_top,
        dst_width: len_x,
        dst_height: len_y,
    }
}

/// One axis of a centre crop of `crop` out of `size`: (output offset, source offset, length).
fn center_axis(size: u32, crop: u32) -> (u32, u32, u32) {
    if crop > size {
        // torchvision pads by (crop - size) // 2 before, the rest after, then crops at 0.
        ((crop - size) / 2, 0, size)
    } else {
        let offset = (f64::from(size - crop) / 2.0).round_ties_even() as u32;
        (0, offset, crop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boxes_stay_inside_the_image_for_any_seed_and_size() {
        for seed in 0..2000u64 {
            let mut rng = SplitMix64::new(seed);
            let width = 1 + (seed * 37 % 700) as u32;
            let height = 1 + (seed * 91 % 500) as u32;
            let b = random_resized_crop(width, height, (0.08, 1.0), (0.75, 4.0 / 3.0), &mut rng);
            assert!(b.width >= 1 && b.height >= 1, "{b:?}");
            assert!(b.left + b.width <= width && b.top + b.height <= height, "{b:?} in {width}x{height}");
        }
    }

    #[test]
    fn impossible_ratio_falls_back_to_the_centre_crop() {
        // A 1000x10 strip cannot hold a box of ratio ≤ 4/3 with 8% of its area: every attempt
        // fails, and the fallback takes the full height and width = round(10 * 4/3) = 13.
        let mut rng = SplitMix64::new(7);
        let b = random_resized_crop(1000, 10, (0.5, 1.0), (0.75, 4.0 / 3.0), &mut rng);
        assert_eq!(b, CropBox { top: 0, left: (1000 - 13) / 2, height: 10, width: 13 });
    }

    #[test]
    fn resize_follows_torchvision_rounding() {
        assert_eq!(resized_size(500, 375, 256), (341, 256));
        assert_eq!(resized_size(375, 500, 256), (256, 341));
        assert_eq!(resized_size(256, 256, 224), (224, 224));
    }

    #[test]
    fn center_crop_of_a_resized_image_maps_back_to_the_source() {
        // 500x375 -> 341x256, centre 224: left = round(117 / 2) = 58 (half to even), top = 16.
        let p = resize_center_crop(500, 375, Some(256), 224, 224);
        assert_eq!((p.dst_left, p.dst_top, p.dst_width, p.dst_height), (0, 0, 224, 224));
        assert!((p.src_left - 58.0 * 500.0 / 341.0).abs() < 1e-9);
        assert!((p.src_top - 16.0 * 375.0 / 256.0).abs() < 1e-9);
    }

    #[test]
    fn center_crop_larger_than_the_image_pads() {
        let p = resize_center_crop(100, 50, None, 120, 40);
        assert_eq!((p.dst_left, p.dst_width), (10, 100));
        assert_eq!((p.dst_top, p.dst_height), (0, 40));
        assert_eq!((p.src_left, p.src_top, p.src_width, p.src_height), (0.0, 5.0, 100.0, 40.0));
    }
}
