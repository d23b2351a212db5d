//! Element types, reduction operators, and the one reduction kernel (`dst = dst op src`).
//!
//! The loops are written over slices so the compiler vectorises them; a reduction is
//! memory-bound, so one portable kernel per (dtype, op) is enough.

use scalefree_transport::{Error, Result};

/// Element type of a collective's buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum DType {
    F32 = 1,
    F64 = 2,
    I32 = 3,
    I64 = 4,
    /// uint8, and raw bytes: any other dtype moves (broadcast, allgather) as bytes. Reduced
    /// as uint8 (wrapping sum and product, as numpy does).
    U8 = 5,
}

impl DType {
    pub fn size_bytes(self) -> usize {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::F64 | DType::I64 => 8,
            DType::U8 => 1,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "float32",
            DType::F64 => "float64",
            DType::I32 => "int32",
            DType::I64 => "int64",
            DType::U8 => "uint8",
        }
    }
    pub fn from_u32(v: u32) -> Option<Self> {
        Some(match v {
            1 => DType::F32,
            2 => DType::F64,
            3 => DType::I32,
            4 => DType::I64,
            5 => DType::U8,
            _ => return None,
        })
    }
}

/// Reduction operator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum ReduceOp {
    Sum = 1,
    Prod = 2,
    Min = 3,
    Max = 4,
}

impl ReduceOp {
    pub fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Prod => "prod",
            ReduceOp::Min => "min",
            ReduceOp::Max => "max",
        }
    }
    pub fn parse(s: &str) -> Result<Self> {
        Ok(match s {
            "sum" => ReduceOp::Sum,
            "prod" => ReduceOp::Prod,
            "min" => ReduceOp::Min,
            "max" => ReduceOp::Max,
            _ => {
                return Err(Error::InvalidArgument(format!(
                    "unknown op {s:?}: expected one of sum, prod, min, max"
                )))
            }
        })
    }
    pub fn from_u32(v: u32) -> Option<Self> {
        Some(match v {
            1 => ReduceOp::Sum,
            2 => ReduceOp::Prod,
            3 => ReduceOp::Min,
            4 => ReduceOp::Max,
            _ => return None,
        })
    }
}

trait Elem: Copy {
    fn sum(a: Self, b: Self) -> Self;
    fn prod(a: Self, b: Self) -> Self;
    fn min(a: Self, b: Self) -> Self;
    fn max(a: Self, b: Self) -> Self;
    /// `x op identity == x`: what a reduction of nothing is.
    fn identity(op: ReduceOp) -> Self;
}

macro_rules! float_elem {
    ($t:ty) => {
        impl Elem for $t {
            #[inline(always)]
            fn sum(a: Self, b: Self) -> Self { a + b }
            #[inline(always)]
            fn prod(a: Self, b: Self) -> Self { a * b }
            // NaN-propagating like numpy's minimum/maximum.
            #[inline(always)]
            fn min(a: Self, b: Self) -> Self { if a < b || a != a { a } else { b } }
            #[inline(always)]
            fn max(a: Self, b: Self) -> Self { if a > b || a != a { a } else { b } }
            fn identity(op: ReduceOp) -> Self {
                match op {
                    ReduceOp::Sum => 0.0,
                    ReduceOp::Prod => 1.0,
                    ReduceOp::Min => <$t>::INFINITY,
                    ReduceOp::Max => <$t>::NEG_INFINITY,
                }
            }
        }
    };
}
macro_rules! int_elem {
    ($t:ty) => {
        impl Elem for $t {
            #[inline(always)]
            fn sum(a: Self, b: Self) -> Self { a.wrapping_add(b) }
            #[inline(always)]
            fn prod(a: Self, b: Self) -> Self { a.wrapping_mul(b) }
            #[inline(always)]
            fn min(a: Self, b: Self) -> Self { Ord::min(a, b) }
            #[inline(always)]
            fn max(a: Self, b: Self) -> Self { Ord::max(a, b) }
            fn identity(op: ReduceOp) -> Self {
                match op {
                    ReduceOp::Sum => 0,
                    ReduceOp::Prod => 1,
                    ReduceOp::Min => <$t>::MAX,
                    ReduceOp::Max => <$t>::MIN,
                }
            }
        }
    };
}
float_elem!(f32);
float_elem!(f64);
int_elem!(i32);
int_elem!(i64);
int_elem!(u8);

#[inline(always)]
fn apply3<T: Elem>(dst: &mut [T], a: &[T], b: &[T], f: impl Fn(T, T) -> T) {
    for ((d, &x), &y) in dst.iter_mut().zip(a).zip(b) {
        *d = f(x, y);
    }
}

