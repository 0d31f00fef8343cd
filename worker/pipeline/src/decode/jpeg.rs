//! libjpeg-turbo through TurboJPEG 3's raw API. The `turbojpeg` crate's safe `Decompressor`
//! has no cropping region, so this module owns one `tjhandle` and calls `tj3SetScalingFactor`,
//! `tj3SetCroppingRegion` and `tj3Decompress8` itself. All `unsafe` of the decoder is here.
//!
//! With a cropping region TurboJPEG decodes only the iMCU columns the region touches, skips
//! the rows above it without IDCT (`jpeg_skip_scanlines`), and stops entropy decoding at the
//! region's last row (skipping to the end marks the input finished). That is the "decode as
//! little as the crop needs" of DESIGN §8.

use std::ffi::{CStr, c_int};
use std::ptr::NonNull;

use turbojpeg::raw;

use crate::error::DecodeError;

/// iMCU width in pixels by TurboJPEG subsampling code (444, 422, 420, gray, 440, 411, 441).
/// `tjMCUWidth` is a C array that does not link from Rust, so the table is repeated here.
const MCU_WIDTH: [u32; 7] = [8, 16, 16, 8, 8, 32, 8];

/// What the header says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct JpegHeader {
    pub(crate) width: u32,
    pub(crate) height: u32,
    /// iMCU width at scale 1 (cropping regions start on a multiple of its scaled value).
    pub(crate) mcu_width: u32,
    /// CMYK or YCCK: decoded as CMYK and converted here (libjpeg has no CMYK → RGB).
    pub(crate) cmyk: bool,
    /// Cropping and DCT scaling apply (not for lossless JPEG or an unknown subsampling).
    pub(crate) scalable: bool,
}

/// A rectangle of the scaled image, in scaled pixels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Region {
    pub(crate) x: u32,
    pub(crate) y: u32,
    pub(crate) width: u32,
    pub(crate) height: u32,
}

/// `TJSCALED`: a dimension scaled by `num / 8`, rounded up.
pub(crate) fn scaled(dimension: u32, num: u32) -> u32 {
    (dimension * num).div_ceil(8)
}

/// One TurboJPEG decompressor. Not `Sync`: each decode thread owns its own.
pub(crate) struct JpegDecoder {
    handle: NonNull<std::ffi::c_void>,
    max_pixels: Option<u64>,
}

// SAFETY: a tjhandle is plain heap state with no thread affinity; `&mut self` on every call
// keeps it to one thread at a time.
unsafe impl Send for JpegDecoder {}

impl std::fmt::Debug for JpegDecoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JpegDecoder").finish_non_exhaustive()
    }
}

impl JpegDecoder {
    /// A decompressor. Fails only when libjpeg-turbo cannot allocate its state.
    pub(crate) fn new() -> Result<Self, DecodeError> {
        // SAFETY: tj3Init has no preconditions; it returns null on failure.
        let handle = unsafe { raw::tj3Init(raw::TJINIT_TJINIT_DECOMPRESS as c_int) };
        let handle = NonNull::new(handle).ok_or_else(|| DecodeError::Jpeg("tj3Init failed: out of memory".to_owned()))?;
        Ok(Self { handle, max_pixels: None })
    }

    /// Replace the handle after an error: libjpeg leaves a decompressor that failed inside
    /// `jpeg_read_header` mid-header, and the next image would be parsed from that state.
    fn recover(&mut self) {
        if let Ok(mut fresh) = Self::new() {
            if let Some(max_pixels) = self.max_pixels
                && fresh.set_limits(max_pixels).is_err()
            {
                return;
            }
            std::mem::swap(self, &mut fresh);
        }
    }

    /// The error of the last call, after which the handle is replaced.
    fn fail(&mut self) -> DecodeError {
        let error = DecodeError::Jpeg(self.last_error());
        self.recover();
        error
    }

    fn is_warning(&self) -> bool {
        // SAFETY: the handle is live.
        unsafe { raw::tj3GetErrorCode(self.handle.as_ptr()) == raw::TJERR_TJERR_WARNING as c_int }
    }

