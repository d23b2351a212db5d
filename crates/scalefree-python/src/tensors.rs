//! `scalefree._native.StaticSlot` / `DynamicChannel`: zero-copy tensor transfer (made by
//! `Group._static_slots` / `Group._dynamic_channels`; `scalefree.tensors` wraps them).

use std::ffi::c_int;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pyo3::ffi;
use pyo3::prelude::*;
use scalefree_tensors::{DynamicChannel, Meta, StaticSlot, StaticSpec};
use scalefree_transport::Device;

use crate::buffer::Buf;
use crate::errors::{invalid, IntoPy};

fn timeout_of(t: Option<f64>) -> Option<Duration> {
    t.filter(|s| s.is_finite() && *s >= 0.0).map(Duration::from_secs_f64)
}

struct SendPtr(*mut u8);
unsafe impl Send for SendPtr {}
impl SendPtr {
    fn get(&self) -> *mut u8 {
        self.0
    }
}

#[pyclass(name = "StaticSlot", module = "scalefree._native")]
pub struct PyStaticSlot {
    inner: Arc<Mutex<StaticSlot>>,
    buffer: (usize, usize),
    #[pyo3(get)]
    src: u32,
    #[pyo3(get)]
    dst: u32,
    #[pyo3(get)]
    nbytes: u64,
}

pub fn static_slots(py: Python<'_>, dev: &Device, specs: Vec<(u32, u32, u64)>) -> PyResult<Vec<Option<PyStaticSlot>>> {
    let specs: Vec<StaticSpec> = specs.into_iter().map(|(src, dst, nbytes)| StaticSpec { src, dst, nbytes }).collect();
    let dev = dev.clone();
    let slots = py.detach(move || StaticSlot::create(&dev, &specs)).py_err(py)?;
    Ok(slots
        .into_iter()
        .map(|s| {
            s.map(|s| {
                let spec = s.spec();
                let buffer = if s.is_sender() { (0, 0) } else { (s.buffer() as usize, spec.nbytes as usize) };
                PyStaticSlot { inner: Arc::new(Mutex::new(s)), buffer, src: spec.src, dst: spec.dst, nbytes: spec.nbytes }
            })
        })
        .collect())
}

#[pymethods]
impl PyStaticSlot {
    /// Writes `data` (exactly the slot's bytes) into the receiver's buffer; waits first for
    /// the receiver to release the previous message.
    #[pyo3(signature = (data, timeout=None))]
    fn send(&self, py: Python<'_>, data: Bound<'_, PyAny>, timeout: Option<f64>) -> PyResult<()> {
        let b = Buf::get(&data, false, "send: the tensor")?;
        let (p, n) = (SendPtr(b.ptr()), b.len_bytes());
        let inner = self.inner.clone();
        py.detach(move || {
            let bytes = unsafe { std::slice::from_raw_parts(p.get(), n) };
            inner.lock().unwrap().send(bytes, timeout_of(timeout))
        })
        .py_err(py)?;
        drop(b);
        Ok(())
    }

