//! Maps transport/collective errors to the exception classes of `scalefree.errors`.

use std::cell::RefCell;
use std::sync::Arc;

use pyo3::prelude::*;
use scalefree_transport::Error;

thread_local! {
    /// The exception a Python signal handler raised during a wait of this thread (Ctrl-C's
    /// `KeyboardInterrupt`, or whatever a user's handler raises), re-raised when the wait
    /// returns [`Error::Interrupted`].
    static SIGNAL_ERROR: RefCell<Option<PyErr>> = const { RefCell::new(None) };
}

/// The check every parked wait runs (`scalefree_transport::wait::InterruptCheck`): in
/// Python's main thread (the process's first thread, where Python runs signal handlers),
/// runs the pending handlers; one that raises ends the wait. Other threads return at once.
pub(crate) fn signal_check() -> scalefree_transport::wait::InterruptCheck {
    Arc::new(|| {
        // SAFETY: plain system calls without arguments.
        let main_thread = unsafe { libc::syscall(libc::SYS_gettid) } == unsafe { libc::getpid() } as libc::c_long;
        // (After the interpreter has finalized, a wait in a destructor has nobody to ask.)
        main_thread
            && unsafe { pyo3::ffi::Py_IsInitialized() } != 0
            && Python::attach(|py| match py.check_signals() {
                Ok(()) => false,
                Err(e) => {
                    SIGNAL_ERROR.with(|s| *s.borrow_mut() = Some(e));
                    true
                }
            })
    })
}

/// The exception of an interrupted wait: what the signal handler raised, else
/// `KeyboardInterrupt` with `message`.
pub(crate) fn interrupted(message: String) -> PyErr {
    SIGNAL_ERROR.with(|s| s.borrow_mut().take()).unwrap_or_else(|| pyo3::exceptions::PyKeyboardInterrupt::new_err(message))
}

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
        Error::Interrupted(_) => return interrupted(e.to_string()),
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