    /// Refuse images over `max_pixels` inside libjpeg too, and cap its working memory (a
    /// progressive JPEG buffers every coefficient: 6 bytes per pixel at 4:4:4).
    pub(crate) fn set_limits(&mut self, max_pixels: u64) -> Result<(), DecodeError> {
        let pixels = c_int::try_from(max_pixels).unwrap_or(c_int::MAX);
        let megabytes = c_int::try_from(max_pixels.saturating_mul(6) / (1 << 20) + 64).unwrap_or(c_int::MAX);
        for (param, value) in [(raw::TJPARAM_TJPARAM_MAXPIXELS, pixels), (raw::TJPARAM_TJPARAM_MAXMEMORY, megabytes)] {
            // SAFETY: the handle is live; both parameters take any non-negative integer.
            if unsafe { raw::tj3Set(self.handle.as_ptr(), param as c_int, value) } != 0 {
                return Err(DecodeError::Jpeg(self.last_error()));
            }
        }
        self.max_pixels = Some(max_pixels);
        Ok(())
    }

    fn last_error(&self) -> String {
        // SAFETY: the handle is live; tj3GetErrorStr returns a NUL-terminated string owned by it.
        let message = unsafe { CStr::from_ptr(raw::tj3GetErrorStr(self.handle.as_ptr())) };
        message.to_string_lossy().trim().replace('\n', " ")
    }

    fn decompress_header(&mut self, data: &[u8]) -> c_int {
        // SAFETY: `data` is a live slice of `data.len()` bytes; TurboJPEG only reads it.
        unsafe { raw::tj3DecompressHeader(self.handle.as_ptr(), data.as_ptr(), data.len() as raw::size_t) }
    }

    fn get(&self, param: raw::TJPARAM) -> c_int {
        // SAFETY: the handle is live; tj3Get reads an integer parameter.
        unsafe { raw::tj3Get(self.handle.as_ptr(), param as c_int) }
    }

    /// Read the header of `data` (markers only, no pixels) and remember it for the next decode.
    pub(crate) fn read_header(&mut self, data: &[u8]) -> Result<JpegHeader, DecodeError> {
        let mut status = self.decompress_header(data);
        if status != 0 && self.is_warning() {
            // TurboJPEG reports "warning" for a fatal error that followed a warning, and keeps
            // the previous image's dimensions after a fatal error. On a fresh handle the
            // dimensions are unset (-1) unless this header was read to the end.
            self.recover();
            status = self.decompress_header(data);
        }
        let width = u32::try_from(self.get(raw::TJPARAM_TJPARAM_JPEGWIDTH)).unwrap_or(0);
        let height = u32::try_from(self.get(raw::TJPARAM_TJPARAM_JPEGHEIGHT)).unwrap_or(0);
        if status != 0 && (!self.is_warning() || width == 0 || height == 0) {
            return Err(self.fail());
        }
        if width == 0 || height == 0 {
            self.recover();
            return Err(DecodeError::Jpeg(format!("header gives an empty image ({width}x{height})")));
        }
        let subsamp = self.get(raw::TJPARAM_TJPARAM_SUBSAMP);
        let colorspace = self.get(raw::TJPARAM_TJPARAM_COLORSPACE);
        let lossless = self.get(raw::TJPARAM_TJPARAM_LOSSLESS) != 0;
        let precision = self.get(raw::TJPARAM_TJPARAM_PRECISION);
        let mcu_width = usize::try_from(subsamp).ok().and_then(|s| MCU_WIDTH.get(s)).copied();
        Ok(JpegHeader {
            width,
            height,
            mcu_width: mcu_width.unwrap_or(8),
            cmyk: colorspace == raw::TJCS_TJCS_CMYK as c_int || colorspace == raw::TJCS_TJCS_YCCK as c_int,
            scalable: mcu_width.is_some() && !lossless && precision == 8,
        })
    }

