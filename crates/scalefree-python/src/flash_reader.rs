//! `scalefree._native.FlashBlockReader` and `FlashBlock`: blocks of a file read through the
//! flash runtime's program cache (`scalefree_flash::CacheReader`), for consumers that compute
//! in Python (the MF modes' rating blocks under a memory budget).

use std::os::raw::c_int;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use scalefree_flash::{AccessSpec, CacheReader, CachedBlock, FlashFile, OpenMode, ReaderStats};

use crate::errors::invalid;
use crate::flash::{flash_err, PyFlashRuntime};

/// Blocks of one file, read through a program cache of `budget_bytes` with prefetch of the
/// blocks announced by `push_ahead`.
#[pyclass(name = "FlashBlockReader", module = "scalefree._native")]
pub struct PyFlashBlockReader {
    reader: Arc<CacheReader>,
    file: Arc<FlashFile>,
}

#[pymethods]
impl PyFlashBlockReader {
    #[new]
    #[pyo3(signature = (runtime, path, budget_bytes, max_ahead=65536))]
    fn new(py: Python<'_>, runtime: &PyFlashRuntime, path: PathBuf, budget_bytes: u64, max_ahead: usize) -> PyResult<Self> {
        let opts = runtime.rt.file_options();
        let file = py.detach(|| FlashFile::open(&path, OpenMode::ReadOnly, &opts)).map_err(|e| flash_err(py, e))?;
        let reader = CacheReader::new(runtime.rt.clone(), budget_bytes, max_ahead).map_err(|e| flash_err(py, e))?;
        Ok(PyFlashBlockReader { reader: Arc::new(reader), file })
    }

    /// Announces blocks (byte offsets and lengths in the file), in the order they will be
    /// asked for: they are prefetched as the budget allows.
    fn push_ahead(&self, py: Python<'_>, offsets: Vec<u64>, lengths: Vec<u64>) -> PyResult<()> {
        if offsets.len() != lengths.len() {
            return Err(invalid(py, format!("{} offsets but {} lengths", offsets.len(), lengths.len())));
        }
        let specs = offsets.iter().zip(&lengths).map(|(&o, &l)| AccessSpec::contiguous(self.file.clone(), o, l)).collect::<Result<Vec<_>, _>>().map_err(|e| flash_err(py, e))?;
        py.detach(|| self.reader.push_ahead(specs));
        Ok(())
    }

    /// Forgets the announced blocks (nothing more is prefetched).
    fn clear_ahead(&self, py: Python<'_>) {
        py.detach(|| self.reader.clear_ahead());
    }

    /// The `length` bytes at `offset`, in memory (waits for the read). Export it with
    /// `np.frombuffer`; `release()` hands the buffer back once no array uses it.
    fn get(&self, py: Python<'_>, offset: u64, length: u64) -> PyResult<PyFlashBlock> {
        let spec = AccessSpec::contiguous(self.file.clone(), offset, length).map_err(|e| flash_err(py, e))?;
        let reader = self.reader.clone();
        let block = py.detach(move || reader.get(&spec)).map_err(|e| flash_err(py, e))?;
        Ok(PyFlashBlock { state: Mutex::new(BlockState { block: Some(block), exports: 0, released: false }) })
    }

    /// Counters: gets, waits, wait_seconds, peak_resident_bytes (since `reset_peak`),
    /// resident_bytes, bytes_read, cache_hits, cache_misses, evictions, budget_bytes.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        reader_stats_dict(py, &self.reader.stats())
    }

    /// Starts a new peak of resident bytes.
    fn reset_peak(&self) {
        self.reader.reset_peak();
    }

    /// Whether the file is read with O_DIRECT (else through the page cache).
    #[getter]
    fn direct(&self) -> bool {
        self.file.is_direct()
    }
}

/// A [`ReaderStats`] as the dict `FlashBlockReader.stats()` and `MfTrainer.flash_stats()` return.
pub(crate) fn reader_stats_dict<'py>(py: Python<'py>, s: &ReaderStats) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("gets", s.gets)?;
    d.set_item("waits", s.waits)?;
    d.set_item("wait_seconds", s.wait.as_secs_f64())?;
    d.set_item("peak_resident_bytes", s.cache.peak_resident_bytes)?;
    d.set_item("resident_bytes", s.resident_bytes)?;
    d.set_item("bytes_read", s.cache.bytes_prefetched)?;
    d.set_item("cache_hits", s.cache.hits)?;
    d.set_item("cache_misses", s.cache.misses)?;
    d.set_item("evictions", s.cache.evictions)?;
    d.set_item("budget_bytes", s.cache.budget_bytes)?;
    Ok(d)
}

struct BlockState {
    block: Option<CachedBlock>,
    exports: usize,
    released: bool,
}

/// One block in memory, read-only through the buffer protocol. `release()` returns it to
/// the cache as soon as no exported view remains (at once if none).
#[pyclass(name = "FlashBlock", module = "scalefree._native")]
pub struct PyFlashBlock {
    state: Mutex<BlockState>,
}

#[pymethods]
impl PyFlashBlock {
    unsafe fn __getbuffer__(slf: Bound<'_, Self>, view: *mut ffi::Py_buffer, flags: c_int) -> PyResult<()> {
        let py = slf.py();
        let (ptr, len) = {
            let me = slf.borrow();
            let mut st = me.state.lock().unwrap_or_else(|p| p.into_inner());
            let Some(block) = st.block.as_ref().filter(|_| !st.released) else {
                return Err(invalid(py, "this flash block was released"));
            };
            let bytes = block.bytes();
            let out = (bytes.as_ptr(), bytes.len());
            st.exports += 1;
            out
        };
        let ptr = if len == 0 { std::ptr::NonNull::<u8>::dangling().as_ptr() as *const u8 } else { ptr };
        // SAFETY: `view` comes from Python; the bytes stay valid until the last export is
        // released (`__releasebuffer__`), since the block is dropped only then.
        let r = unsafe { ffi::PyBuffer_FillInfo(view, slf.as_ptr(), ptr as *mut std::ffi::c_void, len as ffi::Py_ssize_t, 1, flags) };
        if r != 0 {
            let me = slf.borrow();
            me.state.lock().unwrap_or_else(|p| p.into_inner()).exports -= 1;
            return Err(PyErr::fetch(py));
        }
        Ok(())
    }

    unsafe fn __releasebuffer__(&self, _view: *mut ffi::Py_buffer) {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        st.exports -= 1;
        if st.exports == 0 && st.released {
            st.block = None;
        }
    }

    /// Hands the block back to the cache (once no array made from it is alive).
    fn release(&self) {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        st.released = true;
        if st.exports == 0 {
            st.block = None;
        }
    }

    fn __len__(&self) -> usize {
        let st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        st.block.as_ref().map_or(0, |b| b.bytes().len())
    }
}
