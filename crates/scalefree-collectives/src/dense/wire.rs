//! Compressed allreduce between hosts (`wire=` bf16 or fp16): float32 sums whose step
//! between hosts carries 16-bit values, half the bytes of float32.
//!
//! The step between hosts is the put-based all-to-all of [`super::all_to_all`] over the
//! hosts' owners of one share (see [`super::hierarchical`]): every owner rounds the parts
//! other owners reduce to 16 bits once and sends them; each owner sums the 16-bit copies it
//! receives into its own float32 part (float32 arithmetic, its own values unrounded), rounds
//! the sum to 16 bits once, keeps that rounded value itself and sends it to every other owner,
//! which widens it into its buffer. So every rank ends with the same bits, and the result
//! is the float32 sum of `H` partials each rounded once, itself rounded once: with `u` the
//! format's unit roundoff (bf16: 2^-8, fp16: 2^-11),
//! `|result - exact| <= u·|exact| + (u + H·u_32)·(1 + u)·Σ|partial_h|`
//! (`docs/algorithms.md`, "Compressed allreduce"). fp16 overflows past 65504.
//! Over TCP lanes the first peer's pieces are summed in as they arrive and the rounded parts
//! are widened into the caller's buffer as they arrive (see [`group_allreduce`]); nothing is
//! allocated per call, and the bf16 loops are vectorised ([`kernels`]), the fp16 ones on F16C
//! ([`fp16`]).

use scalefree_transport::{Error, Result};

use scalefree_transport::Window;

use crate::comm::Communicator;
use crate::dense::landing::{direct_landing_on, pieces, reduce_on_arrival_on, wait_all, DirectLanding};
use crate::dense::{chunk_bounds, ALIGN_ELEMS};

/// What the step between hosts carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum Wire {
    /// The buffer's own dtype (no compression).
    Exact = 0,
    /// bfloat16: 8 significant bits, float32's range.
    Bf16 = 1,
    /// IEEE half precision: 11 significant bits, largest finite 65504.
    Fp16 = 2,
}

impl Wire {
    pub fn name(self) -> &'static str {
        match self {
            Wire::Exact => "exact",
            Wire::Bf16 => "bf16",
            Wire::Fp16 => "fp16",
        }
    }

    pub fn parse(s: &str) -> Result<Self> {
        Ok(match s {
            "exact" | "none" => Wire::Exact,
            "bf16" | "bfloat16" => Wire::Bf16,
            "fp16" | "float16" => Wire::Fp16,
            _ => return Err(Error::InvalidArgument(format!("unknown wire {s:?}: expected bf16, fp16 or exact"))),
        })
    }

    pub fn from_u32(v: u32) -> Option<Self> {
        Some(match v {
            0 => Wire::Exact,
            1 => Wire::Bf16,
            2 => Wire::Fp16,
            _ => return None,
        })
    }

    /// The unit roundoff of the format (half the distance from 1 to the next value).
    pub fn unit_roundoff(self) -> f64 {
        match self {
            Wire::Exact => 0.0,
            Wire::Bf16 => 2f64.powi(-8),
            Wire::Fp16 => 2f64.powi(-11),
        }
    }
}

/// float32 to bfloat16 bits, rounding to nearest even; a NaN stays a (quiet) NaN. The same
/// bits as the `half` crate's `bf16::from_f32`, without its branches, so that loops of it
/// vectorise (see [`kernels`]).
#[inline(always)]
fn to_bf16(x: f32) -> u16 {
    let b = x.to_bits();
    let rounded = b.wrapping_add(0x7FFF + ((b >> 16) & 1)) >> 16;
    let nan = (b & 0x7FFF_FFFF) > 0x7F80_0000;
    (if nan { (b >> 16) | 0x40 } else { rounded }) as u16
}

/// bfloat16 bits to float32 (exact: a shift); a NaN is made quiet, as `half`'s `to_f32`.
#[inline(always)]
fn from_bf16(h: u16) -> f32 {
    let nan = (h & 0x7FFF) > 0x7F80;
    f32::from_bits(((h | if nan { 0x40 } else { 0 }) as u32) << 16)
}

/// The bf16 loops, written once over slices of equal length and compiled for each ISA
/// ([`Isa`]): conversion is a shift and an add, memory-bound when vectorised; as
/// per-element calls of `half` it did not vectorise (`examples/wire_convert.rs` times both).
pub mod kernels {
    use super::{from_bf16, to_bf16};

    #[inline(always)]
    fn narrow(src: &[f32], dst: &mut [u16]) {
        let n = dst.len().min(src.len());
        let (src, dst) = (&src[..n], &mut dst[..n]);
        for i in 0..n {
            dst[i] = to_bf16(src[i]);
        }
    }

    #[inline(always)]
    fn widen(src: &[u16], dst: &mut [f32]) {
        let n = dst.len().min(src.len());
        let (src, dst) = (&src[..n], &mut dst[..n]);
        for i in 0..n {
            dst[i] = from_bf16(src[i]);
        }
    }

