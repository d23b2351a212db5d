//! `scalefree._native.TextStream`: a text file (edges, ratings, svmlight rows) in one gzip
//! stream that one rank decompresses and hands out in chunks while the others parse them
//! (`scalefree_io::TextStream`). Every rank opens it (reading the prologue); the reader calls
//! `read_chunks`, the receivers `parse`; `take` returns what was parsed so far as numpy
//! arrays.

use std::path::PathBuf;

use pyo3::prelude::*;
use scalefree_io::gz::BodyChunks;
use scalefree_io::{EdgeOptions, Parsed, StreamKind, DEFAULT_GZIP_CHUNK_BYTES};

use crate::buffer::Buf;
use crate::io::{array, io_err, read_options, Owned};

#[pyclass(name = "TextStream", module = "scalefree._native")]
pub struct PyTextStream {
    stream: scalefree_io::TextStream,
    chunks: Option<BodyChunks>,
    chunk_bytes: usize,
}

#[pymethods]
impl PyTextStream {
    /// `kind`: "edges", "ratings" or "svmlight" (indices at most `max_index`).
    #[new]
    #[pyo3(signature = (path, kind="edges", delimiter=None, header="auto", chunk_bytes=DEFAULT_GZIP_CHUNK_BYTES, max_index=u64::MAX))]
    fn new(py: Python<'_>, path: PathBuf, kind: &str, delimiter: Option<&str>, header: &str, chunk_bytes: usize, max_index: u64) -> PyResult<Self> {
        let kind = match kind {
            "edges" => StreamKind::Edges(EdgeOptions::default()),
            "ratings" => StreamKind::Ratings,
            "svmlight" => StreamKind::Svmlight { max_index },
            other => return Err(crate::errors::invalid(py, format!("kind must be 'edges', 'ratings' or 'svmlight', got {other:?}"))),
        };
        let stream = py
            .detach(|| {
                let o = read_options(chunk_bytes, delimiter, header)?;
                scalefree_io::TextStream::open(&path, kind, &o)
            })
            .map_err(|e| io_err(py, e))?;
        Ok(PyTextStream { stream, chunks: None, chunk_bytes })
    }

    /// Whether the file is one gzip stream that cannot be split by members.
    fn is_single_stream(&self) -> bool {
        self.stream.is_single_stream()
    }

    /// Up to `n` next chunks of the body: `(lines_before uint64[k], lengths int64[k], bytes
    /// uint8)`, the chunks concatenated; k < n only at the end of the data (k = 0: done).
    fn read_chunks<'py>(&mut self, py: Python<'py>, n: usize) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyAny>, Bound<'py, PyAny>)> {
        if self.chunks.is_none() {
            let c = py.detach(|| self.stream.chunks(self.chunk_bytes)).map_err(|e| io_err(py, e))?;
            self.chunks = Some(c);
        }
        let chunks = self.chunks.as_mut().expect("set above");
        let (lines, lens, bytes) = py
            .detach(|| {
                let (mut lines, mut lens, mut bytes) = (Vec::new(), Vec::new(), Vec::new());
                for _ in 0..n {
                    match chunks.next_chunk()? {
                        None => break,
                        Some((before, c)) => {
                            lines.push(before);
                            lens.push(c.len() as i64);
                            bytes.extend_from_slice(c);
                        }
                    }
                }
                Ok((lines, lens, bytes))
            })
            .map_err(|e| io_err(py, e))?;
        Ok((array(py, Owned::U64(lines))?, array(py, Owned::I64(lens))?, array(py, Owned::U8(bytes))?))
    }

    /// Parses a chunk of whole body lines (a uint8 array); `lines_before`: the lines of the
    /// file before it.
    fn parse(&mut self, py: Python<'_>, chunk: Bound<'_, PyAny>, lines_before: u64) -> PyResult<()> {
        let buf = Buf::get(&chunk, false, "chunk")?;
        // SAFETY: the view is held (and the exporter cannot resize) until `buf` drops.
        let bytes = unsafe { std::slice::from_raw_parts(buf.ptr() as *const u8, buf.len_bytes()) };
        let stream = &mut self.stream;
        py.detach(|| stream.parse(bytes, lines_before)).map_err(|e| io_err(py, e))
    }

    /// What was parsed so far (the stream keeps none): edges `(src, dst)` int64; ratings
    /// `(user, item)` int64 and `rating` float32; svmlight `(labels float64, indptr int64,
    /// indices int64, values float64)`.
    fn take<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, pyo3::types::PyTuple>> {
        let out = match self.stream.take() {
            Parsed::Edges(e) => vec![array(py, Owned::I64(e.src))?, array(py, Owned::I64(e.dst))?],
            Parsed::Ratings(r) => vec![array(py, Owned::I64(r.users))?, array(py, Owned::I64(r.items))?, array(py, Owned::F32(r.ratings))?],
            Parsed::Svmlight(s) => vec![array(py, Owned::F64(s.labels))?, array(py, Owned::I64(s.indptr))?, array(py, Owned::I64(s.indices))?, array(py, Owned::F64(s.values))?],
        };
        pyo3::types::PyTuple::new(py, out)
    }
}
