//! What a worker's metrics add to each sample it makes: reading the clock before and after
//! the sample and recording the time in the decode histogram (the batch histogram and the
//! counters are per batch: 1/256 of this). Compare with the time a sample takes to make
//! (`stoker bench pipeline`: ~1 ms on one core).
#![allow(missing_docs)] // criterion_group! generates an undocumented function.

use std::hint::black_box;
use std::time::Instant;

use criterion::{Criterion, criterion_group, criterion_main};
use stoker_obs::{Metrics, latency_buckets};

fn bench_metrics(criterion: &mut Criterion) {
    let metrics = Metrics::new();
    let histogram = metrics.histogram("stoker_bench_seconds", "Bench.", latency_buckets()).unwrap_or_else(|error| panic!("{error}"));
    criterion.bench_function("per_sample_timing", |bench| {
        bench.iter(|| {
            let started = Instant::now();
            black_box(&histogram).observe(started.elapsed().as_secs_f64());
        })
    });
    let counter = metrics.counter("stoker_bench_total", "Bench.").unwrap_or_else(|error| panic!("{error}"));
    criterion.bench_function("counter_inc", |bench| bench.iter(|| black_box(&counter).inc()));
    criterion.bench_function("scrape_render", |bench| bench.iter(|| black_box(metrics.render().map(|text| text.len()).unwrap_or(0))));
}

criterion_group!(benches, bench_metrics);
criterion_main!(benches);
