//! `scalefree._native.read_edges_share`, `read_svmlight_share`, `read_ratings_share`: thin
//! wrappers over `scalefree-io` (rank `rank` of `size` reads and parses only its share of a
//! file). The arrays are numpy views of the vectors the reader filled (no copy), read with
//! the GIL released. Bad data raises `scalefree.errors.DataError` (a `ValueError`) with a
//! one-line `PATH:LINE: problem`; a missing file `FileNotFoundError`; bad arguments
//! `InvalidArgumentError`.

use std::ffi::c_int;
use std::path::PathBuf;

use pyo3::exceptions::{PyFileNotFoundError, PyOSError};
use pyo3::ffi;
use pyo3::prelude::*;
use scalefree_io::{Delimiter, EdgeOptions, Header, Part, ReadError, ReadOptions, DEFAULT_GZIP_CHUNK_BYTES};

use crate::errors::raise;

pub(crate) fn io_err(py: Python<'_>, e: ReadError) -> PyErr {
    match e {
        ReadError::Io { path, source } => {
            let Some(code) = source.raw_os_error() else { return PyOSError::new_err(format!("{}: {source}", path.display())) };
            let text = source.to_string();
            let strerror = text.split(" (os error").next().unwrap_or(&text).to_string();
            let args = (code, strerror, path.display().to_string());
            if source.kind() == std::io::ErrorKind::NotFound {
                PyFileNotFoundError::new_err(args)
            } else {
                PyOSError::new_err(args)
            }
        }
        ReadError::InvalidArgument(_) => raise(py, "InvalidArgumentError", e.to_string()),
        ReadError::Parse { .. } | ReadError::Format { .. } => raise(py, "DataError", e.to_string()),
    }
}

/// A vector a reader (or a graph kernel) filled, handed to numpy through the buffer protocol.
#[pyclass(name = "ShareArray", module = "scalefree._native")]
pub struct PyShareArray {
    bytes: Owned,
}

pub(crate) enum Owned {
    I64(Vec<i64>),
    U64(Vec<u64>),
    U32(Vec<u32>),
    F64(Vec<f64>),
    F32(Vec<f32>),
    U8(Vec<u8>),
}

impl Owned {
    fn ptr_len(&self) -> (*mut u8, usize) {
        match self {
            Owned::I64(v) => (v.as_ptr() as *mut u8, std::mem::size_of_val(v.as_slice())),
            Owned::U64(v) => (v.as_ptr() as *mut u8, std::mem::size_of_val(v.as_slice())),
            Owned::U32(v) => (v.as_ptr() as *mut u8, std::mem::size_of_val(v.as_slice())),
            Owned::F64(v) => (v.as_ptr() as *mut u8, std::mem::size_of_val(v.as_slice())),
            Owned::F32(v) => (v.as_ptr() as *mut u8, std::mem::size_of_val(v.as_slice())),
            Owned::U8(v) => (v.as_ptr() as *mut u8, v.len()),
        }
    }
    fn dtype(&self) -> &'static str {
        match self {
            Owned::I64(_) => "int64",
            Owned::U64(_) => "uint64",
            Owned::U32(_) => "uint32",
            Owned::F64(_) => "float64",
            Owned::F32(_) => "float32",
            Owned::U8(_) => "uint8",
        }
    }
}

#[pymethods]
impl PyShareArray {
    unsafe fn __getbuffer__(slf: Bound<'_, Self>, view: *mut ffi::Py_buffer, flags: c_int) -> PyResult<()> {
        let (ptr, len) = slf.borrow().bytes.ptr_len();
        // SAFETY: the vector lives as long as this object, which the view keeps alive, and
        // is never resized.
        unsafe { crate::buffer::export(slf.as_any(), view, ptr, len, flags) }
    }

    unsafe fn __releasebuffer__(&self, _view: *mut ffi::Py_buffer) {}
}

