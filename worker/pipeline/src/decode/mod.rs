//! Image decode: read a header, then decode only the part of the image a crop needs, at the
//! smallest DCT scale that keeps the crop at least as large as the output.

mod fallback;
mod jpeg;
pub(crate) mod restart;
mod transcode;

use stoker_plan::transform::Interpolation;

use self::jpeg::{JpegDecoder, JpegHeader, Region, align_to_mcu, scaled};
use self::restart::{Intervals, Layout};
pub use self::transcode::{make_seekable, make_seekable_for_pack};
use crate::error::DecodeError;

/// A header read from an image member.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Probe {
    /// A JPEG libjpeg-turbo can decode.
    Jpeg(JpegHeader),
    /// Another format, decoded whole by the fallback.
    Other {
        /// Pixels per row.
        width: u32,
        /// Rows.
        height: u32,
    },
}

impl Probe {
    /// Source dimensions.
    pub(crate) fn size(&self) -> (u32, u32) {
        match *self {
            Self::Jpeg(h) => (h.width, h.height),
            Self::Other { width, height } => (width, height),
        }
    }
}

/// The part of the source a sample needs, as requested by the geometry.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct SourceBox {
    pub(crate) left: f64,
    pub(crate) top: f64,
    pub(crate) width: f64,
    pub(crate) height: f64,
}

/// A decoded region: packed RGB rows of `width` pixels. The resize treats `view` (an integer
/// sub-rectangle) as its whole source image, and reads `crop` (fractional, relative to `view`)
/// out of it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Decoded {
    pub(crate) width: u32,
    pub(crate) height: u32,
    pub(crate) view: View,
    pub(crate) crop: SourceBox,
    /// The DCT scale used, M in M/8.
    pub(crate) scale_num: u32,
    /// libjpeg warned (corrupt data that still gave an image); the text is in
    /// [`Decoder::last_warning`].
    pub(crate) warned: bool,
}

/// An integer rectangle of a decoded region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct View {
    pub(crate) left: u32,
    pub(crate) top: u32,
    pub(crate) width: u32,
    pub(crate) height: u32,
}

/// What the resize may read around the box.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Edges {
    /// Only the box (torchvision's crop-then-resize: RandomResizedCrop, CenterCrop).
    Clip,
    /// The image around the box too (resize-then-crop: Resize + CenterCrop).
    Image,
}

/// Per-thread decoder state.
#[derive(Debug)]
pub(crate) struct Decoder {
    jpeg: JpegDecoder,
    max_pixels: u64,
    /// Restart intervals of the image being decoded, and the band JPEG cut from them.
    intervals: Intervals,
    band: Vec<u8>,
    /// libjpeg's warning for the last image decoded with one.
    last_warning: String,
}

const JPEG_MAGIC: [u8; 3] = [0xff, 0xd8, 0xff];

impl Decoder {
    /// A decoder refusing images over `max_pixels`.
    pub(crate) fn new(max_pixels: u64) -> Result<Self, DecodeError> {
        let mut jpeg = JpegDecoder::new()?;
        jpeg.set_limits(max_pixels)?;
        Ok(Self { jpeg, max_pixels, intervals: Intervals::default(), band: Vec::new(), last_warning: String::new() })
    }

    /// libjpeg's warning for the last image that decoded with one.
    pub(crate) fn last_warning(&self) -> &str {
        &self.last_warning
    }

    /// Keep `warning_opt`'s text; whether there was one.
    fn note(&mut self, warning_opt: Option<String>) -> bool {
        match warning_opt {
            Some(warning) => {
                self.last_warning = warning;
                true
            }
            None => false,
        }
    }

