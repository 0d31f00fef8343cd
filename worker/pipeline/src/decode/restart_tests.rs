use stoker_plan::prng::SplitMix64;
use turbojpeg::{Image, PixelFormat, Subsamp};

use super::*;
use crate::decode::jpeg::{JpegDecoder, Region, align_to_mcu, scaled};
use crate::decode::transcode::{Restart, make_seekable, transcode};

const MAX_PIXELS: u64 = 1 << 26;

/// A JPEG of sines plus noise (so a wrong pixel anywhere shows).
fn jpeg(width: usize, height: usize, seed: u64, subsamp: Subsamp, progressive: bool) -> Vec<u8> {
    let mut rng = SplitMix64::new(seed);
    let pixels: Vec<u8> = (0..width * height * 3)
        .map(|i| {
            let (x, y) = ((i / 3 % width) as f64, (i / 3 / width) as f64);
            (128.0 + 60.0 * (x * 0.07 + (i % 3) as f64).sin() * (y * 0.05).cos() + (rng.next_f64() - 0.5) * 60.0) as u8
        })
        .collect();
    let image = Image { pixels: pixels.as_slice(), width, pitch: width * 3, height, format: PixelFormat::RGB };
    let mut compressor = turbojpeg::Compressor::new().expect("compressor");
    compressor.set_quality(85).expect("quality");
    compressor.set_subsamp(subsamp).expect("subsamp");
    compressor.set_progressive(progressive).expect("progressive");
    compressor.compress_to_vec(image).expect("compress")
}

/// `region` decoded from the whole file at scale `num / 8` with a cropping region: what the
/// decoder gives for a file without restart markers.
fn from_file(decoder: &mut JpegDecoder, data: &[u8], num: u32, region: Region) -> Vec<u8> {
    let header = decoder.read_header(data).expect("header");
    let mut pixels = Vec::new();
    decoder.decode(data, &header, num, region, &mut pixels).expect("decode");
    pixels.truncate(region.width as usize * region.height as usize * 3);
    pixels
}

/// `region` of the image decoded whole at scale `num / 8`.
fn whole_then_cut(decoder: &mut JpegDecoder, data: &[u8], num: u32, region: Region) -> Vec<u8> {
    let header = decoder.read_header(data).expect("header");
    let full = Region { x: 0, y: 0, width: scaled(header.width, num), height: scaled(header.height, num) };
    let mut pixels = Vec::new();
    decoder.decode(data, &header, num, full, &mut pixels).expect("decode");
    let row = full.width as usize * 3;
    (region.y..region.y + region.height)
        .flat_map(|y| {
            let start = y as usize * row + region.x as usize * 3;
            pixels[start..start + region.width as usize * 3].to_vec()
        })
        .collect()
}

/// `region` decoded from the band of `data` that covers it, and how many bytes the band had.
fn from_band(decoder: &mut JpegDecoder, data: &[u8], num: u32, region: Region) -> Option<(Vec<u8>, usize)> {
    let layout = Layout::parse(data)?;
    let (mut intervals, mut band_bytes) = (Intervals::default(), Vec::new());
    let band = layout.band(data, num, [region.x, region.y, region.width, region.height], &mut intervals, &mut band_bytes)?;
    let header = decoder.read_header(&band_bytes).expect("band header");
    let inner = Region { x: region.x - band.left * num / 8, y: region.y - band.top * num / 8, ..region };
    let mut pixels = Vec::new();
    decoder.decode(&band_bytes, &header, num, inner, &mut pixels).expect("band decode");
    pixels.truncate(region.width as usize * region.height as usize * 3);
    Some((pixels, band_bytes.len()))
}

