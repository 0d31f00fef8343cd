//! Finished batches and the pool of buffers they live in. A [`Batch`] owns a
//! [`BatchStorage`] from the pipeline's pool and gives it back when dropped, so the number of
//! storages — fixed when the pipeline starts — bounds the pipeline's memory, and a consumer
//! that holds on to batches stops the pipeline instead of growing it.

use std::sync::atomic::AtomicU8;

use crossbeam_channel::Sender;
use stoker_plan::ids::{Epoch, Rank, Step};
use stoker_plan::transform::{OutputDtype, OutputLayout};

/// The reusable memory of one batch.
#[derive(Debug)]
pub(crate) struct BatchStorage {
    /// Images, `len * sample_bytes` used.
    pub(crate) images: ImageBuffer,
    pub(crate) labels: Vec<i64>,
    /// Keys, concatenated; `key_ends[i]` is where key i ends.
    pub(crate) key_text: String,
    pub(crate) key_ends: Vec<u32>,
    /// Slots whose image was replaced by black.
    pub(crate) replaced: Vec<u32>,
    /// Slots whose image decoded only with warnings (corrupt data), kept as decoded.
    pub(crate) corrupt: Vec<u32>,
    /// Per-slot flags the decode threads set: [`SLOT_REPLACED`], [`SLOT_CORRUPT`].
    pub(crate) slot_flags: Vec<AtomicU8>,
}

/// A slot's image was replaced by black.
pub(crate) const SLOT_REPLACED: u8 = 1;
/// A slot's image decoded with warnings.
pub(crate) const SLOT_CORRUPT: u8 = 2;

impl BatchStorage {
    /// Storage for batches of up to `batch_size` samples of `sample_bytes` each. The image
    /// buffer is allocated (and written, so its pages are touched once) here, not per batch.
    pub(crate) fn new(batch_size: usize, sample_bytes: usize) -> std::io::Result<Self> {
        Ok(Self {
            images: ImageBuffer::touched(batch_size * sample_bytes)?,
            labels: Vec::with_capacity(batch_size),
            key_text: String::with_capacity(batch_size * 32),
            key_ends: Vec::with_capacity(batch_size),
            replaced: Vec::with_capacity(batch_size),
            corrupt: Vec::new(),
            slot_flags: (0..batch_size).map(|_| AtomicU8::new(0)).collect(),
        })
    }

    pub(crate) fn clear(&mut self) {
        self.labels.clear();
        self.key_text.clear();
        self.key_ends.clear();
        self.replaced.clear();
        self.corrupt.clear();
    }
}

/// One finished batch: rank `rank`'s step `step` of epoch `epoch`.
#[derive(Debug)]
pub struct Batch {
    /// Epoch.
    pub epoch: Epoch,
    /// Rank it is for.
    pub rank: Rank,
    /// Step.
    pub step: Step,
    /// Image tensor shape in `layout`.
    pub shape: [u32; 4],
    /// Element type of the images.
    pub dtype: OutputDtype,
    /// Image layout.
    pub layout: OutputLayout,
    /// xxh3-64 of [`Batch::images`].
    pub checksum: u64,
    pub(crate) len: usize,
    pub(crate) image_bytes: usize,
    pub(crate) storage: Option<BatchStorage>,
    pub(crate) pool: Sender<BatchStorage>,
}

impl Batch {
    fn storage(&self) -> &BatchStorage {
        // Present from construction until drop.
        self.storage.as_ref().unwrap_or_else(|| unreachable!("batch storage is taken only in drop"))
    }

    /// Samples in the batch (B, or fewer in a `partial` tail).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the batch has no samples.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The images: `shape` elements of `dtype`, little-endian.
    pub fn images(&self) -> &[u8] {
        &self.storage().images[..self.image_bytes]
    }

    /// One label per sample (`-1` where the sample had no `.cls`).
    pub fn labels(&self) -> &[i64] {
        &self.storage().labels
    }

    /// The key of sample `i`.
    pub fn key(&self, i: usize) -> Option<&str> {
        let s = self.storage();
        let end = *s.key_ends.get(i)? as usize;
        let start = if i == 0 { 0 } else { s.key_ends[i - 1] as usize };
        s.key_text.get(start..end)
    }

    /// Keys in slot order.
    pub fn keys(&self) -> impl ExactSizeIterator<Item = &str> + '_ {
        (0..self.len).map(|i| self.key(i).unwrap_or(""))
    }

    /// Slots whose image could not be decoded and is black.
    pub fn replaced(&self) -> &[u32] {
        &self.storage().replaced
    }

    /// Slots whose image decoded only with libjpeg warnings (corrupt data; kept as decoded).
    pub fn corrupt(&self) -> &[u32] {
        &self.storage().corrupt
    }
}

impl Drop for Batch {
    fn drop(&mut self) {
        if let Some(storage) = self.storage.take() {
            // The pool is gone when the pipeline is: then the memory is simply freed.
            let _ = self.pool.try_send(storage);
        }
    }
}

/// A batch's image memory: `len` zero bytes, their pages written when the buffer is made (an
/// untouched allocation faults on first write, which put ~9,400 page faults into each of the
/// first batches a pipeline made).
///
/// A heap allocation, not an anonymous mapping of its own: with a mapping the pipeline made
/// ~4% fewer images per second on these machines (measured in turns, BENCHMARKS.md; the cause
/// is not pinned down). The memory of a released pipeline is returned to the system by
/// `return_freed_memory` once its threads have ended.
#[derive(Debug)]
pub(crate) struct ImageBuffer(Vec<u8>);

impl ImageBuffer {
    fn touched(len: usize) -> std::io::Result<Self> {
        let mut bytes = Vec::new();
        bytes.try_reserve_exact(len).map_err(|error| std::io::Error::new(std::io::ErrorKind::OutOfMemory, error.to_string()))?;
        bytes.resize(len, 0);
        // `black_box` keeps the compiler from dropping the fill as a store of zeros over calloc.
        std::hint::black_box(bytes.as_mut_slice()).fill(0);
        Ok(Self(bytes))
    }
}

impl std::ops::Deref for ImageBuffer {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.0
    }
}

impl std::ops::DerefMut for ImageBuffer {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.0
    }
}

/// Hand the memory the allocator holds free back to the system. glibc keeps freed buffers of
/// up to 32 MiB in its arenas (its mmap threshold rises to the size of the first one freed),
/// so without this a worker that served one job after another kept the buffers of the largest
/// job it ever served (measured: 18 MiB after the first job, 60 MiB from the third on).
pub fn return_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        unsafe extern "C" {
            fn malloc_trim(pad: usize) -> std::ffi::c_int;
        }
        // SAFETY: malloc_trim takes no pointers; it only walks the allocator's own free lists.
        unsafe {
            malloc_trim(0);
        }
    }
}
