//! A received batch as Python objects. The image bytes and the labels move into numpy arrays
//! that own the Rust allocations (no copy); `stoker.Batch` reshapes them into views.

use numpy::IntoPyArray;
use pyo3::prelude::*;
use pyo3::types::PyTuple;
use stoker_client::ReceivedBatch;
use stoker_common::transform::{FloatDtype, OutputDtype, OutputLayout};

/// `(images_u8_flat, shape, dtype, layout, labels, keys, epoch, step, rank, replaced, checksum)`:
/// the order `stoker/batch.py` unpacks.
pub(crate) fn to_python(py: Python<'_>, batch: ReceivedBatch) -> PyResult<Bound<'_, PyTuple>> {
    let (header, payload) = batch.into_parts();
    let dtype = match header.dtype {
        OutputDtype::U8 => "uint8",
        OutputDtype::Float(FloatDtype::F32) => "float32",
        OutputDtype::Float(FloatDtype::F16) => "float16",
    };
    let layout = match header.layout {
        OutputLayout::Nhwc => "NHWC",
        OutputLayout::Nchw => "NCHW",
    };
    let images = payload.into_pyarray(py);
    let labels = header.labels.into_pyarray(py);
    let shape = PyTuple::new(py, header.shape)?;
    let items: [Bound<'_, PyAny>; 11] = [
        images.into_any(),
        shape.into_any(),
        dtype.into_pyobject(py)?.into_any(),
        layout.into_pyobject(py)?.into_any(),
        labels.into_any(),
        header.keys.into_pyobject(py)?.into_any(),
        header.epoch.0.into_pyobject(py)?.into_any(),
        header.step.0.into_pyobject(py)?.into_any(),
        header.rank.0.into_pyobject(py)?.into_any(),
        header.replaced.into_pyobject(py)?.into_any(),
        header.checksum.into_pyobject(py)?.into_any(),
    ];
    PyTuple::new(py, items)
}
