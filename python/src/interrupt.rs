//! Ctrl-C, counted where Python cannot lose it.
//!
//! Python runs a signal's handler at the next point the main thread executes Python code; when
//! that point is a finalizer (a `__del__`, a generator closed by the garbage collector), the
//! `KeyboardInterrupt` it raises is printed as "Exception ignored" and dropped, and a loop
//! that goes on to wait for data waits out its whole batch timeout. `stoker.interrupt` installs,
//! while a loader is iterated, a SIGINT handler that counts the signal here before raising as
//! Python's own does; a wait for a batch that sees the count move since the loop last had
//! control raises `KeyboardInterrupt` itself.

use std::sync::atomic::{AtomicU64, Ordering};

use pyo3::prelude::*;

static INTERRUPTS: AtomicU64 = AtomicU64::new(0);

/// Count one SIGINT (called by `stoker.interrupt`'s handler).
#[pyfunction]
pub(crate) fn note_interrupt() {
    INTERRUPTS.fetch_add(1, Ordering::AcqRel);
}

/// SIGINTs counted so far in this process.
#[pyfunction]
pub(crate) fn interrupts() -> u64 {
    INTERRUPTS.load(Ordering::Acquire)
}

/// Whether a SIGINT was counted since the count was `seen`.
pub(crate) fn since(seen: u64) -> bool {
    interrupts() != seen
}
