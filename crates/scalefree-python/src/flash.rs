//! `scalefree._native.FlashRuntime`, `FlashMatrix`, `FlashCsr` and the flash kernels.

use std::path::PathBuf;
use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::PyDict;
use scalefree_collectives::DType;
use scalefree_flash::{
    csr_gram_in_memory, csrmm_in_memory, docword_input_to_flash, read_docword, read_matrix_market, DOCWORD_CHUNK_ENTRIES, FlashFile, FlashPtr, OpenMode, CsrRef, DenseInput, DenseMut, DenseOutput, DenseRef, ColIndex, FlashCsrMatrix, FlashError, FlashMatrix, Layout, Runtime,
    RuntimeOptions, RunStats, Transpose, TransposedProduct,
};

use crate::buffer::Buf;
use crate::errors::invalid;

pub(crate) fn flash_err(py: Python<'_>, e: FlashError) -> PyErr {
    let msg = e.to_string();
    let class = match &e {
        FlashError::OutOfBudget { .. } => "OutOfBudgetError",
        FlashError::ShapeMismatch { .. } | FlashError::InvalidArgument { .. } => "InvalidArgumentError",
        _ => "FlashIOError",
    };
    py.import("scalefree.errors")
        .and_then(|m| m.getattr(class))
        .and_then(|c| c.call1((msg.clone(),)))
        .map(PyErr::from_value)
        .unwrap_or_else(|_| pyo3::exceptions::PyRuntimeError::new_err(msg))
}

fn layout_of(py: Python<'_>, order: &str) -> PyResult<Layout> {
    match order {
        "C" => Ok(Layout::RowMajor),
        "F" => Ok(Layout::ColMajor),
        _ => Err(invalid(py, format!("order must be 'C' or 'F', got {order:?}"))),
    }
}

pub(crate) fn stats_dict<'py>(py: Python<'py>, s: &RunStats) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("tasks", s.tasks_completed)?;
    d.set_item("seconds", s.elapsed.as_secs_f64())?;
    d.set_item("budget_bytes", s.cache.budget_bytes)?;
    d.set_item("peak_resident_bytes", s.cache.peak_resident_bytes)?;
    d.set_item("bytes_read", s.cache.bytes_prefetched)?;
    d.set_item("bytes_written", s.cache.bytes_written_back)?;
    d.set_item("cache_hits", s.cache.hits)?;
    d.set_item("cache_misses", s.cache.misses)?;
    d.set_item("evictions", s.cache.evictions)?;
    d.set_item("compute_busy_seconds", s.compute_busy.as_secs_f64())?;
    d.set_item("compute_idle_seconds", s.compute_idle.as_secs_f64())?;
    Ok(d)
}

/// A flash runtime: scratch directory, IO threads, compute pool, hard memory budget.
#[pyclass(name = "FlashRuntime", module = "scalefree._native")]
pub struct PyFlashRuntime {
    pub(crate) rt: Arc<Runtime>,
}

#[pymethods]
impl PyFlashRuntime {
    #[new]
    #[pyo3(signature = (memory_budget_bytes=None, threads=None, dir=None, blas=None))]
    fn new(py: Python<'_>, memory_budget_bytes: Option<u64>, threads: Option<usize>, dir: Option<PathBuf>, blas: Option<PathBuf>) -> PyResult<Self> {
        let mut o = RuntimeOptions::from_env().map_err(|e| flash_err(py, e))?;
        if let Some(b) = memory_budget_bytes {
            o.memory_budget_bytes = b;
        }
        if let Some(t) = threads {
            o.compute_threads = t;
            o.max_tasks_in_flight = t + 2;
        }
        if let Some(d) = dir {
            o.dir = d;
        }
        if let Some(path) = blas {
            o.blas_library = (!path.as_os_str().is_empty()).then_some(path);
        }
        let rt = py.detach(move || Runtime::new(o)).map_err(|e| flash_err(py, e))?;
        Ok(PyFlashRuntime { rt: Arc::new(rt) })
    }
    #[getter]
    fn memory_budget_bytes(&self) -> u64 {
        self.rt.options().memory_budget_bytes
    }
    #[getter]
    fn threads(&self) -> usize {
        self.rt.options().compute_threads
    }
    #[getter]
    fn dir(&self) -> PathBuf {
        self.rt.dir().to_path_buf()
    }
    /// The CBLAS library dense gemm blocks go through, or None (faer).
    #[getter]
    fn blas(&self) -> Option<PathBuf> {
        self.rt.blas().map(|b| b.path().to_path_buf())
    }
    /// Live counters `(tasks_added, tasks_completed, bytes_read, bytes_written)`, cumulative
    /// over the runtime's life (read them from another thread while a kernel runs).
    #[getter]
    fn progress(&self) -> (u64, u64, u64, u64) {
        let p = self.rt.progress().snapshot();
        (p.tasks_added, p.tasks_completed, p.bytes_read, p.bytes_written)
    }
    /// The CBLAS library's own thread count, where it says.
    #[getter]
    fn blas_threads(&self) -> Option<usize> {
        self.rt.blas().and_then(|b| b.threads())
    }
}

enum AnyMatrix {
    F32(FlashMatrix<f32>),
    F64(FlashMatrix<f64>),
}

/// A dense matrix on flash (a scratch file deleted when the last reference goes).
#[pyclass(name = "FlashMatrix", module = "scalefree._native")]
pub struct PyFlashMatrix {
    m: AnyMatrix,
}

macro_rules! with_matrix {
    ($m:expr, $x:ident => $body:expr) => {
        match $m {
            AnyMatrix::F32($x) => $body,
            AnyMatrix::F64($x) => $body,
        }
    };
}

