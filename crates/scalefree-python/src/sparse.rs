//! `scalefree._native.SparseAllreduce`: the sparse allreduce of one group (thin: the
//! Python wrapper in `group.py` checks shapes and allocates results).

use std::sync::{Arc, Mutex};

use pyo3::prelude::*;
use pyo3::types::PyDict;
use scalefree_collectives::sparse::{SDType, SOp, SparseAllreduce};

use crate::buffer::Buf;
use crate::errors::{invalid, IntoPy};
use crate::group::Group;

/// Byte slices crossing into a GIL-free section.
struct SendSlice(*const u8, usize);
unsafe impl Send for SendSlice {}
impl SendSlice {
    fn get(&self) -> &[u8] {
        if self.1 == 0 { &[] } else { unsafe { std::slice::from_raw_parts(self.0, self.1) } }
    }
    #[allow(clippy::mut_from_ref)]
    fn get_mut(&self) -> &mut [u8] {
        if self.1 == 0 { &mut [] } else { unsafe { std::slice::from_raw_parts_mut(self.0 as *mut u8, self.1) } }
    }
}

fn slice_of(b: &Buf) -> SendSlice {
    SendSlice(b.ptr(), b.len_bytes())
}

fn indices(py: Python<'_>, b: &Buf, what: &str) -> PyResult<SendSlice> {
    if b.len_bytes() > 0 && (b.itemsize() != 8 || !matches!(b.format.as_str(), "q" | "l" | "<q" | "<l" | "=q" | "=l")) {
        return Err(invalid(py, format!("{what} must be int64, got buffer format {:?}", b.format)));
    }
    Ok(slice_of(b))
}

#[pyclass(name = "SparseAllreduce", module = "scalefree._native")]
pub struct PySparseAllreduce {
    group: Py<Group>,
    inner: Arc<Mutex<SparseAllreduce>>,
}

#[pymethods]
impl PySparseAllreduce {
    #[new]
    /// `seed=None`: no index hash (keys are the indices).
    /// `replication`: ranks per logical node (ranks p and p + size/replication are replicas).
    /// `ssp`: build the maps of the reduce with slack at config (`_reduce_ssp_into`).
    #[pyo3(signature = (group, dim, op="sum", degrees=None, seed=Some(0), replication=1, ssp=false))]
    #[allow(clippy::too_many_arguments)]
    fn new(py: Python<'_>, group: Py<Group>, dim: u64, op: &str, degrees: Option<Vec<usize>>, seed: Option<u64>, replication: usize, ssp: bool) -> PyResult<Self> {
        let op = SOp::parse(op).py_err(py)?;
        let size = group.borrow(py).size as usize;
        let mut inner = SparseAllreduce::new(dim, op, degrees, size, seed, replication).py_err(py)?;
        if ssp {
            inner.enable_ssp();
        }
        Ok(PySparseAllreduce { group, inner: Arc::new(Mutex::new(inner)) })
    }

    /// Collective: saves the maps for `out_indices` / `in_indices` (int64, contiguous).
    fn config(&self, py: Python<'_>, out_indices: Bound<'_, PyAny>, in_indices: Bound<'_, PyAny>) -> PyResult<()> {
        let ob = Buf::get(&out_indices, false, "out_indices")?;
        let ib = Buf::get(&in_indices, false, "in_indices")?;
        let (o, i) = (indices(py, &ob, "out_indices")?, indices(py, &ib, "in_indices")?);
        let inner = self.inner.clone();
        self.group.borrow(py).with_comm(py, move |c| {
            let o: &[i64] = bytemuck_i64(o.get());
            let i: &[i64] = bytemuck_i64(i.get());
            inner.lock().unwrap().config(c, o, i)
        })
    }

    /// Collective: reduces `out_values` into `in_values` (preallocated, same dtype/width).
    fn _reduce_into(&self, py: Python<'_>, out_values: Bound<'_, PyAny>, in_values: Bound<'_, PyAny>, dtype: &str, width: usize) -> PyResult<()> {
        let dt = SDType::parse(dtype).py_err(py)?;
        let ob = Buf::get(&out_values, false, "out_values")?;
        let ib = Buf::get(&in_values, true, "in_values")?;
        let (o, i) = (slice_of(&ob), slice_of(&ib));
        let inner = self.inner.clone();
        self.group.borrow(py).with_comm(py, move |c| inner.lock().unwrap().reduce(c, o.get(), i.get_mut(), dt, width))
    }

