//! `scalefree._native.Group`: rank, size and the dense collectives.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pyo3::prelude::*;
use scalefree_collectives::dense::wire::Wire;
use scalefree_collectives::{Algorithm, CommOptions, Communicator, ReduceOp};
use scalefree_transport::{Device, DeviceOptions, JobInfo};

use crate::buffer::Buf;
use crate::device::PyDevice;
use crate::errors::{invalid, IntoPy};

/// Raw pointers crossing into a GIL-free section.
struct SendPtr(*mut u8);
unsafe impl Send for SendPtr {}
unsafe impl Sync for SendPtr {}
impl SendPtr {
    // A method (not `.0`) so closures capture the whole Send wrapper.
    fn get(&self) -> *mut u8 {
        self.0
    }
}

/// The ranks of a job and the collectives between them. Made by `scalefree.init()`.
#[pyclass(subclass, module = "scalefree._native")]
pub struct Group {
    comm: Arc<Mutex<Option<Communicator>>>,
    /// Peers' arenas, mapped here (kept alive while arrays from them may be in use).
    peer_arenas: Mutex<Vec<scalefree_transport::RemoteRegion>>,
    device: Device,
    #[pyo3(get)]
    rank: u32,
    #[pyo3(get)]
    pub(crate) size: u32,
    #[pyo3(get)]
    local_rank: u32,
    #[pyo3(get)]
    local_size: u32,
    #[pyo3(get)]
    job_id: String,
    #[pyo3(get)]
    launcher: String,
    /// The algorithm the last allreduce used (`last_algorithm`).
    last: Arc<Mutex<&'static str>>,
    /// The communicator's count of bytes staged (`_bytes_staged`), read without its lock.
    staged: Arc<AtomicU64>,
}

impl Group {
    pub(crate) fn with_comm<T: Send>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&mut Communicator) -> scalefree_transport::Result<T> + Send,
    ) -> PyResult<T> {
        let comm = self.comm.clone();
        let r = py.detach(move || {
            let mut guard = comm.lock().unwrap_or_else(|p| p.into_inner());
            match guard.as_mut() {
                Some(c) => f(c).map_err(Some),
                None => Err(None),
            }
        });
        match r {
            Ok(v) => Ok(v),
            Err(Some(scalefree_transport::Error::Interrupted(what))) => {
                // Peers are still inside the call: this group can no longer be used.
                self.comm.lock().unwrap_or_else(|p| p.into_inner()).take();
                Err(crate::errors::interrupted(format!("interrupted while {what}")))
            }
            Err(Some(e)) => Err(e).py_err(py),
            Err(None) => Err(invalid(py, "this group is closed")),
        }
    }
}

fn parse_algo(py: Python<'_>, s: &str) -> PyResult<Algorithm> {
    Algorithm::parse(s).py_err(py)
}

#[pymethods]
impl Group {
    /// Joins the job described by the environment (`scalefree run`, mpirun, srun,
    /// torchrun; size 1 when there is none). Collective: every rank must call it.
    #[new]
    #[pyo3(signature = (timeout=None, bootstrap_timeout=None, job_id=None, token=None))]
    fn new(py: Python<'_>, timeout: Option<f64>, bootstrap_timeout: Option<f64>, job_id: Option<String>, token: Option<String>) -> PyResult<Self> {
        let mut job = JobInfo::from_env().py_err(py)?;
        if let Some(id) = job_id {
            job.job_id = id;
        }
        if let Some(t) = token {
            job.token = t;
        }
        let mut opts = DeviceOptions::default();
        for (v, slot) in [(timeout, &mut opts.timeout), (bootstrap_timeout, &mut opts.bootstrap_timeout)] {
            if let Some(s) = v {
                if !(s > 0.0 && s.is_finite()) {
                    return Err(invalid(py, format!("timeouts must be positive seconds, got {s}")));
                }
                *slot = Duration::from_secs_f64(s);
            }
        }
        // Ctrl-C (or any Python signal handler that raises) ends a parked wait, the
        // rendezvous's too. A group interrupted in a collective is then out of step with its
        // peers, so it is closed (see `with_comm`).
        scalefree_transport::wait::set_interrupt_check(Some(crate::errors::signal_check()));
        let job2 = job.clone();
        let (device, comm) = py
            .detach(move || {
                let dev = Device::new(job2, opts)?;
                let comm = Communicator::new(dev.clone(), CommOptions::default())?;
                Ok((dev, comm))
            })
            .py_err(py)?;
        let staged = comm.staged_counter();
        Ok(Group {
            staged,
            comm: Arc::new(Mutex::new(Some(comm))),
            peer_arenas: Mutex::new(Vec::new()),
            device,
            rank: job.rank,
            size: job.size,
            local_rank: job.local_rank,
            local_size: job.local_size,
            job_id: job.job_id,
            launcher: job.launcher.name().to_string(),
            last: Arc::new(Mutex::new("")),
        })
    }

