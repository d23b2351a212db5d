//! In-memory `Z := Aᵀ A X` (fused) and `Z := Aᵀ X` for a CSR matrix A held in memory,
//! parallel over row ranges of A: what an eigensolver on `AᵀA` applies per block when A fits
//! the memory budget.
//!
//! The Gram product reads each row `a_i` of A once: `y = a_i X` (a gather of `nnz(a_i)` rows
//! of X), then `Z += a_iᵀ y` (a scatter into the same rows of Z) while the row is still in
//! cache — one pass over A instead of the two of `Aᵀ (A X)`, and no `rows x n` intermediate.
//! Rows are split into one contiguous range per thread with about the same number of
//! entries; each thread scatters into its own `cols x n` accumulator (the first thread into Z
//! itself), and the accumulators are summed into Z at the end, in parallel over rows of Z.
//! No locks, no atomics; the extra memory is `(threads - 1) * cols * n` elements.
//!
//! The result is deterministic for a given thread count (each range is summed in row order,
//! the accumulators in range order); it differs from a sequential sum only by rounding.

use rayon::prelude::*;

use crate::element::Real;
use crate::error::{FlashError, Result};
use crate::sparse::CsrRef;

use super::csrtmm::TransposedProduct;

/// Below this many multiply-adds (`nnz * n`), one thread does the whole product.
const SEQUENTIAL_BELOW: usize = 1 << 16;

/// `Z := Aᵀ A X` (`product = Gram`, X `cols x n`) or `Z := Aᵀ X` (`Transpose`, X
/// `rows x n`), X and Z row-major with `n` columns, on the current rayon pool (run it inside
/// [`crate::Runtime::install`] to use the runtime's compute threads). Shapes and A's
/// structure are checked first.
pub fn csr_gram_in_memory<T: Real>(product: TransposedProduct, a: CsrRef<'_, T>, x: &[T], n: usize, z: &mut [T]) -> Result<()> {
    a.validate()?;
    let x_rows = match product {
        TransposedProduct::Transpose => a.rows,
        TransposedProduct::Gram => a.cols,
    };
    if x.len() != x_rows * n || z.len() != a.cols * n {
        return Err(FlashError::shape(format!(
            "A is {}x{}: {product:?} needs X of {x_rows}x{n} and Z of {}x{n} elements, got {} and {}",
            a.rows,
            a.cols,
            a.cols,
            x.len(),
            z.len()
        )));
    }
    z.fill(T::ZERO);
    if a.rows == 0 || a.cols == 0 || n == 0 {
        return Ok(());
    }
    let nnz = a.nnz();
    let parts = if nnz.saturating_mul(n) < SEQUENTIAL_BELOW { 1 } else { rayon::current_num_threads().clamp(1, a.rows) };
    let ranges = balanced_ranges(a.indptr, parts);
    let (first, rest) = ranges.split_first().expect("at least one range");
    let ((), partial) = rayon::join(
        || rows_into(product, &a, x, n, *first, z),
        || {
            rest.par_iter()
                .map(|&range| {
                    let mut acc = vec![T::ZERO; a.cols * n];
                    rows_into(product, &a, x, n, range, &mut acc);
                    acc
                })
                .collect::<Vec<Vec<T>>>()
        },
    );
    // Sum the accumulators into Z, in parallel over blocks of rows of Z.
    if !partial.is_empty() {
        let chunk = (64 * n).max(1);
        z.par_chunks_mut(chunk).enumerate().for_each(|(i, dst)| {
            for acc in &partial {
                let src = &acc[i * chunk..i * chunk + dst.len()];
                for (d, &s) in dst.iter_mut().zip(src) {
                    *d += s;
                }
            }
        });
    }
    Ok(())
}

/// `parts` contiguous row ranges covering all rows, each with about `nnz / parts` entries
/// (never empty unless there are fewer rows than parts).
fn balanced_ranges(indptr: &[u64], parts: usize) -> Vec<(usize, usize)> {
    let rows = indptr.len() - 1;
    let nnz = indptr[rows];
    let mut out = Vec::with_capacity(parts);
    let mut start = 0;
    for p in 1..=parts {
        let end = if p == parts {
            rows
        } else {
            let target = nnz * p as u64 / parts as u64;
            // First row boundary at or past the target, at least one row past `start` and
            // leaving a row for each later part.
            indptr.partition_point(|&v| v < target).clamp(start + 1, rows - (parts - p))
        };
        out.push((start, end));
        start = end;
    }
    out
}

/// The rows `r0..r1` of A into `z` (`cols x n`, added to), sequentially.
fn rows_into<T: Real>(product: TransposedProduct, a: &CsrRef<'_, T>, x: &[T], n: usize, range: (usize, usize), z: &mut [T]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 is present (checked above).
        unsafe { rows_into_avx2(product, a, x, n, range, z) };
        return;
    }
    rows_into_generic(product, a, x, n, range, z)
}