#[inline(always)]
fn apply2<T: Elem>(dst: &mut [T], b: &[T], f: impl Fn(T, T) -> T) {
    for (d, &y) in dst.iter_mut().zip(b) {
        *d = f(*d, y);
    }
}

unsafe fn typed<T: Elem>(op: ReduceOp, dst: *mut u8, a: *const u8, b: *const u8, n: usize) {
    let d = unsafe { std::slice::from_raw_parts_mut(dst as *mut T, n) };
    let b = unsafe { std::slice::from_raw_parts(b as *const T, n) };
    if std::ptr::eq(a, dst) {
        // In place: two operands, so no slice aliases another.
        match op {
            ReduceOp::Sum => apply2(d, b, T::sum),
            ReduceOp::Prod => apply2(d, b, T::prod),
            ReduceOp::Min => apply2(d, b, T::min),
            ReduceOp::Max => apply2(d, b, T::max),
        }
        return;
    }
    let a = unsafe { std::slice::from_raw_parts(a as *const T, n) };
    match op {
        ReduceOp::Sum => apply3(d, a, b, T::sum),
        ReduceOp::Prod => apply3(d, a, b, T::prod),
        ReduceOp::Min => apply3(d, a, b, T::min),
        ReduceOp::Max => apply3(d, a, b, T::max),
    }
}

/// `dst[i] = a[i] op b[i]` for `n` elements. `dst` may equal `a` (in place); the pointers
/// need no alignment beyond the element's.
///
/// # Safety
/// All three ranges must be valid for `n` elements of `dtype`; `dst` may be `a` exactly,
/// otherwise no range may overlap `dst`.
pub unsafe fn reduce3(dtype: DType, op: ReduceOp, dst: *mut u8, a: *const u8, b: *const u8, n: usize) {
    if n == 0 {
        return;
    }
    unsafe {
        match dtype {
            DType::F32 => typed::<f32>(op, dst, a, b, n),
            DType::F64 => typed::<f64>(op, dst, a, b, n),
            DType::I32 => typed::<i32>(op, dst, a, b, n),
            DType::I64 => typed::<i64>(op, dst, a, b, n),
            DType::U8 => typed::<u8>(op, dst, a, b, n),
        }
    }
}

#[inline(always)]
fn apply4<T: Elem>(dst: &mut [T], a: &[T], b: &[T], c: &[T], f: impl Fn(T, T) -> T) {
    for (((d, &x), &y), &z) in dst.iter_mut().zip(a).zip(b).zip(c) {
        *d = f(f(x, y), z);
    }
}

unsafe fn typed4<T: Elem>(op: ReduceOp, dst: *mut u8, a: *const u8, b: *const u8, c: *const u8, n: usize) {
    let d = unsafe { std::slice::from_raw_parts_mut(dst as *mut T, n) };
    let (a, b, c) = unsafe {
        (
            std::slice::from_raw_parts(a as *const T, n),
            std::slice::from_raw_parts(b as *const T, n),
            std::slice::from_raw_parts(c as *const T, n),
        )
    };
    match op {
        ReduceOp::Sum => apply4(d, a, b, c, T::sum),
        ReduceOp::Prod => apply4(d, a, b, c, T::prod),
        ReduceOp::Min => apply4(d, a, b, c, T::min),
        ReduceOp::Max => apply4(d, a, b, c, T::max),
    }
}

#[inline(always)]
fn apply3_in_place<T: Elem>(dst: &mut [T], b: &[T], c: &[T], f: impl Fn(T, T) -> T) {
    for ((d, &y), &z) in dst.iter_mut().zip(b).zip(c) {
        *d = f(f(*d, y), z);
    }
}

unsafe fn typed4_into<T: Elem>(op: ReduceOp, dst: *mut u8, b: *const u8, c: *const u8, n: usize) {
    let d = unsafe { std::slice::from_raw_parts_mut(dst as *mut T, n) };
    let (b, c) = unsafe { (std::slice::from_raw_parts(b as *const T, n), std::slice::from_raw_parts(c as *const T, n)) };
    match op {
        ReduceOp::Sum => apply3_in_place(d, b, c, T::sum),
        ReduceOp::Prod => apply3_in_place(d, b, c, T::prod),
        ReduceOp::Min => apply3_in_place(d, b, c, T::min),
        ReduceOp::Max => apply3_in_place(d, b, c, T::max),
    }
}