#[pymethods]
impl PyFlashMatrix {
    /// Copies a contiguous 2-D float32/float64 array (`order` 'C' or 'F') to flash.
    #[staticmethod]
    fn from_array(py: Python<'_>, rt: &PyFlashRuntime, a: Bound<'_, PyAny>, rows: usize, cols: usize, order: &str) -> PyResult<Self> {
        let layout = layout_of(py, order)?;
        let buf = Buf::get(&a, false, "FlashMatrix.from_numpy: the array")?;
        if buf.count() != rows * cols {
            return Err(invalid(py, format!("array has {} elements, not {rows}x{cols}", buf.count())));
        }
        let (dir, opts) = (rt.rt.dir().to_path_buf(), rt.rt.file_options());
        let m = match buf.dtype {
            Some(DType::F32) => {
                let s = unsafe { std::slice::from_raw_parts(buf.ptr() as *const f32, rows * cols) };
                AnyMatrix::F32(FlashMatrix::from_slice(&dir, s, rows, cols, layout, &opts).map_err(|e| flash_err(py, e))?)
            }
            Some(DType::F64) => {
                let s = unsafe { std::slice::from_raw_parts(buf.ptr() as *const f64, rows * cols) };
                AnyMatrix::F64(FlashMatrix::from_slice(&dir, s, rows, cols, layout, &opts).map_err(|e| flash_err(py, e))?)
            }
            _ => return Err(invalid(py, "flash matrices hold float32 or float64")),
        };
        Ok(PyFlashMatrix { m })
    }

    /// An uninitialised (zero) matrix on flash.
    #[staticmethod]
    fn scratch(py: Python<'_>, rt: &PyFlashRuntime, rows: usize, cols: usize, dtype: &str, order: &str) -> PyResult<Self> {
        let layout = layout_of(py, order)?;
        let (dir, opts) = (rt.rt.dir().to_path_buf(), rt.rt.file_options());
        let m = match dtype {
            "float32" => AnyMatrix::F32(FlashMatrix::scratch(&dir, rows, cols, layout, &opts).map_err(|e| flash_err(py, e))?),
            "float64" => AnyMatrix::F64(FlashMatrix::scratch(&dir, rows, cols, layout, &opts).map_err(|e| flash_err(py, e))?),
            d => return Err(invalid(py, format!("flash matrices hold float32 or float64, not {d}"))),
        };
        Ok(PyFlashMatrix { m })
    }

    /// Maps `rows x cols` packed elements of an existing file starting at byte `offset` (e.g.
    /// the data of a `.npy` file) without copying; `writable` opens it read-write.
    #[staticmethod]
    #[allow(clippy::too_many_arguments)]
    fn map_file(py: Python<'_>, rt: &PyFlashRuntime, path: PathBuf, offset: u64, rows: usize, cols: usize, dtype: &str, order: &str, writable: bool) -> PyResult<Self> {
        let layout = layout_of(py, order)?;
        let opts = rt.rt.file_options();
        let mode = if writable { OpenMode::ReadWrite } else { OpenMode::ReadOnly };
        fn map<T: scalefree_flash::Real>(path: &std::path::Path, offset: u64, rows: usize, cols: usize, layout: Layout, mode: OpenMode, opts: &scalefree_flash::FileOptions) -> Result<FlashMatrix<T>, FlashError> {
            let file = FlashFile::open(path, mode, opts)?;
            let ptr = FlashPtr::<T>::from_file(file, offset, rows as u64 * cols as u64)?;
            FlashMatrix::new(ptr, rows, cols, layout, scalefree_flash::DenseShape::packed(rows, cols, layout).leading_dim)
        }
        let m = match dtype {
            "float32" => AnyMatrix::F32(py.detach(|| map(&path, offset, rows, cols, layout, mode, &opts)).map_err(|e| flash_err(py, e))?),
            "float64" => AnyMatrix::F64(py.detach(|| map(&path, offset, rows, cols, layout, mode, &opts)).map_err(|e| flash_err(py, e))?),
            d => return Err(invalid(py, format!("flash matrices hold float32 or float64, not {d}"))),
        };
        Ok(PyFlashMatrix { m })
    }

    /// A new file at `path` holding `header` then a zero `rows x cols` matrix (mapped), that
    /// appears at `path` only on [`PyFlashMatrix::publish`] (synced, then renamed in one step):
    /// an interrupted writer leaves nothing at `path`.
    #[staticmethod]
    #[allow(clippy::too_many_arguments)]
    fn create_atomic(py: Python<'_>, rt: &PyFlashRuntime, path: PathBuf, header: Vec<u8>, rows: usize, cols: usize, dtype: &str, order: &str) -> PyResult<Self> {
        let layout = layout_of(py, order)?;
        let opts = rt.rt.file_options();
        fn create<T: scalefree_flash::Real>(path: &std::path::Path, header: &[u8], rows: usize, cols: usize, layout: Layout, opts: &scalefree_flash::FileOptions) -> Result<FlashMatrix<T>, FlashError> {
            let len = (rows as u64).checked_mul(cols as u64).ok_or_else(|| FlashError::invalid("matrix size overflows"))?;
            let file = FlashFile::create_atomic(path, header.len() as u64 + len * std::mem::size_of::<T>() as u64, opts)?;
            file.write_bytes(0, header)?;
            let ptr = FlashPtr::<T>::from_file(file, header.len() as u64, len)?;
            FlashMatrix::new(ptr, rows, cols, layout, scalefree_flash::DenseShape::packed(rows, cols, layout).leading_dim)
        }
        let m = match dtype {
            "float32" => AnyMatrix::F32(py.detach(|| create(&path, &header, rows, cols, layout, &opts)).map_err(|e| flash_err(py, e))?),
            "float64" => AnyMatrix::F64(py.detach(|| create(&path, &header, rows, cols, layout, &opts)).map_err(|e| flash_err(py, e))?),
            d => return Err(invalid(py, format!("flash matrices hold float32 or float64, not {d}"))),
        };
        Ok(PyFlashMatrix { m })
    }

