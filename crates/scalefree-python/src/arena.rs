//! numpy's data allocator backed by the registered arena: once installed, every numpy
//! array of at least `min_bytes` allocated in this thread's context lives in shared
//! memory that peers map, so collectives on it move no extra copy.
//!
//! Small arrays and everything that does not fit go to the C allocator as before. Each
//! array remembers the handler that allocated it, so uninstalling is always safe.
//!
//! Allocation-site tracing (the RDMA tensor paper, §3.4): an array below `min_bytes` (and
//! at least [`SITE_MIN`] bytes) allocated from Python code remembers its *site*, a key made
//! of the innermost two Python frames outside numpy (code object and instruction). When
//! such an array is sent through a staging copy ([`mark_site`], called by the tensor
//! channels), its site is traced, and every later allocation from that site comes from the
//! arena: sending it then copies nothing, with no site named in user code.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Mutex;

use std::ffi::{c_int, c_void, CStr};
use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::Arc;

use pyo3::ffi;
use pyo3::prelude::*;
use scalefree_transport::Arena;

#[repr(C)]
struct PyDataMemAllocator {
    ctx: *mut c_void,
    malloc: unsafe extern "C" fn(*mut c_void, usize) -> *mut c_void,
    calloc: unsafe extern "C" fn(*mut c_void, usize, usize) -> *mut c_void,
    realloc: unsafe extern "C" fn(*mut c_void, *mut c_void, usize) -> *mut c_void,
    free: unsafe extern "C" fn(*mut c_void, *mut c_void, usize),
}

#[repr(C)]
struct PyDataMemHandler {
    name: [u8; 127],
    version: u8,
    allocator: PyDataMemAllocator,
}

struct Ctx {
    arena: Arc<Arena>,
    min_bytes: usize,
}

/// Smallest allocation whose site is remembered (smaller tensors cost little to stage).
pub const SITE_MIN: usize = 4096;

/// What the tracing knows: traced sites, the site of every live small allocation, and
/// which code objects belong to numpy (skipped when making a key).
struct Sites {
    traced: HashSet<u64>,
    /// Start address -> (length, site) of live allocations below the arena threshold.
    live: BTreeMap<usize, (usize, u64)>,
    numpy_code: HashMap<usize, bool>,
}

static SITES: Mutex<Option<Sites>> = Mutex::new(None);

fn with_sites<T>(f: impl FnOnce(&mut Sites) -> T) -> T {
    let mut g = SITES.lock().unwrap_or_else(|p| p.into_inner());
    let s = g.get_or_insert_with(|| Sites { traced: HashSet::new(), live: BTreeMap::new(), numpy_code: HashMap::new() });
    f(s)
}

/// Whether a code object is numpy's own (its file is under a `numpy` package directory).
unsafe fn is_numpy_code(code: *mut ffi::PyObject) -> bool {
    let name = unsafe { ffi::PyObject_GetAttrString(code, c"co_filename".as_ptr()) };
    if name.is_null() {
        unsafe { ffi::PyErr_Clear() };
        return false;
    }
    let mut len: ffi::Py_ssize_t = 0;
    let p = unsafe { ffi::PyUnicode_AsUTF8AndSize(name, &mut len) };
    let r = if p.is_null() {
        unsafe { ffi::PyErr_Clear() };
        false
    } else {
        let f = unsafe { std::slice::from_raw_parts(p as *const u8, len as usize) };
        f.windows(7).any(|w| w == b"/numpy/")
    };
    unsafe { ffi::Py_DECREF(name) };
    r
}

/// Whether `code` is numpy's, cached per code object. No lock is held while Python runs
/// (it may collect garbage, and freeing an array takes the lock).
unsafe fn numpy_code(code: *mut ffi::PyObject) -> bool {
    if let Some(v) = with_sites(|s| s.numpy_code.get(&(code as usize)).copied()) {
        return v;
    }
    let v = unsafe { is_numpy_code(code) };
    with_sites(|s| s.numpy_code.insert(code as usize, v));
    v
}

