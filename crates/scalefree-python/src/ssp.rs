//! `scalefree._native.SspReduction`: a stale-synchronous allreduce set up once, called
//! many times (made by `Group._ssp_reduction`).

use std::sync::{Arc, Mutex};

use pyo3::prelude::*;
use scalefree_collectives::ssp::{PushOrder, SspReduction, Variant};
use scalefree_collectives::{DType, ReduceOp};
use scalefree_transport::Device;

use crate::buffer::Buf;
use crate::errors::{invalid, IntoPy};

pub fn parse_dtype(py: Python<'_>, s: &str) -> PyResult<DType> {
    Ok(match s {
        "float32" | "f4" | "f" => DType::F32,
        "float64" | "f8" | "d" => DType::F64,
        "int32" | "i4" | "i" => DType::I32,
        "int64" | "i8" | "l" | "q" => DType::I64,
        _ => return Err(invalid(py, format!("unsupported dtype {s:?}: expected float32, float64, int32 or int64"))),
    })
}

/// The result of one call: (clock, seconds, wait_seconds, age_diff).
type Stats = (u64, f64, f64, u64);

#[pyclass(module = "scalefree._native")]
pub struct PySspReduction {
    inner: Arc<Mutex<Option<SspReduction>>>,
    #[pyo3(get)]
    count: usize,
    #[pyo3(get)]
    dtype: String,
    #[pyo3(get)]
    op: String,
    #[pyo3(get)]
    variant: String,
    #[pyo3(get)]
    push_order: String,
}

impl PySspReduction {
    pub fn create(py: Python<'_>, dev: &Device, count: usize, dtype: &str, op: &str, variant: &str, push_order: &str) -> PyResult<Self> {
        let d = parse_dtype(py, dtype)?;
        let o = ReduceOp::parse(op).py_err(py)?;
        let v = Variant::resolve(variant, dev.size() as usize, count * d.size_bytes(), scalefree_collectives::ssp::ring_min_bytes()).py_err(py)?;
        let po = PushOrder::parse(push_order).py_err(py)?;
        let dev = dev.clone();
        let red = py.detach(move || SspReduction::with_order(&dev, count, d, o, v, po)).py_err(py)?;
        Ok(PySspReduction {
            inner: Arc::new(Mutex::new(Some(red))),
            count,
            dtype: d.name().to_string(),
            op: o.name().to_string(),
            variant: v.name().to_string(),
            push_order: po.name().to_string(),
        })
    }

    fn with<T: Send>(&self, py: Python<'_>, f: impl FnOnce(&mut SspReduction) -> scalefree_transport::Result<T> + Send) -> PyResult<T> {
        let inner = self.inner.clone();
        let r = py.detach(move || {
            let mut g = inner.lock().unwrap_or_else(|p| p.into_inner());
            match g.as_mut() {
                Some(red) => f(red).map_err(Some),
                None => Err(None),
            }
        });
        match r {
            Ok(v) => Ok(v),
            Err(Some(e)) => {
                if matches!(e, scalefree_transport::Error::Interrupted(_) | scalefree_transport::Error::PeerLost { .. } | scalefree_transport::Error::Timeout { .. }) {
                    // Out of step with the peers: unusable from now on.
                    self.inner.lock().unwrap_or_else(|p| p.into_inner()).take();
                }
                Err(e).py_err(py)
            }
            Err(None) => Err(invalid(py, "this SSP reduction is closed")),
        }
    }
}

struct SendPtr(*mut u8, usize);
unsafe impl Send for SendPtr {}
impl SendPtr {
    fn bytes(&self) -> &'static mut [u8] {
        unsafe { std::slice::from_raw_parts_mut(self.0, self.1) }
    }
}

