//! Gaussian blur of packed RGB uint8 pixels as torchvision v2's `gaussian_blur_image`: the
//! kernel `softmax(-(x / sigma)²)` over `x = linspace(-lim, lim, k)`, `lim = (k - 1) / (2√2)`
//! (a Gaussian of standard deviation `sigma` over integer offsets), reflected edges
//! (`torch.nn.functional.pad(mode="reflect")`: the edge pixel is not repeated), float32
//! arithmetic, rounded half to even. torchvision convolves with the 2-D outer product of the
//! two kernels; this makes a horizontal pass, then a vertical one, which is the same sum
//! grouped differently (float rounding apart).

/// Reusable buffers of the blur.
#[derive(Debug, Default)]
pub(crate) struct BlurScratch {
    rows: Vec<f32>,
    padded: Vec<f32>,
    kernel_x: Vec<f32>,
    kernel_y: Vec<f32>,
}

/// The normalised 1-D kernel of `size` taps (odd) for `sigma`, into `kernel`.
fn gaussian_kernel(size: u32, sigma: f64, kernel: &mut Vec<f32>) {
    let half = i64::from(size / 2);
    let weights = (-half..=half).map(|offset| (-(offset * offset) as f64 / (2.0 * sigma * sigma)).exp());
    let weights: Vec<f64> = weights.collect();
    let total: f64 = weights.iter().sum();
    kernel.clear();
    kernel.extend(weights.iter().map(|weight| (weight / total) as f32));
}

/// `index` reflected into `0..len` without repeating the edge (…, 2, 1, | 0, 1, …, n-1, | n-2, …),
/// periodically for offsets wider than the image (where torch refuses; a 1-pixel side is
/// constant).
#[inline]
fn reflect(index: isize, len: usize) -> usize {
    if len == 1 {
        return 0;
    }
    let period = 2 * (len as isize - 1);
    let folded = index.rem_euclid(period);
    (if folded < len as isize { folded } else { period - folded }) as usize
}

/// Blur the `width` × `height` packed RGB `pixels` in place.
pub(crate) fn gaussian_blur(
    pixels: &mut [u8],
    width: usize,
    height: usize,
    kernel_size: [u32; 2],
    sigma: [f64; 2],
    scratch: &mut BlurScratch,
) {
    if width == 0 || height == 0 {
        return;
    }
    gaussian_kernel(kernel_size[0], sigma[0], &mut scratch.kernel_x);
    gaussian_kernel(kernel_size[1], sigma[1], &mut scratch.kernel_y);
    let (kernel_x, kernel_y) = (&scratch.kernel_x, &scratch.kernel_y);
    let row_len = width * 3;
    scratch.rows.clear();
    scratch.rows.resize(row_len * height, 0.0);
    let half_x = kernel_x.len() / 2;
    let rows = &mut scratch.rows;
    // Horizontal pass into float rows: each source row is copied once, as floats, with its
    // reflected margins, so the taps read a plain slice (the same sums in the same order).
    let padded = &mut scratch.padded;
    padded.clear();
    padded.resize((width + 2 * half_x) * 3, 0.0);
    for (src_row, dst_row) in pixels.chunks_exact(row_len).zip(rows.chunks_exact_mut(row_len)) {
        for (x, slot) in padded.chunks_exact_mut(3).enumerate() {
            let source = reflect(x as isize - half_x as isize, width) * 3;
            for c in 0..3 {
                slot[c] = f32::from(src_row[source + c]);
            }
        }
        dst_row.fill(0.0);
        for (tap, &weight) in kernel_x.iter().enumerate() {
            for (sum, &value) in dst_row.iter_mut().zip(&padded[tap * 3..tap * 3 + row_len]) {
                *sum += weight * value;
            }
        }
    }
    // Vertical pass: each output row is a weighted sum of whole float rows.
    let half_y = (kernel_y.len() / 2) as isize;
    let mut accumulator = vec![0f32; row_len];
    for (y, out_row) in pixels.chunks_exact_mut(row_len).enumerate() {
        accumulator.fill(0.0);
        for (tap, &weight) in kernel_y.iter().enumerate() {
            let source = reflect(y as isize + tap as isize - half_y, height);
            let source_row = &rows[source * row_len..(source + 1) * row_len];
            for (sum, &value) in accumulator.iter_mut().zip(source_row) {
                *sum += weight * value;
            }
        }
        for (out, &sum) in out_row.iter_mut().zip(&accumulator) {
            // `round_()` (half to even) then `.to(torch.uint8)`; the sum of a normalised
            // kernel over levels stays in [0, 255] but for rounding, which `as` clamps.
            *out = sum.round_ties_even() as u8;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reflection_does_not_repeat_the_edge() {
        let reflected: Vec<usize> = (-3..8).map(|i| reflect(i, 5)).collect();
        assert_eq!(reflected, vec![3, 2, 1, 0, 1, 2, 3, 4, 3, 2, 1]);
        assert_eq!(reflect(-4, 1), 0);
    }

    #[test]
    fn kernel_is_normalised_symmetric_and_peaks_in_the_middle() {
        let mut kernel = Vec::new();
        gaussian_kernel(7, 1.5, &mut kernel);
        assert_eq!(kernel.len(), 7);
        assert!((kernel.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        for i in 0..3 {
            assert_eq!(kernel[i], kernel[6 - i]);
            assert!(kernel[i] < kernel[i + 1]);
        }
    }

    #[test]
    fn a_flat_image_stays_flat_and_a_point_spreads_as_the_kernel() {
        let mut scratch = BlurScratch::default();
        let mut flat = vec![90u8; 9 * 7 * 3];
        gaussian_blur(&mut flat, 9, 7, [5, 3], [1.2, 0.7], &mut scratch);
        assert!(flat.iter().all(|&v| v == 90));
        // A single bright pixel in the middle becomes the outer product of the kernels × 255.
        let (width, height) = (9, 9);
        let mut point = vec![0u8; width * height * 3];
        point[(4 * width + 4) * 3..(4 * width + 4) * 3 + 3].fill(255);
        gaussian_blur(&mut point, width, height, [3, 3], [1.0, 1.0], &mut scratch);
        let mut kernel = Vec::new();
        gaussian_kernel(3, 1.0, &mut kernel);
        for (dy, ky) in kernel.iter().enumerate() {
            for (dx, kx) in kernel.iter().enumerate() {
                let at = ((3 + dy) * width + 3 + dx) * 3;
                assert_eq!(f32::from(point[at]), (255.0 * kx * ky).round_ties_even(), "offset {dx}, {dy}");
            }
        }
        assert_eq!(point[0], 0);
    }
}