    /// Bytes this rank's collectives copied into the transport's buffers to send them
    /// since the group started (the staging copy of a buffer peers cannot reach where it
    /// is, and payloads small enough to travel with the call's header); counted by the
    /// transport where it copies, readable while a call runs.
    fn _bytes_staged(&self) -> u64 {
        self.staged.load(Ordering::Relaxed)
    }

    /// Allreduce in place; returns `a`. `op`: sum, prod, min, max. `algorithm`: auto,
    /// one_shot, direct, ring, hierarchical. `wire`: "bf16" or "fp16" rounds what crosses
    /// between hosts to 16 bits (float32 sums only; see docs/algorithms.md).
    #[pyo3(signature = (a, op="sum", algorithm="auto", wire=None))]
    fn allreduce<'py>(&self, py: Python<'py>, a: Bound<'py, PyAny>, op: &str, algorithm: &str, wire: Option<&str>) -> PyResult<Bound<'py, PyAny>> {
        let op = ReduceOp::parse(op).py_err(py)?;
        let algo = parse_algo(py, algorithm)?;
        let wire = match wire {
            None => Wire::Exact,
            Some(w) => Wire::parse(w).py_err(py)?,
        };
        let buf = Buf::get(&a, true, "allreduce: the array")?;
        let dtype = buf.reducible(py, "allreduce")?;
        let (p, count) = (SendPtr(buf.ptr()), buf.count());
        let used = self.with_comm(py, move |c| unsafe { c.allreduce_wire(p.get(), count, dtype, op, algo, wire) })?;
        *self.last.lock().unwrap_or_else(|p| p.into_inner()) = used.name();
        drop(buf);
        Ok(a)
    }

    /// The algorithm the last `allreduce` of this group used ("" before the first): one_shot,
    /// direct (over the network: the all-to-all, or halving and doubling), ring, or hierarchical.
    #[getter]
    fn last_algorithm(&self) -> &'static str {
        *self.last.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Reduce-scatter into `out`, which must hold this rank's share
    /// (`a.size*rank//size .. a.size*(rank+1)//size` of the flattened array).
    #[pyo3(signature = (a, out, op="sum", algorithm="auto"))]
    fn _reduce_scatter_into(&self, py: Python<'_>, a: Bound<'_, PyAny>, out: Bound<'_, PyAny>, op: &str, algorithm: &str) -> PyResult<()> {
        let op = ReduceOp::parse(op).py_err(py)?;
        let algo = parse_algo(py, algorithm)?;
        let input = Buf::get(&a, false, "reduce_scatter: the input")?;
        let output = Buf::get(&out, true, "reduce_scatter: out")?;
        let dtype = input.reducible(py, "reduce_scatter")?;
        if output.dtype != Some(dtype) {
            return Err(invalid(py, "reduce_scatter: out must have the input's dtype"));
        }
        let count = input.count();
        let (lo, hi) = scalefree_collectives::dense::share_bounds(count, self.size, self.rank);
        if output.count() != hi - lo {
            return Err(invalid(py, format!("reduce_scatter: out must hold {} elements (this rank's share), has {}", hi - lo, output.count())));
        }
        overlap_check(py, &input, &output)?;
        let (i, o) = (SendPtr(input.ptr()), SendPtr(output.ptr()));
        self.with_comm(py, move |c| unsafe { c.reduce_scatter(i.get(), count, o.get(), dtype, op, algo) })
    }

