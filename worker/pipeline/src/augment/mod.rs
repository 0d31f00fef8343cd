//! The per-pixel augmentations ([`PixelOp`]) on a packed RGB uint8 image: after the resize and
//! the flip, before `Normalize`. Each matches torchvision v2's functional of the same name on
//! a uint8 tensor with the same explicit parameters, within the tolerance docs/transforms.md
//! states (python/tests/test_augment_parity.py checks it). The parameters come from
//! [`stoker_plan::transform::Augmentations::draw`].

mod blur;
mod color;
mod geometry;
mod tone;

use stoker_plan::transform::PixelOp;

use self::blur::BlurScratch;

/// A thread's reusable buffers for [`apply`].
#[derive(Debug, Default)]
pub struct AugmentScratch {
    blur: BlurScratch,
    copy: Vec<u8>,
}

/// Apply `ops`, in order, to the `width` × `height` packed RGB image `pixels` (exactly
/// `width * height * 3` bytes). Parameters are taken as given: [`PixelOp::check`] them first
/// where they come from outside a recipe.
pub fn apply(ops: &[PixelOp], pixels: &mut [u8], width: usize, height: usize, scratch: &mut AugmentScratch) {
    debug_assert_eq!(pixels.len(), width * height * 3, "a packed RGB image of {width}x{height}");
    for op in ops {
        match *op {
            PixelOp::Brightness { factor } => color::brightness(pixels, factor),
            PixelOp::Contrast { factor } => color::contrast(pixels, factor),
            PixelOp::Saturation { factor } => color::saturation(pixels, factor),
            PixelOp::Hue { factor } => color::hue(pixels, factor),
            PixelOp::Grayscale => color::grayscale(pixels),
            PixelOp::Erase { top, left, height: box_height, width: box_width, value } => {
                erase(pixels, width, height, [top, left, box_height, box_width].map(|v| v as usize), value);
            }
            PixelOp::GaussianBlur { kernel_size, sigma } => {
                blur::gaussian_blur(pixels, width, height, kernel_size, sigma, &mut scratch.blur)
            }
            PixelOp::Sharpness { factor } => tone::sharpness(pixels, width, height, factor, &mut scratch.copy),
            PixelOp::Posterize { bits } => tone::posterize(pixels, bits),
            PixelOp::Solarize { threshold } => tone::solarize(pixels, threshold),
            PixelOp::AutoContrast => tone::autocontrast(pixels),
            PixelOp::Equalize => tone::equalize(pixels),
            PixelOp::Affine { angle, translate, scale, shear, center } => {
                let params = geometry::AffineParams { angle, translate, scale, shear, center };
                geometry::affine(pixels, width, height, params, &mut scratch.copy);
            }
            PixelOp::Rotate { angle } => geometry::rotate(pixels, width, height, angle, &mut scratch.copy),
            PixelOp::Invert => tone::invert(pixels),
        }
    }
}

/// `erase_image`: fill the box (clipped to the image, as a tensor slice is) with `value`.
fn erase(pixels: &mut [u8], width: usize, height: usize, [top, left, box_height, box_width]: [usize; 4], value: [u8; 3]) {
    let (bottom, right) = ((top.saturating_add(box_height)).min(height), (left.saturating_add(box_width)).min(width));
    if left >= right {
        return;
    }
    for row in pixels.chunks_exact_mut(width * 3).take(bottom).skip(top) {
        for pixel in row[left * 3..right * 3].chunks_exact_mut(3) {
            pixel.copy_from_slice(&value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn erase_fills_exactly_the_box_and_clips_at_the_edges() {
        let (width, height) = (6, 4);
        let mut image = vec![9u8; width * height * 3];
        let mut scratch = AugmentScratch::default();
        apply(&[PixelOp::Erase { top: 1, left: 2, height: 2, width: 3, value: [1, 2, 3] }], &mut image, width, height, &mut scratch);
        for y in 0..height {
            for x in 0..width {
                let inside = (1..3).contains(&y) && (2..5).contains(&x);
                let at = (y * width + x) * 3;
                assert_eq!(image[at..at + 3], if inside { [1, 2, 3] } else { [9; 3] }, "({x}, {y})");
            }
        }
        apply(&[PixelOp::Erase { top: 3, left: 5, height: 10, width: 10, value: [0; 3] }], &mut image, width, height, &mut scratch);
        assert_eq!(image[(3 * width + 5) * 3..], [0, 0, 0]);
    }

    #[test]
    fn ops_apply_in_order() {
        let mut scratch = AugmentScratch::default();
        let mut gray_then_bright = vec![200u8, 10, 10];
        apply(&[PixelOp::Grayscale, PixelOp::Brightness { factor: 2.0 }], &mut gray_then_bright, 1, 1, &mut scratch);
        let mut bright_then_gray = vec![200u8, 10, 10];
        apply(&[PixelOp::Brightness { factor: 2.0 }, PixelOp::Grayscale], &mut bright_then_gray, 1, 1, &mut scratch);
        assert_eq!(gray_then_bright, vec![132; 3]);
        assert_ne!(gray_then_bright, bright_then_gray);
    }
}