    /// Releases the previous message and waits for the next (the data is then in this
    /// object's buffer).
    #[pyo3(signature = (timeout=None))]
    fn recv(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<()> {
        let inner = self.inner.clone();
        py.detach(move || inner.lock().unwrap().recv(timeout_of(timeout)).map(|_| ())).py_err(py)
    }

    /// Hands the buffer back to the sender (done with the message).
    fn release(&self) {
        self.inner.lock().unwrap().release();
    }

    /// True if a message is waiting.
    fn poll(&self) -> bool {
        self.inner.lock().unwrap().poll()
    }

    #[getter]
    fn is_sender(&self) -> bool {
        self.inner.lock().unwrap().is_sender()
    }

    /// (bytes_zero_copy, bytes_copied, transfers)
    fn stats(&self) -> (u64, u64, u64) {
        self.inner.lock().unwrap().stats().snapshot()
    }

    unsafe fn __getbuffer__(slf: Bound<'_, Self>, view: *mut ffi::Py_buffer, flags: c_int) -> PyResult<()> {
        let (ptr, len) = slf.borrow().buffer;
        if ptr == 0 && len == 0 && slf.borrow().is_sender() {
            return Err(invalid(slf.py(), "the sending end of a slot has no buffer"));
        }
        unsafe { crate::buffer::export(slf.as_any(), view, ptr as *mut u8, len, flags) }
    }

    unsafe fn __releasebuffer__(&self, _view: *mut ffi::Py_buffer) {}
}

#[pyclass(name = "DynamicChannel", module = "scalefree._native")]
pub struct PyDynamicChannel {
    inner: Arc<Mutex<DynamicChannel>>,
    #[pyo3(get)]
    src: u32,
    #[pyo3(get)]
    dst: u32,
}

pub fn dynamic_channels(py: Python<'_>, dev: &Device, pairs: Vec<(u32, u32)>) -> PyResult<Vec<Option<PyDynamicChannel>>> {
    let dev2 = dev.clone();
    let p2 = pairs.clone();
    let chans = py.detach(move || DynamicChannel::create(&dev2, &p2)).py_err(py)?;
    Ok(chans
        .into_iter()
        .zip(pairs)
        .map(|(c, (src, dst))| c.map(|c| PyDynamicChannel { inner: Arc::new(Mutex::new(c)), src, dst }))
        .collect())
}

#[pymethods]
impl PyDynamicChannel {
    /// Sends the bytes of `data` as a tensor of `shape` (`dtype` a code the receiver
    /// understands, `itemsize` its bytes). With `wait`, returns once the receiver pulled it.
    /// Returns True if the data had to be staged (it was not in registered memory).
    #[pyo3(signature = (data, shape, dtype, itemsize, wait=true, timeout=None))]
    #[allow(clippy::too_many_arguments)]
    fn send(&self, py: Python<'_>, data: Bound<'_, PyAny>, shape: Vec<u64>, dtype: u32, itemsize: u32, wait: bool, timeout: Option<f64>) -> PyResult<bool> {
        let b = Buf::get(&data, false, "send: the tensor")?;
        let meta = Meta { dtype, itemsize, shape };
        let want = meta.nbytes().py_err(py)?;
        if want != b.len_bytes() as u64 {
            return Err(invalid(py, format!("send: shape and dtype give {want} bytes, the buffer has {}", b.len_bytes())));
        }
        let p = SendPtr(b.ptr());
        let inner = self.inner.clone();
        let staged = py
            .detach(move || {
                let mut c = inner.lock().unwrap();
                let staged = unsafe { c.send(p.get(), &meta, timeout_of(timeout))? };
                if wait {
                    c.wait_sent(timeout_of(timeout))?;
                }
                Ok(staged)
            })
            .py_err(py)?;
        drop(b);
        Ok(staged)
    }

