//! Resize through `fast_image_resize`'s typed RGB8 API (SIMD: SSE4.1/AVX2 chosen at run time).
//! The typed API compiles one pixel type instead of all of them, which keeps release rebuilds
//! of this crate short.

use fast_image_resize::images::{TypedCroppedImage, TypedImage, TypedImageRef};
use fast_image_resize::pixels::U8x3;
use fast_image_resize::{FilterType, ResizeAlg, ResizeOptions, Resizer};
use stoker_plan::transform::Interpolation;

use crate::decode::{Decoded, SourceBox};
use crate::error::DecodeError;

/// A resizer with its scratch buffers (kept between calls).
#[derive(Debug, Default)]
pub(crate) struct Resize {
    resizer: Resizer,
}

impl Resize {
    /// Resize `decoded.crop` of `decoded.view` of the packed RGB `src` into all of `dst`
    /// (`dst_width` × `dst_height`, packed RGB). The view is the resize's whole source image:
    /// its filter never reads outside it.
    pub(crate) fn resize(
        &mut self,
        src: &[u8],
        decoded: &Decoded,
        dst: &mut [u8],
        dst_width: u32,
        dst_height: u32,
        interpolation: Interpolation,
    ) -> Result<(), DecodeError> {
        let error = |e: &dyn std::fmt::Display| DecodeError::Resize(e.to_string());
        let image = TypedImageRef::<U8x3>::from_buffer(decoded.width, decoded.height, src).map_err(|e| error(&e))?;
        let v = decoded.view;
        let src = TypedCroppedImage::new(image, v.left, v.top, v.width, v.height).map_err(|e| error(&e))?;
        let crop: SourceBox = decoded.crop;
        let mut dst = TypedImage::<U8x3>::from_buffer(dst_width, dst_height, dst).map_err(|e| error(&e))?;
        let algorithm = match interpolation {
            Interpolation::Nearest => ResizeAlg::Nearest,
            Interpolation::Bilinear => ResizeAlg::Convolution(FilterType::Bilinear),
            Interpolation::Bicubic => ResizeAlg::Convolution(FilterType::CatmullRom),
        };
        let options = ResizeOptions::new().resize_alg(algorithm).crop(crop.left, crop.top, crop.width, crop.height);
        self.resizer.resize_typed(&src, &mut dst, &options).map_err(|e| error(&e))
    }
}

#[cfg(test)]
mod tests {
    use stoker_plan::transform::crop::resize_center_crop;

    use super::*;
    use crate::decode::View;

    /// The region `left..left + width` × `top..top + height` of an image whose pixel (x, y)
    /// is (x % 256, x / 256, y % 256).
    fn coordinates_region(left: u32, top: u32, width: u32, height: u32) -> Vec<u8> {
        (top..top + height)
            .flat_map(|y| (left..left + width).flat_map(move |x| [(x % 256) as u8, (x / 256) as u8, (y % 256) as u8]))
            .collect()
    }

    #[test]
    fn nearest_reads_the_pixel_a_whole_position_lands_on() {
        // Resize(160) + CenterCrop(128) of 640x427: resized to 239x160, crop offset (56, 16).
        // Output column 63 is resized column 119, whose centre maps to source x =
        // 119.5 * 640 / 239 = 320 exactly; the worker hands the resize the region from column
        // 144 (the crop's left edge, 149.96, aligned down to a 16-pixel MCU) and row 42. Every
        // output reads the pixel its exact position lands on, also at such a tie. (Pillow, and
        // so torchvision on PIL images, accumulates the step in floating point and reads 319
        // there: python/README.md, "Parity with torchvision".)
        let (left, top) = (144, 42);
        let (width, height) = (640 - left, 427 - top);
        let p = resize_center_crop(640, 427, Some(160), 128, 128);
        let decoded = Decoded {
            width,
            height,
            view: View { left: 0, top: 0, width, height },
            crop: SourceBox {
                left: p.src_left - f64::from(left),
                top: p.src_top - f64::from(top),
                width: p.src_width,
                height: p.src_height,
            },
            scale_num: 8,
            warned: false,
        };
        let src = coordinates_region(left, top, width, height);
        let mut dst = vec![0u8; 128 * 128 * 3];
        Resize::default().resize(&src, &decoded, &mut dst, 128, 128, Interpolation::Nearest).expect("resize");
        for y in 0..128usize {
            for x in 0..128usize {
                // Exactly, in integers: floor((offset + i + 0.5) * source / resized).
                let want_x = ((2 * (56 + x) + 1) * 640) / (2 * 239);
                let want_y = ((2 * (16 + y) + 1) * 427) / (2 * 160);
                let pixel = &dst[(y * 128 + x) * 3..][..3];
                assert_eq!(
                    (usize::from(pixel[0]) + 256 * usize::from(pixel[1]), usize::from(pixel[2])),
                    (want_x, want_y % 256),
                    "output ({x}, {y})"
                );
            }
        }
    }
}
