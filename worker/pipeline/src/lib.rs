#![doc = include_str!("../README.md")]

pub mod augment;
pub mod batch;
pub mod dataset;
mod decode;
pub mod error;
pub mod floor;
pub mod metrics;
pub mod pipeline;
mod pixel_ops;
mod resize;
pub mod sample;

pub use self::batch::Batch;
pub use self::dataset::Dataset;
pub use self::decode::{make_seekable, make_seekable_for_pack};
pub use self::error::{DecodeError, PipelineError};
pub use self::pipeline::{BatchRequest, Pipeline, PipelineConfig, PipelineStats};
pub use self::sample::{SampleMaker, SampleReport};

/// Entry points into private modules, for the fuzz targets in `fuzz/` only (see ARCHITECTURE.md,
/// "Fuzzing"): thin wrappers with no behaviour of their own, not an API, and free to change.
#[doc(hidden)]
pub mod fuzzing {
    use crate::decode::restart::{Intervals, Layout};

    /// The restart-interval layout of a seekable JPEG (`decode::restart::Layout`).
    #[derive(Debug)]
    pub struct RestartLayout(Layout);

    /// Where a band cut by [`RestartLayout::band`] sits in the source.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub struct BandOrigin {
        /// The band's left edge, in pixels at scale 1.
        pub left: u32,
        /// The band's top edge, in pixels at scale 1.
        pub top: u32,
    }

    /// Reusable scratch for [`RestartLayout::band`], as a decode thread keeps it.
    #[derive(Debug, Default)]
    pub struct RestartScratch(Intervals);

    /// `Layout::parse(data)`.
    pub fn restart_layout(data: &[u8]) -> Option<RestartLayout> {
        Layout::parse(data).map(RestartLayout)
    }

    impl RestartLayout {
        /// The image's width and height at scale 1.
        pub fn size(&self) -> (u32, u32) {
            self.0.size()
        }

        /// `Layout::band`: the band JPEG covering `region` (x, y, width, height at scale
        /// `num / 8`) written into `out`.
        pub fn band(&self, data: &[u8], num: u32, region: [u32; 4], scratch: &mut RestartScratch, out: &mut Vec<u8>) -> Option<BandOrigin> {
            self.0.band(data, num, region, &mut scratch.0, out).map(|band| BandOrigin { left: band.left, top: band.top })
        }
    }
}
