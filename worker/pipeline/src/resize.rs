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
