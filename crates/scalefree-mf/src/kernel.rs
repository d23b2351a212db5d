//! The SGD update for one rating r_ij (eqs. 3–7 of the Rima paper):
//! e = r − p·q;  p ← p + η(e q − λ p);  q ← q + η(e p − λ q)  (the factor 2 is folded into η).
//!
//! Three step-size rules: `Constant` is the paper's strawman SGD; `Adagrad` scales η per row of
//! P and per row of Q by 1/√G, with G the running sum of mean squared gradients, which
//! converges in far fewer iterations without tuning η. `AdagradSplit` is LIBMF's form of it:
//! two accumulators per row, one for the first [`SLOW`] lanes and one for the rest (the
//! accumulator arrays hold 2 floats per row), each adding its own lanes' mean squared
//! gradient; with `slow_only` only the first [`SLOW`] lanes are updated (LIBMF does this in
//! its first pass, which lets the leading lanes settle before the others start).
//!
//! Three builds of the block loop, picked at run time ([`Isa::best`]): AVX-512 and AVX2+FMA
//! kernels written with `std::arch` intrinsics (`simd_x86.rs`), which keep a row of P and a row
//! of Q in registers for the whole update and work on k rounded up to 8 lanes (rows padded
//! with zeros, see [`padded_k`]); and a portable loop over `chunks_exact(8)` with eight
//! independent accumulators that the compiler vectorises for any target. [`sgd_block_scalar`]
//! is the plain reference the tests compare all of them against.

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Schedule {
    Constant,
    Adagrad,
    /// LIBMF's split AdaGrad: accumulators `pg[2u]` (lanes `0..SLOW`) and `pg[2u + 1]` (the
    /// others, normalised by `padded_k(k) − SLOW`); `slow_only` updates lanes `0..SLOW` only.
    AdagradSplit { slow_only: bool },
}

/// The lanes with their own AdaGrad accumulator in [`Schedule::AdagradSplit`] (one AVX
/// register, as in LIBMF's AVX build).
pub const SLOW: usize = 8;

impl Schedule {
    /// Accumulator floats per row of P or Q.
    pub fn acc_per_row(self) -> usize {
        match self {
            Schedule::AdagradSplit { .. } => 2,
            _ => 1,
        }
    }
}

#[derive(Clone, Copy, Debug)]
pub struct SgdParams {
    pub k: usize,
    pub eta: f32,
    pub lambda: f32,
    pub schedule: Schedule,
}

/// One rating in a block, with dense ids.
#[derive(Clone, Copy, Debug, PartialEq)]
#[repr(C)]
pub struct Entry {
    pub u: u32,
    pub i: u32,
    pub r: f32,
}

/// Raw views of the factors. Callers guarantee that no two threads touch the same row at once
/// (the block scheduler hands out blocks with disjoint row and column ranges).
#[derive(Clone, Copy)]
pub struct Factors {
    pub p: *mut f32,
    pub q: *mut f32,
    pub pg: *mut f32,
    pub qg: *mut f32,
}
unsafe impl Send for Factors {}
unsafe impl Sync for Factors {}

#[inline(always)]
fn dot8(p: &[f32], q: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (pc, qc) = (p.chunks_exact(8), q.chunks_exact(8));
    let (pr, qr) = (pc.remainder(), qc.remainder());
    for (a, b) in pc.zip(qc) {
        for l in 0..8 {
            acc[l] += a[l] * b[l];
        }
    }
    let mut s = (acc[0] + acc[4]) + (acc[1] + acc[5]) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for (a, b) in pr.iter().zip(qr) {
        s += a * b;
    }
    s
}

#[inline(always)]
fn update_const(p: &mut [f32], q: &mut [f32], e: f32, eta: f32, lambda: f32) {
    let (a, c) = (eta * e, 1.0 - eta * lambda);
    for (pv, qv) in p.iter_mut().zip(q.iter_mut()) {
        let (po, qo) = (*pv, *qv);
        *pv = c * po + a * qo;
        *qv = c * qo + a * po;
    }
}