    /// Syncs a matrix made by `create_atomic` and makes its file appear at its path (no-op
    /// for other matrices).
    fn publish(&self, py: Python<'_>) -> PyResult<()> {
        with_matrix!(&self.m, m => py.detach(|| m.data().file().publish())).map_err(|e| flash_err(py, e))
    }

    #[getter]
    fn shape(&self) -> (usize, usize) {
        with_matrix!(&self.m, m => { let s = m.shape(); (s.rows, s.cols) })
    }
    #[getter]
    fn dtype(&self) -> &'static str {
        match self.m {
            AnyMatrix::F32(_) => "float32",
            AnyMatrix::F64(_) => "float64",
        }
    }
    #[getter]
    fn order(&self) -> &'static str {
        let layout = with_matrix!(&self.m, m => m.shape().layout);
        if layout == Layout::RowMajor { "C" } else { "F" }
    }

    /// Reads the `rows x cols` block at (`row0`, `col0`) into `out` (contiguous, the matrix's
    /// dtype, packed in its order), straight from flash (no intermediate copy).
    fn _read_block(&self, py: Python<'_>, row0: usize, col0: usize, rows: usize, cols: usize, out: Bound<'_, PyAny>) -> PyResult<()> {
        let buf = Buf::get(&out, true, "FlashMatrix.read_block: out")?;
        with_matrix!(&self.m, m => {
            let ptr = block_ptr(py, &buf, m, rows, cols)? as usize;
            // SAFETY: see block_ptr; `out` is writable and held by `buf` for the call.
            py.detach(|| m.read_block_into(row0, col0, rows, cols, unsafe { std::slice::from_raw_parts_mut(ptr as *mut _, rows * cols) }))
                .map_err(|e| flash_err(py, e))
        })
    }

    /// Writes `src` (contiguous, the matrix's dtype, packed in its order) as the `rows x cols`
    /// block at (`row0`, `col0`).
    fn _write_block(&self, py: Python<'_>, row0: usize, col0: usize, rows: usize, cols: usize, src: Bound<'_, PyAny>) -> PyResult<()> {
        let buf = Buf::get(&src, false, "FlashMatrix.write_block: src")?;
        with_matrix!(&self.m, m => {
            let ptr = block_ptr(py, &buf, m, rows, cols)? as usize;
            // SAFETY: see block_ptr; only read, while `buf` holds the view.
            py.detach(|| m.write_block(row0, col0, rows, cols, unsafe { std::slice::from_raw_parts(ptr as *const _, rows * cols) }))
                .map_err(|e| flash_err(py, e))
        })
    }

    /// Reads the whole matrix into `out` (contiguous, same dtype and order, rows*cols elements).
    fn _read_into(&self, py: Python<'_>, out: Bound<'_, PyAny>) -> PyResult<()> {
        let buf = Buf::get(&out, true, "FlashMatrix.to_numpy: out")?;
        let n = buf.len_bytes();
        let bytes: Vec<u8> = with_matrix!(&self.m, m => {
            let v = py.detach(|| m.to_vec()).map_err(|e| flash_err(py, e))?;
            let b = unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, std::mem::size_of_val(&v[..])) };
            b.to_vec()
        });
        if bytes.len() != n {
            return Err(invalid(py, "out has the wrong size"));
        }
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), buf.ptr(), n) };
        Ok(())
    }
}

/// `buf`'s start as `rows x cols` elements of `m`'s element type (checked: dtype and length;
/// Buf::get checked contiguity and alignment).
fn block_ptr<T: scalefree_flash::Real>(py: Python<'_>, buf: &Buf, _m: &FlashMatrix<T>, rows: usize, cols: usize) -> PyResult<*mut T> {
    if buf.itemsize() != std::mem::size_of::<T>() || !matches!(buf.dtype, Some(DType::F32) | Some(DType::F64)) {
        return Err(invalid(py, format!("the buffer's elements are not the matrix's {}", T::NAME)));
    }
    if buf.count() != rows * cols {
        return Err(invalid(py, format!("the buffer has {} elements, the block {rows}x{cols}", buf.count())));
    }
    Ok(buf.ptr() as *mut T)
}

pub(crate) enum AnyCsr {
    F32(FlashCsrMatrix<f32>),
    F64(FlashCsrMatrix<f64>),
}

/// A CSR matrix on flash.
#[pyclass(name = "FlashCsr", module = "scalefree._native")]
pub struct PyFlashCsr {
    pub(crate) m: AnyCsr,
}

#[pymethods]
impl PyFlashCsr {
    /// From CSR arrays: `indptr` (uint64), `indices` (uint32, or uint64 for any column
    /// count), `data` (float32/64). Stored with 64-bit column indices only past 2^32 columns.
    #[staticmethod]
    fn from_arrays(py: Python<'_>, rt: &PyFlashRuntime, rows: usize, cols: usize, indptr: Bound<'_, PyAny>, indices: Bound<'_, PyAny>, data: Bound<'_, PyAny>) -> PyResult<Self> {
        let ip = Buf::get(&indptr, false, "indptr")?;
        let ix = Buf::get(&indices, false, "indices")?;
        let dv = Buf::get(&data, false, "data")?;
        if ip.itemsize() != 8 || (ix.itemsize() != 4 && ix.itemsize() != 8) {
            return Err(invalid(py, "indptr must be uint64 and indices uint32 or uint64"));
        }
        let ip_s = unsafe { std::slice::from_raw_parts(ip.ptr() as *const u64, ip.count()) };
        let (dir, opts) = (rt.rt.dir().to_path_buf(), rt.rt.file_options());
        fn store<T: scalefree_flash::Real, I: ColIndex>(dir: &std::path::Path, opts: &scalefree_flash::FileOptions, rows: usize, cols: usize, ip: &[u64], ix: &Buf, dv: &Buf) -> Result<FlashCsrMatrix<T>, FlashError> {
            let ix_s = unsafe { std::slice::from_raw_parts(ix.ptr() as *const I, ix.count()) };
            let v = unsafe { std::slice::from_raw_parts(dv.ptr() as *const T, dv.count()) };
            FlashCsrMatrix::from_csr(dir, CsrRef::new(rows, cols, ip, ix_s, v)?, opts)
        }
        let wide = ix.itemsize() == 8;
        let m = match (dv.dtype, wide) {
            (Some(DType::F32), false) => AnyCsr::F32(store::<f32, u32>(&dir, &opts, rows, cols, ip_s, &ix, &dv).map_err(|e| flash_err(py, e))?),
            (Some(DType::F32), true) => AnyCsr::F32(store::<f32, u64>(&dir, &opts, rows, cols, ip_s, &ix, &dv).map_err(|e| flash_err(py, e))?),
            (Some(DType::F64), false) => AnyCsr::F64(store::<f64, u32>(&dir, &opts, rows, cols, ip_s, &ix, &dv).map_err(|e| flash_err(py, e))?),
            (Some(DType::F64), true) => AnyCsr::F64(store::<f64, u64>(&dir, &opts, rows, cols, ip_s, &ix, &dv).map_err(|e| flash_err(py, e))?),
            _ => return Err(invalid(py, "CSR data must be float32 or float64")),
        };
        Ok(PyFlashCsr { m })
    }

