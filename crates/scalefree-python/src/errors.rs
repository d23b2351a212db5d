//! Maps transport/collective errors to the exception classes of `scalefree.errors`.

use pyo3::prelude::*;
use scalefree_transport::Error;

pub(crate) fn raise(py: Python<'_>, class: &str, msg: String) -> PyErr {
    let made = py
        .import("scalefree.errors")
        .and_then(|m| m.getattr(class))
        .and_then(|cls| cls.call1((msg.clone(),)));
    match made {
        Ok(exc) => PyErr::from_value(exc),
        Err(_) => pyo3::exceptions::PyRuntimeError::new_err(msg),
    }
}

pub fn to_py(py: Python<'_>, e: Error) -> PyErr {
    let class = match &e {
        Error::Io { .. } => "TransportIOError",
        Error::PeerLost { .. } => "PeerLostError",
        Error::Timeout { .. } => "ScalefreeTimeoutError",
        Error::InvalidArgument(_) => "InvalidArgumentError",
        Error::Mismatch(_) => "MismatchError",
        Error::Bootstrap(_) => "BootstrapError",
        Error::Unsupported(_) => "UnsupportedError",
        Error::Interrupted(_) => return pyo3::exceptions::PyKeyboardInterrupt::new_err(e.to_string()),
    };
    raise(py, class, e.to_string())
}

pub fn invalid(py: Python<'_>, msg: impl Into<String>) -> PyErr {
    raise(py, "InvalidArgumentError", msg.into())
}

/// `Result<T, Error>` → `PyResult<T>`.
pub trait IntoPy<T> {
    fn py_err(self, py: Python<'_>) -> PyResult<T>;
}

impl<T> IntoPy<T> for Result<T, Error> {
    fn py_err(self, py: Python<'_>) -> PyResult<T> {
        self.map_err(|e| to_py(py, e))
    }
}