    /// Read the header and refuse empty or oversized images before anything is allocated.
    pub(crate) fn probe(&mut self, data: &[u8]) -> Result<Probe, DecodeError> {
        if data.is_empty() {
            return Err(DecodeError::Empty);
        }
        let probe = if data.starts_with(&JPEG_MAGIC) {
            Probe::Jpeg(self.jpeg.read_header(data)?)
        } else {
            let (width, height) = fallback::dimensions(data)?;
            Probe::Other { width, height }
        };
        let (width, height) = probe.size();
        let pixels = u64::from(width) * u64::from(height);
        if pixels > self.max_pixels || width == 0 || height == 0 {
            return Err(DecodeError::TooLarge { width, height, pixels, limit: self.max_pixels });
        }
        Ok(probe)
    }

    /// Decode what `want` (in source pixels) needs for an output of `out_width` × `out_height`
    /// into `out`. With `dct_scaling`, a JPEG is decoded at the smallest M/8 that keeps the box
    /// at least the output size; the region decoded is the box plus the resize filter's
    /// support, so resizing it gives the pixels resizing the whole image would.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn decode(
        &mut self,
        data: &[u8],
        probe: &Probe,
        want: SourceBox,
        out_width: u32,
        out_height: u32,
        interpolation: Interpolation,
        edges: Edges,
        dct_scaling: bool,
        out: &mut Vec<u8>,
    ) -> Result<Decoded, DecodeError> {
        let header = match probe {
            Probe::Jpeg(header) if header.scalable => header,
            Probe::Jpeg(header) => {
                let region = Region { x: 0, y: 0, width: header.width, height: header.height };
                let warning_opt = self.jpeg.decode(data, header, 8, region, out)?;
                let warned = self.note(warning_opt);
                return Ok(Decoded { warned, ..whole(header.width, header.height, want, edges) });
            }
            Probe::Other { .. } => {
                let (width, height) = fallback::decode_rgb(data, self.max_pixels, out)?;
                return Ok(whole(width, height, want, edges));
            }
        };
        let num = if dct_scaling { dct_scale(want, out_width, out_height) } else { 8 };
        let factor = f64::from(num) / 8.0;
        let (full_w, full_h) = (scaled(header.width, num), scaled(header.height, num));
        let scaled_box =
            SourceBox { left: want.left * factor, top: want.top * factor, width: want.width * factor, height: want.height * factor };
        let (margin_x, margin_y) = match edges {
            Edges::Clip => (0.0, 0.0),
            Edges::Image => {
                (filter_margin(interpolation, scaled_box.width, out_width), filter_margin(interpolation, scaled_box.height, out_height))
            }
        };
        let x0 = align_to_mcu(clamp_floor(scaled_box.left - margin_x, full_w), header, num);
        let y0 = clamp_floor(scaled_box.top - margin_y, full_h);
        let x1 = clamp_ceil(scaled_box.left + scaled_box.width + margin_x, full_w).max(x0 + 1);
        let y1 = clamp_ceil(scaled_box.top + scaled_box.height + margin_y, full_h).max(y0 + 1);
        let region = Region { x: x0, y: y0, width: x1 - x0, height: y1 - y0 };
        let warning_opt = self.decode_region(data, header, num, region, out)?;
        let in_region = SourceBox { left: scaled_box.left - f64::from(x0), top: scaled_box.top - f64::from(y0), ..scaled_box };
        let mut decoded = whole(region.width, region.height, in_region, edges);
        decoded.scale_num = num;
        decoded.warned = self.note(warning_opt);
        Ok(decoded)
    }
}

/// `want` in a decoded image of `width` × `height`: with [`Edges::Clip`] the view is the
/// smallest integer rectangle holding the box, else the whole image.
fn whole(width: u32, height: u32, want: SourceBox, edges: Edges) -> Decoded {
    let full = View { left: 0, top: 0, width, height };
    let view = match edges {
        Edges::Image => full,
        Edges::Clip => {
            let left = clamp_floor(want.left, width);
            let top = clamp_floor(want.top, height);
            let right = clamp_ceil(want.left + want.width, width).max(left + 1);
            let bottom = clamp_ceil(want.top + want.height, height).max(top + 1);
            View { left, top, width: right - left, height: bottom - top }
        }
    };
    let crop = SourceBox { left: want.left - f64::from(view.left), top: want.top - f64::from(view.top), ..want };
    Decoded { width, height, view, crop, scale_num: 8, warned: false }
}