    /// Reads a Matrix Market coordinate file or a UCI docword file (`kind` "mtx" or
    /// "docword"; plain or gzip) and writes it to flash as CSR of `dtype`. Returns the matrix,
    /// the sorted ids of its rows and of its columns where the file's row or column count
    /// needs more than 32 bits (else None), and the file's (rows, cols).
    #[staticmethod]
    #[allow(clippy::type_complexity)]
    fn from_text_file(py: Python<'_>, rt: &PyFlashRuntime, path: PathBuf, kind: &str, dtype: &str)
        -> PyResult<(Self, Option<Vec<u64>>, Option<Vec<u64>>, (usize, usize))> {
        let (dir, opts) = (rt.rt.dir().to_path_buf(), rt.rt.file_options());
        type Loaded<T> = (FlashCsrMatrix<T>, Option<Vec<u64>>, Option<Vec<u64>>, (usize, usize));
        fn load<T: scalefree_flash::Real>(path: &std::path::Path, kind: &str, dir: &std::path::Path, opts: &scalefree_flash::FileOptions) -> Result<Loaded<T>, FlashError> {
            let t = match kind {
                "mtx" => read_matrix_market(path)?,
                "docword" => read_docword(path)?,
                k => return Err(FlashError::invalid(format!("unknown text matrix kind {k:?} (mtx or docword)"))),
            };
            Ok((FlashCsrMatrix::from_csr(dir, t.matrix.view(), opts)?, t.row_ids, t.col_ids, (t.rows, t.cols)))
        }
        Ok(match dtype {
            "float32" => {
                let (m, r, c, shape) = py.detach(|| load::<f32>(&path, kind, &dir, &opts)).map_err(|e| flash_err(py, e))?;
                (PyFlashCsr { m: AnyCsr::F32(m) }, r, c, shape)
            }
            "float64" => {
                let (m, r, c, shape) = py.detach(|| load::<f64>(&path, kind, &dir, &opts)).map_err(|e| flash_err(py, e))?;
                (PyFlashCsr { m: AnyCsr::F64(m) }, r, c, shape)
            }
            d => return Err(invalid(py, format!("flash CSR matrices hold float32 or float64, not {d}"))),
        })
    }

    /// A docword input to flash as CSR of `dtype`: a UCI docword file streams (bounded
    /// memory); a part directory or `doc word count` triples without the UCI lines (delimiter
    /// detected or `delimiter`, a header line by `header`: auto, yes, no) are read in memory
    /// first. Returns the matrix, the sorted document ids of its rows when the document count
    /// D needs more than 32 bits (else None), likewise the word ids of its columns for the
    /// vocabulary W, and (D, W).
    #[staticmethod]
    #[pyo3(signature = (rt, path, dtype, delimiter=None, header="auto"))]
    #[allow(clippy::type_complexity)]
    fn from_docword_file(py: Python<'_>, rt: &PyFlashRuntime, path: PathBuf, dtype: &str, delimiter: Option<&str>, header: &str)
        -> PyResult<(Self, Option<Vec<u64>>, Option<Vec<u64>>, (usize, usize))> {
        let (dir, opts) = (rt.rt.dir().to_path_buf(), rt.rt.file_options());
        let o = crate::io::read_options(0, delimiter, header).map_err(|e| invalid(py, e.to_string()))?;
        let (delimiter, header) = (o.delimiter, o.header);
        Ok(match dtype {
            "float32" => {
                let d = py.detach(|| docword_input_to_flash::<f32>(&path, &dir, &opts, DOCWORD_CHUNK_ENTRIES, delimiter, header)).map_err(|e| flash_err(py, e))?;
                (PyFlashCsr { m: AnyCsr::F32(d.matrix) }, d.doc_ids, d.word_ids, (d.documents, d.words))
            }
            "float64" => {
                let d = py.detach(|| docword_input_to_flash::<f64>(&path, &dir, &opts, DOCWORD_CHUNK_ENTRIES, delimiter, header)).map_err(|e| flash_err(py, e))?;
                (PyFlashCsr { m: AnyCsr::F64(d.matrix) }, d.doc_ids, d.word_ids, (d.documents, d.words))
            }
            d => return Err(invalid(py, format!("flash CSR matrices hold float32 or float64, not {d}"))),
        })
    }

    /// Reads the whole matrix into `indptr` (uint64, rows+1), `indices` (uint32 or uint64,
    /// nnz; uint64 for a matrix of 64-bit indices, see `index_bytes`) and `data` (dtype, nnz).
    fn _read_into(&self, py: Python<'_>, indptr: Bound<'_, PyAny>, indices: Bound<'_, PyAny>, data: Bound<'_, PyAny>) -> PyResult<()> {
        let ip = Buf::get(&indptr, true, "indptr")?;
        let ix = Buf::get(&indices, true, "indices")?;
        let dv = Buf::get(&data, true, "data")?;
        fn copy<T: Copy>(src: &[T], dst: &Buf) -> bool {
            if std::mem::size_of_val(src) != dst.len_bytes() {
                return false;
            }
            unsafe { std::ptr::copy_nonoverlapping(src.as_ptr() as *const u8, dst.ptr(), dst.len_bytes()) };
            true
        }
        let wide = ix.itemsize() == 8;
        let ok = match &self.m {
            AnyCsr::F32(m) if wide => {
                let c = py.detach(|| m.to_csr_wide()).map_err(|e| flash_err(py, e))?;
                copy(&c.indptr, &ip) && copy(&c.indices, &ix) && copy(&c.values, &dv)
            }
            AnyCsr::F32(m) => {
                let c = py.detach(|| m.to_csr()).map_err(|e| flash_err(py, e))?;
                copy(&c.indptr, &ip) && copy(&c.indices, &ix) && copy(&c.values, &dv)
            }
            AnyCsr::F64(m) if wide => {
                let c = py.detach(|| m.to_csr_wide()).map_err(|e| flash_err(py, e))?;
                copy(&c.indptr, &ip) && copy(&c.indices, &ix) && copy(&c.values, &dv)
            }
            AnyCsr::F64(m) => {
                let c = py.detach(|| m.to_csr()).map_err(|e| flash_err(py, e))?;
                copy(&c.indptr, &ip) && copy(&c.indices, &ix) && copy(&c.values, &dv)
            }
        };
        if !ok {
            return Err(invalid(py, "FlashCsr._read_into: output arrays have the wrong sizes"));
        }
        Ok(())
    }

    /// Reads rows `start .. start + indptr.len() - 1`: `indptr` (uint64, absolute offsets into
    /// the matrix's entries) first, then entries `indptr[0] .. indptr[-1]` into `indices`
    /// (uint32, or uint64: any matrix) and `data` (dtype), whose lengths must be that many entries.
    fn _read_rows(&self, py: Python<'_>, start: u64, indptr: Bound<'_, PyAny>, indices: Bound<'_, PyAny>, data: Bound<'_, PyAny>) -> PyResult<()> {
        let ip = Buf::get(&indptr, true, "indptr")?;
        let ix = Buf::get(&indices, true, "indices")?;
        let dv = Buf::get(&data, true, "data")?;
        if ip.itemsize() != 8 || (ix.itemsize() != 4 && ix.itemsize() != 8) || ip.count() == 0 {
            return Err(invalid(py, "FlashCsr._read_rows: indptr must be a non-empty uint64 array and indices uint32 or uint64"));
        }
        let ip_s = unsafe { std::slice::from_raw_parts_mut(ip.ptr() as *mut u64, ip.count()) };
        let ix_s = if ix.itemsize() == 8 {
            Indices::U64(unsafe { std::slice::from_raw_parts_mut(ix.ptr() as *mut u64, ix.count()) })
        } else {
            Indices::U32(unsafe { std::slice::from_raw_parts_mut(ix.ptr() as *mut u32, ix.count()) })
        };
        let (dv_ptr, dv_bytes) = (dv.ptr() as usize, dv.len_bytes());
        enum Indices<'a> {
            U32(&'a mut [u32]),
            U64(&'a mut [u64]),
        }
        fn go<T: scalefree_flash::Real>(m: &FlashCsrMatrix<T>, start: u64, ip: &mut [u64], ix: Indices<'_>, dv_ptr: usize, dv_bytes: usize) -> Result<(), FlashError> {
            if start + ip.len() as u64 > m.rows() as u64 + 1 {
                return Err(FlashError::invalid(format!("rows {start}..{} of a {}-row matrix", start + ip.len() as u64 - 1, m.rows())));
            }
            m.indptr().read(start, ip)?;
            let (lo, hi) = (ip[0], ip[ip.len() - 1]);
            let n = (hi - lo) as usize;
            let ix_len = match &ix {
                Indices::U32(s) => s.len(),
                Indices::U64(s) => s.len(),
            };
            if ix_len != n || dv_bytes != n * std::mem::size_of::<T>() {
                return Err(FlashError::invalid(format!("FlashCsr._read_rows: the rows hold {n} entries, the output arrays do not")));
            }
            match ix {
                Indices::U32(s) => m.indices().read_u32(lo, s)?,
                Indices::U64(s) => m.indices().read_u64(lo, s)?,
            }
            let v = unsafe { std::slice::from_raw_parts_mut(dv_ptr as *mut T, n) };
            m.values().read(lo, v)
        }
        match &self.m {
            AnyCsr::F32(m) => py.detach(|| go(m, start, ip_s, ix_s, dv_ptr, dv_bytes)),
            AnyCsr::F64(m) => py.detach(|| go(m, start, ip_s, ix_s, dv_ptr, dv_bytes)),
        }
        .map_err(|e| flash_err(py, e))
    }

    /// Entry offsets `indptr[start .. start + out.len()]` (uint64).
    fn _read_indptr(&self, py: Python<'_>, start: u64, out: Bound<'_, PyAny>) -> PyResult<()> {
        let ip = Buf::get(&out, true, "out")?;
        if ip.itemsize() != 8 {
            return Err(invalid(py, "FlashCsr._read_indptr: out must be uint64"));
        }
        let ip_s = unsafe { std::slice::from_raw_parts_mut(ip.ptr() as *mut u64, ip.count()) };
        match &self.m {
            AnyCsr::F32(m) => py.detach(|| m.indptr().read(start, ip_s)),
            AnyCsr::F64(m) => py.detach(|| m.indptr().read(start, ip_s)),
        }
        .map_err(|e| flash_err(py, e))
    }

    #[getter]
    fn shape(&self) -> (usize, usize) {
        match &self.m {
            AnyCsr::F32(m) => (m.rows(), m.cols()),
            AnyCsr::F64(m) => (m.rows(), m.cols()),
        }
    }
    #[getter]
    fn nnz(&self) -> u64 {
        match &self.m {
            AnyCsr::F32(m) => m.nnz(),
            AnyCsr::F64(m) => m.nnz(),
        }
    }
    #[getter]
    fn dtype(&self) -> &'static str {
        match self.m {
            AnyCsr::F32(_) => "float32",
            AnyCsr::F64(_) => "float64",
        }
    }
    /// Bytes per stored column index: 4, or 8 for a matrix of more than 2^32 columns.
    #[getter]
    fn index_bytes(&self) -> u64 {
        match &self.m {
            AnyCsr::F32(m) => m.indices().width_bytes(),
            AnyCsr::F64(m) => m.indices().width_bytes(),
        }
    }
}

fn tr(t: bool) -> Transpose {
    if t { Transpose::Yes } else { Transpose::No }
}

/// `C := alpha op(A) op(B) + beta C`, all three on flash. Returns run statistics.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
pub fn flash_gemm<'py>(py: Python<'py>, rt: &PyFlashRuntime, trans_a: bool, trans_b: bool, alpha: f64, a: &PyFlashMatrix, b: &PyFlashMatrix, beta: f64, c: &PyFlashMatrix) -> PyResult<Bound<'py, PyDict>> {
    let rt = rt.rt.clone();
    let stats = match (&a.m, &b.m, &c.m) {
        (AnyMatrix::F32(a), AnyMatrix::F32(b), AnyMatrix::F32(c)) => {
            py.detach(|| rt.gemm(tr(trans_a), tr(trans_b), alpha as f32, a, b, beta as f32, c))
        }
        (AnyMatrix::F64(a), AnyMatrix::F64(b), AnyMatrix::F64(c)) => {
            py.detach(|| rt.gemm(tr(trans_a), tr(trans_b), alpha, a, b, beta, c))
        }
        _ => return Err(invalid(py, "gemm: A, B and C must have the same dtype")),
    }
    .map_err(|e| flash_err(py, e))?;
    stats_dict(py, &stats)
}