    /// Allgather `a` from every rank into `out` (`size * a.size` elements, rank order).
    #[pyo3(signature = (a, out, algorithm="auto"))]
    fn _allgather_into(&self, py: Python<'_>, a: Bound<'_, PyAny>, out: Bound<'_, PyAny>, algorithm: &str) -> PyResult<()> {
        let algo = parse_algo(py, algorithm)?;
        let input = Buf::get(&a, false, "allgather: the input")?;
        let output = Buf::get(&out, true, "allgather: out")?;
        let (dtype, count) = input.movable();
        if output.len_bytes() != input.len_bytes() * self.size as usize || output.format != input.format {
            return Err(invalid(py, format!(
                "allgather: out must have the input's dtype and {} times its size", self.size
            )));
        }
        let nbytes = input.len_bytes();
        let mine = unsafe { output.ptr().add(self.rank as usize * nbytes) };
        if input.ptr() != mine {
            overlap_check(py, &input, &output)?;
        }
        let (i, o) = (SendPtr(input.ptr()), SendPtr(output.ptr()));
        self.with_comm(py, move |c| unsafe { c.allgather(i.get(), count, o.get(), dtype, algo) })
    }

    /// Broadcast `a` from `root` into every rank's `a`, in place; returns `a`.
    #[pyo3(signature = (a, root=0, algorithm="auto"))]
    fn broadcast<'py>(&self, py: Python<'py>, a: Bound<'py, PyAny>, root: i64, algorithm: &str) -> PyResult<Bound<'py, PyAny>> {
        let algo = parse_algo(py, algorithm)?;
        if root < 0 || root >= self.size as i64 {
            return Err(invalid(py, format!("broadcast: root {root} is not a rank of a group of {}", self.size)));
        }
        let buf = Buf::get(&a, true, "broadcast: the array")?;
        let (dtype, count) = buf.movable();
        let p = SendPtr(buf.ptr());
        self.with_comm(py, move |c| unsafe { c.broadcast(p.get(), count, dtype, root as u32, algo) })?;
        drop(buf);
        Ok(a)
    }

    /// Collective: creates this rank's registered arena, maps every peer's, and makes it
    /// numpy's allocator for arrays of at least `min_bytes` (in the calling thread's
    /// context). Collectives on such arrays then copy nothing extra.
    #[pyo3(signature = (min_bytes=65536))]
    fn _enable_arena(&self, py: Python<'_>, min_bytes: usize) -> PyResult<()> {
        if !self.peer_arenas.lock().unwrap().is_empty() {
            return Ok(());
        }
        let dev = self.device.clone();
        let (arena, peers) = py
            .detach(move || dev.create_arena(&scalefree_transport::ArenaOptions::default()))
            .py_err(py)?;
        crate::arena::install(py, arena, min_bytes.max(1))?;
        *self.peer_arenas.lock().unwrap() = peers;
        Ok(())
    }

    /// Returns once every rank has called `barrier`.
    fn barrier(&self, py: Python<'_>) -> PyResult<()> {
        self.with_comm(py, |c| c.barrier())
    }

    /// Collective: a stale-synchronous reduction of `count` elements (see `scalefree.ssp`).
    #[pyo3(signature = (count, dtype="float32", op="sum", variant="sharded_async_thread", push_order="cyclic"))]
    fn _ssp_reduction(&self, py: Python<'_>, count: usize, dtype: &str, op: &str, variant: &str, push_order: &str) -> PyResult<crate::ssp::PySspReduction> {
        crate::ssp::PySspReduction::create(py, &self.device, count, dtype, op, variant, push_order)
    }

