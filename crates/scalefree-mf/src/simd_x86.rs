//! x86-64 SGD kernels with explicit AVX2+FMA and AVX-512 intrinsics (see [`crate::kernel`]
//! for the update rule and the dispatch). Both work on `w = k` rounded up to 8 lanes per row:
//! rows are `ld ≥ w` floats apart and lanes `k..w` hold zeros, which stay zero (their
//! gradient is λ·0 − e·0). A row of P and a row of Q live in registers for the whole update:
//! one load, a dot product, the fused AdaGrad gradient / norm / step pass, one store.
//! The rows of the rating 16 places ahead are prefetched into L2; those of the rating 6
//! places ahead, and their AdaGrad accumulators, into L1.
//!
//! One body, [`sgd_rows`], is the kernel of both instruction sets: it is generic over the
//! register type ([`Lanes`]: AVX2's 8 lanes, [`Ymm`], or AVX-512's 16, [`Zmm`]) and inlined
//! into [`block_avx2`] and [`block_avx512`], whose target features enable the instructions.
//! LIBMF's split rule ([`Schedule::AdagradSplit`]) has an AVX2 kernel only
//! ([`block_split_avx2`]), built a second time for AVX-512VL's 32 registers.

#![cfg(target_arch = "x86_64")]

use std::arch::x86_64::*;

use crate::kernel::{split_norms, Entry, Factors, Schedule, SgdParams};

/// How many ratings ahead the rows are prefetched.
const AHEAD: usize = 6;
/// How many ratings ahead the rows are first prefetched into L2. The L1 prefetch alone cannot
/// keep enough misses in flight when the blocks are not in the caches (rima's and dsgd-ps's
/// blocks of 12,500 rows and more, which arrive from other ranks); starting each row's fetch
/// 16 ratings earlier into L2 made those updates about 22 % faster and costs nothing
/// measurable on blocks in cache (`docs/benchmarks/mf.md`).
const FAR: usize = 16;

/// Prefetches the cache lines of one row: into L1 with `_MM_HINT_T0`, into L2 with
/// `_MM_HINT_T1`.
#[inline(always)]
unsafe fn prefetch_row<const HINT: i32>(ptr: *const f32, bytes: usize) {
    let mut off = 0;
    while off < bytes {
        // SAFETY: prefetch never faults; the address is inside the factor array anyway.
        unsafe { _mm_prefetch::<HINT>((ptr as *const i8).add(off)) };
        off += 64;
    }
}

/// Prefetches the AdaGrad accumulators at `pg[a]` and `qg[b]` into L1: in blocks larger
/// than the caches they miss as often as the rows do (about 18 % of the update time on
/// cold 12,500-row blocks; `docs/benchmarks/mf.md`).
#[inline(always)]
unsafe fn prefetch_acc(f: Factors, a: usize, b: usize) {
    // SAFETY: prefetch never faults.
    unsafe {
        _mm_prefetch::<_MM_HINT_T0>(f.pg.add(a) as *const i8);
        _mm_prefetch::<_MM_HINT_T0>(f.qg.add(b) as *const i8);
    }
}

/// The step sizes of one update: η, or η over the root of each row's AdaGrad accumulator.
///
/// # Safety
/// With `ADA`, rows `u` of `pg` and `i` of `qg` are in bounds.
#[inline(always)]
unsafe fn step_sizes<const ADA: bool>(f: Factors, prm: &SgdParams, u: usize, i: usize) -> (f32, f32) {
    if ADA {
        unsafe { (prm.eta / (*f.pg.add(u)).sqrt(), prm.eta / (*f.qg.add(i)).sqrt()) }
    } else {
        (prm.eta, prm.eta)
    }
}

/// Adds one update's mean squared gradients to the rows' AdaGrad accumulators.
///
/// # Safety
/// As [`step_sizes`].
#[inline(always)]
unsafe fn accumulate(f: Factors, u: usize, i: usize, gp: f32, gq: f32) {
    unsafe {
        *f.pg.add(u) += gp;
        *f.qg.add(i) += gq;
    }
}