/// `y := op(A) x` with CSR A on flash; `x` and `y` are contiguous arrays of A's dtype.
#[pyfunction]
pub fn flash_csrgemv<'py>(py: Python<'py>, rt: &PyFlashRuntime, transpose: bool, a: &PyFlashCsr, x: Bound<'py, PyAny>, y: Bound<'py, PyAny>) -> PyResult<Bound<'py, PyDict>> {
    let xb = Buf::get(&x, false, "csrgemv: x")?;
    let yb = Buf::get(&y, true, "csrgemv: y")?;
    let rt = rt.rt.clone();
    let stats = match (&a.m, xb.dtype, yb.dtype) {
        (AnyCsr::F32(m), Some(DType::F32), Some(DType::F32)) => {
            let xs = unsafe { std::slice::from_raw_parts(xb.ptr() as *const f32, xb.count()) };
            let ys = unsafe { std::slice::from_raw_parts_mut(yb.ptr() as *mut f32, yb.count()) };
            py.detach(|| rt.csrgemv(tr(transpose), m, xs, ys))
        }
        (AnyCsr::F64(m), Some(DType::F64), Some(DType::F64)) => {
            let xs = unsafe { std::slice::from_raw_parts(xb.ptr() as *const f64, xb.count()) };
            let ys = unsafe { std::slice::from_raw_parts_mut(yb.ptr() as *mut f64, yb.count()) };
            py.detach(|| rt.csrgemv(tr(transpose), m, xs, ys))
        }
        _ => return Err(invalid(py, "csrgemv: x and y must have the matrix's dtype")),
    }
    .map_err(|e| flash_err(py, e))?;
    stats_dict(py, &stats)
}

