//! `stoker._stoker`: the native half of the `stoker` Python package, a thin PyO3 layer over
//! [`stoker_client`]. The torch-style API (`stoker.Loader`, transforms, `stoker.torch`) is
//! written in Python over [`loader::NativeLoader`]; this crate only attaches, waits for batches
//! with the GIL released, and hands each batch's memory to numpy without copying it.

mod batch;
mod errors;
mod interrupt;
mod loader;

use pyo3::prelude::*;

/// The module `stoker._stoker`.
#[pymodule]
fn _stoker(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_class::<loader::NativeLoader>()?;
    module.add_function(wrap_pyfunction!(interrupt::note_interrupt, module)?)?;
    module.add_function(wrap_pyfunction!(interrupt::interrupts, module)?)?;
    errors::register(module)?;
    module.add("__version__", env!("CARGO_PKG_VERSION"))?;
    init_logging();
    Ok(())
}

/// Rust logs go to stderr when `STOKER_LOG` is set (a `tracing` filter: `info`,
/// `stoker_client=debug`, ...); silent otherwise, as a library inside a trainer should be.
fn init_logging() {
    let Ok(filter) = std::env::var("STOKER_LOG") else { return };
    stoker_obs::init_tracing(Some(&filter), "info", false);
}
