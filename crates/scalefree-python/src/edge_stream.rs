//! `scalefree._native.EdgeStream`: an edge list in one gzip stream that one rank decompresses
//! and hands out in chunks while the others parse them (`scalefree_io::EdgeStream`). Every
//! rank opens it (reading the prologue); the reader calls `read_chunks`, the receivers
//! `parse`; `take` returns the edges parsed so far as numpy arrays.

use std::path::PathBuf;

use pyo3::prelude::*;
use scalefree_io::gz::BodyChunks;
use scalefree_io::{EdgeOptions, DEFAULT_GZIP_CHUNK_BYTES};

use crate::buffer::Buf;
use crate::io::{array, io_err, read_options, Owned};

#[pyclass(name = "EdgeStream", module = "scalefree._native")]
pub struct PyEdgeStream {
    stream: scalefree_io::EdgeStream,
    chunks: Option<BodyChunks>,
    chunk_bytes: usize,
}

#[pymethods]
impl PyEdgeStream {
    #[new]
    #[pyo3(signature = (path, delimiter=None, header="auto", chunk_bytes=DEFAULT_GZIP_CHUNK_BYTES))]
    fn new(py: Python<'_>, path: PathBuf, delimiter: Option<&str>, header: &str, chunk_bytes: usize) -> PyResult<Self> {
        let stream = py
            .detach(|| {
                let o = read_options(chunk_bytes, delimiter, header)?;
                scalefree_io::EdgeStream::open(&path, &EdgeOptions::default(), &o)
            })
            .map_err(|e| io_err(py, e))?;
        Ok(PyEdgeStream { stream, chunks: None, chunk_bytes })
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

    /// `(src, dst)` int64: the edges parsed so far (the stream keeps none).
    fn take<'py>(&mut self, py: Python<'py>) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyAny>)> {
        let e = self.stream.take_edges();
        Ok((array(py, Owned::I64(e.src))?, array(py, Owned::I64(e.dst))?))
    }
}