/// [`rows_into_generic`] compiled for AVX2 (4 float64 / 8 float32 lanes per operation).
///
/// # Safety
/// The CPU must support AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn rows_into_avx2<T: Real>(product: TransposedProduct, a: &CsrRef<'_, T>, x: &[T], n: usize, range: (usize, usize), z: &mut [T]) {
    rows_into_generic(product, a, x, n, range, z)
}

#[inline(always)]
fn rows_into_generic<T: Real>(product: TransposedProduct, a: &CsrRef<'_, T>, x: &[T], n: usize, (r0, r1): (usize, usize), z: &mut [T]) {
    let mut y = vec![T::ZERO; n];
    for r in r0..r1 {
        let (lo, hi) = (a.indptr[r] as usize, a.indptr[r + 1] as usize);
        if lo == hi {
            continue;
        }
        let (idx, val) = (&a.indices[lo..hi], &a.values[lo..hi]);
        let yr: &[T] = match product {
            TransposedProduct::Transpose => &x[r * n..(r + 1) * n],
            TransposedProduct::Gram => {
                y.fill(T::ZERO);
                for (&c, &v) in idx.iter().zip(val) {
                    let c = c as usize;
                    for (acc, &xv) in y.iter_mut().zip(&x[c * n..(c + 1) * n]) {
                        *acc += v * xv;
                    }
                }
                &y
            }
        };
        for (&c, &v) in idx.iter().zip(val) {
            let c = c as usize;
            for (d, &yv) in z[c * n..(c + 1) * n].iter_mut().zip(yr) {
                *d += v * yv;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::csrtmm::csrtmm_in_memory;
    use crate::kernels::test_support::{assert_close, random_csr, random_vec};

    #[test]
    fn matches_sequential_twin_on_every_shape_and_thread_count() {
        for threads in [1usize, 2, 3] {
            let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
            for &(rows, cols) in &[(0usize, 0usize), (1, 1), (5, 0), (0, 4), (2, 7), (37, 23), (301, 41), (41, 300), (4000, 900)] {
                let a = random_csr(rows as u64 * 3 + cols as u64, rows, cols);
                for n in [0usize, 1, 3, 16, 33] {
                    for product in [TransposedProduct::Transpose, TransposedProduct::Gram] {
                        let x_rows = if product == TransposedProduct::Gram { cols } else { rows };
                        let x = random_vec::<f64>(7 + n as u64, x_rows * n);
                        let mut want = vec![f64::NAN; cols * n];
                        csrtmm_in_memory(product, a.view(), &x, n, &mut want).unwrap();
                        let mut got = vec![f64::NAN; cols * n];
                        pool.install(|| csr_gram_in_memory(product, a.view(), &x, n, &mut got)).unwrap();
                        assert_close(&got, &want, 1e-12, &format!("{rows}x{cols} n={n} {product:?} threads={threads}"));
                        let xf: Vec<f32> = x.iter().map(|&v| v as f32).collect();
                        let af = crate::sparse::CsrMatrix { rows, cols, indptr: a.indptr.clone(), indices: a.indices.clone(), values: a.values.iter().map(|&v| v as f32).collect() };
                        let mut gotf = vec![f32::NAN; cols * n];
                        pool.install(|| csr_gram_in_memory(product, af.view(), &xf, n, &mut gotf)).unwrap();
                        let wantf: Vec<f32> = want.iter().map(|&v| v as f32).collect();
                        assert_close(&gotf, &wantf, 1e-4, &format!("f32 {rows}x{cols} n={n} {product:?} threads={threads}"));
                    }
                }
            }
        }
    }

    #[test]
    fn ranges_cover_rows_with_balanced_entries() {
        let indptr = [0u64, 10, 10, 11, 30, 31, 40];
        for parts in 1..=6 {
            let r = balanced_ranges(&indptr, parts);
            assert_eq!(r.len(), parts);
            assert_eq!(r[0].0, 0);
            assert_eq!(r[parts - 1].1, 6);
            assert!(r.windows(2).all(|w| w[0].1 == w[1].0 && w[0].0 < w[0].1), "{parts}: {r:?}");
        }
        assert_eq!(balanced_ranges(&indptr, 2), vec![(0, 4), (4, 6)]);
    }

    #[test]
    fn shape_errors_before_work() {
        let a = random_csr(1, 4, 3);
        let mut z = [0.0; 6];
        assert!(matches!(csr_gram_in_memory(TransposedProduct::Gram, a.view(), &[1.0; 8], 2, &mut z), Err(FlashError::ShapeMismatch(_))));
        assert!(matches!(csr_gram_in_memory(TransposedProduct::Transpose, a.view(), &[1.0; 6], 2, &mut z), Err(FlashError::ShapeMismatch(_))));
        let bad_indices = [5u32];
        let bad = CsrRef { rows: 1, cols: 3, indptr: &[0, 1], indices: &bad_indices, values: &[1.0] };
        assert!(csr_gram_in_memory(TransposedProduct::Gram, bad, &[1.0; 3], 1, &mut [0.0; 3]).is_err());
    }
}
