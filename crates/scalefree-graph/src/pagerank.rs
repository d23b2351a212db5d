//! Local kernels of a PageRank iteration over compact local ids.
//!
//! The sparse allreduce's idea carried into the local work: a rank's matrix is a CSR over
//! its own edges only, rows = the vertices its edges point to (its out vector), columns =
//! the vertices it reads (its in vector), both numbered in the sparse allreduce's key order
//! so neither vector needs a permutation around the collective. The matrix holds no values
//! (column slots only): every edge weighs 1/out-degree of its source, which is folded into
//! the source vector once per iteration. So one iteration reads 4 bytes per edge plus the
//! gathers into a vector of the touched vertices, not of the graph.
//!
//! Slots are [`Id`]s: `u32` while the rank touches fewer than 2^32 vertices, `u64` past
//! that (8 bytes per edge; chosen per rank, so only a rank whose vectors alone hold 2^32
//! values or more pays it).

use crate::Id;

/// The float types the kernels run in (f32 halves the bytes of every vector and message).
pub trait Real: Copy + Default + std::ops::Add<Output = Self> + std::ops::Mul<Output = Self> + Send + Sync {
    fn of(x: f64) -> Self;
    fn f64(self) -> f64;
}

impl Real for f32 {
    #[inline(always)]
    fn of(x: f64) -> Self {
        x as f32
    }
    #[inline(always)]
    fn f64(self) -> f64 {
        self as f64
    }
}

impl Real for f64 {
    #[inline(always)]
    fn of(x: f64) -> Self {
        x
    }
    #[inline(always)]
    fn f64(self) -> f64 {
        self
    }
}

/// A CSR pattern from edge lists `(rows[e], cols[e])`, `rows < nrows`, `cols < ncols`:
/// `(indptr, cols)` with the columns of every row ascending (two stable counting passes,
/// linear in edges + rows + columns). Errors name the first out-of-range edge.
pub fn csr_pattern<S: Id>(rows: &[S], cols: &[S], nrows: usize, ncols: usize) -> Result<(Vec<u64>, Vec<S>), String> {
    if rows.len() != cols.len() {
        return Err(format!("csr_pattern: {} row ids but {} column ids", rows.len(), cols.len()));
    }
    if let Some(e) = rows.iter().position(|&r| r.u64() >= nrows as u64) {
        return Err(format!("csr_pattern: edge {e} has row {} >= nrows {nrows}", rows[e].u64()));
    }
    if let Some(e) = cols.iter().position(|&c| c.u64() >= ncols as u64) {
        return Err(format!("csr_pattern: edge {e} has column {} >= ncols {ncols}", cols[e].u64()));
    }
    // Pass 1: edges by column (stable), as edge numbers.
    let mut cstart = vec![0usize; ncols + 1];
    for &c in cols {
        cstart[c.u64() as usize + 1] += 1;
    }
    for i in 0..ncols {
        cstart[i + 1] += cstart[i];
    }
    let mut by_col = vec![0u32; cols.len()];
    let wide = cols.len() > u32::MAX as usize;
    let mut by_col_wide = if wide { vec![0usize; cols.len()] } else { Vec::new() };
    for (e, &c) in cols.iter().enumerate() {
        let p = &mut cstart[c.u64() as usize];
        if wide {
            by_col_wide[*p] = e;
        } else {
            by_col[*p] = e as u32;
        }
        *p += 1;
    }
    drop(cstart);
    // Pass 2: place by row in column order, so each row's columns come out ascending.
    let mut indptr = vec![0u64; nrows + 1];
    for &r in rows {
        indptr[r.u64() as usize + 1] += 1;
    }
    for i in 0..nrows {
        indptr[i + 1] += indptr[i];
    }
    let mut next: Vec<u64> = indptr[..nrows].to_vec();
    let mut out = vec![S::default(); cols.len()];
    let mut place = |e: usize| {
        let p = &mut next[rows[e].u64() as usize];
        out[*p as usize] = cols[e];
        *p += 1;
    };
    if wide {
        by_col_wide.iter().for_each(|&e| place(e));
    } else {
        by_col.iter().for_each(|&e| place(e as usize));
    }
    Ok((indptr, out))
}

/// How far ahead (in edges) the SpMV prefetches vector entries.
const PREFETCH_EDGES: usize = 128;

