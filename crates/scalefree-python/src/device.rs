//! `Device`, `Region`, `RemoteRegion`, `Channel`, `Completion`: the one-sided API.

use std::os::raw::c_int;
use std::time::Duration;

use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use scalefree_transport::{Channel, Completion, Device, Region, RemoteRegion};

use crate::errors::{invalid, IntoPy};

/// A rank's endpoint: allocates regions, attaches peers' regions, makes channels, and
/// waits on its notification slots.
#[pyclass(name = "Device", module = "scalefree._native")]
pub struct PyDevice {
    dev: Device,
}

impl PyDevice {
    pub fn new(dev: Device) -> Self {
        PyDevice { dev }
    }
}

fn timeout_of(py: Python<'_>, t: Option<f64>) -> PyResult<Option<Duration>> {
    match t {
        None => Ok(None),
        Some(s) if s >= 0.0 && s.is_finite() => Ok(Some(Duration::from_secs_f64(s))),
        Some(s) => Err(invalid(py, format!("timeout must be non-negative seconds, got {s}"))),
    }
}

#[pymethods]
impl PyDevice {
    #[getter]
    fn rank(&self) -> u32 {
        self.dev.rank()
    }
    #[getter]
    fn size(&self) -> u32 {
        self.dev.size()
    }

    /// Allocates `nbytes` of shared memory peers can address (zero-filled, pre-faulted).
    fn alloc_region(&self, py: Python<'_>, nbytes: usize) -> PyResult<PyRegion> {
        let dev = self.dev.clone();
        let r = py.detach(move || dev.alloc_region(nbytes)).py_err(py)?;
        Ok(PyRegion { region: r })
    }

    /// Registers `nbytes` at address `ptr`, a shared mapping of the file open as `fd`
    /// (e.g. a torch storage after `share_memory_()`): peers on this host map the file, so
    /// collectives on buffers inside it copy nothing extra. Keep the memory mapped while
    /// the returned region lives.
    fn _register_shared(&self, py: Python<'_>, ptr: usize, nbytes: usize, fd: i32) -> PyResult<PyRegion> {
        let r = unsafe { self.dev.register_shared(ptr as *mut u8, nbytes, fd) }.py_err(py)?;
        Ok(PyRegion { region: r })
    }

    /// Whether `ptr..ptr+nbytes` lies in registered memory of this device (a region or the
    /// arena): a one-sided write can send it without staging.
    fn _is_registered(&self, ptr: usize, nbytes: usize) -> bool {
        self.dev.find_region(ptr as *const u8, nbytes).is_some()
    }

    /// Makes a peer's region (named by its `handle` bytes) addressable here.
    fn attach(&self, py: Python<'_>, handle: &[u8]) -> PyResult<PyRemoteRegion> {
        let r = self.dev.attach_serialized(handle).py_err(py)?;
        Ok(PyRemoteRegion { remote: r })
    }

    /// Latency probe (benchmarks): `iters` round trips of an `nbytes` `write_notify` from
    /// `local` into `remote` on `peer` (notification slot `slot`), this rank starting them
    /// when `first`, answering otherwise; both ranks call it. Returns the seconds taken.
    /// The loop runs without the Python interpreter, as `ucx_perftest`'s does.
    #[allow(clippy::too_many_arguments)]
    fn _ping_pong(&self, py: Python<'_>, peer: u32, local: PyRef<'_, PyRegion>, remote: PyRef<'_, PyRemoteRegion>, nbytes: usize,
                  iters: u32, slot: usize, first: bool) -> PyResult<f64> {
        let (dev, region, remote) = (self.dev.clone(), local.region.clone(), remote.remote.clone());
        py.detach(move || -> scalefree_transport::Result<f64> {
            let ch = dev.channel(peer)?;
            let t = std::time::Instant::now();
            for i in 1..=iters {
                if first {
                    ch.write_notify(&region, 0, &remote, 0, nbytes, slot, i)?.wait()?;
                    dev.wait(slot, None)?;
                } else {
                    dev.wait(slot, None)?;
                    ch.write_notify(&region, 0, &remote, 0, nbytes, slot, i)?.wait()?;
                }
            }
            Ok(t.elapsed().as_secs_f64())
        })
        .py_err(py)
    }

    /// A channel to rank `peer`.
    fn channel(&self, py: Python<'_>, peer: u32) -> PyResult<PyChannel> {
        Ok(PyChannel { ch: self.dev.channel(peer).py_err(py)? })
    }

    /// Waits for a notification in `slot`, consumes it and returns its value.
    #[pyo3(signature = (slot, timeout=None))]
    fn wait(&self, py: Python<'_>, slot: usize, timeout: Option<f64>) -> PyResult<u32> {
        let t = timeout_of(py, timeout)?;
        let dev = self.dev.clone();
        py.detach(move || dev.wait(slot, t)).py_err(py)
    }

    /// Consumes and returns the notification in `slot`, or None.
    fn test(&self, py: Python<'_>, slot: usize) -> PyResult<Option<u32>> {
        self.dev.test(slot).py_err(py)
    }
}

