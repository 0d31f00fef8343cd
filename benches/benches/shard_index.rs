//! Index build throughput (GB/s of tar scanned, page cache cold and warm), index load time and
//! sample lookup latency, on a ~256 MiB shard of ImageNet-sized members (20–200 KB "JPEGs" +
//! a `.cls`), the shape `stoker pack` writes.
//!
//! Cold runs evict the shard from the page cache with `posix_fadvise(POSIX_FADV_DONTNEED)`
//! before each build, so no root is needed; on a VM the host may still cache the disk.
#![allow(missing_docs)] // criterion_group! generates an undocumented function.

use std::fs::File;
use std::hint::black_box;
use std::io::BufWriter;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::time::Duration;

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use memmap2::Mmap;
use stoker_format::tar_writer::TarWriter;
use stoker_format::{IndexPolicy, Shard, build_index};
use stoker_plan::prng::SplitMix64;

const SHARD_BYTES: u64 = 256 << 20;

fn write_shard(path: &Path) -> u64 {
    let file = File::create(path).unwrap_or_else(|error| panic!("{error}"));
    let mut tar = TarWriter::new(BufWriter::new(file));
    let mut random = SplitMix64::new(1);
    let payload: Vec<u8> = (0..200_000).map(|_| random.next_u64() as u8).collect();
    let mut samples = 0u64;
    while tar.written() < SHARD_BYTES {
        let size = 20_000 + random.below(180_000) as usize;
        let key = format!("n{:08}/n{:08}_{samples}", samples % 1000, samples % 1000);
        tar.append(&format!("{key}.jpg"), &payload[..size]).unwrap_or_else(|error| panic!("{error}"));
        tar.append(&format!("{key}.cls"), (samples % 1000).to_string().as_bytes()).unwrap_or_else(|error| panic!("{error}"));
        samples += 1;
    }
    tar.finish().and_then(|mut out| std::io::Write::flush(&mut out)).unwrap_or_else(|error| panic!("{error}"));
    samples
}

fn map(path: &Path) -> Mmap {
    let file = File::open(path).unwrap_or_else(|error| panic!("{error}"));
    // SAFETY: the benchmark's own file, not modified while mapped.
    unsafe { Mmap::map(&file) }.unwrap_or_else(|error| panic!("{error}"))
}

fn evict(path: &Path) {
    let file = File::open(path).unwrap_or_else(|error| panic!("{error}"));
    // SAFETY: plain syscall on an open descriptor.
    let result = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    assert_eq!(result, 0, "posix_fadvise failed");
}

fn bench_index(criterion: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap_or_else(|error| panic!("{error}"));
    let path = dir.path().join("bench.tar");
    let samples = write_shard(&path);
    let shard_len = std::fs::metadata(&path).map(|meta| meta.len()).unwrap_or(0);

    let mut group = criterion.benchmark_group("index_build");
    group.throughput(Throughput::Bytes(shard_len)).sample_size(10).measurement_time(Duration::from_secs(8));
    let warm = map(&path);
    group.bench_function("warm", |bencher| bencher.iter(|| build_index(black_box(&warm)).map(|index| index.len())));
    drop(warm);
    group.bench_function("cold", |bencher| {
        bencher.iter_batched(
            || {
                evict(&path);
                map(&path)
            },
            |cold| build_index(black_box(&cold)).map(|index| index.len()),
            BatchSize::PerIteration,
        )
    });
    group.finish();

    let shard = Shard::open(&path, IndexPolicy::Rebuild).unwrap_or_else(|error| panic!("{error}"));
    drop(shard);
    let mut group = criterion.benchmark_group("shard_open");
    group.bench_function("load_valid_index", |bencher| {
        bencher.iter(|| Shard::open(black_box(&path), IndexPolicy::LoadOrBuildInMemory).map(|shard| shard.len()))
    });
    group.finish();

    let shard = Shard::open(&path, IndexPolicy::LoadOrBuildInMemory).unwrap_or_else(|error| panic!("{error}"));
    let mut random = SplitMix64::new(9);
    let mut group = criterion.benchmark_group("sample_lookup");
    group.throughput(Throughput::Elements(1));
    group.bench_function("random_sample_jpg_slice", |bencher| {
        bencher.iter(|| {
            let index = random.below(samples) as usize;
            shard.sample(index).and_then(|sample| sample.member("jpg")).map(<[u8]>::len)
        })
    });
    group.finish();
}

criterion_group!(benches, bench_index);
criterion_main!(benches);
