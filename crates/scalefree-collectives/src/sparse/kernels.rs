//! Element types and operators of the sparse allreduce, and its three value kernels:
//! fill with the identity, scatter-combine rows through a map, gather rows through a map.

use scalefree_transport::{Error, Result};

/// Element type of sparse values (unsigned types exist for bitwise OR, e.g. HADI).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum SDType {
    F32 = 1,
    F64 = 2,
    I32 = 3,
    I64 = 4,
    U32 = 5,
    U64 = 6,
}

impl SDType {
    pub fn size_bytes(self) -> usize {
        match self {
            SDType::F32 | SDType::I32 | SDType::U32 => 4,
            _ => 8,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            SDType::F32 => "float32",
            SDType::F64 => "float64",
            SDType::I32 => "int32",
            SDType::I64 => "int64",
            SDType::U32 => "uint32",
            SDType::U64 => "uint64",
        }
    }
    pub fn parse(s: &str) -> Result<Self> {
        Ok(match s {
            "float32" => SDType::F32,
            "float64" => SDType::F64,
            "int32" => SDType::I32,
            "int64" => SDType::I64,
            "uint32" => SDType::U32,
            "uint64" => SDType::U64,
            _ => {
                return Err(Error::InvalidArgument(format!(
                    "sparse_allreduce values must be float32, float64, int32, int64, uint32 or uint64, not {s}"
                )))
            }
        })
    }
    pub fn from_u32(v: u32) -> Option<Self> {
        Some(match v {
            1 => SDType::F32,
            2 => SDType::F64,
            3 => SDType::I32,
            4 => SDType::I64,
            5 => SDType::U32,
            6 => SDType::U64,
            _ => return None,
        })
    }
}

/// Combining operator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum SOp {
    Sum = 1,
    Max = 2,
    Min = 3,
    Or = 4,
}

impl SOp {
    pub fn name(self) -> &'static str {
        match self {
            SOp::Sum => "sum",
            SOp::Max => "max",
            SOp::Min => "min",
            SOp::Or => "or",
        }
    }
    pub fn parse(s: &str) -> Result<Self> {
        Ok(match s {
            "sum" => SOp::Sum,
            "max" => SOp::Max,
            "min" => SOp::Min,
            "or" => SOp::Or,
            _ => return Err(Error::InvalidArgument(format!("unknown sparse op {s:?}: expected sum, max, min or or"))),
        })
    }
    pub fn from_u32(v: u32) -> Option<Self> {
        Some(match v {
            1 => SOp::Sum,
            2 => SOp::Max,
            3 => SOp::Min,
            4 => SOp::Or,
            _ => return None,
        })
    }
    /// Bitwise OR is only defined on unsigned integers.
    pub fn check(self, dtype: SDType) -> Result<()> {
        if self == SOp::Or && !matches!(dtype, SDType::U32 | SDType::U64) {
            return Err(Error::InvalidArgument(format!("op=or needs uint32 or uint64 values, got {}", dtype.name())));
        }
        Ok(())
    }
}

trait Elem: Copy {
    fn identity(op: SOp) -> Self;
    fn comb(op: SOp, a: Self, b: Self) -> Self;
}

macro_rules! float_elem {
    ($t:ty) => {
        impl Elem for $t {
            fn identity(op: SOp) -> Self {
                match op {
                    SOp::Max => <$t>::NEG_INFINITY,
                    SOp::Min => <$t>::INFINITY,
                    _ => 0.0,
                }
            }
            #[inline(always)]
            fn comb(op: SOp, a: Self, b: Self) -> Self {
                match op {
                    SOp::Sum => a + b,
                    // NaN-propagating like numpy's maximum/minimum.
                    SOp::Max => if a > b || a != a { a } else { b },
                    SOp::Min => if a < b || a != a { a } else { b },
                    SOp::Or => a,
                }
            }
        }
    };
}
macro_rules! int_elem {
    ($t:ty) => {
        impl Elem for $t {
            fn identity(op: SOp) -> Self {
                match op {
                    SOp::Max => <$t>::MIN,
                    SOp::Min => <$t>::MAX,
                    _ => 0,
                }
            }
            #[inline(always)]
            fn comb(op: SOp, a: Self, b: Self) -> Self {
                match op {
                    SOp::Sum => a.wrapping_add(b),
                    SOp::Max => Ord::max(a, b),
                    SOp::Min => Ord::min(a, b),
                    SOp::Or => a | b,
                }
            }
        }
    };
}
float_elem!(f32);
float_elem!(f64);
int_elem!(i32);
int_elem!(i64);
int_elem!(u32);
int_elem!(u64);