/// `Z := Aᵀ X` (`gram == false`) or `Z := Aᵀ A X` with CSR A on flash; X and Z are
/// C-contiguous arrays of A's dtype with `n` columns.
#[pyfunction]
pub fn flash_csrtmm<'py>(py: Python<'py>, rt: &PyFlashRuntime, gram: bool, a: &PyFlashCsr, x: Bound<'py, PyAny>, n: usize, z: Bound<'py, PyAny>) -> PyResult<Bound<'py, PyDict>> {
    let xb = Buf::get(&x, false, "csrtmm: X")?;
    let zb = Buf::get(&z, true, "csrtmm: Z")?;
    let rt = rt.rt.clone();
    let product = if gram { TransposedProduct::Gram } else { TransposedProduct::Transpose };
    let stats = match (&a.m, xb.dtype, zb.dtype) {
        (AnyCsr::F32(m), Some(DType::F32), Some(DType::F32)) => {
            let xs = unsafe { std::slice::from_raw_parts(xb.ptr() as *const f32, xb.count()) };
            let zs = unsafe { std::slice::from_raw_parts_mut(zb.ptr() as *mut f32, zb.count()) };
            py.detach(|| rt.csrtmm(product, m, xs, n, zs))
        }
        (AnyCsr::F64(m), Some(DType::F64), Some(DType::F64)) => {
            let xs = unsafe { std::slice::from_raw_parts(xb.ptr() as *const f64, xb.count()) };
            let zs = unsafe { std::slice::from_raw_parts_mut(zb.ptr() as *mut f64, zb.count()) };
            py.detach(|| rt.csrtmm(product, m, xs, n, zs))
        }
        _ => return Err(invalid(py, "csrtmm: X and Z must have the matrix's dtype")),
    }
    .map_err(|e| flash_err(py, e))?;
    stats_dict(py, &stats)
}

