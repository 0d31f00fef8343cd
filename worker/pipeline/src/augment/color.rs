//! Colour operations on packed RGB uint8 pixels, each written as torchvision v2's functional
//! computes it on a uint8 tensor: float32 arithmetic, clamped to [0, 255], then truncated
//! toward zero (`Tensor.to(torch.uint8)`), never rounded. Brightness and contrast map each
//! value on its own, so they are a 256-entry table; saturation, grayscale and hue need the
//! whole pixel.

/// torchvision's luma weights (`_rgb_to_grayscale_image`: 0.2989, 0.587, 0.114).
const LUMA: [f32; 3] = [0.2989, 0.587, 0.114];

/// `c + a * b` rounded once to float32, as torch's vectorised `add_(b, alpha=a)` computes it
/// (a fused multiply-add). The product of two float32s is exact in float64, so this is one
/// float64 addition away from a true fused operation, and cheap where no FMA unit is assumed.
#[inline]
fn fused(a: f32, b: f32, c: f32) -> f32 {
    (f64::from(a) * f64::from(b) + f64::from(c)) as f32
}

/// Gray level of a pixel, in float32 as torchvision sums it:
/// `r.mul(0.2989).add_(g, alpha=0.587).add_(b, alpha=0.114)`.
#[inline]
fn luma(pixel: &[u8; 3]) -> f32 {
    let red = f32::from(pixel[0]) * LUMA[0];
    fused(f32::from(pixel[2]), LUMA[2], fused(f32::from(pixel[1]), LUMA[1], red))
}

/// float32 → uint8 as `clamp_(0, 255).to(torch.uint8)`: truncation toward zero.
#[inline]
fn to_u8(value: f32) -> u8 {
    // `as` saturates at 0 and 255 and truncates, exactly the clamp and the conversion.
    value as u8
}

/// Map every value through `table`.
fn map_values(pixels: &mut [u8], table: &[u8; 256]) {
    for value in pixels.iter_mut() {
        *value = table[usize::from(*value)];
    }
}

/// `_blend(image, other, ratio)` for a constant `other`: `image * ratio + other * (1 - ratio)`.
fn blend_table(ratio: f64, other: f32) -> [u8; 256] {
    let (ratio, alpha) = (ratio as f32, (1.0 - ratio) as f32);
    std::array::from_fn(|value| to_u8(fused(alpha, other, value as f32 * ratio)))
}

/// `adjust_brightness_image`: every value times `factor`.
pub(crate) fn brightness(pixels: &mut [u8], factor: f64) {
    let factor = factor as f32;
    let table: [u8; 256] = std::array::from_fn(|value| to_u8(value as f32 * factor));
    map_values(pixels, &table);
}

/// `adjust_contrast_image`: blend with the mean of the floored gray levels.
pub(crate) fn contrast(pixels: &mut [u8], factor: f64) {
    let (rgb, _) = pixels.as_chunks::<3>();
    if rgb.is_empty() {
        return;
    }
    // The floored levels are integers, so this sum is exact; torch's float32 mean of them
    // rounds the quotient once, as this does.
    let sum: f64 = rgb.iter().map(|pixel| f64::from(luma(pixel).floor())).sum();
    let mean = (sum / rgb.len() as f64) as f32;
    map_values(pixels, &blend_table(factor, mean));
}

/// `adjust_saturation_image`: blend each pixel with its own floored gray level.
pub(crate) fn saturation(pixels: &mut [u8], factor: f64) {
    let (ratio, alpha) = (factor as f32, (1.0 - factor) as f32);
    let (rgb, _) = pixels.as_chunks_mut::<3>();
    for pixel in rgb {
        let gray = luma(pixel).floor();
        for value in pixel.iter_mut() {
            *value = to_u8(fused(alpha, gray, f32::from(*value) * ratio));
        }
    }
}

/// `rgb_to_grayscale_image(num_output_channels=3)`: the truncated gray level in every channel.
pub(crate) fn grayscale(pixels: &mut [u8]) {
    let (rgb, _) = pixels.as_chunks_mut::<3>();
    for pixel in rgb {
        *pixel = [to_u8(luma(pixel)); 3];
    }
}

/// `adjust_hue_image`: to float in [0, 1], to HSV (`_rgb_to_hsv`), hue + `factor` modulo 1,
/// back (`_hsv_to_rgb`), to uint8 by `x * 255.999` truncated (`to_dtype_image`).
pub(crate) fn hue(pixels: &mut [u8], factor: f64) {
    let factor = factor as f32;
    let (rgb, _) = pixels.as_chunks_mut::<3>();
    for pixel in rgb {
        *pixel = hue_pixel(pixel, factor);
    }
}