/// A random region of the image scaled by `num / 8`, starting on an MCU column as cropping
/// regions must.
fn random_region(rng: &mut SplitMix64, decoder: &mut JpegDecoder, data: &[u8], num: u32) -> Region {
    let header = decoder.read_header(data).expect("header");
    let (width, height) = (scaled(header.width, num), scaled(header.height, num));
    let x = align_to_mcu(rng.below(u64::from(width)) as u32, &header, num);
    let y = rng.below(u64::from(height)) as u32;
    let w = 1 + rng.below(u64::from(width - x)) as u32;
    let h = 1 + rng.below(u64::from(height - y)) as u32;
    Region { x, y, width: w, height: h }
}

#[test]
fn a_band_decodes_to_exactly_the_pixels_of_a_cropped_decode_of_the_whole_file() {
    let subsamplings = [Subsamp::None, Subsamp::Sub2x1, Subsamp::Sub2x2, Subsamp::Sub1x2, Subsamp::Sub4x1, Subsamp::Gray];
    let mut decoder = JpegDecoder::new().expect("decoder");
    let mut rng = SplitMix64::new(7);
    let mut cut = 0;
    for (i, subsamp) in subsamplings.into_iter().enumerate() {
        for (width, height) in [(203, 157), (320, 240), (96, 500)] {
            let original = jpeg(width, height, i as u64, subsamp, false);
            let seekable = make_seekable(&original, MAX_PIXELS).expect("seekable");
            for num in [8, 4, 2, 1] {
                for _ in 0..40 {
                    let region = random_region(&mut rng, &mut decoder, &seekable, num);
                    let expected = from_file(&mut decoder, &original, num, region);
                    if let Some((pixels, band_len)) = from_band(&mut decoder, &seekable, num, region) {
                        assert!(pixels == expected, "{subsamp:?} {width}x{height} at {num}/8, {region:?}: pixels differ");
                        assert!(band_len < seekable.len());
                        cut += 1;
                    }
                }
            }
        }
    }
    // Most random regions leave something out; a few cover the whole image.
    assert!(cut > 6 * 3 * 4 * 40 * 3 / 4, "only {cut} regions were cut");
}

#[test]
fn every_region_offset_near_mcu_edges_is_exact() {
    // Sweep the region's edges across two MCUs, where chroma context matters most.
    let mut decoder = JpegDecoder::new().expect("decoder");
    for subsamp in [Subsamp::Sub2x2, Subsamp::Sub2x1, Subsamp::Sub4x1] {
        let original = jpeg(160, 128, 3, subsamp, false);
        let seekable = make_seekable(&original, MAX_PIXELS).expect("seekable");
        let header = decoder.read_header(&seekable).expect("header");
        for y in 30..66 {
            for height in [1, 2, 3, 17, 33] {
                let x = align_to_mcu(40 + y % 40, &header, 8);
                let region = Region { x, y, width: 40 + y % 7, height };
                let expected = from_file(&mut decoder, &original, 8, region);
                let (pixels, _) = from_band(&mut decoder, &seekable, 8, region).expect("a band");
                assert!(pixels == expected, "{subsamp:?} {region:?}");
            }
        }
    }
}

#[test]
fn make_seekable_keeps_every_pixel_and_marks_every_mcu() {
    let mut decoder = JpegDecoder::new().expect("decoder");
    for (subsamp, progressive) in [(Subsamp::Sub2x2, false), (Subsamp::Sub2x2, true), (Subsamp::None, true), (Subsamp::Gray, false)] {
        let original = jpeg(250, 190, 11, subsamp, progressive);
        let seekable = make_seekable(&original, MAX_PIXELS).expect("seekable");
        let full = Region { x: 0, y: 0, width: 250, height: 190 };
        assert_eq!(whole_then_cut(&mut decoder, &seekable, 8, full), whole_then_cut(&mut decoder, &original, 8, full));
        let layout = Layout::parse(&seekable).expect("layout");
        assert_eq!((layout.interval, layout.width, layout.height), (1, 250, 190));
        assert!(Layout::parse(&original).is_none(), "the original has no restart markers");
    }
}