    /// Decode `region` of the image scaled by `num / 8` into `out` as packed RGB (3 bytes per
    /// pixel, rows of `region.width`). Call right after [`Self::read_header`] on the same data.
    /// `out` grows to fit and is never shrunk, so a thread's buffer stops allocating once it
    /// has seen its largest region. Returns libjpeg's warning when the data was corrupt but
    /// still gave an image (parts of it may be gray or black).
    pub(crate) fn decode(
        &mut self,
        data: &[u8],
        header: &JpegHeader,
        num: u32,
        region: Region,
        out: &mut Vec<u8>,
    ) -> Result<Option<String>, DecodeError> {
        let full = Region { x: 0, y: 0, width: scaled(header.width, num), height: scaled(header.height, num) };
        let scale = if num.is_multiple_of(8) {
            (1, 1)
        } else if num.is_multiple_of(4) {
            (num / 4, 2)
        } else if num.is_multiple_of(2) {
            (num / 2, 4)
        } else {
            (num, 8)
        };
        let factor = raw::tjscalingfactor { num: scale.0 as c_int, denom: scale.1 as c_int };
        // SAFETY: the handle is live; the factor is one of TurboJPEG's M/8 factors (M in 1..=8).
        if unsafe { raw::tj3SetScalingFactor(self.handle.as_ptr(), factor) } != 0 {
            return Err(self.fail());
        }
        let crop = if region == full {
            raw::tjregion { x: 0, y: 0, w: 0, h: 0 }
        } else {
            raw::tjregion { x: region.x as c_int, y: region.y as c_int, w: region.width as c_int, h: region.height as c_int }
        };
        // SAFETY: the handle is live and has read this image's header.
        if unsafe { raw::tj3SetCroppingRegion(self.handle.as_ptr(), crop) } != 0 {
            return Err(self.fail());
        }
        let channels: usize = if header.cmyk { 4 } else { 3 };
        let pitch = region.width as usize * channels;
        let needed = pitch * region.height as usize;
        if out.len() < needed {
            out.resize(needed, 0);
        }
        let format = if header.cmyk { raw::TJPF_TJPF_CMYK } else { raw::TJPF_TJPF_RGB };
        // SAFETY: `out` holds at least `pitch * region.height` bytes, which is what
        // tj3Decompress8 writes for a cropped decode of `region` at this scale.
        let status = unsafe {
            raw::tj3Decompress8(
                self.handle.as_ptr(),
                data.as_ptr(),
                data.len() as raw::size_t,
                out.as_mut_ptr(),
                pitch as c_int,
                format as c_int,
            )
        };
        // A warning ("corrupt JPEG data: N extraneous bytes", a premature end) still
        // produced an image; Pillow, and so torchvision, accepts those too. But TurboJPEG also
        // says "warning" when a fatal error followed one, leaving rows unwritten: decode again
        // over zeros so those rows are black, not the last image's pixels (determinism).
        if status != 0 && !self.is_warning() {
            return Err(self.fail());
        }
        let mut warning_opt = None;
        if status != 0 {
            warning_opt = Some(self.last_error());
            out[..needed].fill(0);
            self.recover();
            self.read_header(data)?;
            // SAFETY: as above; the fresh handle has read this image's header.
            let again = unsafe {
                raw::tj3SetScalingFactor(self.handle.as_ptr(), factor) == 0
                    && raw::tj3SetCroppingRegion(self.handle.as_ptr(), crop) == 0
                    && raw::tj3Decompress8(
                        self.handle.as_ptr(),
                        data.as_ptr(),
                        data.len() as raw::size_t,
                        out.as_mut_ptr(),
                        pitch as c_int,
                        format as c_int,
                    ) == 0
            };
            if !again && !self.is_warning() {
                return Err(self.fail());
            }
            self.recover();
        }
        if header.cmyk {
            cmyk_to_rgb_in_place(&mut out[..needed]);
        }
        Ok(warning_opt)
    }
}

impl Drop for JpegDecoder {
    fn drop(&mut self) {
        // SAFETY: the handle came from tj3Init and is destroyed once.
        unsafe { raw::tj3Destroy(self.handle.as_ptr()) }
    }
}

/// Round `x` down to a multiple of the iMCU width at scale `num / 8` (cropping regions must
/// start on one).
pub(crate) fn align_to_mcu(x: u32, header: &JpegHeader, num: u32) -> u32 {
    let step = scaled(header.mcu_width, num).max(1);
    x / step * step
}

/// Inverted CMYK (what Adobe applications write, and what libjpeg returns for them) to RGB,
/// packing 4-byte pixels into 3-byte ones from the front: `R = C·K / 255`, as Pillow does.
fn cmyk_to_rgb_in_place(pixels: &mut [u8]) {
    let count = pixels.len() / 4;
    for i in 0..count {
        let (c, m, y, k) = (pixels[4 * i], pixels[4 * i + 1], pixels[4 * i + 2], pixels[4 * i + 3]);
        let mul = |v: u8| ((u32::from(v) * u32::from(k) + 127) / 255) as u8;
        pixels[3 * i] = mul(c);
        pixels[3 * i + 1] = mul(m);
        pixels[3 * i + 2] = mul(y);
    }
}
