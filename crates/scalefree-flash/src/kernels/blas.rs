//! An external CBLAS `sgemm`/`dgemm` loaded at run time with `dlopen`, for the dense blocks of
//! flash gemm: typically the OpenBLAS that numpy ships, so out-of-core blocks run the same
//! micro-kernels as the in-memory product they are compared with. Given to a runtime with
//! [`crate::RuntimeOptions::blas_library`]; faer stays the default and the fallback (element
//! types or dimensions the library cannot take).
//!
//! The library keeps its own thread pool and thread count (numpy's OpenBLAS: one thread per
//! core unless limited, e.g. with threadpoolctl); it is never unloaded, because another user
//! in the process (numpy) may share it and its worker threads.

use std::any::TypeId;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use crate::dense::{DenseMut, DenseRef, Layout, Transpose};
use crate::element::Real;
use crate::error::{FlashError, Result};

type Lp64<T> = unsafe extern "C" fn(c_int, c_int, c_int, i32, i32, i32, T, *const T, i32, *const T, i32, T, *mut T, i32);
type Ilp64<T> = unsafe extern "C" fn(c_int, c_int, c_int, i64, i64, i64, T, *const T, i64, *const T, i64, T, *mut T, i64);

/// A CBLAS gemm entry point: 32-bit (LP64) or 64-bit (ILP64) integers.
#[derive(Clone, Copy)]
enum Entry<T> {
    Lp64(Lp64<T>),
    Ilp64(Ilp64<T>),
}

/// CBLAS symbol names tried in order: `(sgemm, dgemm, 64-bit integers)`. Plain CBLAS, the
/// `64_`-suffixed ILP64 build, and the prefixed builds numpy and scipy wheels ship
/// (`scipy_openblas64_`, `scipy_openblas32`).
const SYMBOLS: [(&str, &str, bool); 4] = [
    ("cblas_sgemm", "cblas_dgemm", false),
    ("cblas_sgemm64_", "cblas_dgemm64_", true),
    ("scipy_cblas_sgemm64_", "scipy_cblas_dgemm64_", true),
    ("scipy_cblas_sgemm", "scipy_cblas_dgemm", false),
];

/// Thread-count getters tried in order (OpenBLAS builds).
const THREAD_GETTERS: [&str; 3] = ["openblas_get_num_threads", "scipy_openblas_get_num_threads64_", "scipy_openblas_get_num_threads"];

const CBLAS_ROW_MAJOR: c_int = 101;
const CBLAS_COL_MAJOR: c_int = 102;
const CBLAS_NO_TRANS: c_int = 111;
const CBLAS_TRANS: c_int = 112;

/// A loaded CBLAS library.
pub struct ExternalBlas {
    path: PathBuf,
    symbol: &'static str,
    sgemm: Entry<f32>,
    dgemm: Entry<f64>,
    threads: Option<unsafe extern "C" fn() -> c_int>,
}

// SAFETY: the struct holds only function pointers into a library that is never unloaded;
// CBLAS gemm is thread-safe.
unsafe impl Send for ExternalBlas {}
unsafe impl Sync for ExternalBlas {}

impl std::fmt::Debug for ExternalBlas {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExternalBlas").field("path", &self.path).field("symbol", &self.symbol).finish()
    }
}

fn dl_error() -> String {
    // SAFETY: dlerror returns a thread-local C string or null.
    let message = unsafe { libc::dlerror() };
    if message.is_null() {
        "unknown dlopen error".into()
    } else {
        // SAFETY: non-null, NUL-terminated, valid until the next dl call on this thread.
        unsafe { CStr::from_ptr(message as *const c_char) }.to_string_lossy().into_owned()
    }
}

fn symbol(handle: *mut c_void, name: &str) -> *mut c_void {
    let name = CString::new(name).expect("symbol names have no NUL");
    // SAFETY: a valid handle and a NUL-terminated name.
    unsafe { libc::dlsym(handle, name.as_ptr()) }
}