/// Registered shared memory. Supports the buffer protocol: `np.frombuffer(region, dtype)`
/// is a zero-copy view; `region.array(dtype, shape)` does the same.
#[pyclass(name = "Region", module = "scalefree._native")]
pub struct PyRegion {
    pub region: Region,
}

#[pymethods]
impl PyRegion {
    #[getter]
    fn nbytes(&self) -> usize {
        self.region.len()
    }

    /// The serializable handle a peer passes to `Device.attach`.
    #[getter]
    fn handle<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.region.serialized())
    }

    /// A numpy view of the region (no copy).
    #[pyo3(signature = (dtype=None, shape=None))]
    fn array<'py>(slf: Bound<'py, Self>, dtype: Option<Bound<'py, PyAny>>, shape: Option<Bound<'py, PyAny>>) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        let np = py.import("numpy")?;
        let dtype = match dtype {
            Some(d) => d,
            None => pyo3::types::PyString::new(py, "uint8").into_any(),
        };
        let a = np.call_method1("frombuffer", (slf.clone(), dtype))?;
        match shape {
            Some(s) => a.call_method1("reshape", (s,)),
            None => Ok(a),
        }
    }

    unsafe fn __getbuffer__(slf: Bound<'_, Self>, view: *mut ffi::Py_buffer, flags: c_int) -> PyResult<()> {
        let (ptr, len) = {
            let me = slf.borrow();
            (me.region.as_ptr(), me.region.len())
        };
        unsafe { crate::buffer::export(slf.as_any(), view, ptr, len, flags) }
    }

    unsafe fn __releasebuffer__(&self, _view: *mut ffi::Py_buffer) {}

    fn __len__(&self) -> usize {
        self.region.len()
    }

    fn __repr__(&self) -> String {
        format!("Region({} bytes)", self.region.len())
    }
}

/// A peer's region, attached here.
#[pyclass(name = "RemoteRegion", module = "scalefree._native")]
pub struct PyRemoteRegion {
    pub remote: RemoteRegion,
}

#[pymethods]
impl PyRemoteRegion {
    #[getter]
    fn nbytes(&self) -> usize {
        self.remote.len()
    }
    #[getter]
    fn owner(&self) -> u32 {
        self.remote.owner()
    }
    fn __repr__(&self) -> String {
        format!("RemoteRegion(rank {}, {} bytes)", self.remote.owner(), self.remote.len())
    }

    /// True when the peer's region is mapped here (shared memory), so it can be viewed.
    #[getter]
    fn mapped(&self) -> bool {
        self.remote.mapped_ptr().is_some()
    }

    /// The peer's memory, mapped (shared-memory backend): loads and stores go straight to
    /// it. Synchronise with notifications; `Channel.read`/`write` work on every backend.
    unsafe fn __getbuffer__(slf: Bound<'_, Self>, view: *mut ffi::Py_buffer, flags: c_int) -> PyResult<()> {
        let (ptr, len) = {
            let me = slf.borrow();
            match me.remote.mapped_ptr() {
                Some(p) => (p, me.remote.len()),
                None => return Err(crate::errors::invalid(slf.py(), "this peer's region is not mapped here (cross-memory attach only): use Channel.read")),
            }
        };
        unsafe { crate::buffer::export(slf.as_any(), view, ptr, len, flags) }
    }

    unsafe fn __releasebuffer__(&self, _view: *mut ffi::Py_buffer) {}
}

/// One-sided operations towards one peer.
#[pyclass(name = "Channel", module = "scalefree._native")]
pub struct PyChannel {
    ch: Channel,
}

/// The completion of a one-sided operation: `test()` / `done()` poll it, `wait(timeout)` /
/// `result(timeout)` block (without the interpreter lock), `await completion` waits in an
/// asyncio loop. Any number may be in flight at once.
#[pyclass(name = "Completion", module = "scalefree._native")]
pub struct PyCompletion {
    inner: std::sync::Arc<Completion>,
}

impl PyCompletion {
    fn new(c: Completion) -> Self {
        PyCompletion { inner: std::sync::Arc::new(c) }
    }
}

#[pymethods]
impl PyCompletion {
    /// True once the operation's local buffer may be reused (a read: the bytes are here).
    fn test(&self) -> bool {
        self.inner.test()
    }
    /// `test()`, as `concurrent.futures.Future.done`.
    fn done(&self) -> bool {
        self.inner.test()
    }
    /// Blocks until the operation has completed (at most `timeout` seconds: then
    /// `TimeoutError`, and the operation stays in flight). Raises if it failed.
    #[pyo3(signature = (timeout=None))]
    fn wait(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<()> {
        let t = timeout_of(py, timeout)?;
        let c = self.inner.clone();
        py.detach(move || c.wait_for(t)).py_err(py)
    }
    /// `wait(timeout)`, returning None (as `concurrent.futures.Future.result`).
    #[pyo3(signature = (timeout=None))]
    fn result(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<()> {
        self.wait(py, timeout)
    }
    /// `await completion` in an asyncio loop: done at once if it already is, else waited
    /// for in the loop's default executor (the loop keeps running).
    fn __await__<'py>(slf: Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        py.import("scalefree._completion")?.getattr("wait_async")?.call1((slf,))?.call_method0("__await__")
    }
    fn __repr__(&self) -> String {
        format!("Completion(done: {})", self.inner.test())
    }
}

#[pymethods]
impl PyChannel {
    #[getter]
    fn peer(&self) -> u32 {
        self.ch.peer()
    }