#[test]
fn make_seekable_refuses_what_it_cannot_keep_exactly() {
    let good = jpeg(64, 48, 1, Subsamp::Sub2x2, false);
    assert!(make_seekable(b"\x89PNG\r\n\x1a\n", MAX_PIXELS).is_none());
    assert!(make_seekable(&good[..good.len() / 2], MAX_PIXELS).is_none(), "a truncated JPEG would be stored repaired");
    assert!(make_seekable(&good, 64 * 47).is_none(), "over the pixel limit");
    let mut lossless = turbojpeg::Compressor::new().expect("compressor");
    lossless.set_lossless(true).expect("lossless");
    let pixels = vec![7u8; 32 * 32 * 3];
    let image = Image { pixels: pixels.as_slice(), width: 32, pitch: 96, height: 32, format: PixelFormat::RGB };
    assert!(make_seekable(&lossless.compress_to_vec(image).expect("compress"), MAX_PIXELS).is_none());
}

#[test]
fn intervals_of_whole_rows_cut_bands_of_rows() {
    let mut decoder = JpegDecoder::new().expect("decoder");
    let original = jpeg(200, 300, 5, Subsamp::Sub2x2, false);
    for rows in [1, 3] {
        let file = transcode(&original, MAX_PIXELS, Restart::Rows(rows)).expect("transcode");
        let layout = Layout::parse(&file).expect("rows tile the grid");
        assert_eq!(layout.interval, u32::from(rows) * 13);
        let region = Region { x: 48, y: 130, width: 60, height: 50 };
        let (pixels, band_len) = from_band(&mut decoder, &file, 8, region).expect("a band");
        assert!(pixels == from_file(&mut decoder, &original, 8, region));
        assert!(band_len < file.len() / 2);
    }
    // 13 MCUs per row: intervals of 3 MCUs straddle rows and cannot be cut.
    let straddling = transcode(&original, MAX_PIXELS, Restart::Mcus(3)).expect("transcode");
    assert!(Layout::parse(&straddling).is_none());
}

#[test]
fn markers_out_of_order_or_damaged_files_give_no_band_and_no_panic() {
    let mut decoder = JpegDecoder::new().expect("decoder");
    let seekable = make_seekable(&jpeg(128, 128, 9, Subsamp::Sub2x2, false), MAX_PIXELS).expect("seekable");
    let region = [32, 64, 40, 40];
    let (mut intervals, mut band) = (Intervals::default(), Vec::new());
    let layout = Layout::parse(&seekable).expect("layout");
    // Renumber the third marker: the count no longer matches and the band is refused.
    let third = (layout.scan_start..seekable.len() - 1)
        .filter(|&i| seekable[i] == 0xff && (RST0..RST0 + 8).contains(&seekable[i + 1]))
        .nth(2)
        .expect("markers");
    let mut renumbered = seekable.clone();
    renumbered[third + 1] = RST0 + 7;
    assert!(layout.band(&renumbered, 8, region, &mut intervals, &mut band).is_none());
    // Truncations and flipped bytes: parse, cut and decode whatever comes out, without panic.
    let mut rng = SplitMix64::new(1);
    for round in 0..300 {
        let mut data = seekable.clone();
        if round % 2 == 0 {
            data.truncate(rng.below(seekable.len() as u64) as usize);
        } else {
            for _ in 0..4 {
                let at = rng.below(data.len() as u64) as usize;
                data[at] = rng.below(256) as u8;
            }
        }
        if let Some(layout) = Layout::parse(&data)
            && layout.band(&data, 8, region, &mut intervals, &mut band).is_some()
            && let Ok(header) = decoder.read_header(&band)
        {
            let mut pixels = Vec::new();
            let inner = Region { x: 0, y: 0, width: header.width.min(8), height: header.height.min(8) };
            let _ = decoder.decode(&band, &header, 8, inner, &mut pixels);
        }
    }
}
