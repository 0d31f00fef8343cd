//! One sample, start to finish: header → geometry from the augmentation seed → region decode →
//! resize into the batch slot → flip → per-pixel augmentations → normalise. A [`SampleMaker`] is one thread's state; its
//! buffers grow to the largest image seen and are reused, so steady state allocates nothing.

use stoker_plan::transform::{Geometry, PixelOp, Recipe, SampleGeometry};

use crate::augment::{self, AugmentScratch};
use crate::decode::{Decoded, Decoder, Edges, SourceBox};
use crate::error::DecodeError;
use crate::pixel_ops::{OutputWriter, flip_rows};
use crate::resize::Resize;

/// What was done to a sample (for tests and statistics).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SampleReport {
    /// Source dimensions.
    pub source_size: (u32, u32),
    /// The geometry drawn from the seed.
    pub geometry: SampleGeometry,
    /// DCT scale numerator M (the image was decoded at M/8).
    pub scale_num: u32,
    /// Pixels decoded (the region, after scaling).
    pub decoded_pixels: u64,
    /// libjpeg warned: the data is corrupt but gave an image (parts may be gray);
    /// [`SampleMaker::last_warning`] says what.
    pub warned: bool,
}

/// A decode thread's state: decoder, resizer and scratch buffers.
#[derive(Debug)]
pub struct SampleMaker {
    recipe: Recipe,
    decoder: Decoder,
    resize: Resize,
    writer: OutputWriter,
    decoded: Vec<u8>,
    staging: Vec<u8>,
    patch: Vec<u8>,
    pixel_ops: Vec<PixelOp>,
    augment_scratch: AugmentScratch,
}

impl SampleMaker {
    /// State for making samples of `recipe`.
    pub fn new(recipe: Recipe) -> Result<Self, DecodeError> {
        Ok(Self {
            decoder: Decoder::new(recipe.max_image_pixels)?,
            resize: Resize::default(),
            writer: OutputWriter::new(&recipe),
            recipe,
            decoded: Vec::new(),
            staging: Vec::new(),
            patch: Vec::new(),
            pixel_ops: Vec::new(),
            augment_scratch: AugmentScratch::default(),
        })
    }

    /// libjpeg's warning for the last sample made with [`SampleReport::warned`].
    pub fn last_warning(&self) -> &str {
        self.decoder.last_warning()
    }

    /// The per-pixel operations drawn for the last sample made (empty without augmentations).
    pub fn last_pixel_ops(&self) -> &[PixelOp] {
        &self.pixel_ops
    }

    /// The recipe this maker runs.
    pub fn recipe(&self) -> &Recipe {
        &self.recipe
    }

    /// Decode and transform the image `data` with augmentation seed `seed` into `slot`
    /// (exactly [`Recipe::sample_bytes`] long). On error the slot's content is unspecified;
    /// call [`Self::black`] to fill it.
    pub fn make(&mut self, data: &[u8], seed: u64, slot: &mut [u8]) -> Result<SampleReport, DecodeError> {
        let probe = self.decoder.probe(data)?;
        let (width, height) = probe.size();
        let geometry = self.recipe.sample(width, height, seed);
        let p = geometry.placement;
        let want = SourceBox { left: p.src_left, top: p.src_top, width: p.src_width, height: p.src_height };
        let decoded = self.decoder.decode(
            data,
            &probe,
            want,
            p.dst_width,
            p.dst_height,
            self.recipe.interpolation,
            match self.recipe.geometry {
                Geometry::ResizeCenterCrop { shorter_side: Some(_), .. } => Edges::Image,
                _ => Edges::Clip,
            },
            self.recipe.dct_scaling,
            &mut self.decoded,
        )?;
        let out = self.recipe.output_size();
        let (out_w, out_h) = (out.width as usize, out.height as usize);
        let covers_output = p.dst_left == 0 && p.dst_top == 0 && p.dst_width == out.width && p.dst_height == out.height;
        self.recipe.augmentations.draw(seed, out.width, out.height, &mut self.pixel_ops);
        if covers_output && self.writer.is_direct() {
            self.resize_into_slot(&decoded, p.dst_width, p.dst_height, slot)?;
            if geometry.flip {
                flip_rows(slot, out_w);
            }
            augment::apply(&self.pixel_ops, &mut slot[..out_w * out_h * 3], out_w, out_h, &mut self.augment_scratch);
        } else {
            let mut staging = std::mem::take(&mut self.staging);
            staging.resize(out_w * out_h * 3, 0);
            if covers_output {
                self.resize_into_slot(&decoded, p.dst_width, p.dst_height, &mut staging)?;
            } else {
                // Padding (CenterCrop larger than the image): black, then the image in its place.
                staging.fill(0);
                let mut patch = std::mem::take(&mut self.patch);
                patch.resize(p.dst_width as usize * p.dst_height as usize * 3, 0);
                self.resize_into_slot(&decoded, p.dst_width, p.dst_height, &mut patch)?;
                let row = p.dst_width as usize * 3;
                for (y, src_row) in patch.chunks_exact(row).enumerate() {
                    let start = ((p.dst_top as usize + y) * out_w + p.dst_left as usize) * 3;
                    staging[start..start + row].copy_from_slice(src_row);
                }
                self.patch = patch;
            }
            if geometry.flip {
                flip_rows(&mut staging, out_w);
            }
            augment::apply(&self.pixel_ops, &mut staging, out_w, out_h, &mut self.augment_scratch);
            self.writer.write(&staging, out_w, out_h, slot);
            self.staging = staging;
        }
        Ok(SampleReport {
            source_size: (width, height),
            geometry,
            scale_num: decoded.scale_num,
            decoded_pixels: u64::from(decoded.width) * u64::from(decoded.height),
            warned: decoded.warned,
        })
    }

    fn resize_into_slot(&mut self, decoded: &Decoded, dst_width: u32, dst_height: u32, dst: &mut [u8]) -> Result<(), DecodeError> {
        let src = &self.decoded[..decoded.width as usize * decoded.height as usize * 3];
        self.resize.resize(src, decoded, dst, dst_width, dst_height, self.recipe.interpolation)
    }

    /// Fill `slot` with a black image in the output format (zeros before normalisation).
    pub fn black(&mut self, slot: &mut [u8]) {
        if self.writer.is_direct() {
            slot.fill(0);
            return;
        }
        let out = self.recipe.output_size();
        let (out_w, out_h) = (out.width as usize, out.height as usize);
        self.staging.clear();
        self.staging.resize(out_w * out_h * 3, 0);
        self.writer.write(&self.staging, out_w, out_h, slot);
    }
}
