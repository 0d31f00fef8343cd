//! The per-pixel stages after the resize: flip, normalise and lay out. Loops are written so
//! the compiler vectorises them (fixed 3-byte pixels, no bounds checks in the inner loop);
//! normalisation is a 256-entry table per channel, so a float output costs one load per value.

use half::f16;
use stoker_plan::transform::{FloatDtype, OutputLayout, Recipe};

/// Mirror packed RGB rows left-right in place.
pub(crate) fn flip_rows(pixels: &mut [u8], width: usize) {
    if width == 0 {
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("ssse3") {
        // SAFETY: SSSE3 is present (checked just above).
        unsafe { flip_rows_ssse3(pixels, width) };
        return;
    }
    for row in pixels.chunks_exact_mut(width * 3) {
        flip_row_scalar(row);
    }
}

/// Mirror one packed RGB row, a pixel at a time.
fn flip_row_scalar(row: &mut [u8]) {
    let (pixels, _) = row.as_chunks_mut::<3>();
    pixels.reverse();
}

/// Pixels per block of the SIMD flip: 16 RGB pixels are three 16-byte lanes.
#[cfg(target_arch = "x86_64")]
const BLOCK_PIXELS: usize = 16;

/// `pshufb` masks that mirror a block of 16 RGB pixels: output lane `r` is the OR of input lane
/// `k` shuffled by `FLIP_MASKS[r][k]` (0x80 selects zero).
#[cfg(target_arch = "x86_64")]
const FLIP_MASKS: [[[u8; 16]; 3]; 3] = {
    let mut masks = [[[0x80u8; 16]; 3]; 3];
    let mut out = 0;
    while out < 48 {
        let source = 3 * (BLOCK_PIXELS - 1 - out / 3) + out % 3;
        masks[out / 16][source / 16][out % 16] = (source % 16) as u8;
        out += 1;
    }
    masks
};

/// Mirror rows by swapping mirrored 16-pixel blocks from both ends; the middle, narrower than
/// two blocks, goes a pixel at a time.
///
/// The lane work is in `#[target_feature]` functions of its own rather than closures: a closure
/// does not inherit its function's target features, and once this code moved into its own crate
/// the closures' SSSE3 intrinsics stopped being inlined (the whole pipeline lost ~4%).
///
/// # Safety
/// The CPU must support SSSE3.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "ssse3")]
unsafe fn flip_rows_ssse3(pixels: &mut [u8], width: usize) {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128};

    // SAFETY: each mask is 16 bytes, read unaligned.
    let masks = FLIP_MASKS.map(|lanes| lanes.map(|mask| unsafe { _mm_loadu_si128(mask.as_ptr().cast::<__m128i>()) }));
    for row in pixels.chunks_exact_mut(width * 3) {
        let pairs = width / (2 * BLOCK_PIXELS);
        for pair in 0..pairs {
            let (head, tail) = row.split_at_mut(row.len() - (pair + 1) * FLIP_BLOCK);
            let (Some(left), Some(right)) =
                (head[pair * FLIP_BLOCK..].first_chunk_mut::<FLIP_BLOCK>(), tail.first_chunk_mut::<FLIP_BLOCK>())
            else {
                unreachable!("two blocks per pair fit in the row");
            };
            // SAFETY: SSSE3 is present (this function's contract).
            unsafe { swap_mirrored_blocks(left, right, &masks) };
        }
        let middle = pairs * FLIP_BLOCK..row.len() - pairs * FLIP_BLOCK;
        flip_row_scalar(&mut row[middle]);
    }
}

/// Bytes per block of the SIMD flip.
#[cfg(target_arch = "x86_64")]
const FLIP_BLOCK: usize = 3 * BLOCK_PIXELS;