/// The calling site: the innermost two Python frames outside numpy (code object and last
/// instruction of each), hashed; None without a Python frame or the GIL.
unsafe fn site_key() -> Option<u64> {
    if unsafe { pyo3::ffi::PyGILState_Check() } != 1 {
        return None;
    }
    let mut frame = unsafe { ffi::PyEval_GetFrame() };
    if frame.is_null() {
        return None;
    }
    unsafe { ffi::Py_INCREF(frame as *mut ffi::PyObject) };
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut taken = 0;
    let mut depth = 0;
    while !frame.is_null() && taken < 2 && depth < 32 {
        let code = unsafe { ffi::PyFrame_GetCode(frame) } as *mut ffi::PyObject;
        let lasti: c_int = unsafe { ffi::PyFrame_GetLasti(frame) };
        let numpy = unsafe { numpy_code(code) };
        if !numpy {
            for v in [code as usize as u64, lasti as u64] {
                h = (h ^ v).wrapping_mul(0x0100_0000_01b3);
            }
            taken += 1;
        }
        unsafe { ffi::Py_DECREF(code) };
        let back = unsafe { ffi::PyFrame_GetBack(frame) };
        unsafe { ffi::Py_DECREF(frame as *mut ffi::PyObject) };
        frame = back;
        depth += 1;
    }
    if !frame.is_null() {
        unsafe { ffi::Py_DECREF(frame as *mut ffi::PyObject) };
    }
    (taken > 0).then_some(h)
}

/// A small allocation: from the arena when its site is traced, else from the C allocator
/// (remembering its site). `zero`: calloc semantics.
unsafe fn small_alloc(c: &Ctx, size: usize, zero: bool) -> *mut c_void {
    let site = if size >= SITE_MIN { unsafe { site_key() }.map(|k| (k, with_sites(|s| s.traced.contains(&k)))) } else { None };
    if let Some((_, true)) = site {
        if let Some(b) = c.arena.alloc(size) {
            if zero && !b.zeroed {
                unsafe { std::ptr::write_bytes(b.ptr, 0, size) };
            }
            return b.ptr as *mut c_void;
        }
    }
    let p = unsafe { if zero { libc::calloc(size, 1) } else { libc::malloc(size) } };
    if let (Some((k, _)), false) = (site, p.is_null()) {
        with_sites(|s| s.live.insert(p as usize, (size, k)));
    }
    p
}

fn forget(ptr: *mut c_void) {
    if !ptr.is_null() {
        with_sites(|s| s.live.remove(&(ptr as usize)));
    }
}

/// Traces the allocation site of the live small allocation holding `ptr`, if it has one
/// (the tensor channels call it when they had to stage an array). True if a site was
/// traced.
pub fn mark_site(ptr: usize) -> bool {
    with_sites(|s| {
        let hit = s.live.range(..=ptr).next_back().filter(|(start, (len, _))| ptr < **start + (*len).max(1)).map(|(_, (_, k))| *k);
        match hit {
            Some(k) => {
                s.traced.insert(k);
                true
            }
            None => false,
        }
    })
}

/// How many allocation sites are traced.
pub fn traced_sites() -> usize {
    with_sites(|s| s.traced.len())
}

unsafe extern "C" fn sf_malloc(ctx: *mut c_void, size: usize) -> *mut c_void {
    let c = unsafe { &*(ctx as *const Ctx) };
    if size >= c.min_bytes {
        if let Some(b) = c.arena.alloc(size) {
            return b.ptr as *mut c_void;
        }
        return unsafe { libc::malloc(size) };
    }
    unsafe { small_alloc(c, size, false) }
}

unsafe extern "C" fn sf_calloc(ctx: *mut c_void, n: usize, elsize: usize) -> *mut c_void {
    let c = unsafe { &*(ctx as *const Ctx) };
    let Some(size) = n.checked_mul(elsize) else { return std::ptr::null_mut() };
    if size >= c.min_bytes {
        if let Some(b) = c.arena.alloc(size) {
            if !b.zeroed {
                unsafe { std::ptr::write_bytes(b.ptr, 0, size) };
            }
            return b.ptr as *mut c_void;
        }
        return unsafe { libc::calloc(n, elsize) };
    }
    unsafe { small_alloc(c, size, true) }
}

unsafe extern "C" fn sf_realloc(ctx: *mut c_void, ptr: *mut c_void, size: usize) -> *mut c_void {
    let c = unsafe { &*(ctx as *const Ctx) };
    if ptr.is_null() {
        return unsafe { sf_malloc(ctx, size) };
    }
    if !c.arena.contains(ptr as *const u8) {
        forget(ptr);
        return unsafe { libc::realloc(ptr, size) };
    }
    let region_end = c.arena.region().as_ptr() as usize + c.arena.region().len();
    // After a fork the block length is unknown; bytes past the old end are undefined in a
    // realloc anyway, so copying up to `size` (within the mapping) is correct.
    let old = c.arena.block_len(ptr as *const u8).unwrap_or(region_end - ptr as usize);
    let new = unsafe { sf_malloc(ctx, size) };
    if !new.is_null() {
        unsafe { std::ptr::copy_nonoverlapping(ptr as *const u8, new as *mut u8, old.min(size)) };
        c.arena.free(ptr as *mut u8);
    }
    new
}