#[pymethods]
impl PySspReduction {
    /// Adds `contribution`, writes the reduction of every contribution so far into `out`
    /// (other ranks' data at most `slack` clocks old) and returns the call's statistics.
    fn _allreduce_into(&self, py: Python<'_>, contribution: Bound<'_, PyAny>, out: Bound<'_, PyAny>, slack: u64) -> PyResult<Stats> {
        let c = Buf::get(&contribution, false, "the contribution")?;
        let o = Buf::get(&out, true, "out")?;
        for (b, what) in [(&c, "the contribution"), (&o, "out")] {
            if b.dtype.map(|d| d.name()) != Some(self.dtype.as_str()) {
                return Err(invalid(py, format!("{what} has buffer format {:?}; this reduction is {}", b.format, self.dtype)));
            }
        }
        let (cp, op_) = (SendPtr(c.ptr(), c.len_bytes()), SendPtr(o.ptr(), o.len_bytes()));
        let st = self.with(py, move |r| r.allreduce(cp.bytes(), op_.bytes(), slack))?;
        drop((c, o));
        Ok((st.clock, st.seconds, st.wait_seconds, st.age_diff))
    }

    /// Delta mode: adds the contribution held in `inout` and writes back, in its place, the
    /// change of the result since this rank's previous call times `scale`.
    fn _allreduce_delta(&self, py: Python<'_>, inout: Bound<'_, PyAny>, slack: u64, scale: f64) -> PyResult<Stats> {
        let b = Buf::get(&inout, true, "the contribution")?;
        if b.dtype.map(|d| d.name()) != Some(self.dtype.as_str()) {
            return Err(invalid(py, format!("the contribution has buffer format {:?}; this reduction is {}", b.format, self.dtype)));
        }
        let p = SendPtr(b.ptr(), b.len_bytes());
        let st = self.with(py, move |r| r.allreduce_delta(p.bytes(), slack, scale))?;
        drop(b);
        Ok((st.clock, st.seconds, st.wait_seconds, st.age_diff))
    }

    /// Delta mode: publishes what the last `_allreduce_delta` left unpublished.
    fn _publish(&self, py: Python<'_>) -> PyResult<()> {
        self.with(py, |r| r.publish())
    }

    /// Delta mode, collective, once at the end: flushes, and writes into `out` the change
    /// of the exact total since this rank's last call times `scale`.
    fn _flush_delta_into(&self, py: Python<'_>, out: Bound<'_, PyAny>, scale: f64) -> PyResult<()> {
        let o = Buf::get(&out, true, "out")?;
        if o.dtype.map(|d| d.name()) != Some(self.dtype.as_str()) {
            return Err(invalid(py, format!("out has buffer format {:?}; this reduction is {}", o.format, self.dtype)));
        }
        let op_ = SendPtr(o.ptr(), o.len_bytes());
        self.with(py, move |r| r.flush_delta(op_.bytes(), scale))?;
        drop(o);
        Ok(())
    }

    /// Collective: sends everything not yet sent, waits for every rank to do the same, and
    /// writes the exact reduction of all contributions into `out`.
    fn _flush_into(&self, py: Python<'_>, out: Bound<'_, PyAny>) -> PyResult<()> {
        let o = Buf::get(&out, true, "out")?;
        if o.dtype.map(|d| d.name()) != Some(self.dtype.as_str()) {
            return Err(invalid(py, format!("out has buffer format {:?}; this reduction is {}", o.format, self.dtype)));
        }
        let op_ = SendPtr(o.ptr(), o.len_bytes());
        self.with(py, move |r| r.flush(op_.bytes()))?;
        drop(o);
        Ok(())
    }

    /// Calls made so far.
    #[getter]
    fn clock(&self) -> u64 {
        self.inner.lock().unwrap().as_ref().map_or(0, |r| r.clock())
    }

    #[getter]
    fn flushed(&self) -> bool {
        self.inner.lock().unwrap().as_ref().is_none_or(|r| r.flushed())
    }

    /// Every call's (clock, seconds, wait_seconds, age_diff), oldest first.
    fn stats(&self) -> Vec<Stats> {
        self.inner.lock().unwrap().as_ref().map_or_else(Vec::new, |r| {
            r.stats().iter().map(|s| (s.clock, s.seconds, s.wait_seconds, s.age_diff)).collect()
        })
    }

    /// Stops the background shard (Thread variants) and frees the regions. Call it on every
    /// rank, after `flush` if the totals matter.
    fn close(&self, py: Python<'_>) {
        let inner = self.inner.clone();
        py.detach(move || drop(inner.lock().unwrap_or_else(|p| p.into_inner()).take()));
    }
}
