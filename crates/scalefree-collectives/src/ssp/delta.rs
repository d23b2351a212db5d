//! Delta mode of the SSP reduction: instead of the running result, a call returns (in the
//! caller's own buffer) how much the result changed since the caller's previous call,
//! times a scale. This is what an optimizer applies: DDP's SSP comm hook hands back the
//! averaged gradient, `(result_k - result_{k-1}) / p`, in the gradient bucket itself, with
//! no copy or temporary on the Python side.
//!
//! Kernels for float32 and float64 (sum only; the caller checks), one pass each.

use super::Buf;
use crate::reduce::DType;

/// Float element types of the delta kernels.
trait Elem: Copy + std::ops::Add<Output = Self> + std::ops::Sub<Output = Self> + std::ops::Mul<Output = Self> {
    fn of(x: f64) -> Self;
}
impl Elem for f32 {
    fn of(x: f64) -> Self {
        x as f32
    }
}
impl Elem for f64 {
    fn of(x: f64) -> Self {
        x
    }
}

/// `inout = (cur - prev) * scale` over `n` bytes.
pub(crate) fn diff(dtype: DType, inout: &mut [u8], cur: &Buf, prev: &Buf, scale: f64) {
    fn go<T: Elem>(inout: &mut [u8], cur: *const u8, prev: *const u8, scale: f64) {
        let n = inout.len() / std::mem::size_of::<T>();
        let (o, c, p) = unsafe {
            (
                std::slice::from_raw_parts_mut(inout.as_mut_ptr() as *mut T, n),
                std::slice::from_raw_parts(cur as *const T, n),
                std::slice::from_raw_parts(prev as *const T, n),
            )
        };
        let s = T::of(scale);
        for ((o, &c), &p) in o.iter_mut().zip(c).zip(p) {
            *o = (c - p) * s;
        }
    }
    match dtype {
        DType::F32 => go::<f32>(inout, cur.ptr(), prev.ptr(), scale),
        DType::F64 => go::<f64>(inout, cur.ptr(), prev.ptr(), scale),
        _ => unreachable!("delta mode is for float32 and float64"),
    }
}

/// The two-rank step, one pass: with `c` the contribution held in `inout`, `p` the
/// partner's history (None: nothing received yet, zeros) and `seen` the partner's history
/// at the previous call: `hist += c` (when `hist` is given), `inout = (c + (p - seen)) *
/// scale`, `seen = p`.
///
/// # Safety
/// `p` (if given) must be valid for `inout.len()` bytes and not overlap the others.
pub(crate) unsafe fn pair_step(dtype: DType, inout: &mut [u8], p: Option<*const u8>, seen: &mut Buf, hist: Option<&mut Buf>, scale: f64) {
    unsafe fn go<T: Elem>(inout: &mut [u8], p: Option<*const u8>, seen: &mut Buf, hist: Option<&mut Buf>, scale: f64) {
        let n = inout.len() / std::mem::size_of::<T>();
        let s = T::of(scale);
        let c = unsafe { std::slice::from_raw_parts_mut(inout.as_mut_ptr() as *mut T, n) };
        let seen = unsafe { std::slice::from_raw_parts_mut(seen.mut_ptr() as *mut T, n) };
        match (p, hist) {
            (Some(p), Some(h)) => {
                let p = unsafe { std::slice::from_raw_parts(p as *const T, n) };
                let h = unsafe { std::slice::from_raw_parts_mut(h.mut_ptr() as *mut T, n) };
                for (((c, &q), seen), h) in c.iter_mut().zip(p).zip(seen.iter_mut()).zip(h.iter_mut()) {
                    let x = *c;
                    *h = *h + x;
                    *c = (x + (q - *seen)) * s;
                    *seen = q;
                }
            }
            (Some(p), None) => {
                let p = unsafe { std::slice::from_raw_parts(p as *const T, n) };
                for ((c, &q), seen) in c.iter_mut().zip(p).zip(seen.iter_mut()) {
                    *c = (*c + (q - *seen)) * s;
                    *seen = q;
                }
            }
            // Nothing from the partner yet: `seen` stays zero.
            (None, Some(h)) => {
                let h = unsafe { std::slice::from_raw_parts_mut(h.mut_ptr() as *mut T, n) };
                for (c, h) in c.iter_mut().zip(h.iter_mut()) {
                    *h = *h + *c;
                    *c = *c * s;
                }
            }
            (None, None) => {
                for x in c.iter_mut() {
                    *x = *x * s;
                }
            }
        }
    }
    unsafe {
        match dtype {
            DType::F32 => go::<f32>(inout, p, seen, hist, scale),
            DType::F64 => go::<f64>(inout, p, seen, hist, scale),
            _ => unreachable!("delta mode is for float32 and float64"),
        }
    }
}

/// `out = a + b` (float32/float64), for the last result of the two-rank step (`hist + seen`).
pub(crate) fn sum_into(dtype: DType, out: &mut Buf, a: &Buf, b: &Buf) {
    fn go<T: Elem>(out: *mut u8, a: *const u8, b: *const u8, nbytes: usize) {
        let n = nbytes / std::mem::size_of::<T>();
        let (o, a, b) = unsafe {
            (
                std::slice::from_raw_parts_mut(out as *mut T, n),
                std::slice::from_raw_parts(a as *const T, n),
                std::slice::from_raw_parts(b as *const T, n),
            )
        };
        for ((o, &a), &b) in o.iter_mut().zip(a).zip(b) {
            *o = a + b;
        }
    }
    let n = out.bytes().len();
    match dtype {
        DType::F32 => go::<f32>(out.mut_ptr(), a.ptr(), b.ptr(), n),
        DType::F64 => go::<f64>(out.mut_ptr(), a.ptr(), b.ptr(), n),
        _ => unreachable!("delta mode is for float32 and float64"),
    }
}