/// A numpy array viewing `v` (no copy).
pub(crate) fn array(py: Python<'_>, v: Owned) -> PyResult<Bound<'_, PyAny>> {
    let dtype = v.dtype();
    let owner = Bound::new(py, PyShareArray { bytes: v })?;
    py.import("numpy")?.call_method1("frombuffer", (owner, dtype))
}

type Arr<'py> = Bound<'py, PyAny>;

/// A reader's input: one path (a file or a part directory) or a list of part files.
#[derive(FromPyObject)]
pub enum Paths {
    One(PathBuf),
    Many(Vec<PathBuf>),
}

impl Paths {
    fn resolve(self) -> scalefree_io::Result<Vec<PathBuf>> {
        match self {
            Paths::One(p) => scalefree_io::resolve_parts(&p),
            Paths::Many(v) => Ok(v),
        }
    }
}

/// The options of every reader; `delimiter`: a name of [`Delimiter::from_name`] or None
/// (detected); `header`: `auto`, `yes`, `no`.
pub(crate) fn read_options(gzip_chunk_bytes: usize, delimiter: Option<&str>, header: &str) -> scalefree_io::Result<ReadOptions> {
    let delimiter = match delimiter {
        None => None,
        Some(name) => Some(Delimiter::from_name(name).ok_or_else(|| ReadError::InvalidArgument(format!("unknown delimiter {name:?} (tab, space, comma, semicolon)")))?),
    };
    let header = Header::from_name(header).ok_or_else(|| ReadError::InvalidArgument(format!("unknown header rule {header:?} (auto, yes, no)")))?;
    Ok(ReadOptions { gzip_chunk_bytes, delimiter, header })
}

/// `(src, dst)`, int64, in file order: rank `rank` of `size`'s share of an edge list.
#[pyfunction]
#[pyo3(signature = (path, rank, size, offset=0, min_fields=2, max_fields=2, gzip_chunk_bytes=DEFAULT_GZIP_CHUNK_BYTES, delimiter=None, header="auto"))]
#[allow(clippy::too_many_arguments)]
pub fn read_edges_share<'py>(py: Python<'py>, path: Paths, rank: usize, size: usize, offset: u64, min_fields: usize, max_fields: usize, gzip_chunk_bytes: usize, delimiter: Option<&str>, header: &str) -> PyResult<(Arr<'py>, Arr<'py>)> {
    let eo = EdgeOptions { min_fields, max_fields };
    let e = py
        .detach(|| {
            let o = read_options(gzip_chunk_bytes, delimiter, header)?;
            let part = Part::new(rank, size, offset)?;
            scalefree_io::read_edges_parts(&path.resolve()?, part, &eo, &o)
        })
        .map_err(|e| io_err(py, e))?;
    Ok((array(py, Owned::I64(e.src))?, array(py, Owned::I64(e.dst))?))
}

/// uint64 packed keys (`src << 32 | dst`), in file order: rank `rank` of `size`'s share as
/// `read_edges_share` reads it (text) or `read_columnar_share` (Parquet, Arrow IPC: `columns`,
/// `max_id`), half the memory; None when an id is 2^32 or larger (read the share as columns).
#[pyfunction]
#[pyo3(signature = (path, rank, size, gzip_chunk_bytes=DEFAULT_GZIP_CHUNK_BYTES, delimiter=None, header="auto", columnar=false, columns=None, max_id=i64::MAX as u64))]
#[allow(clippy::too_many_arguments)]
pub fn read_edge_keys_share<'py>(py: Python<'py>, path: Paths, rank: usize, size: usize, gzip_chunk_bytes: usize, delimiter: Option<&str>, header: &str, columnar: bool, columns: Option<Vec<String>>, max_id: u64) -> PyResult<Option<Arr<'py>>> {
    let k = py
        .detach(|| {
            let paths = path.resolve()?;
            if columnar {
                let columns = columns.map_or(scalefree_columnar::Columns::Default, scalefree_columnar::Columns::Named);
                return scalefree_columnar::read_edge_keys(&paths, rank, size, &columns, &scalefree_columnar::Limits { max_id });
            }
            let o = read_options(gzip_chunk_bytes, delimiter, header)?;
            scalefree_io::read_edge_keys_parts(&paths, Part::new(rank, size, 0)?, &EdgeOptions::default(), &o)
        })
        .map_err(|e| io_err(py, e))?;
    if k.wide {
        return Ok(None);
    }
    Ok(Some(array(py, Owned::U64(k.keys))?))
}