/// For a CSR matrix A in memory (`indptr` int64, `indices` int32, `values` float32/float64;
/// checked), on the runtime's compute threads: `product` is `"gram"` (`Z := Aᵀ A X`),
/// `"transpose"` (`Z := Aᵀ X`) or `"times"` (`Z := A X`). X and Z: C-contiguous arrays of A's
/// dtype with `n` columns.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
pub fn memory_csr_product<'py>(py: Python<'py>, rt: &PyFlashRuntime, product: &str, rows: usize, cols: usize, indptr: Bound<'py, PyAny>, indices: Bound<'py, PyAny>, values: Bound<'py, PyAny>, x: Bound<'py, PyAny>, n: usize, z: Bound<'py, PyAny>) -> PyResult<()> {
    let pb = Buf::get(&indptr, false, "csr product: indptr")?;
    let ib = Buf::get(&indices, false, "csr product: indices")?;
    let vb = Buf::get(&values, false, "csr product: values")?;
    let xb = Buf::get(&x, false, "csr product: X")?;
    let zb = Buf::get(&z, true, "csr product: Z")?;
    if pb.dtype != Some(DType::I64) || ib.dtype != Some(DType::I32) {
        return Err(invalid(py, "csr product: indptr must be int64 and indices int32"));
    }
    // SAFETY: the buffers are held (and typed as checked) for the whole call; a negative
    // int64/int32 reads as a huge u64/u32, which `validate` rejects.
    let ip = unsafe { std::slice::from_raw_parts(pb.ptr() as *const u64, pb.count()) };
    let ix = unsafe { std::slice::from_raw_parts(ib.ptr() as *const u32, ib.count()) };
    let rt = rt.rt.clone();
    let product = match product {
        "gram" => Some(TransposedProduct::Gram),
        "transpose" => Some(TransposedProduct::Transpose),
        "times" => None,
        other => return Err(invalid(py, format!("csr product: unknown product {other:?} (gram, transpose, times)"))),
    };
    macro_rules! run {
        ($t:ty) => {{
            let vs = unsafe { std::slice::from_raw_parts(vb.ptr() as *const $t, vb.count()) };
            let xs = unsafe { std::slice::from_raw_parts(xb.ptr() as *const $t, xb.count()) };
            let zs = unsafe { std::slice::from_raw_parts_mut(zb.ptr() as *mut $t, zb.count()) };
            let a = CsrRef { rows, cols, indptr: ip, indices: ix, values: vs };
            py.detach(|| {
                rt.install(|| match product {
                    Some(p) => csr_gram_in_memory(p, a, xs, n, zs),
                    None => {
                        let b = DenseRef::packed(xs, cols, n, Layout::RowMajor)?;
                        let c = DenseMut::packed(zs, rows, n, Layout::RowMajor)?;
                        csrmm_in_memory(1.0, a, Transpose::No, b, 0.0, c)
                    }
                })
            })
        }};
    }
    match (vb.dtype, xb.dtype, zb.dtype) {
        (Some(DType::F32), Some(DType::F32), Some(DType::F32)) => run!(f32),
        (Some(DType::F64), Some(DType::F64), Some(DType::F64)) => run!(f64),
        _ => return Err(invalid(py, "csr product: values, X and Z must all be float32 or all float64")),
    }
    .map_err(|e| flash_err(py, e))
}

/// A dense operand of csrmm from Python: a flash matrix or a contiguous array (`order`).
fn dense_operand<'py>(obj: &Bound<'py, PyAny>, writable: bool, what: &str) -> PyResult<Result<PyRef<'py, PyFlashMatrix>, Buf>> {
    if let Ok(m) = obj.extract::<PyRef<'py, PyFlashMatrix>>() {
        return Ok(Ok(m));
    }
    Ok(Err(Buf::get(obj, writable, what)?))
}

/// `C := alpha A op(B) + beta C` with CSR A on flash; B and C are each a flash matrix or a
/// contiguous array of shape `b_shape` / `c_shape` and `order`.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
pub fn flash_csrmm<'py>(py: Python<'py>, rt: &PyFlashRuntime, alpha: f64, a: &PyFlashCsr, trans_b: bool, b: Bound<'py, PyAny>, b_shape: (usize, usize, String), beta: f64, c: Bound<'py, PyAny>, c_shape: (usize, usize, String)) -> PyResult<Bound<'py, PyDict>> {
    let bo = dense_operand(&b, false, "csrmm: B")?;
    let co = dense_operand(&c, true, "csrmm: C")?;
    let b_layout = layout_of(py, &b_shape.2)?;
    let c_layout = layout_of(py, &c_shape.2)?;
    let rt = rt.rt.clone();
    macro_rules! run {
        ($t:ty, $m:expr, $var:ident) => {{
            let b_in = match &bo {
                Ok(fm) => match &fm.m {
                    AnyMatrix::$var(x) => DenseInput::Flash(x),
                    _ => return Err(invalid(py, "csrmm: B must have A's dtype")),
                },
                Err(buf) => {
                    if buf.dtype != Some(<$t as DTypeOf>::DTYPE) || buf.count() != b_shape.0 * b_shape.1 {
                        return Err(invalid(py, "csrmm: B must be a contiguous array of A's dtype and the given shape"));
                    }
                    let s = unsafe { std::slice::from_raw_parts(buf.ptr() as *const $t, buf.count()) };
                    DenseInput::Memory(DenseRef::packed(s, b_shape.0, b_shape.1, b_layout).map_err(|e| flash_err(py, e))?)
                }
            };
            let c_out = match &co {
                Ok(fm) => match &fm.m {
                    AnyMatrix::$var(x) => DenseOutput::Flash(x),
                    _ => return Err(invalid(py, "csrmm: C must have A's dtype")),
                },
                Err(buf) => {
                    if buf.dtype != Some(<$t as DTypeOf>::DTYPE) || buf.count() != c_shape.0 * c_shape.1 {
                        return Err(invalid(py, "csrmm: C must be a contiguous array of A's dtype and the given shape"));
                    }
                    let s = unsafe { std::slice::from_raw_parts_mut(buf.ptr() as *mut $t, buf.count()) };
                    DenseOutput::Memory(DenseMut::packed(s, c_shape.0, c_shape.1, c_layout).map_err(|e| flash_err(py, e))?)
                }
            };
            py.detach(|| rt.csrmm(alpha as $t, $m, tr(trans_b), b_in, beta as $t, c_out))
        }};
    }
    let stats = match &a.m {
        AnyCsr::F32(m) => run!(f32, m, F32),
        AnyCsr::F64(m) => run!(f64, m, F64),
    }
    .map_err(|e| flash_err(py, e))?;
    stats_dict(py, &stats)
}