unsafe extern "C" fn sf_free(ctx: *mut c_void, ptr: *mut c_void, size: usize) {
    let c = unsafe { &*(ctx as *const Ctx) };
    if c.arena.contains(ptr as *const u8) {
        c.arena.free(ptr as *mut u8);
    } else {
        if size >= SITE_MIN {
            forget(ptr);
        }
        unsafe { libc::free(ptr) };
    }
}

/// The arena whose mapping a forked child must make private.
static FORK_ARENA: AtomicPtr<Arena> = AtomicPtr::new(std::ptr::null_mut());

extern "C" fn after_fork_in_child() {
    let a = FORK_ARENA.load(Ordering::SeqCst);
    if !a.is_null() {
        unsafe { (*a).privatize_after_fork() };
    }
}

/// The numpy C-API table (`_ARRAY_API`).
fn numpy_api(py: Python<'_>) -> PyResult<*const *const c_void> {
    let module = py
        .import("numpy._core._multiarray_umath")
        .or_else(|_| py.import("numpy.core.multiarray"))?;
    let capsule = module.getattr("_ARRAY_API")?;
    let p = unsafe { ffi::PyCapsule_GetPointer(capsule.as_ptr(), std::ptr::null()) };
    if p.is_null() {
        return Err(PyErr::fetch(py));
    }
    Ok(p as *const *const c_void)
}

/// Installs the arena as numpy's allocator for the current context. Arrays of at least
/// `min_bytes` are allocated from it. The arena stays alive for the rest of the process
/// (arrays may outlive every group).
pub fn install(py: Python<'_>, arena: Arc<Arena>, min_bytes: usize) -> PyResult<()> {
    let version: Vec<u32> = py
        .import("numpy")?
        .getattr("__version__")?
        .extract::<String>()?
        .split('.')
        .take(2)
        .map(|x| x.parse().unwrap_or(0))
        .collect();
    if version < vec![1, 22] {
        return Err(pyo3::exceptions::PyRuntimeError::new_err("the arena needs numpy >= 1.22 (PyDataMem_SetHandler)"));
    }
    let api = numpy_api(py)?;
    let set_handler: unsafe extern "C" fn(*mut ffi::PyObject) -> *mut ffi::PyObject =
        unsafe { std::mem::transmute(*api.add(304)) };
    let ctx = Box::into_raw(Box::new(Ctx { arena: arena.clone(), min_bytes })) as *mut c_void;
    let mut name = [0u8; 127];
    let label = b"scalefree_arena";
    name[..label.len()].copy_from_slice(label);
    let handler = Box::into_raw(Box::new(PyDataMemHandler {
        name,
        version: 1,
        allocator: PyDataMemAllocator { ctx, malloc: sf_malloc, calloc: sf_calloc, realloc: sf_realloc, free: sf_free },
    }));
    let cname: &'static CStr = c"mem_handler";
    let capsule = unsafe { ffi::PyCapsule_New(handler as *mut c_void, cname.as_ptr(), None) };
    if capsule.is_null() {
        return Err(PyErr::fetch(py));
    }
    let old = unsafe { set_handler(capsule) };
    unsafe { ffi::Py_DECREF(capsule) };
    if old.is_null() {
        return Err(PyErr::fetch(py));
    }
    unsafe { ffi::Py_DECREF(old) };
    // Leak one reference: the arena must outlive every array allocated from it.
    let raw = Arc::into_raw(arena) as *mut Arena;
    if FORK_ARENA.swap(raw, Ordering::SeqCst).is_null() {
        unsafe { libc::pthread_atfork(None, None, Some(after_fork_in_child)) };
    }
    Ok(())
}

/// Returns the pages of the arena's freed blocks to the kernel (`Arena::release_cached`):
/// the bytes released, 0 without an arena.
#[pyfunction]
pub fn arena_release_cached(py: Python<'_>) -> usize {
    let a = FORK_ARENA.load(Ordering::SeqCst);
    if a.is_null() {
        return 0;
    }
    // SAFETY: the installed arena is leaked (never dropped) once installed.
    let a: &'static Arena = unsafe { &*a };
    py.detach(|| a.release_cached())
}

/// Traces the allocation site of the array whose data starts at `ptr` (see [`mark_site`]).
#[pyfunction]
pub fn _trace_site(ptr: usize) -> bool {
    mark_site(ptr)
}

/// How many allocation sites are traced in this process.
#[pyfunction]
pub fn _traced_site_count() -> usize {
    traced_sites()
}