#[inline]
#[target_feature(enable = "avx2,fma")]
fn hsum256(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// Prefetches the rows of the rating `FAR` places after `n` into L2, and those of the rating
/// `AHEAD` places after it into L1, with (when `ADA`) their AdaGrad accumulators, `acc` per row.
///
/// # Safety
/// Every entry's rows are in bounds (prefetches never fault; the addresses are computed).
#[inline(always)]
unsafe fn prefetch_ahead<const ADA: bool>(block: &[Entry], n: usize, f: Factors, ld: usize, row_bytes: usize, acc: usize) {
    if let Some(nx) = block.get(n + FAR) {
        // SAFETY: prefetches of in-bounds rows.
        unsafe {
            prefetch_row::<_MM_HINT_T1>(f.p.add(nx.u as usize * ld), row_bytes);
            prefetch_row::<_MM_HINT_T1>(f.q.add(nx.i as usize * ld), row_bytes);
        }
    }
    if let Some(nx) = block.get(n + AHEAD) {
        // SAFETY: prefetches of in-bounds rows.
        unsafe {
            prefetch_row::<_MM_HINT_T0>(f.p.add(nx.u as usize * ld), row_bytes);
            prefetch_row::<_MM_HINT_T0>(f.q.add(nx.i as usize * ld), row_bytes);
            if ADA {
                prefetch_acc(f, nx.u as usize * acc, nx.i as usize * acc);
            }
        }
    }
}

/// One register of f32 lanes and what the SGD update does with it. The methods are plain
/// (no target features of their own): they are inlined into the `#[target_feature]` kernels
/// that instantiate [`sgd_rows`], which enable the instructions.
trait Lanes: Copy {
    /// Floats in a row of `n` chunks (the last one a half in a [`Zmm`] of `HALF`).
    fn row_floats(n: usize) -> usize;
    unsafe fn zero() -> Self;
    unsafe fn splat(x: f32) -> Self;
    /// Chunk `j` of the `n` chunks of the row at `row`.
    unsafe fn load(row: *const f32, j: usize, n: usize) -> Self;
    unsafe fn store(self, row: *mut f32, j: usize, n: usize);
    unsafe fn mul(self, b: Self) -> Self;
    unsafe fn add(self, b: Self) -> Self;
    /// `self · b + c`.
    unsafe fn mul_add(self, b: Self, c: Self) -> Self;
    /// `self · b − c`.
    unsafe fn mul_sub(self, b: Self, c: Self) -> Self;
    /// `c − self · b`.
    unsafe fn neg_mul_add(self, b: Self, c: Self) -> Self;
    /// The sum of the lanes.
    unsafe fn sum(self) -> f32;
}

/// AVX2: 8 lanes.
#[derive(Clone, Copy)]
struct Ymm(__m256);

// SAFETY (every method): only called from the kernels that enable these instructions.
impl Lanes for Ymm {
    fn row_floats(n: usize) -> usize {
        8 * n
    }
    #[inline(always)]
    unsafe fn zero() -> Self {
        unsafe { Ymm(_mm256_setzero_ps()) }
    }
    #[inline(always)]
    unsafe fn splat(x: f32) -> Self {
        unsafe { Ymm(_mm256_set1_ps(x)) }
    }
    #[inline(always)]
    unsafe fn load(row: *const f32, j: usize, _n: usize) -> Self {
        // SAFETY: lanes 8j..8j+8 < ld of an in-bounds row (the kernel's contract).
        Ymm(unsafe { _mm256_loadu_ps(row.add(8 * j)) })
    }
    #[inline(always)]
    unsafe fn store(self, row: *mut f32, j: usize, _n: usize) {
        // SAFETY: as for the load.
        unsafe { _mm256_storeu_ps(row.add(8 * j), self.0) }
    }
    #[inline(always)]
    unsafe fn mul(self, b: Self) -> Self {
        unsafe { Ymm(_mm256_mul_ps(self.0, b.0)) }
    }
    #[inline(always)]
    unsafe fn add(self, b: Self) -> Self {
        unsafe { Ymm(_mm256_add_ps(self.0, b.0)) }
    }
    #[inline(always)]
    unsafe fn mul_add(self, b: Self, c: Self) -> Self {
        unsafe { Ymm(_mm256_fmadd_ps(self.0, b.0, c.0)) }
    }
    #[inline(always)]
    unsafe fn mul_sub(self, b: Self, c: Self) -> Self {
        unsafe { Ymm(_mm256_fmsub_ps(self.0, b.0, c.0)) }
    }
    #[inline(always)]
    unsafe fn neg_mul_add(self, b: Self, c: Self) -> Self {
        unsafe { Ymm(_mm256_fnmadd_ps(self.0, b.0, c.0)) }
    }
    #[inline(always)]
    unsafe fn sum(self) -> f32 {
        unsafe { hsum256(self.0) }
    }
}

/// AVX-512: 16 lanes; with `HALF`, a row's last chunk is masked to its first 8 lanes.
#[derive(Clone, Copy)]
struct Zmm<const HALF: bool>(__m512);

impl<const HALF: bool> Zmm<HALF> {
    #[inline(always)]
    fn mask(j: usize, n: usize) -> __mmask16 {
        if HALF && j == n - 1 { 0x00ff } else { 0xffff }
    }
}

// SAFETY (every method): only called from the kernels that enable these instructions.
impl<const HALF: bool> Lanes for Zmm<HALF> {
    fn row_floats(n: usize) -> usize {
        16 * n - if HALF { 8 } else { 0 }
    }
    #[inline(always)]
    unsafe fn zero() -> Self {
        unsafe { Zmm(_mm512_setzero_ps()) }
    }
    #[inline(always)]
    unsafe fn splat(x: f32) -> Self {
        unsafe { Zmm(_mm512_set1_ps(x)) }
    }
    #[inline(always)]
    unsafe fn load(row: *const f32, j: usize, n: usize) -> Self {
        // SAFETY: the unmasked lanes lie inside an in-bounds row.
        Zmm(unsafe { _mm512_maskz_loadu_ps(Self::mask(j, n), row.add(16 * j)) })
    }
    #[inline(always)]
    unsafe fn store(self, row: *mut f32, j: usize, n: usize) {
        // SAFETY: as for the load.
        unsafe { _mm512_mask_storeu_ps(row.add(16 * j), Self::mask(j, n), self.0) }
    }
    #[inline(always)]
    unsafe fn mul(self, b: Self) -> Self {
        unsafe { Zmm(_mm512_mul_ps(self.0, b.0)) }
    }
    #[inline(always)]
    unsafe fn add(self, b: Self) -> Self {
        unsafe { Zmm(_mm512_add_ps(self.0, b.0)) }
    }
    #[inline(always)]
    unsafe fn mul_add(self, b: Self, c: Self) -> Self {
        unsafe { Zmm(_mm512_fmadd_ps(self.0, b.0, c.0)) }
    }
    #[inline(always)]
    unsafe fn mul_sub(self, b: Self, c: Self) -> Self {
        unsafe { Zmm(_mm512_fmsub_ps(self.0, b.0, c.0)) }
    }
    #[inline(always)]
    unsafe fn neg_mul_add(self, b: Self, c: Self) -> Self {
        unsafe { Zmm(_mm512_fnmadd_ps(self.0, b.0, c.0)) }
    }
    #[inline(always)]
    unsafe fn sum(self) -> f32 {
        unsafe { _mm512_reduce_add_ps(self.0) }
    }
}

/// The SGD kernel (constant step, or AdaGrad with one accumulator per row) for rows of `N`
/// registers of `V`, rows `ld` floats apart: for each rating, the error of the rows' dot
/// product, then `p −= s_p (λp − e q)` and `q −= s_q (λq − e p)` from the old values, and the
/// mean squared gradients into the accumulators. Returns Σ e².
///
/// # Safety
/// As the kernel that instantiates it, whose target features `V`'s instructions need.
#[inline(always)]
unsafe fn sgd_rows<V: Lanes, const N: usize, const ADA: bool>(block: &[Entry], f: Factors, prm: &SgdParams, ld: usize) -> f64 {
    // SAFETY (all vector operations): inlined into a kernel with `V`'s target features.
    unsafe {
        let lam = V::splat(prm.lambda);
        let inv_k = 1.0 / prm.k as f32;
        let row_bytes = V::row_floats(N) * 4;
        let mut loss = 0f64;
        for (n, en) in block.iter().enumerate() {
            prefetch_ahead::<ADA>(block, n, f, ld, row_bytes, 1);
            let (u, i) = (en.u as usize, en.i as usize);
            // Rows u and i are in bounds and exclusively ours (caller's contract).
            let (pp, qp) = (f.p.add(u * ld), f.q.add(i * ld));
            let mut p = [V::zero(); N];
            let mut q = [V::zero(); N];
            for j in 0..N {
                p[j] = V::load(pp, j, N);
                q[j] = V::load(qp, j, N);
            }
            let mut d0 = p[0].mul(q[0]);
            let mut d1 = V::zero();
            for j in 1..N {
                if j % 2 == 1 {
                    d1 = p[j].mul_add(q[j], d1);
                } else {
                    d0 = p[j].mul_add(q[j], d0);
                }
            }
            let e = en.r - d0.add(d1).sum();
            loss += (e * e) as f64;
            let ev = V::splat(e);
            // Accumulator rows u and i, in bounds and ours.
            let (sp, sq) = step_sizes::<ADA>(f, prm, u, i);
            let (spv, sqv) = (V::splat(sp), V::splat(sq));
            let mut ap = V::zero();
            let mut aq = V::zero();
            for j in 0..N {
                // gp = λp − e q, gq = λq − e p (old values); p −= sp·gp, q −= sq·gq.
                let gp = lam.mul_sub(p[j], ev.mul(q[j]));
                let gq = lam.mul_sub(q[j], ev.mul(p[j]));
                if ADA {
                    ap = gp.mul_add(gp, ap);
                    aq = gq.mul_add(gq, aq);
                }
                spv.neg_mul_add(gp, p[j]).store(pp, j, N);
                sqv.neg_mul_add(gq, q[j]).store(qp, j, N);
            }
            if ADA {
                accumulate(f, u, i, ap.sum() * inv_k, aq.sum() * inv_k);
            }
        }
        loss
    }
}

/// AVX2 kernel for rows of `N` × 8 lanes, rows `ld` floats apart.
///
/// # Safety
/// The CPU has AVX2 and FMA; every `u`/`i` indexes a row of P/Q (and of the accumulators);
/// `ld ≥ 8N`; no other thread touches these rows during the call.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub unsafe fn block_avx2<const N: usize, const ADA: bool>(block: &[Entry], f: Factors, prm: &SgdParams, ld: usize) -> f64 {
    // SAFETY: forwarded contract; this function enables Ymm's instructions.
    unsafe { sgd_rows::<Ymm, N, ADA>(block, f, prm, ld) }
}

