//! `scalefree._native.PageRankCsr`: one rank's local PageRank matrix in compact ids (thin:
//! the kernels are in `scalefree-collectives/src/sparse/pagerank.rs`, the algorithm in
//! `python/scalefree/graph/pagerank.py`).

use pyo3::prelude::*;
use scalefree_collectives::sparse::pagerank::{csr_pattern, owned_update, spmv_step, Real};

use crate::buffer::Buf;
use crate::errors::invalid;

fn u32s<'a>(py: Python<'_>, b: &'a Buf, what: &str) -> PyResult<&'a [u32]> {
    let f = b.format.trim_start_matches(['@', '=', '<']);
    if b.len_bytes() > 0 && (b.itemsize() != 4 || !matches!(f, "I" | "L")) {
        return Err(invalid(py, format!("{what} must be uint32, got buffer format {:?}", b.format)));
    }
    Ok(if b.len_bytes() == 0 { &[] } else { unsafe { std::slice::from_raw_parts(b.ptr() as *const u32, b.count()) } })
}

/// Float view of a buffer: 4 → f32, 8 → f64 (checked by format). Mutable through a shared
/// `Buf`: the buffer protocol hands out the memory, not Rust ownership; `y` and `scores`
/// are requested writable, and no two views of one call alias (distinct arrays).
#[allow(clippy::mut_from_ref)]
fn floats<'a, T: Real>(py: Python<'_>, b: &'a Buf, what: &str, n: usize) -> PyResult<&'a mut [T]> {
    let f = b.format.trim_start_matches(['@', '=', '<']);
    let want = if std::mem::size_of::<T>() == 4 { "f" } else { "d" };
    if f != want || b.itemsize() != std::mem::size_of::<T>() {
        return Err(invalid(py, format!("{what} must be {} like the matrix, got buffer format {:?}", if want == "f" { "float32" } else { "float64" }, b.format)));
    }
    if b.count() != n {
        return Err(invalid(py, format!("{what} holds {} values, expected {n}", b.count())));
    }
    Ok(if n == 0 { &mut [] } else { unsafe { std::slice::from_raw_parts_mut(b.ptr() as *mut T, n) } })
}

/// The local matrix (rows = out slots, columns = in slots, no values) and its scratch
/// vector; `step` and `owned` allocate nothing.
#[pyclass(name = "PageRankCsr", module = "scalefree._native")]
pub struct PyPageRankCsr {
    indptr: Vec<u64>,
    cols: Vec<u32>,
    ncols: usize,
    f32: bool,
    x32: Vec<f32>,
    x64: Vec<f64>,
}

#[pymethods]
impl PyPageRankCsr {
    /// `rows`, `cols`: uint32 slots of every edge (target row, source column).
    #[new]
    fn new(py: Python<'_>, rows: Bound<'_, PyAny>, cols: Bound<'_, PyAny>, nrows: usize, ncols: usize, dtype: &str) -> PyResult<Self> {
        let f32 = match dtype {
            "float32" => true,
            "float64" => false,
            _ => return Err(invalid(py, format!("PageRankCsr: dtype must be float32 or float64, got {dtype:?}"))),
        };
        let rb = Buf::get(&rows, false, "rows")?;
        let cb = Buf::get(&cols, false, "cols")?;
        let (r, c) = (u32s(py, &rb, "rows")?, u32s(py, &cb, "cols")?);
        let (indptr, cols) = py.detach(|| csr_pattern(r, c, nrows, ncols)).map_err(|e| invalid(py, e))?;
        Ok(PyPageRankCsr {
            indptr,
            cols,
            ncols,
            f32,
            x32: if f32 { vec![0.0; ncols] } else { Vec::new() },
            x64: if f32 { Vec::new() } else { vec![0.0; ncols] },
        })
    }

    #[getter]
    fn nnz(&self) -> usize {
        self.cols.len()
    }

    /// Before the reduce: scaled sources into the scratch vector, then `y = A x` and
    /// `y[nrows] = Σ y` (returned). `got`, `inv_deg`: ncols values; `y`: nrows + 1.
    fn step(&mut self, py: Python<'_>, got: Bound<'_, PyAny>, inv_deg: Bound<'_, PyAny>, base: f64, damping: f64, y: Bound<'_, PyAny>) -> PyResult<f64> {
        let (gb, ib, yb) = (Buf::get(&got, false, "got")?, Buf::get(&inv_deg, false, "inv_deg")?, Buf::get(&y, true, "y")?);
        let (n, m) = (self.ncols, self.indptr.len());
        let (ip, cs) = (&self.indptr, &self.cols);
        if self.f32 {
            let (g, w, yv) = (floats::<f32>(py, &gb, "got", n)?, floats::<f32>(py, &ib, "inv_deg", n)?, floats::<f32>(py, &yb, "y", m)?);
            let x = &mut self.x32;
            Ok(py.detach(|| spmv_step(ip, cs, g, w, base, damping, x, yv)))
        } else {
            let (g, w, yv) = (floats::<f64>(py, &gb, "got", n)?, floats::<f64>(py, &ib, "inv_deg", n)?, floats::<f64>(py, &yb, "y", m)?);
            let x = &mut self.x64;
            Ok(py.detach(|| spmv_step(ip, cs, g, w, base, damping, x, yv)))
        }
    }

    /// After the reduce: `scores = base + damping * got[lo : lo + len(scores)]`; returns
    /// the L1 change.
    fn owned(&self, py: Python<'_>, got: Bound<'_, PyAny>, lo: usize, base: f64, damping: f64, scores: Bound<'_, PyAny>) -> PyResult<f64> {
        let (gb, sb) = (Buf::get(&got, false, "got")?, Buf::get(&scores, true, "scores")?);
        let ns = sb.count();
        if lo + ns > self.ncols {
            return Err(invalid(py, format!("owned: slots {lo}..{} past the {} in slots", lo + ns, self.ncols)));
        }
        if self.f32 {
            let (g, s) = (floats::<f32>(py, &gb, "got", self.ncols)?, floats::<f32>(py, &sb, "scores", ns)?);
            Ok(owned_update(g, lo, base, damping, s))
        } else {
            let (g, s) = (floats::<f64>(py, &gb, "got", self.ncols)?, floats::<f64>(py, &sb, "scores", ns)?);
            Ok(owned_update(g, lo, base, damping, s))
        }
    }
}