/// `dst[i] = (dst[i] op b[i]) op c[i]` in one pass over memory.
///
/// # Safety
/// All three ranges must be valid for `n` elements of `dtype`; `dst` may not overlap `b` or `c`.
pub unsafe fn reduce4_into(dtype: DType, op: ReduceOp, dst: *mut u8, b: *const u8, c: *const u8, n: usize) {
    if n == 0 {
        return;
    }
    unsafe {
        match dtype {
            DType::F32 => typed4_into::<f32>(op, dst, b, c, n),
            DType::F64 => typed4_into::<f64>(op, dst, b, c, n),
            DType::I32 => typed4_into::<i32>(op, dst, b, c, n),
            DType::I64 => typed4_into::<i64>(op, dst, b, c, n),
            DType::U8 => typed4_into::<u8>(op, dst, b, c, n),
        }
    }
}

/// `dst[i] = (a[i] op b[i]) op c[i]` in one pass over memory.
///
/// # Safety
/// All four ranges must be valid for `n` elements of `dtype`; `dst` may not overlap any input.
pub unsafe fn reduce4(dtype: DType, op: ReduceOp, dst: *mut u8, a: *const u8, b: *const u8, c: *const u8, n: usize) {
    if n == 0 {
        return;
    }
    unsafe {
        match dtype {
            DType::F32 => typed4::<f32>(op, dst, a, b, c, n),
            DType::F64 => typed4::<f64>(op, dst, a, b, c, n),
            DType::I32 => typed4::<i32>(op, dst, a, b, c, n),
            DType::I64 => typed4::<i64>(op, dst, a, b, c, n),
            DType::U8 => typed4::<u8>(op, dst, a, b, c, n),
        }
    }
}

#[inline(always)]
fn apply_update<T: Elem>(h: &mut [T], c: &[T], a: Option<&[T]>, dst: &mut [T], f: impl Fn(T, T) -> T) {
    match a {
        Some(a) => {
            for (((h, &c), &a), d) in h.iter_mut().zip(c).zip(a).zip(dst.iter_mut()) {
                let v = f(*h, c);
                *h = v;
                *d = f(a, v);
            }
        }
        None => {
            for ((h, &c), d) in h.iter_mut().zip(c).zip(dst.iter_mut()) {
                let v = f(*h, c);
                *h = v;
                *d = v;
            }
        }
    }
}

unsafe fn typed_update<T: Elem>(op: ReduceOp, h: *mut u8, c: *const u8, a: Option<*const u8>, dst: *mut u8, n: usize) {
    let (h, c, dst) = unsafe {
        (
            std::slice::from_raw_parts_mut(h as *mut T, n),
            std::slice::from_raw_parts(c as *const T, n),
            std::slice::from_raw_parts_mut(dst as *mut T, n),
        )
    };
    let a = a.map(|a| unsafe { std::slice::from_raw_parts(a as *const T, n) });
    match op {
        ReduceOp::Sum => apply_update(h, c, a, dst, T::sum),
        ReduceOp::Prod => apply_update(h, c, a, dst, T::prod),
        ReduceOp::Min => apply_update(h, c, a, dst, T::min),
        ReduceOp::Max => apply_update(h, c, a, dst, T::max),
    }
}

/// `h[i] = h[i] op c[i]`, then `dst[i] = a[i] op h[i]` (or `h[i]` without `a`), in one pass:
/// an accumulator updated and passed on (the SSP ring's history and its first hop).
///
/// # Safety
/// All ranges must be valid for `n` elements of `dtype` and none may overlap another.
pub unsafe fn reduce_update(dtype: DType, op: ReduceOp, h: *mut u8, c: *const u8, a: Option<*const u8>, dst: *mut u8, n: usize) {
    if n == 0 {
        return;
    }
    unsafe {
        match dtype {
            DType::F32 => typed_update::<f32>(op, h, c, a, dst, n),
            DType::F64 => typed_update::<f64>(op, h, c, a, dst, n),
            DType::I32 => typed_update::<i32>(op, h, c, a, dst, n),
            DType::I64 => typed_update::<i64>(op, h, c, a, dst, n),
            DType::U8 => typed_update::<u8>(op, h, c, a, dst, n),
        }
    }
}

fn fill_typed<T: Elem>(op: ReduceOp, buf: &mut [u8]) {
    let v = T::identity(op);
    for chunk in buf.chunks_exact_mut(std::mem::size_of::<T>()) {
        unsafe { (chunk.as_mut_ptr() as *mut T).write_unaligned(v) };
    }
}

