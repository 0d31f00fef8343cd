//! Affine warps of packed RGB uint8 pixels with nearest-neighbour sampling and fill 0, as
//! torchvision v2's `affine_image` and `rotate_image` make them on a uint8 tensor
//! (`interpolation=NEAREST`, `fill=None`, the defaults of its auto-augment policies): the inverse
//! matrix of `_get_inverse_affine_matrix` in float64, then in float32 the sampling grid of
//! `_affine_grid` and `grid_sample`'s unnormalisation (`align_corners=False`), each source
//! coordinate rounded half to even; a source outside the image gives 0.

/// The inverse affine matrix `[a, b, c, d, e, f]` (source = `[[a, b, c], [d, e, f]]` · output,
/// in pixel coordinates relative to the image centre), exactly as torchvision computes it.
fn inverse_affine_matrix(center: [f64; 2], angle: f64, translate: [f64; 2], scale: f64, shear: [f64; 2]) -> [f64; 6] {
    let rot = angle.to_radians();
    let (sx, sy) = (shear[0].to_radians(), shear[1].to_radians());
    let [cx, cy] = center;
    let [tx, ty] = translate;
    let cos_sy = sy.cos();
    let tan_sx = sx.tan();
    let rot_minus_sy = rot - sy;
    let (cx_plus_tx, cy_plus_ty) = (cx + tx, cy + ty);
    let a = rot_minus_sy.cos() / cos_sy;
    let b = -(a * tan_sx + rot.sin());
    let c = rot_minus_sy.sin() / cos_sy;
    let d = rot.cos() - c * tan_sx;
    // The inverse of the rotation-shear block is its adjugate (determinant 1), over the scale.
    let mut matrix = [d / scale, -b / scale, 0.0, -c / scale, a / scale, 0.0];
    matrix[2] += cx - matrix[0] * cx_plus_tx - matrix[1] * cy_plus_ty;
    matrix[5] += cy - matrix[3] * cx_plus_tx - matrix[4] * cy_plus_ty;
    matrix
}

/// `torch.linspace(start, end, steps)` in float32 as torch's CPU kernel computes it: from the
/// start for the first half, from the end for the second.
fn linspace_f32(start: f32, end: f32, steps: usize, index: usize) -> f32 {
    if steps == 1 {
        return start;
    }
    let step = (end - start) / (steps - 1) as f32;
    if index < steps / 2 { start + step * index as f32 } else { end - step * (steps - 1 - index) as f32 }
}

/// Warp `pixels` (`width` × `height`) by the inverse `matrix`, nearest neighbour, fill 0.
fn warp(pixels: &mut [u8], width: usize, height: usize, matrix: [f64; 6], scratch: &mut Vec<u8>) {
    scratch.clear();
    scratch.extend_from_slice(pixels);
    let source = &scratch[..];
    let theta = matrix.map(|value| value as f32);
    let (half_width, half_height) = (0.5 * width as f32, 0.5 * height as f32);
    // `theta.transpose(1, 2).div_([0.5 w, 0.5 h])`: the x row over 0.5 w, the y row over 0.5 h.
    let x_row = [theta[0] / half_width, theta[1] / half_width, theta[2] / half_width];
    let y_row = [theta[3] / half_height, theta[4] / half_height, theta[5] / half_height];
    let (width_f, height_f) = (width as f32, height as f32);
    for (out_y, row) in pixels.chunks_exact_mut(width * 3).enumerate() {
        let base_y = linspace_f32((1.0 - height_f) * 0.5, (height_f - 1.0) * 0.5, height, out_y);
        for (out_x, pixel) in row.chunks_exact_mut(3).enumerate() {
            let base_x = linspace_f32((1.0 - width_f) * 0.5, (width_f - 1.0) * 0.5, width, out_x);
            let grid_x = base_x * x_row[0] + base_y * x_row[1] + x_row[2];
            let grid_y = base_x * y_row[0] + base_y * y_row[1] + y_row[2];
            // grid_sample, align_corners=False: ((g + 1) * size - 1) / 2, then nearbyint.
            let source_x = (((grid_x + 1.0) * width_f - 1.0) / 2.0).round_ties_even();
            let source_y = (((grid_y + 1.0) * height_f - 1.0) / 2.0).round_ties_even();
            let inside = source_x >= 0.0 && source_x < width_f && source_y >= 0.0 && source_y < height_f;
            if inside {
                let at = (source_y as usize * width + source_x as usize) * 3;
                pixel.copy_from_slice(&source[at..at + 3]);
            } else {
                pixel.fill(0);
            }
        }
    }
}