/// One fused pass: with gp = λp − e q and gq = λq − e p (old values), sets p ← p − sp·gp,
/// q ← q − sq·gq and returns (Σ gp², Σ gq²). The steps use the accumulators from before this
/// rating, so norms and update need no second pass.
#[inline(always)]
fn update_ada(p: &mut [f32], q: &mut [f32], e: f32, sp: f32, sq: f32, lambda: f32) -> (f32, f32) {
    let mut ap = [0f32; 8];
    let mut aq = [0f32; 8];
    let split = p.len() / 8 * 8;
    let (ph, pt) = p.split_at_mut(split);
    let (qh, qt) = q.split_at_mut(split);
    for (a, b) in ph.chunks_exact_mut(8).zip(qh.chunks_exact_mut(8)) {
        for l in 0..8 {
            let (po, qo) = (a[l], b[l]);
            let gp = lambda * po - e * qo;
            let gq = lambda * qo - e * po;
            ap[l] += gp * gp;
            aq[l] += gq * gq;
            a[l] = po - sp * gp;
            b[l] = qo - sq * gq;
        }
    }
    let mut tp: f32 = ap.iter().sum();
    let mut tq: f32 = aq.iter().sum();
    for (a, b) in pt.iter_mut().zip(qt.iter_mut()) {
        let (po, qo) = (*a, *b);
        let gp = lambda * po - e * qo;
        let gq = lambda * qo - e * po;
        tp += gp * gp;
        tq += gq * gq;
        *a = po - sp * gp;
        *b = qo - sq * gq;
    }
    (tp, tq)
}

/// # Safety
/// Every `u`/`i` in `block` indexes a row inside the factor arrays, and no other thread
/// touches those rows during the call.
#[inline(always)]
unsafe fn block_impl(block: &[Entry], f: Factors, prm: &SgdParams) -> f64 {
    // SAFETY: forwarded contract.
    unsafe { block_strided(block, f, prm, prm.k) }
}

/// [`block_impl`] with rows `ld ≥ k` floats apart.
#[inline(always)]
unsafe fn block_strided(block: &[Entry], f: Factors, prm: &SgdParams, ld: usize) -> f64 {
    let k = prm.k;
    let mut loss = 0f64;
    for en in block {
        let (u, i) = (en.u as usize, en.i as usize);
        // SAFETY: the caller guarantees bounds and exclusive access to rows u and i.
        let p = unsafe { std::slice::from_raw_parts_mut(f.p.add(u * ld), k) };
        let q = unsafe { std::slice::from_raw_parts_mut(f.q.add(i * ld), k) };
        let e = en.r - dot8(p, q);
        loss += (e * e) as f64;
        match prm.schedule {
            Schedule::Constant => update_const(p, q, e, prm.eta, prm.lambda),
            Schedule::Adagrad => {
                // SAFETY: as above, for the per-row accumulators.
                let (pg, qg) = unsafe { (&mut *f.pg.add(u), &mut *f.qg.add(i)) };
                let (sp, sq) = (prm.eta / pg.sqrt(), prm.eta / qg.sqrt());
                let (gp, gq) = update_ada(p, q, e, sp, sq, prm.lambda);
                *pg += gp / k as f32;
                *qg += gq / k as f32;
            }
            Schedule::AdagradSplit { slow_only } => {
                // SAFETY: as above, for the two accumulators of each row.
                let (pg, qg) = unsafe { (std::slice::from_raw_parts_mut(f.pg.add(2 * u), 2), std::slice::from_raw_parts_mut(f.qg.add(2 * i), 2)) };
                let s = SLOW.min(k);
                let (ps, pf) = p.split_at_mut(s);
                let (qs, qf) = q.split_at_mut(s);
                let (gp, gq) = update_ada(ps, qs, e, prm.eta / pg[0].sqrt(), prm.eta / qg[0].sqrt(), prm.lambda);
                let (gp1, gq1) = if slow_only { (0.0, 0.0) } else { update_ada(pf, qf, e, prm.eta / pg[1].sqrt(), prm.eta / qg[1].sqrt(), prm.lambda) };
                let (rs, rf) = split_norms(k);
                pg[0] += gp * rs;
                qg[0] += gq * rs;
                pg[1] += gp1 * rf;
                qg[1] += gq1 * rf;
            }
        }
    }
    loss
}

/// The factors LIBMF scales the two accumulators' sums of squares by: 1/SLOW and
/// 1/(padded_k − SLOW) (0 when there are no fast lanes).
#[inline(always)]
pub(crate) fn split_norms(k: usize) -> (f32, f32) {
    let w = padded_k(k);
    (1.0 / SLOW as f32, if w > SLOW { 1.0 / (w - SLOW) as f32 } else { 0.0 })
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn block_portable_avx2(block: &[Entry], f: Factors, prm: &SgdParams) -> f64 {
    // SAFETY: forwarded contract.
    unsafe { block_impl(block, f, prm) }
}

/// Which build of the kernel runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isa {
    /// 16-lane `__m512` intrinsics (x86-64 with AVX-512F).
    Avx512,
    /// 8-lane `__m256` intrinsics (x86-64 with AVX2 and FMA).
    Avx2,
    /// The compiler-vectorised loop (any CPU).
    Portable,
}