    /// Collective: static tensor slots from (src, dst, nbytes) specs; this rank's end of
    /// each (None where it takes no part).
    fn _static_slots(&self, py: Python<'_>, specs: Vec<(u32, u32, u64)>) -> PyResult<Vec<Option<crate::tensors::PyStaticSlot>>> {
        crate::tensors::static_slots(py, &self.device, specs)
    }

    /// Collective: dynamic tensor channels from (src, dst) pairs.
    fn _dynamic_channels(&self, py: Python<'_>, pairs: Vec<(u32, u32)>) -> PyResult<Vec<Option<crate::tensors::PyDynamicChannel>>> {
        crate::tensors::dynamic_channels(py, &self.device, pairs)
    }

    /// The one-sided device under this group (regions, channels, notifications).
    #[getter]
    fn device(&self) -> PyDevice {
        PyDevice::new(self.device.clone())
    }

    /// Whether peers can read ordinary memory of this rank directly (cross-memory attach).
    /// The backend carrying this group's traffic: `"shm"` (one host) or `"ucx"`.
    #[getter]
    fn transport(&self) -> &'static str {
        self.device.transport_name()
    }

    /// The host index of every rank (ranks of one host share it; numbered in the order of
    /// their lowest rank).
    #[getter]
    fn _hosts(&self) -> Vec<u32> {
        (0..self.device.size()).map(|r| self.device.host_of(r)).collect()
    }

    /// The UCX transports (`name/device`, e.g. `tcp/eth0`) of the endpoint to `peer`;
    /// empty on shared memory.
    fn _ucx_transports(&self, py: Python<'_>, peer: u32) -> PyResult<Vec<String>> {
        self.device.backend().routes(peer).py_err(py)
    }

    /// What this rank's channels moved to each peer so far: one (bytes written, bytes read,
    /// operations) triple per peer rank, counted where the operations are issued.
    fn _traffic(&self) -> Vec<(u64, u64, u64)> {
        self.device.traffic().into_iter().map(|t| (t.bytes_written, t.bytes_read, t.operations)).collect()
    }

    /// Bytes that peers' writes delivered straight into callers' buffers over TCP lanes
    /// (direct landing of gathered pieces); 0 on shared memory.
    fn _direct_landed_bytes(&self) -> u64 {
        self.device.direct_landing().map_or(0, |d| d.landed_bytes().0)
    }

    /// Bytes that peers' writes over TCP lanes reduced straight into callers' buffers as
    /// they arrived (the first peer's reduce-scatter pieces); 0 on shared memory.
    fn _reduced_on_arrival_bytes(&self) -> u64 {
        self.device.direct_landing().map_or(0, |d| d.landed_bytes().1)
    }

    #[getter]
    fn cross_memory_attach(&self) -> bool {
        self.device.cma_everywhere()
    }

    /// Leaves the group. Further calls raise; peers still waiting on this rank get an error.
    fn close(&self, py: Python<'_>) {
        let comm = self.comm.clone();
        py.detach(move || {
            comm.lock().unwrap_or_else(|p| p.into_inner()).take();
        });
    }

    #[getter]
    fn closed(&self) -> bool {
        self.comm.lock().map(|g| g.is_none()).unwrap_or(true)
    }

    fn __repr__(&self) -> String {
        format!("Group(rank={}, size={}, launcher={:?})", self.rank, self.size, self.launcher)
    }
}

fn overlap_check(py: Python<'_>, a: &Buf, b: &Buf) -> PyResult<()> {
    let (a0, a1) = (a.ptr() as usize, a.ptr() as usize + a.len_bytes());
    let (b0, b1) = (b.ptr() as usize, b.ptr() as usize + b.len_bytes());
    if a0 < b1 && b0 < a1 {
        return Err(invalid(py, "input and out overlap"));
    }
    Ok(())
}