    /// Copies `nbytes` from `local[local_offset:]` into the peer's `remote[remote_offset:]`.
    fn write(&self, py: Python<'_>, local: PyRef<'_, PyRegion>, local_offset: usize, remote: PyRef<'_, PyRemoteRegion>, remote_offset: usize, nbytes: usize) -> PyResult<PyCompletion> {
        let c = self.ch.write(&local.region, local_offset, &remote.remote, remote_offset, nbytes).py_err(py)?;
        Ok(PyCompletion::new(c))
    }

    /// Copies `nbytes` from the peer's `remote[remote_offset:]` into `local[local_offset:]`.
    fn read(&self, py: Python<'_>, remote: PyRef<'_, PyRemoteRegion>, remote_offset: usize, local: PyRef<'_, PyRegion>, local_offset: usize, nbytes: usize) -> PyResult<PyCompletion> {
        let c = self.ch.read(&remote.remote, remote_offset, &local.region, local_offset, nbytes).py_err(py)?;
        Ok(PyCompletion::new(c))
    }

    /// `write`, then notification `value` (non-zero) in the peer's `slot`; the peer sees the
    /// data before the notification.
    #[allow(clippy::too_many_arguments)]
    fn write_notify(&self, py: Python<'_>, local: PyRef<'_, PyRegion>, local_offset: usize, remote: PyRef<'_, PyRemoteRegion>, remote_offset: usize, nbytes: usize, slot: usize, value: u32) -> PyResult<PyCompletion> {
        let c = self.ch.write_notify(&local.region, local_offset, &remote.remote, remote_offset, nbytes, slot, value).py_err(py)?;
        Ok(PyCompletion::new(c))
    }

    /// Posts a copy of `nbytes` from `local[local_offset:]` into the peer's
    /// `remote[remote_offset:]` and returns its `Completion` at once; leave those bytes of
    /// `local` unchanged until it is done.
    fn start_write(&self, py: Python<'_>, local: PyRef<'_, PyRegion>, local_offset: usize, remote: PyRef<'_, PyRemoteRegion>, remote_offset: usize, nbytes: usize) -> PyResult<PyCompletion> {
        let c = self.ch.start_write(&local.region, local_offset, &remote.remote, remote_offset, nbytes).py_err(py)?;
        Ok(PyCompletion::new(c))
    }

    /// Posts a copy of `nbytes` of the peer's `remote[remote_offset:]` into
    /// `local[local_offset:]`; the bytes are there once the returned `Completion` is done.
    fn start_read(&self, py: Python<'_>, remote: PyRef<'_, PyRemoteRegion>, remote_offset: usize, local: PyRef<'_, PyRegion>, local_offset: usize, nbytes: usize) -> PyResult<PyCompletion> {
        let c = self.ch.start_read(&remote.remote, remote_offset, &local.region, local_offset, nbytes).py_err(py)?;
        Ok(PyCompletion::new(c))
    }

    /// `start_write`, then notification `value` (non-zero) in the peer's `slot`; the peer
    /// sees the data before the notification.
    #[allow(clippy::too_many_arguments)]
    fn start_write_notify(&self, py: Python<'_>, local: PyRef<'_, PyRegion>, local_offset: usize, remote: PyRef<'_, PyRemoteRegion>, remote_offset: usize, nbytes: usize, slot: usize, value: u32) -> PyResult<PyCompletion> {
        let c = self.ch.start_write_notify(&local.region, local_offset, &remote.remote, remote_offset, nbytes, slot, value).py_err(py)?;
        Ok(PyCompletion::new(c))
    }

    /// Delivers notification `value` (non-zero) into the peer's `slot`.
    fn notify(&self, py: Python<'_>, slot: usize, value: u32) -> PyResult<()> {
        self.ch.notify(slot, value).py_err(py)
    }
}

/// `scalefree._native.HelperThread()`: registers a thread of this process that needs the
/// cores while its ranks wait (waits then spin and park, without their yield phase, unless
/// `SCALEFREE_YIELD_US` is set); `close()` ends the registration (idempotent).
#[pyclass(name = "HelperThread", module = "scalefree._native")]
pub struct PyHelperThread(std::sync::Mutex<Option<scalefree_transport::wait::HelperThread>>);

#[pymethods]
impl PyHelperThread {
    #[new]
    fn new() -> Self {
        PyHelperThread(std::sync::Mutex::new(Some(scalefree_transport::wait::HelperThread::register())))
    }

    fn close(&self) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).take();
    }
}

/// `scalefree._native.helper_thread_count()`: live [`PyHelperThread`] registrations.
#[pyfunction]
pub fn helper_thread_count() -> usize {
    scalefree_transport::wait::helper_threads()
}
