//! In-memory gemm — the twin of the flash [`gemm`](super::gemm::gemm) and the block multiply
//! its tasks run: `C := alpha op(A) op(B) + beta C` through faer's matmul, on any layout and
//! leading dimension (transposes and layouts are stride changes, never copies), or through an
//! external CBLAS library ([`ExternalBlas`], e.g. numpy's OpenBLAS) when one is given.

use faer::{Accum, MatMut, MatRef, Par};

use crate::dense::{DenseMut, DenseRef, DenseShape, Transpose};
use crate::element::Real;
use crate::error::{FlashError, Result};

use super::blas::ExternalBlas;

/// Checks the shapes of `C := alpha op(A) op(B) + beta C`; returns `(m, n, k)`.
pub fn gemm_dims(trans_a: Transpose, a: &DenseShape, trans_b: Transpose, b: &DenseShape, c: &DenseShape) -> Result<(usize, usize, usize)> {
    let (m, k) = a.op_dims(trans_a);
    let (kb, n) = b.op_dims(trans_b);
    if k != kb {
        return Err(FlashError::shape(format!("op(A) is {m}x{k} but op(B) is {kb}x{n}")));
    }
    if (c.rows, c.cols) != (m, n) {
        return Err(FlashError::shape(format!("op(A) op(B) is {m}x{n} but C is {}x{}", c.rows, c.cols)));
    }
    Ok((m, n, k))
}

/// `C := alpha op(A) op(B) + beta C` in memory using up to `threads` threads of the current
/// rayon pool. With `beta == 0`, C is not read (NaNs in it do not propagate).
#[allow(clippy::too_many_arguments)]
pub fn gemm_in_memory<T: Real>(trans_a: Transpose, trans_b: Transpose, alpha: T, a: DenseRef<'_, T>, b: DenseRef<'_, T>, beta: T, c: DenseMut<'_, T>, threads: usize) -> Result<()> {
    gemm_in_memory_with(None, trans_a, trans_b, alpha, a, b, beta, c, threads)
}

/// [`gemm_in_memory`] through `blas` when given (and able to take the element type and
/// dimensions; the library then uses its own threads), else faer on `threads` threads.
#[allow(clippy::too_many_arguments)]
pub fn gemm_in_memory_with<T: Real>(blas: Option<&ExternalBlas>, trans_a: Transpose, trans_b: Transpose, alpha: T, a: DenseRef<'_, T>, b: DenseRef<'_, T>, beta: T, mut c: DenseMut<'_, T>, threads: usize) -> Result<()> {
    let (m, n, k) = gemm_dims(trans_a, &a.shape(), trans_b, &b.shape(), &c.shape())?;
    if m == 0 || n == 0 {
        return Ok(());
    }
    let c_shape = c.shape();
    let (c_rs, c_cs) = c_shape.strides();
    if k == 0 || alpha == T::ZERO {
        scale(&mut c, beta);
        return Ok(());
    }
    if let Some(blas) = blas {
        if blas.gemm(trans_a, trans_b, alpha, a, b, beta, &mut c) {
            return Ok(());
        }
    }
    let accum = if beta == T::ZERO {
        Accum::Replace
    } else {
        if beta != T::ONE {
            scale(&mut c, beta);
        }
        Accum::Add
    };
    let op_view = |shape: DenseShape, transpose: Transpose| {
        let (rs, cs) = shape.strides();
        match transpose {
            Transpose::No => (shape.rows, shape.cols, rs, cs),
            Transpose::Yes => (shape.cols, shape.rows, cs, rs),
        }
    };
    let (ar, ac, ars, acs) = op_view(a.shape(), trans_a);
    let (br, bc, brs, bcs) = op_view(b.shape(), trans_b);
    // SAFETY: the shapes were validated against the slice lengths when the views were made,
    // and the strides describe exactly those views.
    let (lhs, rhs, dst) = unsafe {
        (
            MatRef::<T>::from_raw_parts(a.data().as_ptr(), ar, ac, ars, acs),
            MatRef::<T>::from_raw_parts(b.data().as_ptr(), br, bc, brs, bcs),
            MatMut::<T>::from_raw_parts_mut(c.data().as_mut_ptr(), m, n, c_rs, c_cs),
        )
    };
    let par = if threads > 1 { Par::rayon(threads) } else { Par::Seq };
    faer::linalg::matmul::matmul(dst, accum, lhs, rhs, alpha, par);
    Ok(())
}

/// `C := beta C` (zero-filled when `beta == 0`, without reading C).
fn scale<T: Real>(c: &mut DenseMut<'_, T>, beta: T) {
    let shape = c.shape();
    let (major, minor, ld) = (shape.major_count(), shape.minor_len(), shape.leading_dim);
    let data = c.data();
    for run in 0..major {
        let row = &mut data[run * ld..run * ld + minor];
        if beta == T::ZERO {
            row.fill(T::ZERO);
        } else {
            row.iter_mut().for_each(|x| *x *= beta);
        }
    }
}