/// One pixel of [`hue`], operation for operation as torchvision's tensor code.
fn hue_pixel(pixel: &[u8; 3], factor: f32) -> [u8; 3] {
    const TO_UNIT: f32 = (1.0 / 255.0) as f32;
    const TO_LEVEL: f32 = (255.0 + 1.0 - 1e-3) as f32;
    let [r, g, b] = pixel.map(|value| f32::from(value) * TO_UNIT);
    let (max, min) = (r.max(g).max(b), r.min(g).min(b));
    let equal = max == min;
    let range = max - min;
    let saturation = range / if equal { 1.0 } else { max };
    let divisor = if equal { 1.0 } else { range };
    let (rc, gc, bc) = ((max - r) / divisor, (max - g) / divisor, (max - b) / divisor);
    // torchvision adds the three masked terms; exactly one is non-zero.
    let hue_r = if max == r { bc - gc } else { 0.0 };
    let hue_g = if max == g && max != r { rc + 2.0 - bc } else { 0.0 };
    let hue_b = if max != r && max != g { gc + 4.0 - rc } else { 0.0 };
    let turns = ((hue_r + hue_g + hue_b) * (1.0f64 / 6.0) as f32 + 1.0) % 1.0;
    // `remainder_(1.0)`: fmod, moved into [0, 1) as Python's `%` does.
    let shifted = {
        let rest = (turns + factor) % 1.0;
        if rest < 0.0 { rest + 1.0 } else { rest }
    };
    let value = max;
    let sextant_f = (shifted * 6.0).floor();
    let fraction = shifted * 6.0 - sextant_f;
    let sextant = (sextant_f as i32).rem_euclid(6) as usize;
    let s_f = saturation * fraction;
    let one_minus_s = 1.0 - saturation;
    let q = ((1.0 - s_f) * value).clamp(0.0, 1.0);
    let t = ((s_f + one_minus_s) * value).clamp(0.0, 1.0);
    let p = (one_minus_s * value).clamp(0.0, 1.0);
    let vpqt = [value, p, q, t];
    const SELECT: [[usize; 6]; 3] = [[0, 2, 1, 1, 3, 0], [3, 0, 0, 2, 1, 1], [1, 1, 3, 0, 0, 2]];
    SELECT.map(|row| to_u8(vpqt[row[sextant]] * TO_LEVEL))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every pixel value in a few arrangements: a 16×16 image of all levels per channel.
    fn ramp() -> Vec<u8> {
        (0..256 * 3).map(|i| ((i * 97 + i / 3 * 31) % 256) as u8).collect()
    }

    #[test]
    fn factor_one_and_hue_zero_leave_the_image_alone() {
        let original = ramp();
        for op in [brightness as fn(&mut [u8], f64), contrast, saturation] {
            let mut image = original.clone();
            op(&mut image, 1.0);
            assert_eq!(image, original);
        }
        let mut image = original.clone();
        hue(&mut image, 0.0);
        // The round trip through HSV and `x * 255.999` truncated returns every level.
        assert_eq!(image, original);
    }

    #[test]
    fn grayscale_uses_torchvisions_weights_and_truncates() {
        let mut image = vec![255, 255, 255, 255, 0, 0, 0, 255, 0, 0, 0, 255, 10, 20, 30];
        grayscale(&mut image);
        // White is 254: 255 × 0.9999 truncated, as torchvision gives.
        let expected = [254u8, 76, 149, 29, (10.0f64 * 0.2989 + 20.0 * 0.587 + 30.0 * 0.114) as u8];
        let got: Vec<u8> = image.chunks_exact(3).map(|pixel| pixel[0]).collect();
        assert_eq!(got, expected);
        assert!(image.chunks_exact(3).all(|pixel| pixel[0] == pixel[1] && pixel[1] == pixel[2]));
    }

    #[test]
    fn brightness_scales_clamps_and_truncates() {
        let mut image = vec![0, 10, 100, 200, 255, 3];
        brightness(&mut image, 1.5);
        assert_eq!(image, vec![0, 15, 150, 255, 255, 4]);
    }

    #[test]
    fn contrast_zero_is_the_mean_gray_and_saturation_zero_is_gray() {
        let mut image = vec![0, 0, 0, 255, 255, 255];
        contrast(&mut image, 0.0);
        // Floored levels 0 and 254 (white), mean 127.
        assert_eq!(image, vec![127; 6]);
        let mut image = ramp();
        let mut gray = image.clone();
        saturation(&mut image, 0.0);
        grayscale(&mut gray);
        assert_eq!(image, gray);
    }

    #[test]
    fn hue_half_turn_swaps_to_the_complement() {
        // Pure red turned half a turn is cyan.
        let mut image = vec![255, 0, 0, 0, 255, 0];
        hue(&mut image, 0.5);
        assert_eq!(image, vec![0, 255, 255, 255, 0, 255]);
        // Grays have no hue and stay.
        let mut gray = vec![77, 77, 77];
        hue(&mut gray, 0.3);
        assert_eq!(gray, vec![77, 77, 77]);
    }
}
