#![doc = include_str!("../README.md")]
//!
//! A deterministic sample ImageFolder (real JPEG files, a few PNGs) for `stoker demo` and
//! tests, so a new user needs no dataset to see Stoker work.

use std::io::Cursor;
use std::path::Path;

use image::codecs::jpeg::JpegEncoder;
use image::{ImageFormat, Rgb, RgbImage};

use stoker_format::error::ShardError;
use stoker_plan::prng::SplitMix64;

/// Shape of the generated dataset.
#[derive(Clone, Copy, Debug)]
pub struct SampleDataSpec {
    /// Number of class folders.
    pub classes: u32,
    /// Images per class.
    pub images_per_class: u32,
    /// Seed: the same seed gives the same files.
    pub seed: u64,
}

/// Write an ImageFolder tree under `root`: `class_NNN/img_NNNNN.jpg`, every 25th image a PNG.
/// Images are 160–480 px a side, a gradient in the class's colour with a few rectangles.
/// Returns the number of bytes written.
pub fn write_image_folder(root: &Path, spec: SampleDataSpec) -> Result<u64, ShardError> {
    let mut random = SplitMix64::new(spec.seed);
    let mut written = 0u64;
    for class in 0..spec.classes {
        let class_dir = root.join(format!("class_{class:03}"));
        std::fs::create_dir_all(&class_dir).map_err(|source| ShardError::io("failed to create folder", &class_dir, source))?;
        let hue = [(class * 67 % 256) as u8, (class * 131 % 256) as u8, (class * 29 % 256) as u8];
        for image_index in 0..spec.images_per_class {
            let image = render(&mut random, hue);
            let is_png = image_index % 25 == 24;
            let (bytes, extension) = if is_png { (encode_png(&image), "png") } else { (encode_jpeg(&image), "jpg") };
            let path = class_dir.join(format!("img_{image_index:05}.{extension}"));
            std::fs::write(&path, &bytes).map_err(|source| ShardError::io("failed to write image", &path, source))?;
            written += bytes.len() as u64;
        }
    }
    Ok(written)
}

fn render(random: &mut SplitMix64, hue: [u8; 3]) -> RgbImage {
    let width = 160 + random.below(321) as u32;
    let height = 160 + random.below(321) as u32;
    let rectangles: Vec<[u32; 5]> = (0..4)
        .map(|_| {
            let x = random.below(u64::from(width)) as u32;
            let y = random.below(u64::from(height)) as u32;
            [x, y, x + 20 + random.below(120) as u32, y + 20 + random.below(120) as u32, random.below(256) as u32]
        })
        .collect();
    RgbImage::from_fn(width, height, |x, y| {
        let shade = ((x * 255 / width + y * 255 / height) / 2) as u8;
        let mut pixel = [hue[0] / 2 + shade / 2, hue[1] / 2 + shade / 3, hue[2] / 2 + (255 - shade) / 2];
        for &[left, top, right, bottom, tone] in &rectangles {
            if (left..right).contains(&x) && (top..bottom).contains(&y) {
                pixel = [tone as u8, 255 - tone as u8, hue[0]];
            }
        }
        Rgb(pixel)
    })
}

fn encode_jpeg(image: &RgbImage) -> Vec<u8> {
    let mut bytes = Vec::new();
    // Encoding an in-memory RGB image into a Vec cannot fail.
    let _ = JpegEncoder::new_with_quality(&mut bytes, 85).encode_image(image);
    bytes
}

fn encode_png(image: &RgbImage) -> Vec<u8> {
    let mut bytes = Cursor::new(Vec::new());
    let _ = image.write_to(&mut bytes, ImageFormat::Png);
    bytes.into_inner()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sample_folder_is_deterministic_and_decodable() {
        let dir = tempfile::tempdir().unwrap_or_else(|error| panic!("{error}"));
        let spec = SampleDataSpec { classes: 2, images_per_class: 26, seed: 1 };
        let first = write_image_folder(&dir.path().join("a"), spec).unwrap_or_else(|error| panic!("{error}"));
        let second = write_image_folder(&dir.path().join("b"), spec).unwrap_or_else(|error| panic!("{error}"));
        assert_eq!(first, second);
        let jpeg = std::fs::read(dir.path().join("a/class_001/img_00003.jpg")).unwrap_or_default();
        assert_eq!(jpeg, std::fs::read(dir.path().join("b/class_001/img_00003.jpg")).unwrap_or_default());
        assert!(image::load_from_memory(&jpeg).is_ok());
        assert!(image::open(dir.path().join("a/class_000/img_00024.png")).is_ok());
    }
}
