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
    U8 = 7,
}

impl SDType {
    pub fn size_bytes(self) -> usize {
        match self {
            SDType::U8 => 1,
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
            SDType::U8 => "uint8",
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
            "uint8" => SDType::U8,
            _ => {
                return Err(Error::InvalidArgument(format!(
                    "sparse_allreduce values must be float32, float64, int32, int64, uint8, uint32 or uint64, not {s}"
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
            7 => SDType::U8,
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

trait Elem: Copy + 'static {
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
int_elem!(u8);

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
            SDType::U8 => $f::<u8>($($arg),*),
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

/// Elements that can take back a sum (the SSP reduce's exclusion, `sparse::ssp`).
trait Minus: Elem {
    fn minus(a: Self, b: Self) -> Self;
}
macro_rules! minus_float {
    ($($t:ty),*) => { $(impl Minus for $t { #[inline(always)] fn minus(a: Self, b: Self) -> Self { a - b } })* };
}
macro_rules! minus_int {
    ($($t:ty),*) => { $(impl Minus for $t { #[inline(always)] fn minus(a: Self, b: Self) -> Self { a.wrapping_sub(b) } })* };
}
minus_float!(f32, f64);
minus_int!(i32, i64, u32, u64, u8);

unsafe fn gather_comb_t<T: Minus>(op: SOp, sub: bool, dst: *mut u8, src: *const u8, map: &[usize], w: usize) {
    let (d, s) = (dst as *mut T, src as *const T);
    for (i, &m) in map.iter().enumerate() {
        if m == NONE {
            continue;
        }
        for c in 0..w {
            unsafe {
                let x = d.add(i * w + c);
                let y = *s.add(m * w + c);
                *x = if sub { T::minus(*x, y) } else { T::comb(op, *x, y) };
            }
        }
    }
}

/// `dst[i] = dst[i] op src[map[i]]` for rows of `w` elements (rows where `map[i] == NONE`
/// are left alone).
///
/// # Safety
/// Pointers valid and aligned for the rows named by `map`.
pub unsafe fn gather_combine(dtype: SDType, op: SOp, dst: *mut u8, src: *const u8, map: &[usize], w: usize) {
    unsafe { dispatch!(dtype, gather_comb_t, op, false, dst, src, map, w) }
}

/// `dst[i] = dst[i] - src[map[i]]` for rows of `w` elements (wrapping for integers; rows
/// where `map[i] == NONE` are left alone): takes a summand back out of a sum.
///
/// # Safety
/// Pointers valid and aligned for the rows named by `map`.
pub unsafe fn gather_subtract(dtype: SDType, dst: *mut u8, src: *const u8, map: &[usize], w: usize) {
    unsafe { dispatch!(dtype, gather_comb_t, SOp::Sum, true, dst, src, map, w) }
}

// ---------------------------------------------------------------------------------------
// Row maps of the reduce after config (`direct`): `u32` positions, or a contiguous run.

/// Where the rows of one part go to or come from: row `i` is `start + i` (a contiguous
/// run, e.g. the caller's own buffer when its indices are already in key order) or
/// `idx[i]`. `u32` halves the bytes a map costs beside 4-byte values.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RowMap {
    Contig { start: usize, len: usize },
    Idx(Vec<u32>),
}

impl RowMap {
    /// From positions, stored as a run when they are consecutive. Panics at 2^31 − 1 and past
    /// (callers keep such row counts off this path: `Butterfly::build_direct`).
    pub fn from_positions(pos: impl ExactSizeIterator<Item = usize>) -> RowMap {
        let mut v = Vec::with_capacity(pos.len());
        let mut contig = true;
        for (i, p) in pos.enumerate() {
            // Below 2^31: the SIMD kernels gather by signed 32-bit offsets.
            assert!(p < i32::MAX as usize, "sparse_allreduce: row {p} does not fit the 31-bit maps");
            contig &= i == 0 || p == v[0] as usize + i;
            v.push(p as u32);
        }
        match v.first() {
            Some(&s) if contig => RowMap::Contig { start: s as usize, len: v.len() },
            None => RowMap::Contig { start: 0, len: 0 },
            _ => RowMap::Idx(v),
        }
    }
    pub fn len(&self) -> usize {
        match self {
            RowMap::Contig { len, .. } => *len,
            RowMap::Idx(v) => v.len(),
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Largest row named plus one (0 when empty).
    pub fn rows_spanned(&self) -> usize {
        match self {
            RowMap::Contig { start, len } => if *len == 0 { 0 } else { start + len },
            RowMap::Idx(v) => v.iter().max().map_or(0, |&m| m as usize + 1),
        }
    }
}

trait Rows: Copy {
    fn n(&self) -> usize;
    fn at(&self, i: usize) -> usize;
}

#[derive(Clone, Copy)]
struct Run(usize, usize);

impl Rows for Run {
    #[inline(always)]
    fn n(&self) -> usize {
        self.1
    }
    #[inline(always)]
    fn at(&self, i: usize) -> usize {
        self.0 + i
    }
}

impl Rows for &[u32] {
    #[inline(always)]
    fn n(&self) -> usize {
        self.len()
    }
    #[inline(always)]
    fn at(&self, i: usize) -> usize {
        unsafe { *self.get_unchecked(i) as usize }
    }
}

/// Scalar reference: `dst[dm(i)] = f(dst[dm(i)], src[sm(i)])` for rows of `w` elements.
#[inline(always)]
unsafe fn combine_ref<T: Copy, D: Rows, S: Rows>(dst: *mut T, dm: D, src: *const T, sm: S, w: usize, f: impl Fn(T, T) -> T) {
    let n = dm.n();
    if w == 1 {
        for i in 0..n {
            unsafe {
                let d = dst.add(dm.at(i));
                *d = f(*d, *src.add(sm.at(i)));
            }
        }
    } else {
        for i in 0..n {
            let (d, s) = (dm.at(i) * w, sm.at(i) * w);
            for c in 0..w {
                unsafe {
                    let p = dst.add(d + c);
                    *p = f(*p, *src.add(s + c));
                }
            }
        }
    }
}

/// Scalar reference: `dst[dm(i)] = src[sm(i)]` for rows of `w` elements.
#[inline(always)]
unsafe fn copy_ref<T: Copy, D: Rows, S: Rows>(dst: *mut T, dm: D, src: *const T, sm: S, w: usize) {
    let n = dm.n();
    if w == 1 {
        for i in 0..n {
            unsafe { *dst.add(dm.at(i)) = *src.add(sm.at(i)) };
        }
    } else {
        for i in 0..n {
            unsafe { std::ptr::copy_nonoverlapping(src.add(sm.at(i) * w), dst.add(dm.at(i) * w), w) };
        }
    }
}

macro_rules! with_rows {
    ($m:expr, |$r:ident| $body:expr) => {
        match $m {
            RowMap::Contig { start, len } => {
                let $r = Run(*start, *len);
                $body
            }
            RowMap::Idx(v) => {
                let $r = v.as_slice();
                $body
            }
        }
    };
}

unsafe fn combine_rows_t<T: Elem>(op: SOp, dst: *mut u8, dm: &RowMap, src: *const u8, sm: &RowMap, w: usize) {
    let (d, s) = (dst as *mut T, src as *const T);
    #[cfg(target_arch = "x86_64")]
    if w == 1 && op == SOp::Sum && unsafe { simd::combine_sum::<T>(d, dm, s, sm) } {
        return;
    }
    with_rows!(dm, |dr| with_rows!(sm, |sr| unsafe {
        match op {
            SOp::Sum => combine_ref(d, dr, s, sr, w, |a, b| T::comb(SOp::Sum, a, b)),
            SOp::Max => combine_ref(d, dr, s, sr, w, |a, b| T::comb(SOp::Max, a, b)),
            SOp::Min => combine_ref(d, dr, s, sr, w, |a, b| T::comb(SOp::Min, a, b)),
            SOp::Or => combine_ref(d, dr, s, sr, w, |a, b| T::comb(SOp::Or, a, b)),
        }
    }))
}

unsafe fn copy_rows_t<T: Elem>(dst: *mut u8, dm: &RowMap, src: *const u8, sm: &RowMap, w: usize) {
    let (d, s) = (dst as *mut T, src as *const T);
    #[cfg(target_arch = "x86_64")]
    if w == 1 && unsafe { simd::copy::<T>(d, dm, s, sm) } {
        return;
    }
    with_rows!(dm, |dr| with_rows!(sm, |sr| unsafe { copy_ref(d, dr, s, sr, w) }))
}

/// `dst[dm(i)] = dst[dm(i)] op src[sm(i)]` for rows of `w` elements. `dm` must name each
/// row at most once (the rows of one part are distinct keys), so the sum may run as
/// gather, add, scatter in SIMD.
///
/// # Safety
/// Pointers valid and aligned for every row the maps name.
pub unsafe fn combine_rows(dtype: SDType, op: SOp, dst: *mut u8, dm: &RowMap, src: *const u8, sm: &RowMap, w: usize) {
    debug_assert_eq!(dm.len(), sm.len());
    unsafe { dispatch!(dtype, combine_rows_t, op, dst, dm, src, sm, w) }
}

/// `dst[dm(i)] = src[sm(i)]` for rows of `w` elements.
///
/// # Safety
/// Pointers valid and aligned for every row the maps name; the destination rows distinct.
pub unsafe fn copy_rows(dtype: SDType, dst: *mut u8, dm: &RowMap, src: *const u8, sm: &RowMap, w: usize) {
    debug_assert_eq!(dm.len(), sm.len());
    unsafe { dispatch!(dtype, copy_rows_t, dst, dm, src, sm, w) }
}

/// The AVX-512 kernels (chosen at run time; the scalar loops above are the reference):
/// 16 (4-byte) or 8 (8-byte) rows per instruction, gathered and scattered by the `u32`
/// maps. Each returns false when it has no kernel for the case.
#[cfg(target_arch = "x86_64")]
mod simd {
    use super::{Elem, RowMap};
    use std::any::TypeId;
    use std::arch::x86_64::*;
    use std::sync::OnceLock;

    /// Whether the AVX-512 kernels run: `SCALEFREE_SPARSE_SIMD=1` / `0`, or by default
    /// (`auto`) when the CPU has AVX-512F and a one-time calibration (a few hundred
    /// microseconds, at the first call in the process) finds them faster than the scalar
    /// loops on a 32k-row part. Gathers and scatters are microcoded on some CPUs (AMD Zen 4
    /// runs these kernels at half the scalar speed), fast on others.
    fn avx512() -> bool {
        static HAS: OnceLock<bool> = OnceLock::new();
        *HAS.get_or_init(|| {
            if !std::arch::is_x86_feature_detected!("avx512f") {
                return false;
            }
            match std::env::var("SCALEFREE_SPARSE_SIMD").as_deref().map(str::trim) {
                Ok("0") => false,
                Ok("1") => true,
                _ => calibrate(),
            }
        })
    }

    /// Times a combine and a copy of 32k rows through a random permutation both ways
    /// (best of 5 each): true when the AVX-512 kernels take less time.
    fn calibrate() -> bool {
        const ROWS: usize = 1 << 16;
        const N: usize = 1 << 15;
        let mut s = 0x2545_f491_4f6c_dd1du64;
        let mut perm: Vec<u32> = (0..N as u32).collect();
        for i in (1..N).rev() {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            perm.swap(i, (s % (i as u64 + 1)) as usize);
        }
        let rows: Vec<u32> = (0..N as u32).map(|i| i * 2 + (i & 1)).collect();
        let mut acc = vec![0f32; ROWS];
        let vals = vec![1f32; N];
        let mut out = vec![0f32; N];
        let best = |f: &mut dyn FnMut()| (0..5).map(|_| { let t = std::time::Instant::now(); f(); t.elapsed() }).min().unwrap();
        let (dm, sm) = (rows.as_slice(), perm.as_slice());
        let simd = best(&mut || unsafe {
            combine_f32(acc.as_mut_ptr(), dm, vals.as_ptr(), Some(sm), 0);
            copy_32(out.as_mut_ptr() as *mut i32, Some(sm), 0, acc.as_ptr() as *const i32, dm);
        });
        let scalar = best(&mut || unsafe {
            super::combine_ref(acc.as_mut_ptr(), dm, vals.as_ptr(), sm, 1, |a: f32, b| a + b);
            super::copy_ref(out.as_mut_ptr(), sm, acc.as_ptr(), dm, 1);
        });
        simd < scalar
    }

    /// Element kinds with a SIMD sum: 4-byte float, 4-byte int, 8-byte float, 8-byte int.
    #[derive(Clone, Copy, PartialEq)]
    enum Lane {
        F32,
        I32,
        F64,
        I64,
    }

    fn lane<T: 'static>() -> Lane {
        let t = TypeId::of::<T>();
        if t == TypeId::of::<f32>() {
            Lane::F32
        } else if t == TypeId::of::<f64>() {
            Lane::F64
        } else if std::mem::size_of::<T>() == 4 {
            Lane::I32
        } else {
            Lane::I64
        }
    }

    pub(super) unsafe fn combine_sum<T: Elem>(d: *mut T, dm: &RowMap, s: *const T, sm: &RowMap) -> bool {
        let RowMap::Idx(dv) = dm else { return false };
        if !avx512() {
            return false;
        }
        let (sv, s0) = match sm {
            RowMap::Idx(v) => (Some(v.as_slice()), 0),
            RowMap::Contig { start, .. } => (None, *start),
        };
        unsafe {
            match lane::<T>() {
                Lane::F32 => combine_f32(d as *mut f32, dv, s as *const f32, sv, s0),
                Lane::I32 => combine_i32(d as *mut i32, dv, s as *const i32, sv, s0),
                Lane::F64 => combine_f64(d as *mut f64, dv, s as *const f64, sv, s0),
                Lane::I64 => combine_i64(d as *mut i64, dv, s as *const i64, sv, s0),
            }
        }
        true
    }

    pub(super) unsafe fn copy<T: Elem>(d: *mut T, dm: &RowMap, s: *const T, sm: &RowMap) -> bool {
        let RowMap::Idx(sv) = sm else { return false };
        if !avx512() {
            return false;
        }
        let (dv, d0) = match dm {
            RowMap::Idx(v) => (Some(v.as_slice()), 0),
            RowMap::Contig { start, .. } => (None, *start),
        };
        unsafe {
            if std::mem::size_of::<T>() == 4 {
                copy_32(d as *mut i32, dv, d0, s as *const i32, sv);
            } else {
                copy_64(d as *mut i64, dv, d0, s as *const i64, sv);
            }
        }
        true
    }

    macro_rules! combine32 {
        ($name:ident, $t:ty, $gather:ident, $add:ident, $scatter:ident, $loadu:ident) => {
            #[target_feature(enable = "avx512f")]
            unsafe fn $name(d: *mut $t, dv: &[u32], s: *const $t, sv: Option<&[u32]>, s0: usize) {
                let n = dv.len();
                let mut i = 0;
                while i + 16 <= n {
                    unsafe {
                        let di = _mm512_loadu_si512(dv.as_ptr().add(i) as *const _);
                        let x = match sv {
                            Some(sv) => $gather::<4>(_mm512_loadu_si512(sv.as_ptr().add(i) as *const _), s as *const _),
                            None => $loadu(s.add(s0 + i) as *const _),
                        };
                        let a = $gather::<4>(di, d as *const _);
                        $scatter::<4>(d as *mut _, di, $add(a, x));
                    }
                    i += 16;
                }
                for i in i..n {
                    unsafe {
                        let p = d.add(dv[i] as usize);
                        let x = *s.add(sv.map_or(s0 + i, |v| v[i] as usize));
                        *p = <$t as Elem>::comb(super::SOp::Sum, *p, x);
                    }
                }
            }
        };
    }
    combine32!(combine_f32, f32, _mm512_i32gather_ps, _mm512_add_ps, _mm512_i32scatter_ps, _mm512_loadu_ps);
    combine32!(combine_i32, i32, _mm512_i32gather_epi32, _mm512_add_epi32, _mm512_i32scatter_epi32, _mm512_loadu_si512);

    macro_rules! combine64 {
        ($name:ident, $t:ty, $gather:ident, $add:ident, $scatter:ident, $loadu:ident) => {
            #[target_feature(enable = "avx512f")]
            unsafe fn $name(d: *mut $t, dv: &[u32], s: *const $t, sv: Option<&[u32]>, s0: usize) {
                let n = dv.len();
                let mut i = 0;
                while i + 8 <= n {
                    unsafe {
                        let di = _mm256_loadu_si256(dv.as_ptr().add(i) as *const _);
                        let x = match sv {
                            Some(sv) => $gather::<8>(_mm256_loadu_si256(sv.as_ptr().add(i) as *const _), s as *const _),
                            None => $loadu(s.add(s0 + i) as *const _),
                        };
                        let a = $gather::<8>(di, d as *const _);
                        $scatter::<8>(d as *mut _, di, $add(a, x));
                    }
                    i += 8;
                }
                for i in i..n {
                    unsafe {
                        let p = d.add(dv[i] as usize);
                        let x = *s.add(sv.map_or(s0 + i, |v| v[i] as usize));
                        *p = <$t as Elem>::comb(super::SOp::Sum, *p, x);
                    }
                }
            }
        };
    }
    combine64!(combine_f64, f64, _mm512_i32gather_pd, _mm512_add_pd, _mm512_i32scatter_pd, _mm512_loadu_pd);
    combine64!(combine_i64, i64, _mm512_i32gather_epi64, _mm512_add_epi64, _mm512_i32scatter_epi64, _mm512_loadu_si512);

    #[target_feature(enable = "avx512f")]
    unsafe fn copy_32(d: *mut i32, dv: Option<&[u32]>, d0: usize, s: *const i32, sv: &[u32]) {
        let n = sv.len();
        let mut i = 0;
        while i + 16 <= n {
            unsafe {
                let x = _mm512_i32gather_epi32::<4>(_mm512_loadu_si512(sv.as_ptr().add(i) as *const _), s as *const _);
                match dv {
                    Some(dv) => _mm512_i32scatter_epi32::<4>(d as *mut _, _mm512_loadu_si512(dv.as_ptr().add(i) as *const _), x),
                    None => _mm512_storeu_si512(d.add(d0 + i) as *mut _, x),
                }
            }
            i += 16;
        }
        for i in i..n {
            unsafe { *d.add(dv.map_or(d0 + i, |v| v[i] as usize)) = *s.add(sv[i] as usize) };
        }
    }

    #[target_feature(enable = "avx512f")]
    unsafe fn copy_64(d: *mut i64, dv: Option<&[u32]>, d0: usize, s: *const i64, sv: &[u32]) {
        let n = sv.len();
        let mut i = 0;
        while i + 8 <= n {
            unsafe {
                let x = _mm512_i32gather_epi64::<8>(_mm256_loadu_si256(sv.as_ptr().add(i) as *const _), s as *const _);
                match dv {
                    Some(dv) => _mm512_i32scatter_epi64::<8>(d as *mut _, _mm256_loadu_si256(dv.as_ptr().add(i) as *const _), x),
                    None => _mm512_storeu_si512(d.add(d0 + i) as *mut _, x),
                }
            }
            i += 8;
        }
        for i in i..n {
            unsafe { *d.add(dv.map_or(d0 + i, |v| v[i] as usize)) = *s.add(sv[i] as usize) };
        }
    }
}
