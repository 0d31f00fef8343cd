//! The restart-interval band builder of the worker's JPEG decode (`decode::restart`, through
//! `stoker_pipeline::fuzzing`): `Layout::parse` on arbitrary bytes, then bands for regions at
//! several scales, as the decoder asks for them (inside the scaled image). A band must start at
//! or before its region (the decoder subtracts its origin) and be a JPEG of its own that
//! covers the region.
#![no_main]

use libfuzzer_sys::fuzz_target;
use stoker_fuzz::jpeg_input;
use stoker_pipeline::fuzzing::{RestartScratch, restart_layout};

fuzz_target!(|data: &[u8]| {
    let Some((jpeg, params)) = jpeg_input::decode(data) else { return };
    let Some(layout) = restart_layout(jpeg) else { return };
    let (width, height) = layout.size();
    assert!(width > 0 && height > 0);
    let (mut scratch, mut out) = (RestartScratch::default(), Vec::new());
    let mut regions: Vec<(u32, [u8; 3])> = params.chunks_exact(4).map(|p| (1 + u32::from(p[0] % 8), [p[1], p[2], p[3]])).collect();
    // The scales the decoder uses, each for a region in the middle.
    regions.extend([8, 4, 2, 1].map(|num| (num, [96, 96, 64])));
    for (num, [x, y, size]) in regions {
        let (scaled_w, scaled_h) = ((width * num).div_ceil(8), (height * num).div_ceil(8));
        let x = (u64::from(x) * u64::from(scaled_w) / 256) as u32;
        let y = (u64::from(y) * u64::from(scaled_h) / 256) as u32;
        let region_w = 1 + (u64::from(size) * u64::from(scaled_w - x - 1) / 255) as u32;
        let region_h = 1 + (u64::from(size) * u64::from(scaled_h - y - 1) / 255) as u32;
        let region = [x, y, region_w, region_h];
        let Some(band) = layout.band(jpeg, num, region, &mut scratch, &mut out) else { continue };
        let (left, top) = (band.left * num / 8, band.top * num / 8);
        assert!(left <= x && top <= y, "band at {band:?} is past region {region:?} at scale {num}/8");
        assert!(out.starts_with(&[0xff, 0xd8]) && out.ends_with(&[0xff, 0xd9]), "the band is not a JPEG");
        let band_layout = restart_layout(&out).expect("a band is a seekable JPEG");
        let (band_w, band_h) = band_layout.size();
        assert!(band.left + band_w <= width && band.top + band_h <= height, "band {band:?} {band_w}x{band_h} outside {width}x{height}");
        let (inner_x, inner_y) = (x - left, y - top);
        assert!(inner_x + region_w <= (band_w * num).div_ceil(8), "band {band:?} {band_w}x{band_h} does not cover {region:?} at {num}/8");
        assert!(inner_y + region_h <= (band_h * num).div_ceil(8), "band {band:?} {band_w}x{band_h} does not cover {region:?} at {num}/8");
    }
});