impl ExternalBlas {
    /// Loads the CBLAS library at `path` (kept loaded for the life of the process).
    pub fn load(path: &Path) -> Result<ExternalBlas> {
        let invalid = |reason: String| FlashError::invalid(format!("BLAS library {}: {reason}", path.display()));
        let c_path = CString::new(path.as_os_str().as_bytes()).map_err(|_| invalid("path contains a NUL byte".into()))?;
        // SAFETY: a NUL-terminated path; the handle is never closed (see the module docs).
        let handle = unsafe { libc::dlopen(c_path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if handle.is_null() {
            return Err(invalid(dl_error()));
        }
        for (s, d, ilp64) in SYMBOLS {
            let (sp, dp) = (symbol(handle, s), symbol(handle, d));
            if sp.is_null() || dp.is_null() {
                continue;
            }
            // SAFETY: the symbols are the CBLAS gemm entry points named after their integer
            // width; the signatures above are CBLAS's.
            let (sgemm, dgemm) = unsafe {
                if ilp64 {
                    (Entry::Ilp64(std::mem::transmute::<*mut c_void, Ilp64<f32>>(sp)), Entry::Ilp64(std::mem::transmute::<*mut c_void, Ilp64<f64>>(dp)))
                } else {
                    (Entry::Lp64(std::mem::transmute::<*mut c_void, Lp64<f32>>(sp)), Entry::Lp64(std::mem::transmute::<*mut c_void, Lp64<f64>>(dp)))
                }
            };
            let threads = THREAD_GETTERS.iter().map(|name| symbol(handle, name)).find(|p| !p.is_null()).map(|p| {
                // SAFETY: OpenBLAS's `int get_num_threads(void)`.
                unsafe { std::mem::transmute::<*mut c_void, unsafe extern "C" fn() -> c_int>(p) }
            });
            return Ok(ExternalBlas { path: path.to_path_buf(), symbol: s, sgemm, dgemm, threads });
        }
        Err(invalid(format!("no CBLAS gemm symbol (tried {})", SYMBOLS.iter().map(|s| s.0).collect::<Vec<_>>().join(", "))))
    }

    /// The library's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The `sgemm` symbol in use (names the integer width and build).
    pub fn symbol(&self) -> &'static str {
        self.symbol
    }

    /// The library's thread count, where it says (OpenBLAS).
    pub fn threads(&self) -> Option<usize> {
        // SAFETY: OpenBLAS's thread-count getter takes no arguments.
        self.threads.map(|get| unsafe { get() }.max(1) as usize)
    }

    /// `C := alpha op(A) op(B) + beta C` through the library. Returns `Ok(false)` without
    /// touching C when it cannot (an element type other than f32/f64, or dimensions over
    /// 32 bits for an LP64 library); shapes must have been checked (all dimensions positive).
    #[allow(clippy::too_many_arguments)]
    pub fn gemm<T: Real>(&self, trans_a: Transpose, trans_b: Transpose, alpha: T, a: DenseRef<'_, T>, b: DenseRef<'_, T>, beta: T, c: &mut DenseMut<'_, T>) -> bool {
        let c_shape = c.shape();
        let (a_shape, b_shape) = (a.shape(), b.shape());
        let (m, n) = (c_shape.rows, c_shape.cols);
        let k = a_shape.op_dims(trans_a).1;
        // CBLAS takes one layout (C's); an operand stored the other way is its transpose.
        let flag = |transpose: Transpose, layout: Layout| match (transpose == Transpose::Yes) != (layout != c_shape.layout) {
            true => CBLAS_TRANS,
            false => CBLAS_NO_TRANS,
        };
        let (ta, tb) = (flag(trans_a, a_shape.layout), flag(trans_b, b_shape.layout));
        let order = if c_shape.layout == Layout::RowMajor { CBLAS_ROW_MAJOR } else { CBLAS_COL_MAJOR };
        let (lda, ldb, ldc) = (a_shape.leading_dim.max(1), b_shape.leading_dim.max(1), c_shape.leading_dim.max(1));
        let dims = [m, n, k, lda, ldb, ldc];
        macro_rules! call {
            ($entry:expr, $t:ty) => {{
                let (pa, pb, pc) = (a.data().as_ptr() as *const $t, b.data().as_ptr() as *const $t, c.data().as_mut_ptr() as *mut $t);
                let (alpha, beta) = (alpha.to_f64() as $t, beta.to_f64() as $t);
                match $entry {
                    Entry::Lp64(f) => {
                        if dims.iter().any(|&d| d > i32::MAX as usize) {
                            return false;
                        }
                        // SAFETY: the views were validated against their slices (the
                        // leading dimensions cover every row/column), C is borrowed mutably,
                        // and the flags and leading dimensions describe exactly those views.
                        unsafe { f(order, ta, tb, m as i32, n as i32, k as i32, alpha, pa, lda as i32, pb, ldb as i32, beta, pc, ldc as i32) }
                    }
                    // SAFETY: as above.
                    Entry::Ilp64(f) => unsafe { f(order, ta, tb, m as i64, n as i64, k as i64, alpha, pa, lda as i64, pb, ldb as i64, beta, pc, ldc as i64) },
                }
                true
            }};
        }
        if TypeId::of::<T>() == TypeId::of::<f32>() {
            call!(self.sgemm, f32)
        } else if TypeId::of::<T>() == TypeId::of::<f64>() {
            call!(self.dgemm, f64)
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_library_and_symbols_are_named_errors() {
        let err = ExternalBlas::load(Path::new("/nonexistent/libblas.so")).unwrap_err();
        assert!(err.to_string().contains("/nonexistent/libblas.so"), "{err}");
        // libc has no CBLAS symbols.
        let libc_path = Path::new("libc.so.6");
        let err = ExternalBlas::load(libc_path).unwrap_err();
        assert!(err.to_string().contains("no CBLAS gemm symbol"), "{err}");
    }
}
