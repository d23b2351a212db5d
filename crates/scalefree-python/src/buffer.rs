//! Borrowing the memory of a numpy array (or anything with the buffer protocol).

use std::ffi::CStr;

use pyo3::ffi;
use pyo3::prelude::*;
use scalefree_collectives::DType;

use crate::errors::invalid;

/// A held buffer view; released on drop. The exporter cannot be resized meanwhile.
pub struct Buf {
    view: Box<ffi::Py_buffer>,
    pub dtype: Option<DType>,
    pub format: String,
}

unsafe impl Send for Buf {}

impl Buf {
    /// Requests a contiguous buffer (C or Fortran order), writable if asked.
    pub fn get(obj: &Bound<'_, PyAny>, writable: bool, what: &str) -> PyResult<Buf> {
        let py = obj.py();
        let mut view: Box<ffi::Py_buffer> = Box::new(unsafe { std::mem::zeroed() });
        let flags = ffi::PyBUF_FORMAT | ffi::PyBUF_ANY_CONTIGUOUS | if writable { ffi::PyBUF_WRITABLE } else { 0 };
        if unsafe { ffi::PyObject_GetBuffer(obj.as_ptr(), &mut *view, flags) } != 0 {
            let err = PyErr::fetch(py);
            let tname = obj.get_type().name().map(|n| n.to_string()).unwrap_or_default();
            // Say which of the requirements failed.
            let detail = if unsafe { ffi::PyObject_CheckBuffer(obj.as_ptr()) } == 0 {
                format!("{what} must be a numpy array (or support the buffer protocol), got {tname}")
            } else if writable && obj.getattr("flags").and_then(|f| f.getattr("writeable")).and_then(|w| w.extract::<bool>()).map(|w| !w).unwrap_or(false) {
                format!("{what} is read-only; the collective writes its result into it")
            } else {
                format!("{what} must be contiguous (np.ascontiguousarray makes a contiguous copy): {err}")
            };
            return Err(invalid(py, detail));
        }
        let format = if view.format.is_null() {
            "B".to_string()
        } else {
            unsafe { CStr::from_ptr(view.format) }.to_string_lossy().into_owned()
        };
        let dtype = dtype_of(&format, view.itemsize as usize);
        let b = Buf { view, dtype, format };
        if b.len_bytes() > 0 && !(b.ptr() as usize).is_multiple_of(b.view.itemsize.max(1) as usize) {
            return Err(invalid(py, format!("{what} is not aligned to its element size")));
        }
        Ok(b)
    }

    pub fn ptr(&self) -> *mut u8 {
        self.view.buf as *mut u8
    }
    pub fn len_bytes(&self) -> usize {
        self.view.len as usize
    }
    pub fn itemsize(&self) -> usize {
        self.view.itemsize.max(1) as usize
    }
    pub fn count(&self) -> usize {
        self.len_bytes() / self.itemsize()
    }

    /// The element type for a reduction, or a clear error naming the dtype.
    pub fn reducible(&self, py: Python<'_>, what: &str) -> PyResult<DType> {
        match self.dtype {
            Some(d) => Ok(d),
            None => Err(invalid(py, format!(
                "{what}: unsupported dtype (buffer format {:?}, {} bytes); reductions support float32, float64, int32, int64, uint8",
                self.format, self.itemsize()
            ))),
        }
    }

    /// For data movement any dtype works: reductions' types keep their width, anything else
    /// moves as bytes.
    pub fn movable(&self) -> (DType, usize) {
        match self.dtype {
            Some(d) if d != DType::U8 => (d, self.count()),
            _ => (DType::U8, self.len_bytes()),
        }
    }
}

impl Drop for Buf {
    fn drop(&mut self) {
        // Releasing needs the GIL; Buf is only dropped while holding it.
        unsafe { ffi::PyBuffer_Release(&mut *self.view) };
    }
}

fn dtype_of(format: &str, itemsize: usize) -> Option<DType> {
    let f = format.trim_start_matches(['@', '=', '<']);
    if format.starts_with(['>', '!']) {
        return None;
    }
    match (f, itemsize) {
        ("f", 4) => Some(DType::F32),
        ("d", 8) => Some(DType::F64),
        ("i" | "l" | "q", 4) => Some(DType::I32),
        ("i" | "l" | "q", 8) => Some(DType::I64),
        ("B", 1) => Some(DType::U8),
        _ => None,
    }
}

/// Exports `len` writable bytes at `ptr`, owned by `owner`, through the buffer protocol
/// (for `__getbuffer__` of objects that wrap memory: regions, slots).
///
/// # Safety
/// `view` comes from Python's buffer protocol; `ptr..ptr+len` stays valid while `owner` lives.
pub unsafe fn export(owner: &Bound<'_, PyAny>, view: *mut ffi::Py_buffer, ptr: *mut u8, len: usize, flags: std::ffi::c_int) -> PyResult<()> {
    let ptr = if len == 0 { std::ptr::NonNull::<u8>::dangling().as_ptr() } else { ptr };
    let r = unsafe { ffi::PyBuffer_FillInfo(view, owner.as_ptr(), ptr as *mut std::ffi::c_void, len as ffi::Py_ssize_t, 0, flags) };
    if r != 0 {
        return Err(PyErr::fetch(owner.py()));
    }
    Ok(())
}
