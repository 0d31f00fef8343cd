//! Decoding a crop of a JPEG with restart markers from only the entropy-coded data it covers.
//!
//! A baseline JPEG is one Huffman-coded bit stream, and libjpeg must decode every MCU above a
//! crop's last row to reach it, even with a cropping region. A restart marker (`RSTn`) ends an
//! interval: the bit stream restarts on a byte boundary and the DC predictions reset, so an
//! interval decodes on its own. When intervals tile the MCU grid (a whole number of them per
//! MCU row, or of MCU rows per interval), the intervals a crop covers form a smaller JPEG of
//! their own: the same header with the band's width and height, and those intervals joined by
//! renumbered markers. Decoding that band costs what its area costs.
//!
//! `stoker pack` writes JPEGs with one interval per MCU (see [`super::transcode`]); any other
//! JPEG whose intervals tile the grid (cameras often write one per MCU row) gains as well.
//! Everything else is decoded as it is.

/// Marker codes (the byte after `0xFF`).
const SOI: u8 = 0xd8;
const EOI: u8 = 0xd9;
const SOS: u8 = 0xda;
const DRI: u8 = 0xdd;
const DNL: u8 = 0xdc;
const RST0: u8 = 0xd0;
/// Baseline and extended sequential, Huffman-coded: the frames this module cuts.
const SOF_HUFFMAN: [u8; 2] = [0xc0, 0xc1];
/// Every other start of frame (progressive, lossless, hierarchical, arithmetic).
const SOF_OTHER: [u8; 11] = [0xc2, 0xc3, 0xc5, 0xc6, 0xc7, 0xc9, 0xca, 0xcb, 0xcd, 0xce, 0xcf];

/// Pixels, at the decode scale and per unit of the largest sampling factor, kept around a
/// region inside the band: fancy upsampling reads the neighbouring chroma row and column (one
/// chroma sample, so up to 2 pixels at 4:2:0), and at a band's edge libjpeg repeats the edge
/// instead. With this margin a band decodes to exactly the pixels a cropped decode of the
/// whole file gives (tested; with no margin it does not).
const CONTEXT_PER_SAMPLING_FACTOR: u32 = 1;

/// Where a seekable JPEG's parts are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Layout {
    /// Offset of the frame header's height field; the width follows it.
    dims_at: usize,
    /// First byte of entropy-coded data.
    scan_start: usize,
    width: u32,
    height: u32,
    /// MCU size in pixels at scale 1.
    mcu_width: u32,
    mcu_height: u32,
    /// Largest sampling factor (1 for 4:4:4 and grayscale).
    max_sampling: u32,
    mcus_per_row: u32,
    mcu_rows: u32,
    /// MCUs per restart interval.
    interval: u32,
}

/// A band of a seekable JPEG, written as a JPEG of its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Band {
    /// The band's top-left corner in the source, in pixels at scale 1 (a multiple of the MCU).
    pub(crate) left: u32,
    pub(crate) top: u32,
}

/// Offsets of restart intervals found so far: `starts[i]` is the first byte of interval `i`,
/// `ends[i]` the marker that ends it. Kept per thread so that steady state does not allocate.
#[derive(Debug, Default)]
pub(crate) struct Intervals {
    starts: Vec<usize>,
    ends: Vec<usize>,
}

fn u16_at(data: &[u8], at: usize) -> Option<u32> {
    Some(u32::from(u16::from_be_bytes([*data.get(at)?, *data.get(at + 1)?])))
}