/// `(labels float64, indptr int64 (rows + 1, from 0), indices int64 as written, values
/// float64)`: rank `rank` of `size`'s share of an svmlight file; indices above `max_index`
/// are an error.
#[pyfunction]
#[pyo3(signature = (path, rank, size, max_index, offset=0, gzip_chunk_bytes=DEFAULT_GZIP_CHUNK_BYTES, header="auto"))]
#[allow(clippy::too_many_arguments)]
pub fn read_svmlight_share<'py>(py: Python<'py>, path: Paths, rank: usize, size: usize, max_index: u64, offset: u64, gzip_chunk_bytes: usize, header: &str) -> PyResult<(Arr<'py>, Arr<'py>, Arr<'py>, Arr<'py>)> {
    let s = py
        .detach(|| {
            let o = read_options(gzip_chunk_bytes, None, header)?;
            let part = Part::new(rank, size, offset)?;
            scalefree_io::read_svmlight_parts(&path.resolve()?, part, max_index, &o)
        })
        .map_err(|e| io_err(py, e))?;
    Ok((array(py, Owned::F64(s.labels))?, array(py, Owned::I64(s.indptr))?, array(py, Owned::I64(s.indices))?, array(py, Owned::F64(s.values))?))
}

/// `(user int64, item int64, rating float32)` with the ids as written: rank `rank` of
/// `size`'s share of a rating file (the formats of `scalefree.mf`).
#[pyfunction]
#[pyo3(signature = (path, rank, size, offset=0, gzip_chunk_bytes=DEFAULT_GZIP_CHUNK_BYTES, delimiter=None, header="auto"))]
#[allow(clippy::too_many_arguments)]
pub fn read_ratings_share<'py>(py: Python<'py>, path: Paths, rank: usize, size: usize, offset: u64, gzip_chunk_bytes: usize, delimiter: Option<&str>, header: &str) -> PyResult<(Arr<'py>, Arr<'py>, Arr<'py>)> {
    let r = py
        .detach(|| {
            let o = read_options(gzip_chunk_bytes, delimiter, header)?;
            let part = Part::new(rank, size, offset)?;
            scalefree_io::read_ratings_parts(&path.resolve()?, part, &o)
        })
        .map_err(|e| io_err(py, e))?;
    Ok((array(py, Owned::I64(r.users))?, array(py, Owned::I64(r.items))?, array(py, Owned::F32(r.ratings))?))
}

/// The data files of `path` (`scalefree_io::resolve_parts`): `[path]` for a file, the part
/// files of a directory sorted by name with markers (`_SUCCESS`, `.crc`, hidden) skipped.
#[pyfunction]
pub fn resolve_parts(py: Python<'_>, path: PathBuf) -> PyResult<Vec<String>> {
    let parts = scalefree_io::resolve_parts(&path).map_err(|e| io_err(py, e))?;
    Ok(parts.into_iter().map(|p| p.to_string_lossy().into_owned()).collect())
}

/// `"parquet"`, `"arrow"` or None: the columnar format of `path` by its magic bytes.
#[pyfunction]
pub fn columnar_format(py: Python<'_>, path: PathBuf) -> PyResult<Option<&'static str>> {
    let f = scalefree_columnar::sniff(&path).map_err(|e| io_err(py, e))?;
    Ok(f.map(|f| match f {
        scalefree_columnar::Format::Parquet => "parquet",
        scalefree_columnar::Format::ArrowIpc => "arrow",
    }))
}

/// Rank `rank` of `size`'s share of the rows of Parquet or Arrow IPC files (one file, or the
/// parts of a directory in order), by row groups / record batches: `table="edges"` gives
/// `(src, dst)` int64, `"ratings"` `(user, item)` int64 and `rating` float32. `columns`:
/// names, or None for the first integer columns (and numeric one for ratings); ids above
/// `max_id` are an error.
#[pyfunction]
#[pyo3(signature = (paths, rank, size, table, columns=None, max_id=i64::MAX as u64))]
pub fn read_columnar_share<'py>(py: Python<'py>, paths: Vec<PathBuf>, rank: usize, size: usize, table: &str, columns: Option<Vec<String>>, max_id: u64) -> PyResult<Bound<'py, pyo3::types::PyTuple>> {
    use scalefree_columnar::{Columns, Limits, Table};
    let table = match table {
        "edges" => Table::Edges,
        "ratings" => Table::Ratings,
        other => return Err(raise(py, "InvalidArgumentError", format!("table must be 'edges' or 'ratings', got {other:?}"))),
    };
    let columns = columns.map_or(Columns::Default, Columns::Named);
    let limits = Limits { max_id };
    let s = py.detach(|| scalefree_columnar::read_share(&paths, rank, size, table, &columns, &limits)).map_err(|e| io_err(py, e))?;
    let [a, b] = s.ids;
    let mut out = vec![array(py, Owned::I64(a))?, array(py, Owned::I64(b))?];
    if table == Table::Ratings {
        out.push(array(py, Owned::F32(s.values))?);
    }
    pyo3::types::PyTuple::new(py, out)
}