/// A position that has no source (reads as the identity).
pub const NONE: usize = usize::MAX;

unsafe fn fill_t<T: Elem>(op: SOp, dst: *mut u8, n: usize) {
    let d = unsafe { std::slice::from_raw_parts_mut(dst as *mut T, n) };
    d.fill(T::identity(op));
}

#[inline(always)]
unsafe fn scatter_op<T: Elem>(dst: *mut T, src: *const T, map: &[usize], w: usize, f: impl Fn(T, T) -> T) {
    if w == 1 {
        for (i, &m) in map.iter().enumerate() {
            unsafe {
                let d = dst.add(m);
                *d = f(*d, *src.add(i));
            }
        }
    } else {
        for (i, &m) in map.iter().enumerate() {
            for c in 0..w {
                unsafe {
                    let d = dst.add(m * w + c);
                    *d = f(*d, *src.add(i * w + c));
                }
            }
        }
    }
}

unsafe fn scatter_t<T: Elem>(op: SOp, dst: *mut u8, src: *const u8, map: &[usize], w: usize) {
    let (d, s) = (dst as *mut T, src as *const T);
    unsafe {
        match op {
            SOp::Sum => scatter_op(d, s, map, w, |a, b| T::comb(SOp::Sum, a, b)),
            SOp::Max => scatter_op(d, s, map, w, |a, b| T::comb(SOp::Max, a, b)),
            SOp::Min => scatter_op(d, s, map, w, |a, b| T::comb(SOp::Min, a, b)),
            SOp::Or => scatter_op(d, s, map, w, |a, b| T::comb(SOp::Or, a, b)),
        }
    }
}

unsafe fn gather_t<T: Elem>(op: SOp, dst: *mut u8, src: *const u8, map: &[usize], w: usize) {
    let (d, s) = (dst as *mut T, src as *const T);
    let id = T::identity(op);
    for (i, &m) in map.iter().enumerate() {
        for c in 0..w {
            unsafe { *d.add(i * w + c) = if m == NONE { id } else { *s.add(m * w + c) } };
        }
    }
}

macro_rules! dispatch {
    ($dtype:expr, $f:ident, $($arg:expr),*) => {
        match $dtype {
            SDType::F32 => $f::<f32>($($arg),*),
            SDType::F64 => $f::<f64>($($arg),*),
            SDType::I32 => $f::<i32>($($arg),*),
            SDType::I64 => $f::<i64>($($arg),*),
            SDType::U32 => $f::<u32>($($arg),*),
            SDType::U64 => $f::<u64>($($arg),*),
        }
    };
}

/// Fills `n` elements at `dst` with the identity of `op`.
///
/// # Safety
/// `dst` valid and aligned for `n` elements of `dtype`.
pub unsafe fn fill_identity(dtype: SDType, op: SOp, dst: *mut u8, n: usize) {
    unsafe { dispatch!(dtype, fill_t, op, dst, n) }
}

/// `dst[map[i]] = dst[map[i]] op src[i]` for rows of `w` elements.
///
/// # Safety
/// Pointers valid and aligned for the rows named by `map`.
pub unsafe fn scatter(dtype: SDType, op: SOp, dst: *mut u8, src: *const u8, map: &[usize], w: usize) {
    unsafe { dispatch!(dtype, scatter_t, op, dst, src, map, w) }
}

/// `dst[i] = src[map[i]]` for rows of `w` elements (the identity where `map[i] == NONE`).
///
/// # Safety
/// Pointers valid and aligned for the rows named by `map`.
pub unsafe fn gather(dtype: SDType, op: SOp, dst: *mut u8, src: *const u8, map: &[usize], w: usize) {
    unsafe { dispatch!(dtype, gather_t, op, dst, src, map, w) }
}