    /// Reduce with slack (bounded staleness): returns (clock, seconds, wait_seconds, age_diff).
    fn _reduce_ssp_into(&self, py: Python<'_>, out_values: Bound<'_, PyAny>, in_values: Bound<'_, PyAny>, dtype: &str, width: usize, slack: u64) -> PyResult<(u64, f64, f64, u64)> {
        let dt = SDType::parse(dtype).py_err(py)?;
        let ob = Buf::get(&out_values, false, "out_values")?;
        let ib = Buf::get(&in_values, true, "in_values")?;
        let (o, i) = (slice_of(&ob), slice_of(&ib));
        let inner = self.inner.clone();
        let st = self.group.borrow(py).with_comm(py, move |c| inner.lock().unwrap().reduce_ssp(c, o.get(), i.get_mut(), dt, width, slack))?;
        Ok((st.clock, st.seconds, st.wait_seconds, st.age_diff))
    }

    /// Collective: the exact reduction of every rank's latest contribution into `in_values`.
    fn _flush_into(&self, py: Python<'_>, in_values: Bound<'_, PyAny>) -> PyResult<()> {
        let ib = Buf::get(&in_values, true, "in_values")?;
        let i = slice_of(&ib);
        let inner = self.inner.clone();
        self.group.borrow(py).with_comm(py, move |c| inner.lock().unwrap().flush_ssp(c, i.get_mut()))
    }

    /// Every reduce with slack since config: (clock, seconds, wait_seconds, age_diff) rows.
    fn ssp_stats(&self) -> Vec<(u64, f64, f64, u64)> {
        self.inner.lock().unwrap().ssp_stats().iter().map(|s| (s.clock, s.seconds, s.wait_seconds, s.age_diff)).collect()
    }

    /// Collective: config and reduce in one pass down.
    #[allow(clippy::too_many_arguments)]
    fn _config_reduce_into(
        &self,
        py: Python<'_>,
        out_indices: Bound<'_, PyAny>,
        out_values: Bound<'_, PyAny>,
        in_indices: Bound<'_, PyAny>,
        in_values: Bound<'_, PyAny>,
        dtype: &str,
        width: usize,
    ) -> PyResult<()> {
        let dt = SDType::parse(dtype).py_err(py)?;
        let oib = Buf::get(&out_indices, false, "out_indices")?;
        let iib = Buf::get(&in_indices, false, "in_indices")?;
        let ob = Buf::get(&out_values, false, "out_values")?;
        let ib = Buf::get(&in_values, true, "in_values")?;
        let (oi, ii) = (indices(py, &oib, "out_indices")?, indices(py, &iib, "in_indices")?);
        let (o, i) = (slice_of(&ob), slice_of(&ib));
        let inner = self.inner.clone();
        self.group.borrow(py).with_comm(py, move |c| {
            inner.lock().unwrap().config_reduce(c, bytemuck_i64(oi.get()), o.get(), bytemuck_i64(ii.get()), i.get_mut(), dt, width)
        })
    }

    #[getter]
    fn degrees(&self) -> Vec<usize> {
        self.inner.lock().unwrap().degrees().to_vec()
    }

    #[getter]
    fn n_out(&self) -> usize {
        self.inner.lock().unwrap().n_out()
    }

    #[getter]
    fn n_in(&self) -> usize {
        self.inner.lock().unwrap().n_in()
    }

    /// Per-layer accounting of the last call: list of dicts.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyDict>>> {
        let inner = self.inner.lock().unwrap();
        inner
            .stats()
            .iter()
            .map(|s| {
                let d = PyDict::new(py);
                d.set_item("degree", s.degree)?;
                d.set_item("bytes_sent", s.bytes_sent)?;
                d.set_item("messages", s.messages)?;
                d.set_item("max_packet", s.max_packet)?;
                d.set_item("merge_s", s.merge_ns as f64 * 1e-9)?;
                d.set_item("wait_s", s.wait_ns as f64 * 1e-9)?;
                d.set_item("out_keys", s.out_keys)?;
                d.set_item("in_keys", s.in_keys)?;
                d.set_item("dense", s.dense)?;
                Ok(d)
            })
            .collect()
    }
}

/// Bytes of an int64 buffer (checked by `indices`) as `&[i64]`.
fn bytemuck_i64(b: &[u8]) -> &[i64] {
    if b.is_empty() {
        return &[];
    }
    unsafe { std::slice::from_raw_parts(b.as_ptr() as *const i64, b.len() / 8) }
}