impl Layout {
    /// The layout of `data` if it is a single-scan Huffman JPEG whose restart intervals tile
    /// its MCU grid; `None` for anything else (which is then decoded as it is).
    pub(crate) fn parse(data: &[u8]) -> Option<Self> {
        if data.get(..2)? != [0xff, SOI] {
            return None;
        }
        let mut at = 2;
        let mut frame: Option<(usize, u32, u32, u32, [u32; 2])> = None;
        let mut interval = 0;
        loop {
            if *data.get(at)? != 0xff {
                return None;
            }
            while *data.get(at + 1)? == 0xff {
                at += 1;
            }
            let marker = *data.get(at + 1)?;
            let length = u16_at(data, at + 2)? as usize;
            let body = data.get(at + 4..(at + 2).checked_add(length)?)?;
            if length < 2 || SOF_OTHER.contains(&marker) || marker == DNL || (RST0..=EOI).contains(&marker) {
                return None;
            }
            if SOF_HUFFMAN.contains(&marker) {
                let (&precision, rest) = body.split_first()?;
                let components = u32::from(*rest.get(4)?);
                if precision != 8 || frame.is_some() || !matches!(components, 1 | 3 | 4) {
                    return None;
                }
                let mut max = [1, 1];
                for c in 0..components as usize {
                    let factors = *rest.get(6 + 3 * c)?;
                    let (h, v) = (u32::from(factors >> 4), u32::from(factors & 15));
                    if !(1..=4).contains(&h) || !(1..=4).contains(&v) {
                        return None;
                    }
                    max = [max[0].max(h), max[1].max(v)];
                }
                let (height, width) = (u16_at(rest, 0)?, u16_at(rest, 2)?);
                frame = Some((at + 5, width, height, components, max));
            } else if marker == DRI {
                interval = u16_at(body, 0)?;
            } else if marker == SOS {
                let (dims_at, width, height, components, max) = frame?;
                if u32::from(*body.first()?) != components || width == 0 || height == 0 || interval == 0 {
                    return None;
                }
                // A single-component scan's MCU is one block whatever its sampling factors.
                let (mcu_width, mcu_height) = if components == 1 { (8, 8) } else { (8 * max[0], 8 * max[1]) };
                let mcus_per_row = width.div_ceil(mcu_width);
                if !mcus_per_row.is_multiple_of(interval) && !interval.is_multiple_of(mcus_per_row) {
                    return None;
                }
                return Some(Self {
                    dims_at,
                    scan_start: at + 2 + length,
                    width,
                    height,
                    mcu_width,
                    mcu_height,
                    max_sampling: if components == 1 { 1 } else { max[0].max(max[1]) },
                    mcus_per_row,
                    mcu_rows: height.div_ceil(mcu_height),
                    interval,
                });
            }
            at += 2 + length;
        }
    }

    /// The image's width and height in pixels, at scale 1.
    pub(crate) fn size(&self) -> (u32, u32) {
        (self.width, self.height)
    }

    /// Write into `out` the band of intervals that covers `region` (scaled by `num / 8`, given
    /// as x, y, width, height) with the context upsampling needs, and return where the band
    /// sits. `None` when the band would be the whole image, or when the entropy-coded data
    /// does not have the markers the header promises (then decode the file as it is).
    pub(crate) fn band(&self, data: &[u8], num: u32, region: [u32; 4], intervals: &mut Intervals, out: &mut Vec<u8>) -> Option<Band> {
        let [x, y, width, height] = region;
        let (scaled_w, scaled_h) = ((self.width * num).div_ceil(8), (self.height * num).div_ceil(8));
        let context = CONTEXT_PER_SAMPLING_FACTOR * self.max_sampling;
        let (left, right) = (x.saturating_sub(context), (x + width + context).min(scaled_w));
        let (top, bottom) = (y.saturating_sub(context), (y + height + context).min(scaled_h));
        let row_height = self.mcu_height * num / 8;
        let mut rows = (top / row_height, bottom.div_ceil(row_height).min(self.mcu_rows));
        // Intervals per MCU row, and the columns of intervals the band takes.
        let (per_row, columns) = if self.mcus_per_row.is_multiple_of(self.interval) {
            let per_row = self.mcus_per_row / self.interval;
            let column_width = self.interval * self.mcu_width * num / 8;
            (per_row, (left / column_width, right.div_ceil(column_width).min(per_row)))
        } else {
            // Whole rows per interval: round the band out to interval boundaries.
            let rows_per = self.interval / self.mcus_per_row;
            rows = (rows.0 / rows_per * rows_per, rows.1.div_ceil(rows_per).saturating_mul(rows_per).min(self.mcu_rows));
            (1, (0, 1))
        };
        if rows == (0, self.mcu_rows) && columns == (0, per_row) || rows.0 >= rows.1 || columns.0 >= columns.1 {
            return None;
        }
        let first_row_interval = |row: u32| (row * self.mcus_per_row / self.interval) as usize;
        let last_needed = first_row_interval(rows.1 - 1) + if per_row > 1 { columns.1 as usize - 1 } else { 0 };
        intervals.find(data, self.scan_start, last_needed)?;

        let band_left = columns.0 * self.interval.min(self.mcus_per_row) * self.mcu_width;
        let band_top = rows.0 * self.mcu_height;
        let band_width = (columns.1 * self.interval.min(self.mcus_per_row) * self.mcu_width).min(self.width) - band_left;
        let band_height = (rows.1 * self.mcu_height).min(self.height) - band_top;
        out.clear();
        out.extend_from_slice(data.get(..self.scan_start)?);
        out.get_mut(self.dims_at..self.dims_at + 4)?.copy_from_slice(&[
            (band_height >> 8) as u8,
            band_height as u8,
            (band_width >> 8) as u8,
            band_width as u8,
        ]);
        let mut written = 0usize;
        let mut push = |index: usize, out: &mut Vec<u8>| {
            if written > 0 {
                out.extend_from_slice(&[0xff, RST0 + ((written - 1) % 8) as u8]);
            }
            out.extend_from_slice(&data[intervals.starts[index]..intervals.ends[index]]);
            written += 1;
        };
        if per_row > 1 {
            for row in rows.0..rows.1 {
                for column in columns.0..columns.1 {
                    push(first_row_interval(row) + column as usize, out);
                }
            }
        } else {
            let rows_per = (self.interval / self.mcus_per_row).max(1);
            for index in rows.0 / rows_per..rows.1.div_ceil(rows_per) {
                push(index as usize, out);
            }
        }
        out.extend_from_slice(&[0xff, EOI]);
        Some(Band { left: band_left, top: band_top })
    }
}