/// Swap two 16-pixel blocks, mirroring each.
///
/// # Safety
/// The CPU must support SSSE3.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "ssse3")]
#[inline]
unsafe fn swap_mirrored_blocks(left: &mut [u8; FLIP_BLOCK], right: &mut [u8; FLIP_BLOCK], masks: &[[std::arch::x86_64::__m128i; 3]; 3]) {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_or_si128, _mm_shuffle_epi8, _mm_storeu_si128};

    // SAFETY: each block is exactly 48 bytes: three unaligned 16-byte lanes.
    let load = |block: &[u8; FLIP_BLOCK], k: usize| unsafe { _mm_loadu_si128(block.as_ptr().add(16 * k).cast::<__m128i>()) };
    let (l0, l1, l2) = (load(left, 0), load(left, 1), load(left, 2));
    let (r0, r1, r2) = (load(right, 0), load(right, 1), load(right, 2));
    for (lane, &[m0, m1, m2]) in masks.iter().enumerate() {
        let new_left = _mm_or_si128(_mm_or_si128(_mm_shuffle_epi8(r0, m0), _mm_shuffle_epi8(r1, m1)), _mm_shuffle_epi8(r2, m2));
        let new_right = _mm_or_si128(_mm_or_si128(_mm_shuffle_epi8(l0, m0), _mm_shuffle_epi8(l1, m1)), _mm_shuffle_epi8(l2, m2));
        // SAFETY: as the loads.
        unsafe {
            _mm_storeu_si128(left.as_mut_ptr().add(16 * lane).cast::<__m128i>(), new_left);
            _mm_storeu_si128(right.as_mut_ptr().add(16 * lane).cast::<__m128i>(), new_right);
        }
    }
}

/// How a packed RGB u8 image becomes the recipe's output bytes.
#[derive(Clone, Debug)]
pub(crate) enum OutputWriter {
    /// u8 NHWC: the resize writes the output itself.
    Direct,
    /// u8 NCHW: transpose.
    PlanarU8,
    /// Normalised f32, little-endian: one table per channel.
    F32 { lut: Box<[[f32; 256]; 3]>, layout: OutputLayout },
    /// Normalised f16, little-endian bits: one table per channel.
    F16 { lut: Box<[[u16; 256]; 3]>, layout: OutputLayout },
}

impl OutputWriter {
    /// The writer for `recipe`.
    pub(crate) fn new(recipe: &Recipe) -> Self {
        let Some(n) = recipe.normalize else {
            return match recipe.layout {
                OutputLayout::Nhwc => Self::Direct,
                OutputLayout::Nchw => Self::PlanarU8,
            };
        };
        let value = |c: usize, v: usize| (v as f32 / 255.0 - n.mean[c]) / n.std[c];
        match n.dtype {
            FloatDtype::F32 => {
                let mut lut = Box::new([[0f32; 256]; 3]);
                for (c, table) in lut.iter_mut().enumerate() {
                    for (v, slot) in table.iter_mut().enumerate() {
                        *slot = value(c, v);
                    }
                }
                Self::F32 { lut, layout: recipe.layout }
            }
            FloatDtype::F16 => {
                let mut lut = Box::new([[0u16; 256]; 3]);
                for (c, table) in lut.iter_mut().enumerate() {
                    for (v, slot) in table.iter_mut().enumerate() {
                        *slot = f16::from_f32(value(c, v)).to_bits();
                    }
                }
                Self::F16 { lut, layout: recipe.layout }
            }
        }
    }

    /// Whether the resize can write straight into the batch slot.
    pub(crate) fn is_direct(&self) -> bool {
        matches!(self, Self::Direct)
    }

    /// Write the packed RGB `src` (`width` × `height`) into `slot` in the output format.
    pub(crate) fn write(&self, src: &[u8], width: usize, height: usize, slot: &mut [u8]) {
        let plane = width * height;
        match self {
            Self::Direct => slot[..plane * 3].copy_from_slice(&src[..plane * 3]),
            Self::PlanarU8 => {
                let (r, rest) = slot.split_at_mut(plane);
                let (g, b) = rest.split_at_mut(plane);
                for (i, px) in src[..plane * 3].chunks_exact(3).enumerate() {
                    r[i] = px[0];
                    g[i] = px[1];
                    b[i] = px[2];
                }
            }
            Self::F32 { lut, layout } => write_float(src, plane, *layout, slot, |c, v| lut[c][usize::from(v)].to_le_bytes()),
            Self::F16 { lut, layout } => write_float(src, plane, *layout, slot, |c, v| lut[c][usize::from(v)].to_le_bytes()),
        }
    }
}