    /// Waits until the receiver has pulled everything sent.
    #[pyo3(signature = (timeout=None))]
    fn wait_sent(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<()> {
        let inner = self.inner.clone();
        py.detach(move || inner.lock().unwrap().wait_sent(timeout_of(timeout))).py_err(py)
    }

    /// Waits for the next message; returns (dtype, itemsize, shape).
    #[pyo3(signature = (timeout=None))]
    fn recv_meta(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<(u32, u32, Vec<u64>)> {
        let inner = self.inner.clone();
        let m = py.detach(move || inner.lock().unwrap().recv_meta(timeout_of(timeout))).py_err(py)?;
        Ok((m.dtype, m.itemsize, m.shape))
    }

    /// Pulls the pending message into `out` (writable, exactly its bytes) and acknowledges it.
    fn recv_into(&self, py: Python<'_>, out: Bound<'_, PyAny>) -> PyResult<()> {
        let b = Buf::get(&out, true, "recv_into: out")?;
        let (p, n) = (SendPtr(b.ptr()), b.len_bytes());
        let inner = self.inner.clone();
        py.detach(move || unsafe { inner.lock().unwrap().recv_into(p.get(), n) }).py_err(py)?;
        drop(b);
        Ok(())
    }

    #[getter]
    fn is_sender(&self) -> bool {
        self.inner.lock().unwrap().is_sender()
    }

    /// (bytes_zero_copy, bytes_copied, transfers)
    fn stats(&self) -> (u64, u64, u64) {
        self.inner.lock().unwrap().stats().snapshot()
    }
}

/// `param += alpha * sum(grads)` for float32 arrays, one pass, GIL released.
#[pyfunction]
pub fn sgd_apply(py: Python<'_>, param: Bound<'_, PyAny>, grads: Vec<Bound<'_, PyAny>>, alpha: f32) -> PyResult<()> {
    let p = Buf::get(&param, true, "sgd_apply: param")?;
    let gs = grads.iter().map(|g| Buf::get(g, false, "sgd_apply: a gradient")).collect::<PyResult<Vec<_>>>()?;
    for b in std::iter::once(&p).chain(gs.iter()) {
        if b.format != "f" || b.itemsize() != 4 {
            return Err(invalid(py, "sgd_apply: float32 arrays only"));
        }
        if b.len_bytes() != p.len_bytes() {
            return Err(invalid(py, "sgd_apply: every gradient must have the parameter's size"));
        }
    }
    let n = p.count();
    let pp = SendPtr(p.ptr());
    let gp: Vec<SendPtr> = gs.iter().map(|g| SendPtr(g.ptr())).collect();
    py.detach(move || {
        let param = unsafe { std::slice::from_raw_parts_mut(pp.get() as *mut f32, n) };
        let grads: Vec<&[f32]> = gp.iter().map(|g| unsafe { std::slice::from_raw_parts(g.get() as *const f32, n) }).collect();
        scalefree_tensors::apply::sgd_apply_f32(param, &grads, alpha);
    });
    drop((p, gs));
    Ok(())
}

/// `dst = src + alpha * sum(grads)` for float32 arrays (`dst` another buffer), one pass.
#[pyfunction]
pub fn sgd_apply_to(py: Python<'_>, dst: Bound<'_, PyAny>, src: Bound<'_, PyAny>, grads: Vec<Bound<'_, PyAny>>, alpha: f32) -> PyResult<()> {
    let d = Buf::get(&dst, true, "sgd_apply_to: dst")?;
    let s = Buf::get(&src, false, "sgd_apply_to: src")?;
    let gs = grads.iter().map(|g| Buf::get(g, false, "sgd_apply_to: a gradient")).collect::<PyResult<Vec<_>>>()?;
    for b in [&d, &s].into_iter().chain(gs.iter()) {
        if b.format != "f" || b.itemsize() != 4 || b.len_bytes() != d.len_bytes() {
            return Err(invalid(py, "sgd_apply_to: float32 arrays of one size only"));
        }
    }
    if d.ptr() == s.ptr() {
        return Err(invalid(py, "sgd_apply_to: dst must be another buffer than src (use sgd_apply)"));
    }
    let n = d.count();
    let (dp, sp) = (SendPtr(d.ptr()), SendPtr(s.ptr()));
    let gp: Vec<SendPtr> = gs.iter().map(|g| SendPtr(g.ptr())).collect();
    py.detach(move || {
        let dst = unsafe { std::slice::from_raw_parts_mut(dp.get() as *mut f32, n) };
        let src = unsafe { std::slice::from_raw_parts(sp.get() as *const f32, n) };
        let grads: Vec<&[f32]> = gp.iter().map(|g| unsafe { std::slice::from_raw_parts(g.get() as *const f32, n) }).collect();
        scalefree_tensors::apply::sgd_apply_to_f32(dst, src, &grads, alpha);
    });
    drop((d, s, gs));
    Ok(())
}
