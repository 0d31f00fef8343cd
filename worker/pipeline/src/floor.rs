//! The benchmark floor: plain full decode of the same images with libjpeg-turbo, no crop, no
//! DCT scaling, no resize. `stoker bench pipeline` runs it in the same process as the pipeline
//! so their ratio is meaningful on a noisy machine.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use stoker_plan::SampleRef;

use crate::dataset::{Dataset, image_member};
use crate::decode::{Decoder, Probe};
use crate::error::{DecodeError, PipelineError};

/// What the floor run measured.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FloorResult {
    /// Images decoded.
    pub images: u64,
    /// Pixels decoded.
    pub pixels: u64,
    /// Images that failed to decode (skipped).
    pub failed: u64,
    /// Wall time.
    pub elapsed: Duration,
}

impl FloorResult {
    /// Images per second.
    pub fn images_per_sec(&self) -> f64 {
        self.images as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// Two runs as one (a benchmark that takes turns with the floor).
    pub fn add(&self, other: &Self) -> Self {
        Self {
            images: self.images + other.images,
            pixels: self.pixels + other.pixels,
            failed: self.failed + other.failed,
            elapsed: self.elapsed + other.elapsed,
        }
    }
}

/// Decode `samples` fully (JPEG members only, as RGB) on `threads` threads, cycling through
/// them until `duration` has passed (each thread finishes the image it is on). An image over
/// `max_pixels` is refused before anything is allocated for it and counted as failed, as the
/// pipeline refuses it (found by review: one file whose header claimed 65000×65000 took the
/// floor to 12 GB).
pub fn full_decode(
    dataset: &Arc<Dataset>,
    samples: &Arc<Vec<SampleRef>>,
    threads: usize,
    duration: Duration,
    max_pixels: u64,
) -> Result<FloorResult, PipelineError> {
    let images = Arc::new(AtomicU64::new(0));
    let pixels = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let handles = (0..threads.max(1))
        .map(|thread| {
            let (dataset, samples) = (Arc::clone(dataset), Arc::clone(samples));
            let (images, pixels, failed, stop) = (Arc::clone(&images), Arc::clone(&pixels), Arc::clone(&failed), Arc::clone(&stop));
            let mut decoder = Decoder::new(max_pixels).map_err(|e| PipelineError::Start(e.to_string()))?;
            std::thread::Builder::new()
                .name(format!("stoker-floor-{thread}"))
                .spawn(move || {
                    let mut out = Vec::new();
                    let stride = threads.max(1);
                    let mut i = thread;
                    while !stop.load(Ordering::Relaxed) && !samples.is_empty() {
                        let decoded = dataset.with_sample(samples[i % samples.len()], |sample| {
                            sample.and_then(image_member).map(|data| decode_whole(&mut decoder, data, &mut out))
                        });
                        match decoded {
                            Some(Ok(n)) => {
                                images.fetch_add(1, Ordering::Relaxed);
                                pixels.fetch_add(n, Ordering::Relaxed);
                            }
                            _ => {
                                failed.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                        i += stride;
                    }
                })
                .map_err(|e| PipelineError::Start(e.to_string()))
        })
        .collect::<Result<Vec<_>, _>>()?;
    std::thread::sleep(duration);
    stop.store(true, Ordering::Relaxed);
    for handle in handles {
        handle.join().map_err(|_| PipelineError::Stopped)?;
    }
    Ok(FloorResult {
        images: images.load(Ordering::Relaxed),
        pixels: pixels.load(Ordering::Relaxed),
        failed: failed.load(Ordering::Relaxed),
        elapsed: started.elapsed(),
    })
}

fn decode_whole(decoder: &mut Decoder, data: &[u8], out: &mut Vec<u8>) -> Result<u64, DecodeError> {
    match decoder.probe(data)? {
        probe @ Probe::Jpeg(_) => {
            let (width, height) = probe.size();
            decoder.decode_full(data, &probe, out)?;
            Ok(u64::from(width) * u64::from(height))
        }
        Probe::Other { .. } => Err(DecodeError::Other("not a JPEG".to_owned())),
    }
}