trait DTypeOf {
    const DTYPE: DType;
}
impl DTypeOf for f32 {
    const DTYPE: DType = DType::F32;
}
impl DTypeOf for f64 {
    const DTYPE: DType = DType::F64;
}

/// Sorts `len` elements of `dtype` at byte `offset` of the file at `path`, in place on flash
/// (IEEE total order). Returns run statistics.
#[pyfunction]
pub fn flash_sort_file<'py>(py: Python<'py>, rt: &PyFlashRuntime, path: PathBuf, offset: u64, len: u64, dtype: &str) -> PyResult<Bound<'py, PyDict>> {
    let rt = rt.rt.clone();
    let opts = rt.file_options();
    let stats = py
        .detach(|| {
            let file = FlashFile::open(&path, OpenMode::ReadWrite, &opts)?;
            let stats = match dtype {
                "float32" => rt.sort(&FlashPtr::<f32>::from_file(file.clone(), offset, len)?),
                "float64" => rt.sort(&FlashPtr::<f64>::from_file(file.clone(), offset, len)?),
                d => Err(FlashError::invalid(format!("sort: float32 or float64 arrays, not {d}"))),
            }?;
            file.sync()?;
            Ok(stats)
        })
        .map_err(|e| flash_err(py, e))?;
    stats_dict(py, &stats)
}

/// Sorts a contiguous float32/float64 array through flash (copied to a scratch file, sorted
/// there under the budget, read back).
#[pyfunction]
pub fn flash_sort_array<'py>(py: Python<'py>, rt: &PyFlashRuntime, x: Bound<'py, PyAny>) -> PyResult<Bound<'py, PyDict>> {
    let buf = Buf::get(&x, true, "sort: the array")?;
    let rt = rt.rt.clone();
    fn go<T: scalefree_flash::Real>(rt: &Runtime, data: &mut [T]) -> Result<RunStats, FlashError> {
        let p = FlashPtr::from_slice(rt.dir(), data, &rt.file_options())?;
        let stats = rt.sort(&p)?;
        p.read(0, data)?;
        Ok(stats)
    }
    let stats = match buf.dtype {
        Some(DType::F32) => {
            let s = unsafe { std::slice::from_raw_parts_mut(buf.ptr() as *mut f32, buf.count()) };
            py.detach(|| go(&rt, s))
        }
        Some(DType::F64) => {
            let s = unsafe { std::slice::from_raw_parts_mut(buf.ptr() as *mut f64, buf.count()) };
            py.detach(|| go(&rt, s))
        }
        _ => return Err(invalid(py, "sort: float32 or float64 arrays")),
    }
    .map_err(|e| flash_err(py, e))?;
    stats_dict(py, &stats)
}

/// `Aᵀ` (A's CSC form) as a new CSR matrix on flash, and run statistics.
#[pyfunction]
pub fn flash_csrcsc<'py>(py: Python<'py>, rt: &PyFlashRuntime, a: &PyFlashCsr) -> PyResult<(PyFlashCsr, Bound<'py, PyDict>)> {
    let rt = rt.rt.clone();
    let (m, stats) = match &a.m {
        AnyCsr::F32(m) => py.detach(|| rt.csrcsc(m)).map(|(t, s)| (AnyCsr::F32(t), s)),
        AnyCsr::F64(m) => py.detach(|| rt.csrcsc(m)).map(|(t, s)| (AnyCsr::F64(t), s)),
    }
    .map_err(|e| flash_err(py, e))?;
    Ok((PyFlashCsr { m }, stats_dict(py, &stats)?))
}

/// centers bytes, labels bytes, inertia, iterations, stats.
type KmeansOut<'py> = (Vec<u8>, Vec<u8>, f64, usize, Bound<'py, PyDict>);

/// Lloyd's k-means on the rows of a flash matrix: (centers as bytes, labels as bytes,
/// inertia, iterations, stats). Python wraps the bytes as arrays.
#[pyfunction]
pub fn flash_kmeans<'py>(py: Python<'py>, rt: &PyFlashRuntime, x: &PyFlashMatrix, k: usize, max_iterations: usize, tolerance: f64, seed: u64) -> PyResult<KmeansOut<'py>> {
    let rt = rt.rt.clone();
    let options = scalefree_flash::KmeansOptions { k, max_iterations, tolerance, seed };
    fn bytes<T: Copy>(v: &[T]) -> Vec<u8> {
        unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, std::mem::size_of_val(v)) }.to_vec()
    }
    let (centers, labels, inertia, iterations, stats) = match &x.m {
        AnyMatrix::F32(m) => py.detach(|| rt.kmeans(m, options)).map(|r| (bytes(&r.centers), bytes(&r.labels), r.inertia, r.iterations, r.stats)),
        AnyMatrix::F64(m) => py.detach(|| rt.kmeans(m, options)).map(|r| (bytes(&r.centers), bytes(&r.labels), r.inertia, r.iterations, r.stats)),
    }
    .map_err(|e| flash_err(py, e))?;
    Ok((centers, labels, inertia, iterations, stats_dict(py, &stats)?))
}
