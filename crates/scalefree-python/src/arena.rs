//! numpy's data allocator backed by the registered arena: once installed, every numpy
//! array of at least `min_bytes` allocated in this thread's context lives in shared
//! memory that peers map, so collectives on it move no extra copy.
//!
//! Small arrays and everything that does not fit go to the C allocator as before. Each
//! array remembers the handler that allocated it, so uninstalling is always safe.

use std::ffi::{c_void, CStr};
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

unsafe extern "C" fn sf_malloc(ctx: *mut c_void, size: usize) -> *mut c_void {
    let c = unsafe { &*(ctx as *const Ctx) };
    if size >= c.min_bytes {
        if let Some(b) = c.arena.alloc(size) {
            return b.ptr as *mut c_void;
        }
    }
    unsafe { libc::malloc(size) }
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
    }
    unsafe { libc::calloc(n, elsize) }
}

unsafe extern "C" fn sf_realloc(ctx: *mut c_void, ptr: *mut c_void, size: usize) -> *mut c_void {
    let c = unsafe { &*(ctx as *const Ctx) };
    if ptr.is_null() {
        return unsafe { sf_malloc(ctx, size) };
    }
    if !c.arena.contains(ptr as *const u8) {
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

unsafe extern "C" fn sf_free(ctx: *mut c_void, ptr: *mut c_void, _size: usize) {
    let c = unsafe { &*(ctx as *const Ctx) };
    if c.arena.contains(ptr as *const u8) {
        c.arena.free(ptr as *mut u8);
    } else {
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
