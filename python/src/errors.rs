//! The exception hierarchy Python code catches, and the one mapping from [`ClientError`] to it.
//!
//! ```text
//! StokerError
//! ├── ConfigError        settings, transforms, unknown dataset, refused by the coordinator
//! │   └── ResumeError    a state_dict that does not fit this job
//! ├── ConnectionError    coordinator or workers unreachable, protocol mismatch
//! └── TimeoutError       no batch within the loader's timeout
//! ```
//!
//! `ConnectionError` and `TimeoutError` also subclass Python's built-in exceptions of the same
//! name, so `except TimeoutError:` written for any other library catches Stoker's too. PyO3's
//! `create_exception!` takes one base, so those two classes are made at import time by calling
//! `type(name, (StokerError, builtins.X), {...})`.

use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyTuple, PyType};
use stoker_client::ClientError;
use stoker_proto::ErrorCode;

create_exception!(stoker, StokerError, PyException, "Base class of every error Stoker raises.");
create_exception!(stoker, ConfigError, StokerError, "Invalid settings, or a request the coordinator refused as invalid.");
create_exception!(stoker, ResumeError, ConfigError, "A saved state that does not fit this job.");

/// `stoker.ConnectionError(StokerError, builtins.ConnectionError)`.
static CONNECTION_ERROR: PyOnceLock<Py<PyType>> = PyOnceLock::new();
/// `stoker.TimeoutError(StokerError, builtins.TimeoutError)`.
static TIMEOUT_ERROR: PyOnceLock<Py<PyType>> = PyOnceLock::new();

/// A class named `name` that subclasses both [`StokerError`] and the built-in `name`.
fn dual_class(py: Python<'_>, name: &str, doc: &str) -> PyResult<Py<PyType>> {
    let builtin = py.import("builtins")?.getattr(name)?;
    let bases = PyTuple::new(py, [py.get_type::<StokerError>().into_any(), builtin])?;
    let namespace = PyDict::new(py);
    namespace.set_item("__doc__", doc)?;
    namespace.set_item("__module__", "stoker")?;
    let class = py.get_type::<PyType>().call1((name, bases, namespace))?;
    Ok(class.cast_into::<PyType>()?.unbind())
}

fn connection_error(py: Python<'_>) -> PyResult<&Py<PyType>> {
    CONNECTION_ERROR.get_or_try_init(py, || dual_class(py, "ConnectionError", "The coordinator or a worker cannot be reached."))
}

fn timeout_error(py: Python<'_>) -> PyResult<&Py<PyType>> {
    TIMEOUT_ERROR.get_or_try_init(py, || dual_class(py, "TimeoutError", "No batch arrived within the loader's timeout."))
}

/// An exception of one of the two dual classes, carrying `message`.
fn dual_error(class: for<'py> fn(Python<'py>) -> PyResult<&'py Py<PyType>>, message: String) -> PyErr {
    Python::attach(|py| match class(py) {
        Ok(class) => PyErr::from_type(class.bind(py).clone(), message),
        Err(error) => error,
    })
}

/// Add the exception classes to the module.
pub(crate) fn register(module: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = module.py();
    module.add("StokerError", py.get_type::<StokerError>())?;
    module.add("ConfigError", py.get_type::<ConfigError>())?;
    module.add("ResumeError", py.get_type::<ResumeError>())?;
    module.add("ConnectionError", connection_error(py)?.bind(py))?;
    module.add("TimeoutError", timeout_error(py)?.bind(py))?;
    Ok(())
}

/// The Python exception for a client error, with the Rust message.
pub(crate) fn to_py(error: ClientError) -> PyErr {
    let message = error.to_string();
    match &error {
        ClientError::Config { .. } => ConfigError::new_err(message),
        ClientError::Resume { .. } => ResumeError::new_err(message),
        ClientError::Timeout { .. } => dual_error(timeout_error, message),
        ClientError::Net(stoker_net::NetError::Tls(_)) => ConfigError::new_err(message),
        ClientError::Net(_) => dual_error(connection_error, message),
        ClientError::Runtime { .. } | ClientError::Superseded { .. } => StokerError::new_err(message),
        ClientError::Coordinator { source } => match source.code {
            ErrorCode::InvalidArgument | ErrorCode::NotFound | ErrorCode::Forbidden => ConfigError::new_err(message),
            ErrorCode::Unavailable | ErrorCode::VersionMismatch | ErrorCode::NotLeader { .. } => dual_error(connection_error, message),
            ErrorCode::Timeout => dual_error(timeout_error, message),
            ErrorCode::Internal | ErrorCode::Superseded | ErrorCode::JobFailed | ErrorCode::Stale => StokerError::new_err(message),
        },
    }
}

/// A configuration error from anything displayable.
pub(crate) fn config(error: impl std::fmt::Display) -> PyErr {
    ConfigError::new_err(error.to_string())
}
