//! Criterion benchmarks for Stoker live in `benches/`; run them with `make bench`.
//! Results, as ratios against a baseline taken in the same run, go in BENCHMARKS.md.