impl Isa {
    /// True when this CPU can run `self`.
    pub fn available(self) -> bool {
        match self {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => std::arch::is_x86_feature_detected!("avx512f") && Isa::Avx2.available(),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma"),
            Isa::Portable => true,
            #[allow(unreachable_patterns)]
            _ => false,
        }
    }
    /// The fastest build this CPU runs: AVX2 before AVX-512 (on CPUs that split 512-bit
    /// operations in two, such as AMD Zen 4, the 8-lane kernel wastes no lanes when k is an
    /// odd multiple of 8 and measured as fast or faster), then the portable loop.
    /// `SCALEFREE_MF_ISA=avx512|avx2|portable` overrides (an unavailable choice is ignored).
    pub fn best() -> Isa {
        static BEST: std::sync::OnceLock<Isa> = std::sync::OnceLock::new();
        *BEST.get_or_init(|| {
            let want = std::env::var("SCALEFREE_MF_ISA").ok().and_then(|v| Isa::parse(&v));
            match want {
                Some(isa) if isa.available() => isa,
                _ => [Isa::Avx2, Isa::Avx512, Isa::Portable].into_iter().find(|i| i.available()).unwrap_or(Isa::Portable),
            }
        })
    }
    pub fn parse(s: &str) -> Option<Isa> {
        match s.to_ascii_lowercase().as_str() {
            "avx512" => Some(Isa::Avx512),
            "avx2" => Some(Isa::Avx2),
            "portable" => Some(Isa::Portable),
            _ => None,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Isa::Avx512 => "avx512",
            Isa::Avx2 => "avx2",
            Isa::Portable => "portable",
        }
    }
}

/// True when the AVX2 build of the kernel runs on this CPU.
pub fn has_avx2() -> bool {
    Isa::Avx2.available()
}

/// The row stride the SIMD kernels want for rank `k`: k rounded up to 8 lanes (the extra
/// lanes hold zeros).
pub fn padded_k(k: usize) -> usize {
    k.div_ceil(8) * 8
}

/// Run SGD over `block` in order, rows `k` floats apart; returns Σ e² seen before each update.
///
/// # Safety
/// See [`block_impl`]: ids in bounds, rows exclusively held by this caller.
pub unsafe fn sgd_block(block: &[Entry], f: Factors, prm: &SgdParams) -> f64 {
    if prm.k.is_multiple_of(8) {
        // SAFETY: rows of k = padded_k(k) floats need no padding; contract forwarded.
        return unsafe { sgd_block_ld(block, f, prm, prm.k, Isa::best()) };
    }
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: the CPU supports avx2+fma; contract forwarded.
        return unsafe { block_portable_avx2(block, f, prm) };
    }
    // SAFETY: contract forwarded.
    unsafe { block_impl(block, f, prm) }
}

/// Run SGD over `block` in order with the `isa` build; rows of P and Q are `ld` floats apart
/// with `ld ≥ padded_k(k)`, and lanes `k..padded_k(k)` of every row are zero (they stay
/// zero). Returns Σ e² seen before each update. An `isa` this CPU lacks falls back to the
/// portable loop.
///
/// # Safety
/// Every `u`/`i` in `block` indexes a row inside the factor arrays (and accumulators), and no
/// other thread touches those rows during the call.
pub unsafe fn sgd_block_ld(block: &[Entry], f: Factors, prm: &SgdParams, ld: usize, isa: Isa) -> f64 {
    assert!(ld >= padded_k(prm.k), "row stride {ld} is below padded_k({}) = {}", prm.k, padded_k(prm.k));
    let ada = prm.schedule != Schedule::Constant;
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: the ISA was checked available; rows are padded as required; contract forwarded.
        let done = unsafe {
            match isa {
                // The split rule's 8-lane halves map onto the AVX2 build.
                Isa::Avx512 | Isa::Avx2 if matches!(prm.schedule, Schedule::AdagradSplit { .. }) && Isa::Avx2.available() => crate::simd_x86::dispatch_avx2(block, f, prm, ld, ada),
                Isa::Avx512 if isa.available() => crate::simd_x86::dispatch_avx512(block, f, prm, ld, ada),
                Isa::Avx2 if isa.available() => crate::simd_x86::dispatch_avx2(block, f, prm, ld, ada),
                _ => None,
            }
        };
        if let Some(loss) = done {
            return loss;
        }
    }
    let _ = (isa, ada);
    // SAFETY: the portable loop reads k lanes of each row at stride ld; contract forwarded.
    unsafe { block_strided(block, f, prm, ld) }
}

