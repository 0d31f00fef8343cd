//! Non-JPEG members (PNG today) through the `image` crate. Slower than the JPEG path and it
//! allocates per image; it exists so that a dataset with a few PNGs trains instead of failing.

use std::io::Cursor;

use image::{ImageReader, Limits};

use crate::error::DecodeError;

/// Read the dimensions of a non-JPEG image without decoding its pixels.
pub(crate) fn dimensions(data: &[u8]) -> Result<(u32, u32), DecodeError> {
    let reader = ImageReader::new(Cursor::new(data)).with_guessed_format().map_err(|e| DecodeError::Other(e.to_string()))?;
    if reader.format().is_none() {
        return Err(DecodeError::UnknownFormat { magic: data.iter().take(4).map(|b| format!("{b:02x}")).collect() });
    }
    reader.into_dimensions().map_err(|e| DecodeError::Other(e.to_string()))
}

/// Decode the whole image as packed RGB into `out` (grown to fit), refusing any allocation
/// beyond what `max_pixels` RGBA pixels need.
pub(crate) fn decode_rgb(data: &[u8], max_pixels: u64, out: &mut Vec<u8>) -> Result<(u32, u32), DecodeError> {
    let mut reader = ImageReader::new(Cursor::new(data)).with_guessed_format().map_err(|e| DecodeError::Other(e.to_string()))?;
    let mut limits = Limits::default();
    limits.max_alloc = Some(max_pixels.saturating_mul(8));
    reader.limits(limits);
    let image = reader.decode().map_err(|e| DecodeError::Other(e.to_string()))?.into_rgb8();
    let (width, height) = image.dimensions();
    let pixels = image.as_raw();
    if out.len() < pixels.len() {
        out.resize(pixels.len(), 0);
    }
    out[..pixels.len()].copy_from_slice(pixels);
    Ok((width, height))
}
