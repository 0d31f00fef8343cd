//! A received batch as Python objects. The image bytes and the labels become numpy arrays
//! over the Rust allocations (no copy); `stoker.Batch` reshapes them into views.

use numpy::ndarray::ArrayView1;
use numpy::{IntoPyArray, PyArray1};
use pyo3::prelude::*;
use pyo3::types::PyTuple;
use stoker_client::ReceivedBatch;
use stoker_net::Payload;
use stoker_plan::transform::{FloatDtype, OutputDtype, OutputLayout};

/// `(images_u8_flat, shape, dtype, layout, labels, keys, epoch, step, rank, replaced, checksum,
/// corrupt)`: the order `stoker/batch.py` unpacks.
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
    let images = payload_array(py, payload)?;
    let labels = header.labels.into_pyarray(py);
    let shape = PyTuple::new(py, header.shape)?;
    let items: [Bound<'_, PyAny>; 12] = [
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
        header.corrupt.into_pyobject(py)?.into_any(),
    ];
    PyTuple::new(py, items)
}

/// Keeps a batch's payload alive for as long as numpy arrays (and torch tensors made from
/// them) view it; when the last goes, the buffer returns to the loader's pool. It is the
/// `base` of every array of a batch's images, and can be weakly referenced, so a test can see
/// when it goes.
#[pyclass(frozen, weakref, module = "stoker._stoker")]
struct PayloadOwner {
    _payload: Payload,
}

/// A writable flat `uint8` array over `payload`, owned by a [`PayloadOwner`].
fn payload_array(py: Python<'_>, mut payload: Payload) -> PyResult<Bound<'_, PyArray1<u8>>> {
    let (data, len) = (payload.as_mut_ptr(), payload.len());
    let owner = Bound::new(py, PayloadOwner { _payload: payload })?;
    // SAFETY: `data` points at `len` initialised bytes of a heap buffer that does not move
    // when the `Payload` moves into the owner, and the owner lives (as the array's base
    // object) as long as the array and every view of it. Nothing else reaches the buffer
    // while the owner holds it, so numpy may also write to it.
    let view = unsafe { ArrayView1::from_shape_ptr(len, data) };
    // SAFETY: as above: `owner` keeps the memory `view` describes alive.
    Ok(unsafe { PyArray1::borrow_from_array(&view, owner.into_any()) })
}
