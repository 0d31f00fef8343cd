//! The tone operations of the auto-augment policies on packed RGB uint8 pixels, as torchvision
//! v2's `posterize_image`, `solarize_image`, `autocontrast_image`, `equalize_image` and
//! `adjust_sharpness_image` compute them on a uint8 tensor. All but sharpness are a 256-entry
//! table per channel.

/// Map each channel's values through its table.
fn map_channels(pixels: &mut [u8], tables: &[[u8; 256]; 3]) {
    let (rgb, _) = pixels.as_chunks_mut::<3>();
    for pixel in rgb {
        for (value, table) in pixel.iter_mut().zip(tables) {
            *value = table[usize::from(*value)];
        }
    }
}

/// Per-channel histograms.
fn histograms(pixels: &[u8]) -> [[u32; 256]; 3] {
    let mut counts = [[0u32; 256]; 3];
    let (rgb, _) = pixels.as_chunks::<3>();
    for pixel in rgb {
        for (channel, &value) in pixel.iter().enumerate() {
            counts[channel][usize::from(value)] += 1;
        }
    }
    counts
}

/// `posterize_image(bits)`: keep the top `bits` bits.
pub(crate) fn posterize(pixels: &mut [u8], bits: u8) {
    if bits >= 8 {
        return;
    }
    let mask = !(0xFFu8 >> bits);
    for value in pixels.iter_mut() {
        *value &= mask;
    }
}

/// `invert`: `255 - v` (a bitwise not, as torchvision computes it on uint8).
pub(crate) fn invert(pixels: &mut [u8]) {
    for value in pixels.iter_mut() {
        *value = !*value;
    }
}

/// `solarize_image(threshold)`: invert values at or above `threshold` (compared in float32, as
/// torch compares a uint8 tensor with a Python float).
pub(crate) fn solarize(pixels: &mut [u8], threshold: f64) {
    let threshold = threshold as f32;
    // A table: a branch per value mispredicts on photographs (8× slower).
    let table: [u8; 256] = std::array::from_fn(|value| if value as f32 >= threshold { 255 - value as u8 } else { value as u8 });
    for value in pixels.iter_mut() {
        *value = table[usize::from(*value)];
    }
}

/// `autocontrast_image`: stretch each channel from its minimum and maximum to 0–255, in
/// float32, truncated.
pub(crate) fn autocontrast(pixels: &mut [u8]) {
    let counts = histograms(pixels);
    let tables = counts.map(|histogram| {
        let present = |value: &usize| histogram[*value] > 0;
        let (Some(minimum), Some(maximum)) = ((0..256).find(present), (0..256).rev().find(present)) else {
            return std::array::from_fn(|value| value as u8);
        };
        let (minimum, inverse_scale) = if minimum == maximum {
            (0.0f32, 1.0f32)
        } else {
            (minimum as f32, (maximum as f32 - minimum as f32) * (1.0f64 / 255.0) as f32)
        };
        std::array::from_fn(|value| ((value as f32 - minimum) / inverse_scale) as u8)
    });
    map_channels(pixels, &tables);
}

/// `equalize_image`: Pillow's histogram equalisation per channel (torchvision's integer
/// formulation: `lut[k] = (cum[k - 1] + step / 2) / step`, `step` = the pixels not of the
/// channel's largest value, over 255), a channel left alone where `step` is 0.
pub(crate) fn equalize(pixels: &mut [u8]) {
    let counts = histograms(pixels);
    let total: u64 = counts[0].iter().map(|&count| u64::from(count)).sum();
    let tables = counts.map(|histogram| {
        let identity = std::array::from_fn(|value| value as u8);
        let Some(largest) = (0..256).rev().find(|&value| histogram[value] > 0) else { return identity };
        let step = (total - u64::from(histogram[largest])) / 255;
        if step == 0 {
            return identity;
        }
        let mut table = [0u8; 256];
        let mut cumulative = 0u64;
        for value in 1..256 {
            cumulative += u64::from(histogram[value - 1]);
            table[value] = ((cumulative + step / 2) / step).min(255) as u8;
        }
        table
    });
    map_channels(pixels, &tables);
}