/// AVX-512 kernel: rows of `N` × 16 lanes, the last 16-lane chunk masked to its first 8 when
/// `HALF` (w = 16N − 8), rows `ld` floats apart.
///
/// # Safety
/// The CPU has AVX-512F; otherwise as [`block_avx2`] with `ld ≥ 16N − 8·HALF`.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma")]
pub unsafe fn block_avx512<const N: usize, const HALF: bool, const ADA: bool>(block: &[Entry], f: Factors, prm: &SgdParams, ld: usize) -> f64 {
    // SAFETY: forwarded contract; this function enables Zmm's instructions.
    unsafe { sgd_rows::<Zmm<HALF>, N, ADA>(block, f, prm, ld) }
}

/// Defines the AVX2 kernel of LIBMF's split rule (below) under the given name and target
/// features.
macro_rules! split_kernel {
    ($(#[$m:meta])* $name:ident, $feat:literal) => {
$(#[$m])*
#[inline]
#[target_feature(enable = $feat)]
pub unsafe fn $name<const N: usize>(block: &[Entry], f: Factors, prm: &SgdParams, ld: usize) -> f64 {
    // SPLIT (LIBMF's rule): chunk 0 has accumulator 2u, chunks 1.. accumulator 2u + 1.
    let slow_only = matches!(prm.schedule, Schedule::AdagradSplit { slow_only: true });
    let (rs, rf) = split_norms(prm.k);
    let upto = if slow_only { 1 } else { N };
    // In a slow-only pass the fast lanes do not move and their accumulators get nothing.
    let rf_eff = if slow_only { 0.0 } else { rf };
    let norms = _mm_setr_ps(rs, rf_eff, rs, rf_eff);
    let row_bytes = N * 32;
    let mut loss = 0f64;
    for (n, en) in block.iter().enumerate() {
        // SAFETY: in-bounds rows (caller's contract).
        unsafe { prefetch_ahead::<true>(block, n, f, ld, row_bytes, 2) };
        let (u, i) = (en.u as usize, en.i as usize);
        // SAFETY: rows u and i are in bounds and exclusively ours (caller's contract).
        let (pp, qp) = unsafe { (f.p.add(u * ld), f.q.add(i * ld)) };
        let mut p = [_mm256_setzero_ps(); N];
        let mut q = [_mm256_setzero_ps(); N];
        for j in 0..N {
            // SAFETY: lanes 8j..8j+8 < ld of an in-bounds row.
            unsafe {
                p[j] = _mm256_loadu_ps(pp.add(8 * j));
                q[j] = _mm256_loadu_ps(qp.add(8 * j));
            }
        }
        // LIBMF's rule. The squared gradient norms per accumulator follow from the old rows
        // alone: with gp = λp − e q and gq = λq − e p over the lanes of one accumulator,
        // Σgp² = λ²·p·p − 2λe·p·q + e²·q·q (and p, q swapped for Σgq²). The three dot
        // products per accumulator are summed next to p·q, before e is known, so the next
        // rating of the same item or user waits only for a few FMAs, not for a reduction
        // of the new gradients.
        let ds = _mm256_mul_ps(p[0], q[0]);
        let (pps, qqs) = (_mm256_mul_ps(p[0], p[0]), _mm256_mul_ps(q[0], q[0]));
        let (mut df0, mut df1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        let (mut ppf, mut qqf) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        for j in 1..N {
            if j % 2 == 1 {
                df1 = _mm256_fmadd_ps(p[j], q[j], df1);
            } else {
                df0 = _mm256_fmadd_ps(p[j], q[j], df0);
            }
            ppf = _mm256_fmadd_ps(p[j], p[j], ppf);
            qqf = _mm256_fmadd_ps(q[j], q[j], qqf);
        }
        let df = _mm256_add_ps(df0, df1);
        let e = en.r - hsum256(_mm256_add_ps(ds, df));
        loss += (e * e) as f64;
        // [ds, df, pp_s, pp_f] and [qq_s, qq_f, qq_s, qq_f].
        let h4 = _mm256_hadd_ps(_mm256_hadd_ps(ds, df), _mm256_hadd_ps(pps, ppf));
        let h5 = _mm256_hadd_ps(qqs, qqf);
        let h5 = _mm256_hadd_ps(h5, h5);
        let s1 = _mm_add_ps(_mm256_castps256_ps128(h4), _mm256_extractf128_ps::<1>(h4));
        let s2 = _mm_add_ps(_mm256_castps256_ps128(h5), _mm256_extractf128_ps::<1>(h5));
        let a = _mm_shuffle_ps::<0b01_00_11_10>(s1, s2); // [pp_s, pp_f, qq_s, qq_f]
        let b = _mm_movelh_ps(s1, s1); // [ds, df, ds, df]
        let c = _mm_shuffle_ps::<0b11_10_01_00>(s2, s1); // [qq_s, qq_f, pp_s, pp_f]
        let sums = _mm_fmadd_ps(_mm_set1_ps(e * e), c, _mm_fmadd_ps(_mm_set1_ps(-2.0 * prm.lambda * e), b, _mm_mul_ps(_mm_set1_ps(prm.lambda * prm.lambda), a)));
        // Rounding can leave a tiny negative sum where the gradient is ~0.
        let sums = _mm_max_ps(sums, _mm_setzero_ps());
        // The four accumulators [pg_slow, pg_fast, qg_slow, qg_fast] in one register
        // (each row's pair is contiguous): one sqrt and one division give all four steps.
        // SAFETY: accumulators 2u, 2u + 1, 2i, 2i + 1: in bounds and ours.
        let (pg, qg) = unsafe { (f.pg.add(2 * u), f.qg.add(2 * i)) };
        let g = unsafe { _mm_castpd_ps(_mm_loadh_pd(_mm_load_sd(pg as *const f64), qg as *const f64)) };
        let st = _mm_div_ps(_mm_set1_ps(prm.eta), _mm_sqrt_ps(g));
        let gn = _mm_fmadd_ps(sums, norms, g);
        // SAFETY: as above.
        unsafe {
            _mm_store_sd(pg as *mut f64, _mm_castps_pd(gn));
            _mm_storeh_pd(qg as *mut f64, _mm_castps_pd(gn));
        }
        // p − s(λp − e q) = (1 − sλ)p + (s e)q: per accumulator the two factors
        // [1 − sλ] and [s e] for [p slow, p fast, q slow, q fast], one FMA and one multiply
        // per chunk and side.
        let keep = _mm_fnmadd_ps(st, _mm_set1_ps(prm.lambda), _mm_set1_ps(1.0));
        let pull = _mm_mul_ps(st, _mm_set1_ps(e));
        let bc = |v: __m128| {
            let hi = _mm_movehl_ps(v, v);
            [(_mm256_broadcastss_ps(v), _mm256_broadcastss_ps(hi)), (_mm256_broadcastss_ps(_mm_movehdup_ps(v)), _mm256_broadcastss_ps(_mm_movehdup_ps(hi)))]
        };
        let (kv, pv) = (bc(keep), bc(pull));
        for j in 0..upto {
            let s = (j > 0) as usize;
            let ((kp, kq), (ep, eq)) = (kv[s], pv[s]);
            // SAFETY: as for the loads.
            unsafe {
                _mm256_storeu_ps(pp.add(8 * j), _mm256_fmadd_ps(kp, p[j], _mm256_mul_ps(ep, q[j])));
                _mm256_storeu_ps(qp.add(8 * j), _mm256_fmadd_ps(kq, q[j], _mm256_mul_ps(eq, p[j])));
            }
        }
    }
    loss
}
    };
}

split_kernel!(
    /// AVX2 kernel of LIBMF's split rule ([`Schedule::AdagradSplit`]) for rows of `N` × 8
    /// lanes, rows `ld` floats apart.
    ///
    /// # Safety
    /// As [`block_avx2`], with two accumulators per row.
    block_split_avx2,
    "avx2,fma"
);
split_kernel!(
    /// [`block_split_avx2`] built for AVX-512VL: the same 256-bit instructions and results,
    /// with 32 vector registers instead of 16, so the rows of P and Q and the partial sums of
    /// the split rule stay in registers (the AVX2 build spills some to the stack).
    ///
    /// # Safety
    /// As [`block_split_avx2`], and the CPU has AVX-512F and AVX-512VL.
    block_split_avx2_vl,
    "avx512f,avx512vl,avx2,fma"
);

/// True when the CPU has AVX-512F and AVX-512VL (32 vector registers for 256-bit code).
pub fn has_avx512vl() -> bool {
    static VL: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *VL.get_or_init(|| std::arch::is_x86_feature_detected!("avx512f") && std::arch::is_x86_feature_detected!("avx512vl"))
}

/// Runs the AVX2 kernel instantiated for `w / 8` chunks; `None` when w is above 128 lanes.
///
/// # Safety
/// As [`block_avx2`] with `w = k` rounded up to 8.
pub unsafe fn dispatch_avx2(block: &[Entry], f: Factors, prm: &SgdParams, ld: usize, ada: bool) -> Option<f64> {
    let w = prm.k.div_ceil(8) * 8;
    let split = matches!(prm.schedule, Schedule::AdagradSplit { .. });
    // The split rule's kernel keeps 2N rows plus sums live: with AVX-512VL's 32 registers it
    // does not spill (same instructions and results otherwise).
    let vl = has_avx512vl();
    macro_rules! go {
        ($($n:literal)*) => {
            match (w / 8, ada, split) {
                $(
                    // SAFETY: forwarded contract; N = w / 8.
                    ($n, _, true) if vl => Some(unsafe { block_split_avx2_vl::<$n>(block, f, prm, ld) }),
                    ($n, _, true) => Some(unsafe { block_split_avx2::<$n>(block, f, prm, ld) }),
                    ($n, true, false) => Some(unsafe { block_avx2::<$n, true>(block, f, prm, ld) }),
                    ($n, false, false) => Some(unsafe { block_avx2::<$n, false>(block, f, prm, ld) }),
                )*
                _ => None,
            }
        };
    }
    go!(1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16)
}

/// Runs the AVX-512 kernel for `w` lanes (16-lane chunks, a half chunk at the end when w is
/// an odd multiple of 8); `None` when w is above 128 lanes.
///
/// # Safety
/// As [`block_avx512`] with `w = k` rounded up to 8.
pub unsafe fn dispatch_avx512(block: &[Entry], f: Factors, prm: &SgdParams, ld: usize, ada: bool) -> Option<f64> {
    let w = prm.k.div_ceil(8) * 8;
    let (n, half) = (w.div_ceil(16), w % 16 == 8);
    macro_rules! go {
        ($($n:literal)*) => {
            match (n, half, ada) {
                $(
                    // SAFETY: forwarded contract; 16N − 8·HALF = w.
                    ($n, true, true) => Some(unsafe { block_avx512::<$n, true, true>(block, f, prm, ld) }),
                    ($n, true, false) => Some(unsafe { block_avx512::<$n, true, false>(block, f, prm, ld) }),
                    ($n, false, true) => Some(unsafe { block_avx512::<$n, false, true>(block, f, prm, ld) }),
                    ($n, false, false) => Some(unsafe { block_avx512::<$n, false, false>(block, f, prm, ld) }),
                )*
                _ => None,
            }
        };
    }
    go!(1 2 3 4 5 6 7 8)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::Rng;

    /// The AVX-512VL build of the split-rule kernel gives bit-for-bit the AVX2 build's factors,
    /// accumulators and loss (the same instructions with more registers).
    #[test]
    fn vl_build_matches_avx2_build_bitwise() {
        if !(crate::kernel::Isa::Avx2.available() && has_avx512vl()) {
            return;
        }
        for slow_only in [false, true] {
            let (m, n, k) = (13, 17, 40);
            let ld = 40;
            let mut rng = Rng::new(7);
            let block: Vec<Entry> = (0..500).map(|_| Entry { u: rng.below(m) as u32, i: rng.below(n) as u32, r: 1.0 + 4.0 * rng.unit_f32() }).collect();
            let p: Vec<f32> = (0..m * ld).map(|_| rng.unit_f32() * 0.3).collect();
            let q: Vec<f32> = (0..n * ld).map(|_| rng.unit_f32() * 0.3).collect();
            let prm = SgdParams { k, eta: 0.1, lambda: 0.05, schedule: Schedule::AdagradSplit { slow_only } };
            let run = |vl: bool| {
                let (mut p, mut q, mut pg, mut qg) = (p.clone(), q.clone(), vec![1f32; 2 * m], vec![1f32; 2 * n]);
                let f = Factors { p: p.as_mut_ptr(), q: q.as_mut_ptr(), pg: pg.as_mut_ptr(), qg: qg.as_mut_ptr() };
                // SAFETY: ids below m and n; rows of ld = k floats; the CPU has the features.
                let l = unsafe { if vl { block_split_avx2_vl::<5>(&block, f, &prm, ld) } else { block_split_avx2::<5>(&block, f, &prm, ld) } };
                (l, p, q, pg, qg)
            };
            let (a, b) = (run(false), run(true));
            assert_eq!(a.0.to_bits(), b.0.to_bits());
            for (x, y) in [(&a.1, &b.1), (&a.2, &b.2), (&a.3, &b.3), (&a.4, &b.4)] {
                assert!(x.iter().zip(y.iter()).all(|(u, v)| u.to_bits() == v.to_bits()), "slow_only={slow_only}");
            }
        }
    }
}
