//! Lossless re-encoding of a JPEG into the seekable form [`super::restart`] cuts: the same DCT
//! coefficients (so the same pixels), one restart interval per MCU, optimized Huffman tables,
//! a single sequential scan, every marker (Exif, ICC, comments) kept. This is libjpeg-turbo's
//! `jpegtran -restart 1B -optimize`, through TurboJPEG's `tj3Transform`.

use std::ffi::c_int;
use std::ptr::NonNull;

use stoker_plan::transform::DEFAULT_MAX_IMAGE_PIXELS;
use turbojpeg::raw;

use super::restart::Layout;

/// How often a restart marker is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Restart {
    /// Every N MCUs.
    Mcus(u16),
    /// Every N MCU rows.
    #[cfg(test)]
    Rows(u16),
}

/// The interval `stoker pack` writes. One per MCU lets a crop be cut at any MCU column; the
/// markers cost ~2% of the file and the decoder's slower Huffman path for files with restart
/// markers ~5% of a full decode (both measured on ImageNet-like data: BENCHMARKS.md).
const PACK_RESTART: Restart = Restart::Mcus(1);

/// Re-encode `jpeg` losslessly with restart markers, or `None` to store it as it is: not a
/// JPEG, over `max_pixels`, not losslessly transformable (lossless or 12-bit JPEG), or damaged
/// (any libjpeg warning: re-encoding would store libjpeg's repair, not the file's data).
pub fn make_seekable(jpeg: &[u8], max_pixels: u64) -> Option<Vec<u8>> {
    transcode(jpeg, max_pixels, PACK_RESTART).filter(|bytes| Layout::parse(bytes).is_some())
}

/// [`make_seekable`] with the default pixel limit of a transform spec: the rewrite
/// `stoker pack` applies to every JPEG (`PackOptions::rewrite_jpeg`).
pub fn make_seekable_for_pack(jpeg: &[u8]) -> Option<Vec<u8>> {
    make_seekable(jpeg, DEFAULT_MAX_IMAGE_PIXELS)
}

/// Re-encode `jpeg` losslessly with restart markers every `restart`; `None` as for
/// [`make_seekable`].
pub(crate) fn transcode(jpeg: &[u8], max_pixels: u64, restart: Restart) -> Option<Vec<u8>> {
    if !jpeg.starts_with(&[0xff, 0xd8, 0xff]) {
        return None;
    }
    let transformer = Transformer::new()?;
    let pixels = c_int::try_from(max_pixels).unwrap_or(c_int::MAX);
    for (param, value) in [
        match restart {
            Restart::Mcus(n) => (raw::TJPARAM_TJPARAM_RESTARTBLOCKS, c_int::from(n)),
            #[cfg(test)]
            Restart::Rows(n) => (raw::TJPARAM_TJPARAM_RESTARTROWS, c_int::from(n)),
        },
        (raw::TJPARAM_TJPARAM_MAXPIXELS, pixels),
        (raw::TJPARAM_TJPARAM_SAVEMARKERS, 2),
        (raw::TJPARAM_TJPARAM_STOPONWARNING, 1),
    ] {
        // SAFETY: the handle is live; each parameter takes these values.
        if unsafe { raw::tj3Set(transformer.0.as_ptr(), param as c_int, value) } != 0 {
            return None;
        }
    }
    let transform = raw::tjtransform {
        r: raw::tjregion { x: 0, y: 0, w: 0, h: 0 },
        op: raw::TJXOP_TJXOP_NONE as c_int,
        options: raw::TJXOPT_OPTIMIZE as c_int,
        data: std::ptr::null_mut(),
        customFilter: None,
    };
    let mut output: *mut u8 = std::ptr::null_mut();
    let mut size: raw::size_t = 0;
    // SAFETY: `jpeg` is a live slice; with a null destination TurboJPEG allocates the output
    // (freed below with tj3Free) and stores its size.
    let status = unsafe {
        raw::tj3Transform(transformer.0.as_ptr(), jpeg.as_ptr(), jpeg.len() as raw::size_t, 1, &mut output, &mut size, &transform)
    };
    let bytes = NonNull::new(output).map(|output| {
        // SAFETY: TurboJPEG wrote `size` bytes at `output`.
        let bytes = unsafe { std::slice::from_raw_parts(output.as_ptr(), size as usize) }.to_vec();
        // SAFETY: allocated by TurboJPEG, freed once.
        unsafe { raw::tj3Free(output.as_ptr().cast()) };
        bytes
    })?;
    (status == 0).then_some(bytes)
}

/// A TurboJPEG transform handle, destroyed on drop.
struct Transformer(NonNull<std::ffi::c_void>);

impl Transformer {
    fn new() -> Option<Self> {
        // SAFETY: tj3Init has no preconditions; it returns null on failure.
        NonNull::new(unsafe { raw::tj3Init(raw::TJINIT_TJINIT_TRANSFORM as c_int) }).map(Self)
    }
}

impl Drop for Transformer {
    fn drop(&mut self) {
        // SAFETY: the handle came from tj3Init and is destroyed once.
        unsafe { raw::tj3Destroy(self.0.as_ptr()) }
    }
}