/// Fills `buf` with the identity of `op` for `dtype` (what a reduction of nothing is).
pub fn fill_identity(dtype: DType, op: ReduceOp, buf: &mut [u8]) {
    match dtype {
        DType::F32 => fill_typed::<f32>(op, buf),
        DType::F64 => fill_typed::<f64>(op, buf),
        DType::I32 => fill_typed::<i32>(op, buf),
        DType::I64 => fill_typed::<i64>(op, buf),
        DType::U8 => fill_typed::<u8>(op, buf),
    }
}

/// `dst[i] = dst[i] op src[i]`.
///
/// # Safety
/// See [`reduce3`].
#[inline]
pub unsafe fn reduce_into(dtype: DType, op: ReduceOp, dst: *mut u8, src: *const u8, n: usize) {
    unsafe { reduce3(dtype, op, dst, dst, src, n) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ops_match_reference() {
        let mut a = vec![1.0f32, -2.0, 3.5, f32::NAN];
        let b = vec![2.0f32, 5.0, -1.0, 0.0];
        unsafe { reduce_into(DType::F32, ReduceOp::Max, a.as_mut_ptr() as *mut u8, b.as_ptr() as *const u8, 4) };
        assert_eq!(&a[..3], &[2.0, 5.0, 3.5]);
        assert!(a[3].is_nan());
        let mut x = vec![3i64, i64::MAX];
        let y = vec![4i64, 1];
        unsafe { reduce_into(DType::I64, ReduceOp::Sum, x.as_mut_ptr() as *mut u8, y.as_ptr() as *const u8, 2) };
        assert_eq!(x, vec![7, i64::MIN]);
        let mut p = vec![3i32, -2];
        unsafe { reduce_into(DType::I32, ReduceOp::Prod, p.as_mut_ptr() as *mut u8, y.as_ptr() as *const u8, 0) };
        assert_eq!(p, vec![3, -2]);
    }

    #[test]
    fn uint8_reduces_like_numpy() {
        // Wrapping sum and product, unsigned min/max, identities 0 / 1 / 255 / 0.
        let a = [250u8, 3, 7, 0];
        let b = [10u8, 200, 7, 255];
        for (op, want) in [(ReduceOp::Sum, [4u8, 203, 14, 255]), (ReduceOp::Prod, [196, 88, 49, 0]), (ReduceOp::Min, [10, 3, 7, 0]), (ReduceOp::Max, [250, 200, 7, 255])] {
            let mut d = [0u8; 4];
            unsafe { reduce3(DType::U8, op, d.as_mut_ptr(), a.as_ptr(), b.as_ptr(), 4) };
            assert_eq!(d, want, "{op:?}");
            let mut d = [0u8; 4];
            unsafe { reduce4(DType::U8, op, d.as_mut_ptr(), a.as_ptr(), b.as_ptr(), a.as_ptr(), 4) };
            let mut w = want;
            unsafe { reduce3(DType::U8, op, w.as_mut_ptr(), want.as_ptr(), a.as_ptr(), 4) };
            assert_eq!(d, w, "{op:?}");
            let mut id = [9u8; 2];
            fill_identity(DType::U8, op, &mut id);
            assert_eq!(id[0], match op { ReduceOp::Sum => 0, ReduceOp::Prod => 1, ReduceOp::Min => 255, ReduceOp::Max => 0 });
        }
    }

    #[test]
    fn update_and_pass_on_in_one_pass() {
        let mut h = vec![1i64, 5, -3];
        let c = vec![2i64, 1, 4];
        let a = vec![10i64, 20, 30];
        let mut d = vec![0i64; 3];
        let p = |v: &Vec<i64>| v.as_ptr() as *const u8;
        unsafe { reduce_update(DType::I64, ReduceOp::Sum, h.as_mut_ptr() as *mut u8, p(&c), Some(p(&a)), d.as_mut_ptr() as *mut u8, 3) };
        assert_eq!((h.clone(), d.clone()), (vec![3, 6, 1], vec![13, 26, 31]));
        unsafe { reduce_update(DType::I64, ReduceOp::Max, h.as_mut_ptr() as *mut u8, p(&c), None, d.as_mut_ptr() as *mut u8, 3) };
        assert_eq!((h, d), (vec![3, 6, 4], vec![3, 6, 4]));
    }

    #[test]
    fn parse_ops() {
        assert_eq!(ReduceOp::parse("min").unwrap(), ReduceOp::Min);
        assert!(ReduceOp::parse("avg").is_err());
    }
}
