//! The exception hierarchy Python code catches, and the one mapping from [`ClientError`] to it.
//!
//! ```text
//! StokerError
//! ├── ConfigError        settings, transforms, unknown dataset, refused by the coordinator
//! │   └── ResumeError    a state_dict that does not fit this job
//! ├── ConnectionError    coordinator or workers unreachable, protocol mismatch
//! └── TimeoutError       no batch within the loader's timeout
//! ```

use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use stoker_client::ClientError;
use stoker_common::proto::ErrorCode;

create_exception!(stoker, StokerError, PyException, "Base class of every error Stoker raises.");
create_exception!(stoker, ConfigError, StokerError, "Invalid settings, or a request the coordinator refused as invalid.");
create_exception!(stoker, ResumeError, ConfigError, "A saved state that does not fit this job.");
create_exception!(stoker, ConnectionError, StokerError, "The coordinator or a worker cannot be reached.");
create_exception!(stoker, TimeoutError, StokerError, "No batch arrived within the loader's timeout.");

/// Add the exception classes to the module.
pub(crate) fn register(module: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = module.py();
    module.add("StokerError", py.get_type::<StokerError>())?;
    module.add("ConfigError", py.get_type::<ConfigError>())?;
    module.add("ResumeError", py.get_type::<ResumeError>())?;
    module.add("ConnectionError", py.get_type::<ConnectionError>())?;
    module.add("TimeoutError", py.get_type::<TimeoutError>())?;
    Ok(())
}

/// The Python exception for a client error, with the Rust message.
pub(crate) fn to_py(error: ClientError) -> PyErr {
    let message = error.to_string();
    match &error {
        ClientError::Config { .. } => ConfigError::new_err(message),
        ClientError::Resume { .. } => ResumeError::new_err(message),
        ClientError::Timeout { .. } => TimeoutError::new_err(message),
        ClientError::Net(stoker_common::net::NetError::Tls(_)) => ConfigError::new_err(message),
        ClientError::Net(_) => ConnectionError::new_err(message),
        ClientError::Runtime { .. } | ClientError::Superseded { .. } => StokerError::new_err(message),
        ClientError::Coordinator { source } => match source.code {
            ErrorCode::InvalidArgument | ErrorCode::NotFound | ErrorCode::Forbidden => ConfigError::new_err(message),
            ErrorCode::Unavailable | ErrorCode::VersionMismatch | ErrorCode::NotLeader { .. } => ConnectionError::new_err(message),
            ErrorCode::Timeout => TimeoutError::new_err(message),
            ErrorCode::Internal | ErrorCode::Superseded | ErrorCode::JobFailed | ErrorCode::Stale => StokerError::new_err(message),
        },
    }
}

/// A configuration error from anything displayable.
pub(crate) fn config(error: impl std::fmt::Display) -> PyErr {
    ConfigError::new_err(error.to_string())
}
