//! Worker pipeline tests: torchvision's crop algorithm, Pillow's pixels, determinism and bad
//! input. The Python comparisons need `STOKER_PYTHON` (set by `make test`) and are `#[ignore]`d
//! in a plain `cargo test`.

mod bad_input;
mod determinism;
mod fixtures;
mod pillow;
mod torchvision;