impl Intervals {
    /// Find the intervals of the scan starting at `scan_start` up to interval `last`
    /// (inclusive), checking that markers count `RST0`..`RST7` in turn.
    fn find(&mut self, data: &[u8], scan_start: usize, last: usize) -> Option<()> {
        self.starts.clear();
        self.ends.clear();
        self.starts.push(scan_start);
        // 0xFF bytes 64 at a time: with a marker every MCU and a stuffed 0xFF00 every few
        // hundred bytes, a search per hit (memchr) pays its set-up cost a thousand times an
        // image (it was 2.4% of a decode thread; this is a fifth of that).
        let (mut base, mut resume) = (scan_start, scan_start);
        while base < data.len() {
            let block = &data[base..data.len().min(base + 64)];
            let mut mask = ff_mask(block);
            while mask != 0 {
                let found = base + mask.trailing_zeros() as usize;
                mask &= mask - 1;
                if found < resume {
                    continue;
                }
                let next = *data.get(found + 1)?;
                match next {
                    // A stuffed zero (0xFF in the data), or a fill byte before a marker.
                    0x00 | 0xff => resume = found + 1,
                    _ if (RST0..RST0 + 8).contains(&next) => {
                        if next - RST0 != (self.ends.len() % 8) as u8 {
                            return None;
                        }
                        self.ends.push(found);
                        if self.ends.len() > last {
                            return Some(());
                        }
                        self.starts.push(found + 2);
                        resume = found + 2;
                    }
                    // The end of the scan: the last interval.
                    _ => {
                        self.ends.push(found);
                        return (self.ends.len() > last).then_some(());
                    }
                }
            }
            base += block.len();
        }
        None
    }
}

/// Bit `i` set where `block[i]` is 0xFF (`block` holds at most 64 bytes).
fn ff_mask(block: &[u8]) -> u64 {
    #[cfg(target_arch = "x86_64")]
    if let Ok(full) = <&[u8; 64]>::try_from(block) {
        use std::arch::x86_64::{__m128i, _mm_cmpeq_epi8, _mm_loadu_si128, _mm_movemask_epi8, _mm_set1_epi8};
        // SAFETY: SSE2 is part of x86_64; `full` holds 64 bytes, so each 16-byte unaligned
        // load from `16 * i` (i < 4) is in bounds.
        return unsafe {
            let ff = _mm_set1_epi8(-1);
            (0..4).fold(0, |mask, i| {
                let lane = _mm_loadu_si128(full.as_ptr().add(16 * i).cast::<__m128i>());
                mask | (u64::from(_mm_movemask_epi8(_mm_cmpeq_epi8(lane, ff)) as u16) << (16 * i))
            })
        };
    }
    block.iter().enumerate().fold(0, |mask, (i, &byte)| mask | (u64::from(byte == 0xff) << i))
}

#[cfg(test)]
#[path = "restart_tests.rs"]
mod tests;