/// Plain scalar reference of [`sgd_block`] on safe slices (tests compare the two).
pub fn sgd_block_scalar(block: &[Entry], p: &mut [f32], q: &mut [f32], pg: &mut [f32], qg: &mut [f32], prm: &SgdParams) -> f64 {
    let k = prm.k;
    let mut loss = 0f64;
    let (rs, rf) = split_norms(k);
    for en in block {
        let (u, i) = (en.u as usize, en.i as usize);
        let mut dot = 0f32;
        for d in 0..k {
            dot += p[u * k + d] * q[i * k + d];
        }
        let e = en.r - dot;
        loss += (e * e) as f64;
        // Per lane: which accumulator (0 or 1) and whether the lane is updated.
        let (split, slow_only) = match prm.schedule {
            Schedule::AdagradSplit { slow_only } => (true, slow_only),
            _ => (false, false),
        };
        let slot = |d: usize| if split && d >= SLOW { 1 } else { 0 };
        let mut g2 = [[0f32; 2]; 2];
        for d in 0..k {
            let (po, qo) = (p[u * k + d], q[i * k + d]);
            g2[0][slot(d)] += (prm.lambda * po - e * qo).powi(2);
            g2[1][slot(d)] += (prm.lambda * qo - e * po).powi(2);
        }
        let steps = |d: usize| -> (f32, f32) {
            match prm.schedule {
                Schedule::Constant => (prm.eta, prm.eta),
                Schedule::Adagrad => (prm.eta / pg[u].sqrt(), prm.eta / qg[i].sqrt()),
                Schedule::AdagradSplit { .. } => (prm.eta / pg[2 * u + slot(d)].sqrt(), prm.eta / qg[2 * i + slot(d)].sqrt()),
            }
        };
        let st: Vec<(f32, f32)> = (0..k).map(steps).collect();
        for d in 0..k {
            if slow_only && d >= SLOW {
                continue;
            }
            let (po, qo) = (p[u * k + d], q[i * k + d]);
            let (sp, sq) = st[d];
            p[u * k + d] = po + sp * (e * qo - prm.lambda * po);
            q[i * k + d] = qo + sq * (e * po - prm.lambda * qo);
        }
        match prm.schedule {
            Schedule::Constant => {}
            Schedule::Adagrad => {
                pg[u] += g2[0][0] / k as f32;
                qg[i] += g2[1][0] / k as f32;
            }
            Schedule::AdagradSplit { slow_only } => {
                let fast = if slow_only { 0.0 } else { 1.0 };
                pg[2 * u] += g2[0][0] * rs;
                qg[2 * i] += g2[1][0] * rs;
                pg[2 * u + 1] += g2[0][1] * rf * fast;
                qg[2 * i + 1] += g2[1][1] * rf * fast;
            }
        }
    }
    loss
}

/// Σ (r − p·q)² over `entries` with the vectorised dot product; a pair whose user or item
/// never occurred in training (`known_*` false) is predicted as `mean`.
pub fn sq_error(entries: impl Iterator<Item = (usize, usize, f32)>, p: &[f32], q: &[f32], k: usize, known_u: &[bool], known_i: &[bool], mean: f32) -> f64 {
    sq_error_ld(entries, p, q, k, k, known_u, known_i, mean)
}

/// [`sq_error`] with rows `ld ≥ k` floats apart.
#[allow(clippy::too_many_arguments)]
pub fn sq_error_ld(entries: impl Iterator<Item = (usize, usize, f32)>, p: &[f32], q: &[f32], k: usize, ld: usize, known_u: &[bool], known_i: &[bool], mean: f32) -> f64 {
    entries
        .map(|(u, i, r)| {
            // Ids past the known arrays (seen only outside training) get the mean too.
            let known = known_u.get(u).copied().unwrap_or(false) && known_i.get(i).copied().unwrap_or(false);
            let pred = if known { dot8(&p[u * ld..u * ld + k], &q[i * ld..i * ld + k]) } else { mean };
            let e = r - pred;
            (e * e) as f64
        })
        .sum()
}