impl Decoder {
    /// Decode `region` (scaled by `num / 8`): from the band of restart intervals it covers
    /// when the JPEG has them, else from the whole file with a cropping region.
    fn decode_region(
        &mut self,
        data: &[u8],
        header: &JpegHeader,
        num: u32,
        region: Region,
        out: &mut Vec<u8>,
    ) -> Result<Option<String>, DecodeError> {
        let rect = [region.x, region.y, region.width, region.height];
        if let Some(band) = Layout::parse(data).and_then(|layout| layout.band(data, num, rect, &mut self.intervals, &mut self.band)) {
            let inner = Region { x: region.x - band.left * num / 8, y: region.y - band.top * num / 8, ..region };
            let decoded =
                self.jpeg.read_header(&self.band).and_then(|band_header| self.jpeg.decode(&self.band, &band_header, num, inner, out));
            if let Ok(warning_opt) = decoded {
                return Ok(warning_opt);
            }
            // A band that libjpeg refuses (damaged data behind well-formed markers): decode
            // the file as it is, so the sample fails or warns exactly as it would without
            // restart markers.
            self.jpeg.read_header(data)?;
        }
        self.jpeg.decode(data, header, num, region, out)
    }

    /// Decode a whole JPEG at full scale (the benchmark floor).
    pub(crate) fn decode_full(&mut self, data: &[u8], probe: &Probe, out: &mut Vec<u8>) -> Result<(), DecodeError> {
        let Probe::Jpeg(header) = probe else { return Err(DecodeError::Other("not a JPEG".to_owned())) };
        let region = Region { x: 0, y: 0, width: header.width, height: header.height };
        self.jpeg.decode(data, header, 8, region, out).map(drop)
    }
}

/// The smallest M in {1, 2, 4, 8} such that the box scaled by M/8 is at least the output
/// size. Only these scales have SIMD IDCTs in libjpeg-turbo; at 3/8, 5/8, 6/8 and 7/8 it runs
/// scalar C IDCTs (and 2M×2M ones for subsampled chroma) that cost more than decoding at the
/// next power of two and resizing a little more (measured: BENCHMARKS.md).
pub(crate) fn dct_scale(want: SourceBox, out_width: u32, out_height: u32) -> u32 {
    [1, 2, 4]
        .into_iter()
        .find(|&m| want.width * f64::from(m) >= 8.0 * f64::from(out_width) && want.height * f64::from(m) >= 8.0 * f64::from(out_height))
        .unwrap_or(8)
}

/// Source pixels beyond the box that the resize filter reads on each side.
fn filter_margin(interpolation: Interpolation, box_len: f64, out_len: u32) -> f64 {
    let support = match interpolation {
        Interpolation::Nearest => return 0.0,
        Interpolation::Bilinear => 1.0,
        Interpolation::Bicubic => 2.0,
    };
    (support * (box_len / f64::from(out_len.max(1))).max(1.0)).ceil() + 1.0
}

fn clamp_floor(value: f64, limit: u32) -> u32 {
    (value.floor().max(0.0) as u32).min(limit.saturating_sub(1))
}

fn clamp_ceil(value: f64, limit: u32) -> u32 {
    (value.ceil().max(0.0) as u32).min(limit)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dct_scale_keeps_the_crop_at_least_the_output() {
        let b = |w: f64, h: f64| SourceBox { left: 0.0, top: 0.0, width: w, height: h };
        assert_eq!(dct_scale(b(224.0, 224.0), 224, 224), 8);
        assert_eq!(dct_scale(b(448.0, 448.0), 224, 224), 4);
        assert_eq!(dct_scale(b(447.0, 1000.0), 224, 224), 8);
        assert_eq!(dct_scale(b(896.0, 1000.0), 224, 224), 2);
        assert_eq!(dct_scale(b(1792.0, 1792.0), 224, 224), 1);
        assert_eq!(dct_scale(b(100.0, 100.0), 224, 224), 8);
    }
}