/// `adjust_sharpness_image(factor)`: blend the inner pixels with a 3×3 smoothing (weights 1/13,
/// centre 5/13, rounded half to even); the border stays. Images under 3×3 are left alone.
pub(crate) fn sharpness(pixels: &mut [u8], width: usize, height: usize, factor: f64, scratch: &mut Vec<u8>) {
    if width <= 2 || height <= 2 {
        return;
    }
    scratch.clear();
    scratch.extend_from_slice(pixels);
    let source = &scratch[..];
    let (edge, centre) = ((1.0f64 / 13.0) as f32, (5.0f64 / 13.0) as f32);
    let alpha = (1.0 - factor) as f32;
    let row_len = width * 3;
    let weights = [[edge; 3], [edge, centre, edge], [edge; 3]];
    for y in 1..height - 1 {
        let rows = [0, 1, 2].map(|dy| &source[(y + dy - 1) * row_len..(y + dy) * row_len]);
        for x in 1..width - 1 {
            for channel in 0..3 {
                let mut smooth = 0f32;
                for (row, row_weights) in rows.iter().zip(&weights) {
                    for (dx, &weight) in row_weights.iter().enumerate() {
                        smooth += f32::from(row[(x + dx - 1) * 3 + channel]) * weight;
                    }
                }
                let original = f32::from(rows[1][x * 3 + channel]);
                let difference = smooth.round_ties_even() - original;
                // `view.add_(blurred - view, alpha=1 - factor)`, one rounding (fused), then
                // clamp and truncate.
                let blended = (f64::from(alpha) * f64::from(difference) + f64::from(original)) as f32;
                pixels[y * row_len + x * 3 + channel] = blended as u8;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn posterize_keeps_the_top_bits_and_solarize_inverts_from_the_threshold() {
        let mut values = vec![0, 37, 128, 255, 200, 7];
        posterize(&mut values, 3);
        assert_eq!(values, vec![0, 32, 128, 224, 192, 0]);
        let mut values = vec![0, 100, 127, 128, 255, 3];
        solarize(&mut values, 127.5);
        assert_eq!(values, vec![0, 100, 127, 127, 0, 3]);
        let mut unchanged = vec![1, 2, 3];
        posterize(&mut unchanged, 8);
        solarize(&mut unchanged, 255.5);
        assert_eq!(unchanged, vec![1, 2, 3]);
    }

    #[test]
    fn autocontrast_stretches_each_channel_to_the_full_range() {
        let mut image = vec![50, 10, 9, 100, 20, 9, 150, 30, 9];
        autocontrast(&mut image);
        // Minimum to 0, maximum to 255 but for float32 rounding of 1/255 (torchvision gives 254
        // for some ranges too: the parity test pins the exact values); a flat channel stays.
        assert_eq!([image[0], image[1], image[2]], [0, 0, 9]);
        assert!(image[3] >= 126 && image[3] <= 128 && image[6] >= 254 && image[7] >= 254, "{image:?}");
        assert_eq!([image[5], image[8]], [9, 9]);
    }

    #[test]
    fn equalize_spreads_a_narrow_histogram() {
        // 255 × 3 pixels: values 10, 11, 12 a third each.
        let mut image: Vec<u8> = (0..765).flat_map(|i| [10 + (i % 3) as u8; 3]).collect();
        equalize(&mut image);
        let levels: std::collections::BTreeSet<u8> = image.iter().copied().collect();
        // step = 510 / 255 = 2: lut[10] = 0, lut[11] = (255 + 1) / 2 = 128, lut[12] = (510 + 1) / 2 = 255.
        assert_eq!(levels.into_iter().collect::<Vec<_>>(), vec![0, 128, 255]);
    }

    #[test]
    fn sharpness_one_is_identity_and_the_border_stays() {
        let (width, height) = (5, 4);
        let original: Vec<u8> = (0..width * height * 3).map(|i| (i * 37 % 256) as u8).collect();
        let mut image = original.clone();
        let mut scratch = Vec::new();
        sharpness(&mut image, width, height, 1.0, &mut scratch);
        assert_eq!(image, original);
        sharpness(&mut image, width, height, 0.0, &mut scratch);
        assert_ne!(image, original);
        assert_eq!(image[..width * 3], original[..width * 3], "the top row stays");
    }
}