/// The parameters of `affine_image(angle, translate, scale, shear, NEAREST, fill=None,
/// center)`: `center` in pixels from the top-left corner, `None` for the image centre.
#[derive(Clone, Copy, Debug)]
pub(crate) struct AffineParams {
    pub(crate) angle: f64,
    pub(crate) translate: [f64; 2],
    pub(crate) scale: f64,
    pub(crate) shear: [f64; 2],
    pub(crate) center: Option<[f64; 2]>,
}

/// `affine_image` with `params`.
pub(crate) fn affine(pixels: &mut [u8], width: usize, height: usize, params: AffineParams, scratch: &mut Vec<u8>) {
    let AffineParams { angle, translate, scale, shear, center } = params;
    let center_from_middle = center.map_or([0.0, 0.0], |[x, y]| [x - width as f64 * 0.5, y - height as f64 * 0.5]);
    warp(pixels, width, height, inverse_affine_matrix(center_from_middle, angle, translate, scale, shear), scratch);
}

/// `rotate_image(angle, NEAREST, expand=False, center=None, fill=None)`: counter-clockwise by
/// `angle` degrees about the centre; exact quarter turns as torchvision special-cases them (any
/// image for 0 and 180, square ones for 90 and 270).
pub(crate) fn rotate(pixels: &mut [u8], width: usize, height: usize, angle: f64, scratch: &mut Vec<u8>) {
    let angle = angle.rem_euclid(360.0);
    if angle == 0.0 {
        return;
    }
    if angle == 180.0 {
        let (rgb, _) = pixels.as_chunks_mut::<3>();
        rgb.reverse();
        return;
    }
    if width == height && (angle == 90.0 || angle == 270.0) {
        scratch.clear();
        scratch.extend_from_slice(pixels);
        let side = width;
        for y in 0..side {
            for x in 0..side {
                // torch.rot90(k=1) of [H, W]: out[y][x] = in[x][W-1-y]; k=3: in[H-1-x][y].
                let (source_y, source_x) = if angle == 90.0 { (x, side - 1 - y) } else { (side - 1 - x, y) };
                let (to, from) = ((y * side + x) * 3, (source_y * side + source_x) * 3);
                pixels[to..to + 3].copy_from_slice(&scratch[from..from + 3]);
            }
        }
        return;
    }
    warp(pixels, width, height, inverse_affine_matrix([0.0, 0.0], -angle, [0.0, 0.0], 1.0, [0.0, 0.0]), scratch);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn numbered(width: usize, height: usize) -> Vec<u8> {
        (0..width * height).flat_map(|i| [i as u8, (i * 7) as u8, 1]).collect()
    }

    #[test]
    fn an_integer_translation_moves_pixels_and_fills_with_zero() {
        let (width, height) = (6, 5);
        let original = numbered(width, height);
        let mut moved = original.clone();
        let params = AffineParams { angle: 0.0, translate: [2.0, -1.0], scale: 1.0, shear: [0.0, 0.0], center: None };
        affine(&mut moved, width, height, params, &mut Vec::new());
        for y in 0..height {
            for x in 0..width {
                let at = (y * width + x) * 3;
                let expected = match (x.checked_sub(2), (y + 1 < height).then_some(y + 1)) {
                    (Some(sx), Some(sy)) => original[(sy * width + sx) * 3..(sy * width + sx) * 3 + 3].to_vec(),
                    _ => vec![0; 3],
                };
                assert_eq!(moved[at..at + 3], expected[..], "({x}, {y})");
            }
        }
    }

    #[test]
    fn quarter_turns_agree_with_the_general_warp_and_four_make_a_circle() {
        let side = 7;
        let original = numbered(side, side);
        let mut scratch = Vec::new();
        for angle in [90.0, 270.0, 180.0] {
            let mut special = original.clone();
            rotate(&mut special, side, side, angle, &mut scratch);
            let mut general = original.clone();
            warp(&mut general, side, side, inverse_affine_matrix([0.0, 0.0], -angle, [0.0, 0.0], 1.0, [0.0, 0.0]), &mut scratch);
            assert_eq!(special, general, "{angle}");
        }
        let mut turned = original.clone();
        for _ in 0..4 {
            rotate(&mut turned, side, side, 90.0, &mut scratch);
        }
        assert_eq!(turned, original);
        let mut zero = original.clone();
        rotate(&mut zero, side, side, -360.0, &mut scratch);
        assert_eq!(zero, original);
    }
}
