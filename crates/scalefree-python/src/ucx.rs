//! What UCX this process can load (`scalefree.launch.ucx.info()`).

use pyo3::prelude::*;

use crate::errors::IntoPy;

/// `(version, library path)` of the UCX the UCX backend would use; raises
/// `UnsupportedError` naming every place looked at when there is none.
#[pyfunction]
pub fn ucx_library(py: Python<'_>) -> PyResult<((u32, u32, u32), String)> {
    let u = scalefree_transport::backends::ucx::ffi::ucp().py_err(py)?;
    Ok((u.version, u.path.clone()))
}