#[inline(always)]
fn prefetch<T, S: Id>(x: &[T], cols: &[S], k: usize, ne: usize) {
    #[cfg(target_arch = "x86_64")]
    if k < ne {
        // A hint only: any address is safe to prefetch; the column is in range anyway.
        unsafe {
            let c = cols.get_unchecked(k).u64() as usize;
            std::arch::x86_64::_mm_prefetch(x.as_ptr().wrapping_add(c) as *const i8, std::arch::x86_64::_MM_HINT_T0);
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (x, cols, k, ne);
}

/// One iteration's local work before the collective.
///
/// `x[c] = (base + damping * got[c]) * inv_deg[c]` for every in slot (the scores from the
/// last reduce, divided by the out-degree; 0 where `inv_deg` is 0), then
/// `y[r] = Σ x[cols[k]]` over row `r`'s edges, and `y[nrows] = Σ y` (the flow that left
/// non-dangling vertices, reduced with the rest). Returns that sum.
///
/// The same three steps as [`scale_sources`], [`spmv_rows`] over all rows and
/// [`flow_total`]; the flash twin (`crate::flash_rows`) runs the middle one per row
/// block, so both sum every row, and the total, in the same order (equal bits).
#[allow(clippy::too_many_arguments)]
pub fn spmv_step<T: Real, S: Id>(indptr: &[u64], cols: &[S], got: &[T], inv_deg: &[T], base: f64, damping: f64, x: &mut [T], y: &mut [T]) -> f64 {
    let nrows = indptr.len() - 1;
    debug_assert!(y.len() > nrows && x.len() == got.len() && inv_deg.len() == got.len());
    scale_sources(got, inv_deg, base, damping, x);
    spmv_rows(&indptr[..nrows], indptr[nrows], cols, x, &mut y[..nrows]);
    flow_total(&mut y[..=nrows])
}

/// `x[c] = (base + damping * got[c]) * inv_deg[c]` (the first step of [`spmv_step`]).
pub fn scale_sources<T: Real>(got: &[T], inv_deg: &[T], base: f64, damping: f64, x: &mut [T]) {
    let (b, d) = (T::of(base), T::of(damping));
    for ((xi, &g), &w) in x.iter_mut().zip(got).zip(inv_deg) {
        *xi = (b + d * g) * w;
    }
}

/// `y[r] = Σ x[cols[k]]` over the edges of a run of rows: `starts[r]` is row `r`'s first
/// edge and `end` the run's last edge + 1, both counted from the matrix's first edge;
/// `cols` holds the run's columns only (`cols[0]` is edge `starts[0]`). Columns must be
/// below `x.len()` (checked when the matrix was built).
pub fn spmv_rows<T: Real, S: Id>(starts: &[u64], end: u64, cols: &[S], x: &[T], y: &mut [T]) {
    let nrows = starts.len();
    debug_assert!(y.len() == nrows && (nrows == 0 || (end - starts[0]) as usize == cols.len()));
    let first = starts.first().copied().unwrap_or(end);
    let ne = cols.len();
    for r in 0..nrows {
        let a = (starts[r] - first) as usize;
        let e = (if r + 1 < nrows { starts[r + 1] } else { end } - first) as usize;
        // Four partial sums (no single chain of dependent adds) and a prefetch of the
        // vector entries a few dozen edges ahead (their addresses are known from `cols`).
        let mut acc = [T::default(); 4];
        let mut k = a;
        while k + 4 <= e {
            for (u, slot) in acc.iter_mut().enumerate() {
                prefetch(x, cols, k + u + PREFETCH_EDGES, ne);
                // Columns were checked against the in vector's length when the matrix was built.
                *slot = *slot + unsafe { *x.get_unchecked(cols.get_unchecked(k + u).u64() as usize) };
            }
            k += 4;
        }
        while k < e {
            prefetch(x, cols, k + PREFETCH_EDGES, ne);
            acc[0] = acc[0] + unsafe { *x.get_unchecked(cols.get_unchecked(k).u64() as usize) };
            k += 1;
        }
        y[r] = (acc[0] + acc[1]) + (acc[2] + acc[3]);
    }
}

/// `y[nrows] = Σ y[..nrows]` in row order (f64 sum), `nrows = y.len() - 1`; returns it.
pub fn flow_total<T: Real>(y: &mut [T]) -> f64 {
    let nrows = y.len() - 1;
    let total = y[..nrows].iter().fold(0.0f64, |t, v| t + v.f64());
    y[nrows] = T::of(total);
    total
}

/// After the collective: the new scores of this rank's owned vertices, `base + damping *
/// got[lo + i]`, written into `scores`; returns the L1 change.
pub fn owned_update<T: Real>(got: &[T], lo: usize, base: f64, damping: f64, scores: &mut [T]) -> f64 {
    let mut l1 = 0.0f64;
    let n = scores.len();
    for (s, &g) in scores.iter_mut().zip(&got[lo..lo + n]) {
        let new = base + damping * g.f64();
        l1 += (new - s.f64()).abs();
        *s = T::of(new);
    }
    l1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csr_and_spmv_match_a_dense_product() {
        let mut seed = 7u64;
        let mut rnd = |n: u32| {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((seed >> 33) % n as u64) as u32
        };
        for &(nr, nc, ne) in &[(1usize, 1usize, 0usize), (3, 5, 7), (50, 40, 600)] {
            let rows: Vec<u32> = (0..ne).map(|_| rnd(nr as u32)).collect();
            let cols: Vec<u32> = (0..ne).map(|_| rnd(nc as u32)).collect();
            let (ip, cs) = csr_pattern(&rows, &cols, nr, nc).unwrap();
            assert_eq!(ip[nr] as usize, ne);
            for r in 0..nr {
                let s = &cs[ip[r] as usize..ip[r + 1] as usize];
                assert!(s.windows(2).all(|w| w[0] <= w[1]));
            }
            let got: Vec<f64> = (0..nc).map(|i| i as f64 * 0.5).collect();
            let inv: Vec<f64> = (0..nc).map(|i| if i % 3 == 0 { 0.0 } else { 1.0 / (i as f64 + 1.0) }).collect();
            let mut x = vec![0.0; nc];
            let mut y = vec![0.0; nr + 1];
            let tot = spmv_step(&ip, &cs, &got, &inv, 0.1, 0.85, &mut x, &mut y);
            let mut want = vec![0.0; nr];
            for e in 0..ne {
                let c = cols[e] as usize;
                want[rows[e] as usize] += (0.1 + 0.85 * got[c]) * inv[c];
            }
            for r in 0..nr {
                assert!((y[r] - want[r]).abs() < 1e-12);
            }
            assert!((tot - want.iter().sum::<f64>()).abs() < 1e-9 && y[nr] == tot);
        }
        assert!(csr_pattern(&[3u32], &[0], 3, 1).unwrap_err().contains("edge 0 has row 3"));
    }

    #[test]
    fn u64_slots_are_the_u32_ones_bit_for_bit() {
        // A rank past 2^32 slots numbers them in u64: the same matrix and the same sums.
        let mut seed = 3u64;
        let mut rnd = |n: u64| {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (seed >> 33) % n
        };
        let (nr, nc, ne) = (40usize, 70usize, 900usize);
        let rows: Vec<u32> = (0..ne).map(|_| rnd(nr as u64) as u32).collect();
        let cols: Vec<u32> = (0..ne).map(|_| rnd(nc as u64) as u32).collect();
        let (ip, cs) = csr_pattern(&rows, &cols, nr, nc).unwrap();
        let wide = |v: &[u32]| v.iter().map(|&x| x as u64).collect::<Vec<u64>>();
        let (ip64, cs64) = csr_pattern(&wide(&rows), &wide(&cols), nr, nc).unwrap();
        assert_eq!(ip64, ip);
        assert_eq!(cs64, wide(&cs));
        let got: Vec<f32> = (0..nc).map(|i| 1.0 / (i as f32 + 3.0)).collect();
        let inv: Vec<f32> = (0..nc).map(|i| if i % 5 == 0 { 0.0 } else { 0.5 }).collect();
        let (mut x, mut y) = (vec![0.0f32; nc], vec![0.0f32; nr + 1]);
        let (mut x64, mut y64) = (vec![0.0f32; nc], vec![0.0f32; nr + 1]);
        let t = spmv_step(&ip, &cs, &got, &inv, 0.15, 0.85, &mut x, &mut y);
        let t64 = spmv_step(&ip64, &cs64, &got, &inv, 0.15, 0.85, &mut x64, &mut y64);
        assert_eq!((t.to_bits(), y.iter().map(|v| v.to_bits()).collect::<Vec<_>>()), (t64.to_bits(), y64.iter().map(|v| v.to_bits()).collect::<Vec<_>>()));
        assert!(csr_pattern(&[0u64], &[1 << 33], 1, 2).unwrap_err().contains("column 8589934592 >= ncols 2"));
    }
}