    #[inline(always)]
    fn add_widened(src: &[u16], dst: &mut [f32]) {
        let n = dst.len().min(src.len());
        let (src, dst) = (&src[..n], &mut dst[..n]);
        for i in 0..n {
            dst[i] += from_bf16(src[i]);
        }
    }

    #[inline(always)]
    fn add_round(src: &[u16], dst: &mut [f32], out: &mut [u16]) {
        let n = dst.len().min(src.len()).min(out.len());
        let (src, dst, out) = (&src[..n], &mut dst[..n], &mut out[..n]);
        for i in 0..n {
            let h = to_bf16(dst[i] + from_bf16(src[i]));
            out[i] = h;
            dst[i] = from_bf16(h);
        }
    }

    #[inline(always)]
    fn round_in_place(dst: &mut [f32], out: &mut [u16]) {
        let n = dst.len().min(out.len());
        let (dst, out) = (&mut dst[..n], &mut out[..n]);
        for i in 0..n {
            let h = to_bf16(dst[i]);
            out[i] = h;
            dst[i] = from_bf16(h);
        }
    }

    /// One set of the loops compiled with `$feat` (none: the baseline ISA).
    macro_rules! isa {
        ($m:ident $(, $feat:literal)?) => {
            pub mod $m {
                /// # Safety
                /// The CPU has the module's target features.
                $(#[target_feature(enable = $feat)])?
                pub unsafe fn narrow(src: &[f32], dst: &mut [u16]) { super::narrow(src, dst) }
                /// # Safety
                /// As [`narrow`].
                $(#[target_feature(enable = $feat)])?
                pub unsafe fn widen(src: &[u16], dst: &mut [f32]) { super::widen(src, dst) }
                /// # Safety
                /// As [`narrow`].
                $(#[target_feature(enable = $feat)])?
                pub unsafe fn add_widened(src: &[u16], dst: &mut [f32]) { super::add_widened(src, dst) }
                /// # Safety
                /// As [`narrow`].
                $(#[target_feature(enable = $feat)])?
                pub unsafe fn add_round(src: &[u16], dst: &mut [f32], out: &mut [u16]) { super::add_round(src, dst, out) }
                /// # Safety
                /// As [`narrow`].
                $(#[target_feature(enable = $feat)])?
                pub unsafe fn round_in_place(dst: &mut [f32], out: &mut [u16]) { super::round_in_place(dst, out) }
            }
        };
    }
    isa!(portable);
    #[cfg(target_arch = "x86_64")]
    isa!(avx2, "avx2");
    #[cfg(target_arch = "x86_64")]
    isa!(avx512, "avx512f,avx512bw,avx2");

    /// Which compiled set runs.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum Isa {
        Avx512,
        Avx2,
        Portable,
    }

    impl Isa {
        /// AVX-512 (F and BW) where the CPU has it, else AVX2: in cache, AVX-512 measured
        /// 2x AVX2 on AMD Zen 4 (BW's 32-to-16-bit narrowing is one instruction); from
        /// memory they are even (`examples/wire_convert.rs`).
        /// `SCALEFREE_WIRE_ISA=avx512|avx2|portable` overrides (an unavailable choice is
        /// ignored).
        pub fn best() -> Isa {
            static BEST: std::sync::OnceLock<Isa> = std::sync::OnceLock::new();
            *BEST.get_or_init(|| {
                let want = match std::env::var("SCALEFREE_WIRE_ISA").as_deref().map(str::trim) {
                    Ok("avx512") => Some(Isa::Avx512),
                    Ok("avx2") => Some(Isa::Avx2),
                    Ok("portable") => Some(Isa::Portable),
                    _ => None,
                };
                match want {
                    Some(isa) if isa.available() => isa,
                    _ => [Isa::Avx512, Isa::Avx2, Isa::Portable].into_iter().find(|i| i.available()).unwrap_or(Isa::Portable),
                }
            })
        }

        pub fn available(self) -> bool {
            match self {
                #[cfg(target_arch = "x86_64")]
                Isa::Avx512 => std::arch::is_x86_feature_detected!("avx512f") && std::arch::is_x86_feature_detected!("avx512bw") && Isa::Avx2.available(),
                #[cfg(target_arch = "x86_64")]
                Isa::Avx2 => std::arch::is_x86_feature_detected!("avx2"),
                Isa::Portable => true,
                #[allow(unreachable_patterns)]
                _ => false,
            }
        }
    }

    macro_rules! dispatch {
        ($isa:expr, $f:ident($($a:expr),*)) => {
            // SAFETY: `Isa::best` and callers of the `_on` forms pick only available sets.
            unsafe {
                match $isa {
                    #[cfg(target_arch = "x86_64")]
                    Isa::Avx512 => avx512::$f($($a),*),
                    #[cfg(target_arch = "x86_64")]
                    Isa::Avx2 => avx2::$f($($a),*),
                    _ => portable::$f($($a),*),
                }
            }
        };
    }

    /// `dst[i] = bf16(src[i])` (the shorter length of the two).
    pub fn narrow_on(isa: Isa, src: &[f32], dst: &mut [u16]) {
        assert!(isa.available());
        dispatch!(isa, narrow(src, dst))
    }
    /// `dst[i] = f32(src[i])`.
    pub fn widen_on(isa: Isa, src: &[u16], dst: &mut [f32]) {
        assert!(isa.available());
        dispatch!(isa, widen(src, dst))
    }
    /// `dst[i] += f32(src[i])`.
    pub fn add_widened_on(isa: Isa, src: &[u16], dst: &mut [f32]) {
        assert!(isa.available());
        dispatch!(isa, add_widened(src, dst))
    }
    /// `out[i] = bf16(dst[i] + f32(src[i]))`, `dst[i] = f32(out[i])`.
    pub fn add_round_on(isa: Isa, src: &[u16], dst: &mut [f32], out: &mut [u16]) {
        assert!(isa.available());
        dispatch!(isa, add_round(src, dst, out))
    }
    /// `out[i] = bf16(dst[i])`, `dst[i] = f32(out[i])`.
    pub fn round_in_place_on(isa: Isa, dst: &mut [f32], out: &mut [u16]) {
        assert!(isa.available());
        dispatch!(isa, round_in_place(dst, out))
    }
}

/// The fp16 loops: plain conversions are `half`'s slice conversions (F16C where the CPU has
/// it); the sums fused with a conversion are F16C's conversions (round to nearest even, a NaN
/// made quiet: `half`'s bits) with AVX2 adds, 8 elements at a time, and without F16C (or with
/// `SCALEFREE_WIRE_ISA=portable`) per-element sums through `half`. Those sums were per-element
/// calls of `half` before, each checking the CPU's features: they did not vectorise
/// (`examples/wire_convert.rs` times them).
pub mod fp16 {
    /// Whether the F16C sums run.
    pub fn vectorised() -> bool {
        static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *ON.get_or_init(|| {
            #[cfg(target_arch = "x86_64")]
            {
                std::arch::is_x86_feature_detected!("f16c")
                    && std::arch::is_x86_feature_detected!("avx2")
                    && super::kernels::Isa::best() != super::kernels::Isa::Portable
            }
            #[cfg(not(target_arch = "x86_64"))]
            {
                false
            }
        })
    }

    #[cfg(target_arch = "x86_64")]
    mod x86 {
        use std::arch::x86_64::*;

        const RNE: i32 = _MM_FROUND_TO_NEAREST_INT;

        /// The 8 elements at `i` (fewer at a slice's end: through a zero-padded copy).
        #[inline(always)]
        unsafe fn load_h(src: &[u16], i: usize) -> __m256 {
            unsafe {
                if i + 8 <= src.len() {
                    _mm256_cvtph_ps(_mm_loadu_si128(src.as_ptr().add(i) as *const __m128i))
                } else {
                    let mut t = [0u16; 8];
                    t[..src.len() - i].copy_from_slice(&src[i..]);
                    _mm256_cvtph_ps(_mm_loadu_si128(t.as_ptr() as *const __m128i))
                }
            }
        }
        #[inline(always)]
        unsafe fn load_f(src: &[f32], i: usize) -> __m256 {
            unsafe {
                if i + 8 <= src.len() {
                    _mm256_loadu_ps(src.as_ptr().add(i))
                } else {
                    let mut t = [0f32; 8];
                    t[..src.len() - i].copy_from_slice(&src[i..]);
                    _mm256_loadu_ps(t.as_ptr())
                }
            }
        }
        #[inline(always)]
        unsafe fn store_h(dst: &mut [u16], i: usize, h: __m128i) {
            unsafe {
                if i + 8 <= dst.len() {
                    _mm_storeu_si128(dst.as_mut_ptr().add(i) as *mut __m128i, h);
                } else {
                    let mut t = [0u16; 8];
                    _mm_storeu_si128(t.as_mut_ptr() as *mut __m128i, h);
                    let k = dst.len() - i;
                    dst[i..].copy_from_slice(&t[..k]);
                }
            }
        }
        #[inline(always)]
        unsafe fn store_f(dst: &mut [f32], i: usize, v: __m256) {
            unsafe {
                if i + 8 <= dst.len() {
                    _mm256_storeu_ps(dst.as_mut_ptr().add(i), v);
                } else {
                    let mut t = [0f32; 8];
                    _mm256_storeu_ps(t.as_mut_ptr(), v);
                    let k = dst.len() - i;
                    dst[i..].copy_from_slice(&t[..k]);
                }
            }
        }

        /// # Safety
        /// The CPU has AVX2 and F16C.
        #[target_feature(enable = "avx2,f16c")]
        pub unsafe fn add_widened(src: &[u16], dst: &mut [f32]) {
            let n = src.len().min(dst.len());
            let (src, dst) = (&src[..n], &mut dst[..n]);
            for i in (0..n).step_by(8) {
                unsafe { store_f(dst, i, _mm256_add_ps(load_f(dst, i), load_h(src, i))) };
            }
        }
        /// # Safety
        /// As [`add_widened`].
        #[target_feature(enable = "avx2,f16c")]
        pub unsafe fn add_round(src: &[u16], dst: &mut [f32], out: &mut [u16]) {
            let n = src.len().min(dst.len()).min(out.len());
            let (src, dst, out) = (&src[..n], &mut dst[..n], &mut out[..n]);
            for i in (0..n).step_by(8) {
                unsafe {
                    let h = _mm256_cvtps_ph::<RNE>(_mm256_add_ps(load_f(dst, i), load_h(src, i)));
                    store_h(out, i, h);
                    store_f(dst, i, _mm256_cvtph_ps(h));
                }
            }
        }
        /// # Safety
        /// As [`add_widened`].
        #[target_feature(enable = "avx2,f16c")]
        pub unsafe fn round_in_place(dst: &mut [f32], out: &mut [u16]) {
            let n = dst.len().min(out.len());
            let (dst, out) = (&mut dst[..n], &mut out[..n]);
            for i in (0..n).step_by(8) {
                unsafe {
                    let h = _mm256_cvtps_ph::<RNE>(load_f(dst, i));
                    store_h(out, i, h);
                    store_f(dst, i, _mm256_cvtph_ps(h));
                }
            }
        }
    }

    fn halves(s: &[u16]) -> &[half::f16] {
        // SAFETY: f16 is a transparent u16.
        unsafe { std::slice::from_raw_parts(s.as_ptr() as *const half::f16, s.len()) }
    }
    fn halves_mut(s: &mut [u16]) -> &mut [half::f16] {
        // SAFETY: as above.
        unsafe { std::slice::from_raw_parts_mut(s.as_mut_ptr() as *mut half::f16, s.len()) }
    }

    /// Picks the F16C loop (`$v`) when [`vectorised`], else `$fallback`.
    macro_rules! pick {
        ($v:ident($($a:expr),*), $fallback:block) => {{
            #[cfg(target_arch = "x86_64")]
            if vectorised() {
                // SAFETY: `vectorised` checked AVX2 and F16C.
                return unsafe { x86::$v($($a),*) };
            }
            $fallback
        }};
    }

    /// `dst[i] = fp16(src[i])` (the shorter length of the two): `half`'s slice conversion,
    /// on F16C where the CPU has it.
    pub fn narrow(src: &[f32], dst: &mut [u16]) {
        use half::slice::HalfFloatSliceExt;
        let n = src.len().min(dst.len());
        halves_mut(&mut dst[..n]).convert_from_f32_slice(&src[..n]);
    }
    /// `dst[i] = f32(src[i])`: `half`'s slice conversion, as [`narrow`].
    pub fn widen(src: &[u16], dst: &mut [f32]) {
        use half::slice::HalfFloatSliceExt;
        let n = src.len().min(dst.len());
        halves(&src[..n]).convert_to_f32_slice(&mut dst[..n]);
    }
    /// `dst[i] += f32(src[i])`.
    pub fn add_widened(src: &[u16], dst: &mut [f32]) {
        pick!(add_widened(src, dst), {
            for (d, &s) in dst.iter_mut().zip(src) {
                *d += half::f16::from_bits(s).to_f32();
            }
        })
    }
    /// `out[i] = fp16(dst[i] + f32(src[i]))`, `dst[i] = f32(out[i])`.
    pub fn add_round(src: &[u16], dst: &mut [f32], out: &mut [u16]) {
        pick!(add_round(src, dst, out), {
            for ((d, &s), o) in dst.iter_mut().zip(src).zip(out.iter_mut()) {
                let h = half::f16::from_f32(*d + half::f16::from_bits(s).to_f32());
                *o = h.to_bits();
                *d = h.to_f32();
            }
        })
    }
    /// `out[i] = fp16(dst[i])`, `dst[i] = f32(out[i])`.
    pub fn round_in_place(dst: &mut [f32], out: &mut [u16]) {
        pick!(round_in_place(dst, out), {
            for (d, o) in dst.iter_mut().zip(out.iter_mut()) {
                let h = half::f16::from_f32(*d);
                *o = h.to_bits();
                *d = h.to_f32();
            }
        })
    }
}

/// Rounds `src` into `dst` (same length).
pub(crate) fn narrow(wire: Wire, src: &[f32], dst: &mut [u16]) {
    match wire {
        Wire::Bf16 => kernels::narrow_on(kernels::Isa::best(), src, dst),
        Wire::Fp16 => fp16::narrow(src, dst),
        Wire::Exact => unreachable!("nothing to narrow"),
    }
}

/// `dst[i] = widen(src[i])`.
pub(crate) fn widen(wire: Wire, src: &[u16], dst: &mut [f32]) {
    match wire {
        Wire::Bf16 => kernels::widen_on(kernels::Isa::best(), src, dst),
        Wire::Fp16 => fp16::widen(src, dst),
        Wire::Exact => unreachable!("nothing to widen"),
    }
}

/// `dst[i] += widen(src[i])`, in float32.
pub(crate) fn add_widened(wire: Wire, src: &[u16], dst: &mut [f32]) {
    match wire {
        Wire::Bf16 => kernels::add_widened_on(kernels::Isa::best(), src, dst),
        Wire::Fp16 => fp16::add_widened(src, dst),
        Wire::Exact => unreachable!("nothing to widen"),
    }
}

/// `dst[i] += widen(src[i])`, then `out[i] = narrow(dst[i])` and `dst[i] = widen(out[i])`, in
/// one pass (the last peer's piece of an owner's part, rounded as it is summed).
pub(crate) fn add_round(wire: Wire, src: &[u16], dst: &mut [f32], out: &mut [u16]) {
    match wire {
        Wire::Bf16 => kernels::add_round_on(kernels::Isa::best(), src, dst, out),
        Wire::Fp16 => fp16::add_round(src, dst, out),
        Wire::Exact => unreachable!("nothing to round"),
    }
}

/// `out[i] = narrow(dst[i])`, `dst[i] = widen(out[i])`.
pub(crate) fn round_in_place(wire: Wire, dst: &mut [f32], out: &mut [u16]) {
    match wire {
        Wire::Bf16 => kernels::round_in_place_on(kernels::Isa::best(), dst, out),
        Wire::Fp16 => fp16::round_in_place(dst, out),
        Wire::Exact => unreachable!("nothing to round"),
    }
}

/// What a window over a float32 range at `base` whose bytes arrive as 16-bit values does
/// with each part read off the lane: byte `j` of the window is element `j/2`, at `base + 2j`
/// as float32.
#[derive(Clone, Copy)]
enum OnArrival {
    /// `base[i] += widen(part[i])`.
    Add,
    /// As [`add_round`], the rounded sum also to `rounded + j` (the only peer's pieces:
    /// nothing else is summed in).
    AddRound(*mut u16),
    /// `base[i] = widen(part[i])` (the other owners' rounded parts).
    Widen,
}

fn widening_reducer(wire: Wire, base: *mut u8, what: OnArrival) -> scalefree_transport::Reducer {
    let base = base as usize;
    let rounded = match what {
        OnArrival::AddRound(r) => r as usize,
        _ => 0,
    };
    let what = match what {
        OnArrival::AddRound(_) => 1,
        OnArrival::Add => 0,
        OnArrival::Widen => 2,
    };
    std::sync::Arc::new(move |d: *mut u8, src: *const u8, bytes: usize| {
        let j = d as usize - base;
        let n = bytes / 2;
        let (src, dst) = unsafe { (std::slice::from_raw_parts(src as *const u16, n), std::slice::from_raw_parts_mut((base + 2 * j) as *mut f32, n)) };
        match what {
            1 => add_round(wire, src, dst, unsafe { std::slice::from_raw_parts_mut((rounded + j) as *mut u16, n) }),
            0 => add_widened(wire, src, dst),
            _ => widen(wire, src, dst),
        }
    })
}

/// Sends (or queues) at most this many pieces at a time from the ring of rounded pieces in
/// this rank's own slot of the scatter area (see [`group_allreduce`]).
const RING: usize = 4;

/// Sum allreduce of float32 elements `a..b` of `buf` among `group` (this rank in it) with
/// `wire` values on the network, through landing areas `areas` (scatter, gather); see the
/// module comment. The landing region must hold the largest float32 part already.
///
/// Nothing is allocated per call: the parts other owners reduce are rounded piece by piece
/// into a ring of [`RING`] pieces in this rank's own slot of the scatter area (no peer writes
/// there), each sent as soon as it is rounded, so the socket reads it from cache; a slot is
/// reused once its send is done. This rank's part, rounded, goes to its own slot of the
/// gather area, from where it is sent on.
///
/// Over TCP lanes, as the float32 all-to-all does ([`super::landing`]): the first peer's
/// pieces of this rank's part are widened and summed into it as they are read off the lane
/// in cache-sized parts (`SCALEFREE_REDUCE_ON_ARRIVAL`; with one peer also rounded there),
/// and, once this rank has rounded everything it sends, the other owners' rounded parts are
/// widened straight into the caller's buffer as they are read (`SCALEFREE_DIRECT_LANDING`):
/// no 16-bit copy of them passes through memory.
///
/// # Safety
/// `buf` valid for `b` float32 elements.
pub(super) unsafe fn group_allreduce(c: &mut Communicator, group: &[u32], buf: *mut f32, a: usize, b: usize, wire: Wire, areas: (usize, usize)) -> Result<()> {
    const WES: usize = 2;
    let g = group.len() as u32;
    if g < 2 || b == a {
        return Ok(());
    }
    let me_idx = group.iter().position(|&r| r == c.rank).unwrap() as u32;
    let part = |i: u32| {
        let (x, y) = chunk_bounds(b - a, g, i, ALIGN_ELEMS);
        (a + x, a + y)
    };
    // Elements e0..e1 of the buffer, for a moment (a lane's reader may write other parts).
    let elems = |e0: usize, e1: usize| unsafe { std::slice::from_raw_parts_mut(buf.add(e0), e1 - e0) };
    let piece = c.net_piece_bytes() / 2; // as many elements per piece as the float32 path
    let peers: Vec<(u32, u32)> = (1..g).map(|k| (me_idx + k) % g).map(|i| (i, group[i as usize])).collect();
    let me = c.rank;
    let (x, y) = part(me_idx);
    let mine = unsafe { buf.add(x) } as *mut u8;
    // Our part rounded, as it is sent on (rounded on arrival when there is one peer): in our
    // own slot of the gather area, which holds a float32 part.
    let reduced = c.own_slot(areas.1) as *mut u16;
    let only = (peers.len() == 1).then_some(reduced);
    let reducing = || {
        let q = peers[0].1;
        let what = only.map_or(OnArrival::Add, OnArrival::AddRound);
        Window { offset: c.area_base(areas.0) + c.slot(q), len: (y - x) * WES, dst: mine, reduce: Some(widening_reducer(wire, mine, what)) }
    };
    let mut direct: Option<DirectLanding> = None;
    if reduce_on_arrival_on() {
        unsafe { c.set_windows(&[reducing()], Some(areas.0), &mut direct) };
    }
    // Every part but ours, rounded once, piece by piece into the ring, each piece sent as it
    // is rounded. Pieces are at most 1/256 of a part or `piece` bytes, and the slot holds a
    // float32 part and at least 1 MiB: RING pieces fit.
    let ring = c.own_slot(areas.0);
    let largest = peers.iter().map(|&(i, _)| pieces((part(i).1 - part(i).0) * WES, piece, WES).0).max().unwrap_or(0);
    let cap = c.chunk_cap();
    debug_assert!(largest <= cap, "a piece fits the ring");
    let slots = (cap / largest.max(1)).clamp(1, RING);
    let mut in_ring: Vec<Option<scalefree_transport::Completion>> = (0..slots).map(|_| None).collect();
    let mut t = 0;
    for &(i, q) in &peers {
        let (px, py) = part(i);
        let bytes = (py - px) * WES;
        let (p, np) = pieces(bytes, piece, WES);
        for k in 0..np {
            let (e0, e1) = (px + k * p / WES, px + (k * p + p.min(bytes - k * p)) / WES);
            let s = t % slots;
            if let Some(done) = in_ring[s].take() {
                done.wait()?;
            }
            let at = unsafe { ring.add(s * largest) };
            narrow(wire, elems(e0, e1), unsafe { std::slice::from_raw_parts_mut(at as *mut u16, e1 - e0) });
            in_ring[s] = Some(unsafe { c.send_at(q, at, (e1 - e0) * WES, areas.0, c.slot(me) + k * p, k)? });
            t += 1;
        }
    }
    // Nothing of the other parts is read any more: their rounded sums may be widened into
    // place as they arrive.
    if direct_landing_on() {
        let mut windows: Vec<Window> = peers
            .iter()
            .map(|&(i, q)| {
                let (px, py) = part(i);
                let at = unsafe { buf.add(px) } as *mut u8;
                Window { offset: c.area_base(areas.1) + c.slot(q), len: (py - px) * WES, dst: at, reduce: Some(widening_reducer(wire, at, OnArrival::Widen)) }
            })
            .collect();
        let reduces = direct.is_some() && reduce_on_arrival_on();
        if reduces {
            windows.push(reducing());
        }
        unsafe { c.set_windows(&windows, reduces.then_some(areas.0), &mut direct) };
    }
    // Our part: sum the others' rounded copies in, round the sum once, keep and send it.
    let bytes = (y - x) * WES;
    let (p, np) = pieces(bytes, piece, WES);
    let mut forwarded = Vec::new();
    for k in 0..np {
        let off = k * p;
        let len = p.min(bytes - off);
        let (e0, e1) = (x + off / WES, x + (off + len) / WES);
        let r = unsafe { std::slice::from_raw_parts_mut(reduced.add(off / WES), len / WES) };
        for (j, &(_, q)) in peers.iter().enumerate() {
            let seq = c.seq;
            c.wait_landed(c.landed_word(areas.0, q, k), &|| format!("rank {q}'s {} piece {k} of allreduce call #{seq}", wire.name()))?;
            let last = j + 1 == peers.len();
            if c.reduced_on_arrival(&direct, q, k) {
                if last && only.is_none() {
                    round_in_place(wire, elems(e0, e1), r);
                }
                continue;
            }
            let got = unsafe { std::slice::from_raw_parts(c.landed(areas.0, q, off) as *const u16, len / WES) };
            if last {
                add_round(wire, got, elems(e0, e1), r);
            } else {
                add_widened(wire, got, elems(e0, e1));
            }
        }
        for &(_, q) in &peers {
            forwarded.push(unsafe { c.send_at(q, r.as_ptr() as *const u8, len, areas.1, c.slot(me) + off, k)? });
        }
    }
    wait_all(in_ring.into_iter().flatten().collect())?;
    // The other parts, rounded by their owners: widened as they arrived, or from the region.
    for &(i, q) in &peers {
        let (qx, qy) = part(i);
        let qbytes = (qy - qx) * WES;
        let (qp, qnp) = pieces(qbytes, piece, WES);
        for k in 0..qnp {
            let off = k * qp;
            let len = qp.min(qbytes - off);
            let seq = c.seq;
            c.wait_landed(c.landed_word(areas.1, q, k), &|| format!("rank {q}'s reduced {} piece {k} of allreduce call #{seq}", wire.name()))?;
            if !(direct.is_some() && c.landed_direct(areas.1, q, k)) {
                let e0 = qx + off / WES;
                let got = unsafe { std::slice::from_raw_parts(c.landed(areas.1, q, off) as *const u16, len / WES) };
                widen(wire, got, elems(e0, e0 + len / WES));
            }
        }
    }
    drop(direct);
    wait_all(forwarded)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `n` states of a xorshift generator from `seed`: random bit patterns.
    fn xorshift(seed: u64, n: usize) -> impl Iterator<Item = u64> {
        std::iter::successors(Some(seed), |&s| {
            let s = s ^ (s << 13);
            let s = s ^ (s >> 7);
            Some(s ^ (s << 17))
        })
        .skip(1)
        .take(n)
    }

    #[test]
    fn bf16_rounds_to_nearest_even() {
        for &x in &[0.0f32, -0.0, 1.0, -2.5, 3.140625, 1e-40, f32::MAX, f32::MIN_POSITIVE, f32::INFINITY, 65504.0, 1.0 + 1.0 / 256.0, 1.0 + 3.0 / 512.0] {
            let h = to_bf16(x);
            let back = from_bf16(h);
            let want = half::bf16::from_f32(x).to_f32();
            assert_eq!(back.to_bits(), want.to_bits(), "{x}");
        }
        assert!(from_bf16(to_bf16(f32::NAN)).is_nan());
        // Ties go to even.
        assert_eq!(from_bf16(to_bf16(1.0 + 1.0 / 256.0)), 1.0);
        assert_eq!(from_bf16(to_bf16(1.0 + 3.0 / 256.0)), 1.0 + 4.0 / 256.0);
    }

    /// Every compiled set of the bf16 loops gives `half`'s bits, for every kind of float32
    /// (zeros, subnormals, ties either way, the largest finite values rounding to infinity,
    /// infinities, quiet and signalling NaNs with payloads, random bit patterns) and lengths
    /// that leave every tail of a vector.
    #[test]
    fn bf16_loops_match_half_on_every_isa() {
        let mut bits: Vec<u32> = vec![
            0, 0x8000_0000, 1, 0x8000_0001, 0x007F_FFFF, 0x0080_0000, 0x3F80_8000, 0x3F81_8000, 0x3F80_8001, 0xBF80_8000,
            0x7F7F_FFFF, 0xFF7F_FFFF, 0x7F7F_7FFF, 0x7F80_0000, 0xFF80_0000, 0x7FC0_0000, 0x7F80_0001, 0xFF80_0001, 0x7FFF_FFFF,
            0xFFFF_FFFF, 0x7FBF_FFFF,
        ];
        bits.extend(xorshift(0x9E37_79B9_7F4A_7C15, 5000).map(|s| s as u32));
        let src: Vec<f32> = bits.iter().map(|&b| f32::from_bits(b)).collect();
        let halves: Vec<u16> = bits.iter().map(|&b| (b >> 16) as u16).collect();
        let want_narrow: Vec<u16> = src.iter().map(|&x| half::bf16::from_f32(x).to_bits()).collect();
        let want_widen: Vec<u32> = halves.iter().map(|&h| half::bf16::from_bits(h).to_f32().to_bits()).collect();
        let same = |a: f32, b: f32| a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan());
        for isa in [kernels::Isa::Portable, kernels::Isa::Avx2, kernels::Isa::Avx512] {
            if !isa.available() {
                continue;
            }
            for n in [0usize, 1, 7, 31, 33, 100, src.len()] {
                let mut h = vec![0u16; n];
                kernels::narrow_on(isa, &src[..n], &mut h);
                assert_eq!(h, want_narrow[..n], "{isa:?} narrow, {n}");
                let mut f = vec![0f32; n];
                kernels::widen_on(isa, &halves[..n], &mut f);
                assert_eq!(f.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), want_widen[..n], "{isa:?} widen, {n}");
                // Sums: a float32 accumulator of finite values plus every 16-bit value.
                let acc: Vec<f32> = (0..n).map(|i| (i as f32 - 50.0) * 0.731).collect();
                let mut added = acc.clone();
                kernels::add_widened_on(isa, &halves[..n], &mut added);
                let mut fused = acc.clone();
                let mut out = vec![0u16; n];
                kernels::add_round_on(isa, &halves[..n], &mut fused, &mut out);
                let mut in_place = src[..n].to_vec();
                let mut out2 = vec![0u16; n];
                kernels::round_in_place_on(isa, &mut in_place, &mut out2);
                for i in 0..n {
                    let sum = acc[i] + half::bf16::from_bits(halves[i]).to_f32();
                    assert!(same(added[i], sum), "{isa:?} add_widened {i}");
                    let r = half::bf16::from_f32(sum);
                    assert!(out[i] == r.to_bits() || (sum.is_nan() && half::bf16::from_bits(out[i]).is_nan()), "{isa:?} add_round {i}");
                    assert!(same(fused[i], r.to_f32()), "{isa:?} add_round {i}");
                    assert_eq!(out2[i], want_narrow[i], "{isa:?} round_in_place {i}");
                    assert!(same(in_place[i], half::bf16::from_bits(want_narrow[i]).to_f32()), "{isa:?} round_in_place {i}");
                }
            }
        }
    }

    /// The fp16 loops (F16C where the CPU has it) give `half`'s bits for every kind of
    /// float32 (zeros, subnormals of both formats, ties, values past 65504, infinities, NaNs,
    /// random bit patterns) and every tail length; a NaN only needs to stay a NaN.
    #[test]
    fn fp16_loops_match_half() {
        let mut bits: Vec<u32> = vec![
            0, 0x8000_0000, 1, 0x8000_0001, 0x007F_FFFF, 0x0080_0000, 0x3380_0000, 0x3300_0000, 0x3380_0001, 0x387F_C000,
            0x3F80_1000, 0x3F80_3000, 0x3F80_1001, 0x477F_E000, 0x477F_F000, 0x477F_EFFF, 0x4780_0000, 0x7F7F_FFFF, 0xFF7F_FFFF,
            0x7F80_0000, 0xFF80_0000, 0x7FC0_0000, 0x7F80_0001, 0xFFFF_FFFF,
        ];
        for s in xorshift(0x2545_F491_4F6C_DD1D, 5000) {
            bits.push(s as u32);
            // Values in fp16's range too, not only random exponents.
            bits.push(((s >> 32) as u32 & 0x8FFF_FFFF) | 0x3000_0000);
        }
        let src: Vec<f32> = bits.iter().map(|&b| f32::from_bits(b)).collect();
        let halves: Vec<u16> = bits.iter().map(|&b| b as u16).collect();
        let same = |a: f32, b: f32| a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan());
        let same_h = |a: u16, b: u16| a == b || (half::f16::from_bits(a).is_nan() && half::f16::from_bits(b).is_nan());
        for n in [0usize, 1, 7, 8, 9, 31, 100, src.len()] {
            let mut h = vec![0u16; n];
            fp16::narrow(&src[..n], &mut h);
            let mut f = vec![0f32; n];
            fp16::widen(&halves[..n], &mut f);
            let acc: Vec<f32> = (0..n).map(|i| (i as f32 - 50.0) * 0.731).collect();
            let mut added = acc.clone();
            fp16::add_widened(&halves[..n], &mut added);
            let mut fused = acc.clone();
            let mut out = vec![0u16; n];
            fp16::add_round(&halves[..n], &mut fused, &mut out);
            let mut in_place = src[..n].to_vec();
            let mut out2 = vec![0u16; n];
            fp16::round_in_place(&mut in_place, &mut out2);
            for i in 0..n {
                let want = half::f16::from_f32(src[i]);
                assert!(same_h(h[i], want.to_bits()), "narrow {:#x}: {:#x} vs {:#x}", bits[i], h[i], want.to_bits());
                assert!(same(f[i], half::f16::from_bits(halves[i]).to_f32()), "widen {:#x}", halves[i]);
                let sum = acc[i] + half::f16::from_bits(halves[i]).to_f32();
                assert!(same(added[i], sum), "add_widened {i}");
                let r = half::f16::from_f32(sum);
                assert!(same_h(out[i], r.to_bits()), "add_round {i}");
                assert!(same(fused[i], r.to_f32()), "add_round {i}");
                assert!(same_h(out2[i], want.to_bits()), "round_in_place {i}");
                assert!(same(in_place[i], want.to_f32()), "round_in_place {i}");
            }
        }
    }

    #[test]
    fn narrow_widen_within_unit_roundoff() {
        let src: Vec<f32> = (0..1000).map(|i| (i as f32 - 500.0) * 0.37 + 1e-3).collect();
        for wire in [Wire::Bf16, Wire::Fp16] {
            let mut h = vec![0u16; src.len()];
            narrow(wire, &src, &mut h);
            let mut back = vec![0f32; src.len()];
            widen(wire, &h, &mut back);
            let mut acc = vec![1f32; src.len()];
            add_widened(wire, &h, &mut acc);
            let mut fused = vec![1f32; src.len()];
            let mut out = vec![0u16; src.len()];
            add_round(wire, &h, &mut fused, &mut out);
            let mut rounded = vec![0u16; src.len()];
            narrow(wire, &acc, &mut rounded);
            for i in 0..src.len() {
                let err = ((back[i] - src[i]) as f64).abs();
                assert!(err <= wire.unit_roundoff() * (src[i] as f64).abs() + 1e-30, "{wire:?} {} -> {}", src[i], back[i]);
                assert_eq!(acc[i], 1.0 + back[i]);
                assert_eq!(out[i], rounded[i]);
                let mut w = [0f32];
                widen(wire, &rounded[i..i + 1], &mut w);
                assert_eq!(fused[i], w[0]);
            }
        }
    }
}