/// The textbook triple loop, for tests.
#[cfg(test)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm_naive<T: Real>(trans_a: Transpose, trans_b: Transpose, alpha: T, a: DenseRef<'_, T>, b: DenseRef<'_, T>, beta: T, c: &mut DenseMut<'_, T>) {
    let (m, n, k) = gemm_dims(trans_a, &a.shape(), trans_b, &b.shape(), &c.shape()).unwrap();
    let at = |i: usize, p: usize| if trans_a == Transpose::No { a.get(i, p) } else { a.get(p, i) };
    let bt = |p: usize, j: usize| if trans_b == Transpose::No { b.get(p, j) } else { b.get(j, p) };
    for i in 0..m {
        for j in 0..n {
            let mut sum = 0.0f64;
            for p in 0..k {
                sum += at(i, p).to_f64() * bt(p, j).to_f64();
            }
            let old = if beta == T::ZERO { 0.0 } else { beta.to_f64() * c.get(i, j).to_f64() };
            c.set(i, j, T::from_f64(alpha.to_f64() * sum + old));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dense::Layout;
    use crate::kernels::test_support::{assert_close, random_vec};

    #[test]
    fn matches_naive_over_shapes_layouts_transposes() {
        let shapes = [(0, 3, 2), (1, 1, 1), (3, 0, 2), (4, 5, 0), (7, 5, 3), (17, 9, 33)];
        for &(m, n, k) in &shapes {
            for la in [Layout::RowMajor, Layout::ColMajor] {
                for lc in [Layout::RowMajor, Layout::ColMajor] {
                    for ta in [Transpose::No, Transpose::Yes] {
                        for tb in [Transpose::No, Transpose::Yes] {
                            let (ar, ac) = if ta == Transpose::No { (m, k) } else { (k, m) };
                            let (br, bc) = if tb == Transpose::No { (k, n) } else { (n, k) };
                            // Leading dimensions with padding to exercise `ld > minor`.
                            let lda = DenseShape::packed(ar, ac, la).leading_dim + 2;
                            let ldb = DenseShape::packed(br, bc, lc).leading_dim + 1;
                            let ldc = DenseShape::packed(m, n, lc).leading_dim + 3;
                            let a_data = random_vec::<f64>(1, lda * ar.max(ac) + 8);
                            let b_data = random_vec::<f64>(2, ldb * br.max(bc) + 8);
                            let c0 = random_vec::<f64>(3, ldc * m.max(n) + 8);
                            let a = DenseRef::new(&a_data, ar, ac, la, lda).unwrap();
                            let b = DenseRef::new(&b_data, br, bc, lc, ldb).unwrap();
                            let (mut c1, mut c2) = (c0.clone(), c0.clone());
                            gemm_in_memory(ta, tb, 0.5, a, b, -2.0, DenseMut::new(&mut c1, m, n, lc, ldc).unwrap(), 2).unwrap();
                            gemm_naive(ta, tb, 0.5, a, b, -2.0, &mut DenseMut::new(&mut c2, m, n, lc, ldc).unwrap());
                            assert_close(&c1, &c2, 1e-12, &format!("{m}x{n}x{k} {la:?}/{lc:?} {ta:?} {tb:?}"));
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn beta_zero_ignores_nan_and_shapes_are_checked() {
        let a = vec![1.0f32; 6];
        let b = vec![2.0f32; 6];
        let mut c = vec![f32::NAN; 4];
        let av = DenseRef::packed(&a, 2, 3, Layout::RowMajor).unwrap();
        let bv = DenseRef::packed(&b, 3, 2, Layout::RowMajor).unwrap();
        gemm_in_memory(Transpose::No, Transpose::No, 1.0, av, bv, 0.0, DenseMut::packed(&mut c, 2, 2, Layout::RowMajor).unwrap(), 1).unwrap();
        assert_eq!(c, vec![6.0; 4]);
        let err = gemm_in_memory(Transpose::Yes, Transpose::No, 1.0, av, bv, 0.0, DenseMut::packed(&mut c, 2, 2, Layout::RowMajor).unwrap(), 1).unwrap_err();
        assert!(matches!(err, FlashError::ShapeMismatch(_)));
    }
}

#[cfg(test)]
mod bench {
    use super::*;
    use crate::dense::Layout;
    use crate::kernels::test_support::random_vec;
    use std::time::Instant;

    /// Timing, not correctness: GFLOP/s of the block multiply for the block shapes flash gemm
    /// tiles use (`cargo test -p scalefree-flash --release -- --ignored block_shapes --nocapture`).
    #[test]
    #[ignore]
    fn block_shapes_speed() {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap();
        for &(m, n, k) in &[(4096usize, 4096usize, 4096usize), (128, 1024, 4096), (512, 2048, 4096), (2048, 2048, 512), (256, 4096, 512), (512, 4096, 512), (1024, 4096, 512), (512, 4096, 1024), (1024, 4096, 256)] {
            let a = random_vec::<f32>(1, m * k);
            let b = random_vec::<f32>(2, k * n);
            let mut c = vec![0f32; m * n];
            let reps = ((4096.0f64.powi(3) / (m * n * k) as f64) as usize).max(1);
            let t = Instant::now();
            pool.install(|| {
                for _ in 0..reps {
                    let av = DenseRef::packed(&a, m, k, Layout::RowMajor).unwrap();
                    let bv = DenseRef::packed(&b, k, n, Layout::RowMajor).unwrap();
                    gemm_in_memory(Transpose::No, Transpose::No, 1.0, av, bv, 1.0, DenseMut::packed(&mut c, m, n, Layout::RowMajor).unwrap(), 2).unwrap();
                }
            });
            let secs = t.elapsed().as_secs_f64();
            println!("{m}x{n}x{k} x{reps}: {:.0} GFLOP/s", 2.0 * (m * n * k * reps) as f64 / secs / 1e9);
        }
    }
}