fn write_float<const N: usize>(src: &[u8], plane: usize, layout: OutputLayout, slot: &mut [u8], value: impl Fn(usize, u8) -> [u8; N]) {
    match layout {
        OutputLayout::Nhwc => {
            for (px, out) in src[..plane * 3].chunks_exact(3).zip(slot.chunks_exact_mut(3 * N)) {
                for c in 0..3 {
                    out[c * N..(c + 1) * N].copy_from_slice(&value(c, px[c]));
                }
            }
        }
        OutputLayout::Nchw => {
            for c in 0..3 {
                let out = &mut slot[c * plane * N..(c + 1) * plane * N];
                for (px, o) in src[..plane * 3].chunks_exact(3).zip(out.chunks_exact_mut(N)) {
                    o.copy_from_slice(&value(c, px[c]));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use stoker_plan::transform::{Transform, TransformSpec};

    use super::*;

    #[test]
    fn flip_mirrors_each_row() {
        let mut px = vec![1, 1, 1, 2, 2, 2, 3, 3, 3, 4, 4, 4, 5, 5, 5, 6, 6, 6];
        flip_rows(&mut px, 3);
        assert_eq!(px, vec![3, 3, 3, 2, 2, 2, 1, 1, 1, 6, 6, 6, 5, 5, 5, 4, 4, 4]);
    }

    /// Every width around the SIMD block sizes (one pair of blocks is 32 pixels), against a
    /// pixel-by-pixel mirror.
    #[test]
    fn flip_matches_a_pixel_by_pixel_mirror_at_every_width() {
        for width in 0..=100usize {
            let rows = 3;
            let original: Vec<u8> = (0..width * rows * 3).map(|i| (i * 7 + width) as u8).collect();
            let mut flipped = original.clone();
            flip_rows(&mut flipped, width);
            for y in 0..rows {
                for x in 0..width {
                    let at = |x: usize| (y * width + x) * 3;
                    let mirrored = at(width - 1 - x);
                    assert_eq!(flipped[at(x)..at(x) + 3], original[mirrored..mirrored + 3], "width {width}, row {y}, pixel {x}");
                }
            }
        }
    }

    fn recipe(normalize: Option<FloatDtype>, layout: OutputLayout) -> Recipe {
        let mut transforms = vec![Transform::CenterCrop { size: stoker_plan::transform::Size::square(2) }];
        if let Some(dtype) = normalize {
            transforms.push(Transform::Normalize { mean: [0.5, 0.25, 0.0], std: [0.5, 0.25, 2.0], dtype });
        }
        let mut spec = TransformSpec::new(transforms);
        spec.layout = layout;
        Recipe::new(&spec).expect("valid")
    }

    #[test]
    fn nchw_and_normalise_match_the_formula() {
        let src: Vec<u8> = (0..12).map(|v| v * 20).collect();
        let mut out = vec![0u8; 12];
        OutputWriter::new(&recipe(None, OutputLayout::Nchw)).write(&src, 2, 2, &mut out);
        assert_eq!(out, vec![0, 60, 120, 180, 20, 80, 140, 200, 40, 100, 160, 220]);

        let mut out = vec![0u8; 48];
        OutputWriter::new(&recipe(Some(FloatDtype::F32), OutputLayout::Nhwc)).write(&src, 2, 2, &mut out);
        let floats: Vec<f32> = out.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
        let expected = |i: usize| {
            let (mean, std) = ([0.5f32, 0.25, 0.0][i % 3], [0.5f32, 0.25, 2.0][i % 3]);
            (f32::from(src[i]) / 255.0 - mean) / std
        };
        for (i, v) in floats.iter().enumerate() {
            assert!((v - expected(i)).abs() < 1e-6, "{i}: {v} vs {}", expected(i));
        }

        let mut out = vec![0u8; 24];
        OutputWriter::new(&recipe(Some(FloatDtype::F16), OutputLayout::Nchw)).write(&src, 2, 2, &mut out);
        // Channel 0 of pixel 1 (value 60) is the second f16 of the first plane.
        let v = f16::from_bits(u16::from_le_bytes([out[2], out[3]])).to_f32();
        assert!((v - (60.0 / 255.0 - 0.5) / 0.5).abs() < 1e-3, "{v}");
    }
}
