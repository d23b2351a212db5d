//! Helpers for kernel tests: seeded data and tolerant comparison.

use crate::element::Real;
use crate::sparse::CsrMatrix;

/// Deterministic values in [-1, 1).
pub(crate) fn random_vec<T: Real>(seed: u64, len: usize) -> Vec<T> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15).wrapping_add(0x2545_f491_4f6c_dd1d) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            T::from_f64((x >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0)
        })
        .collect()
}

/// Asserts `|got - want| <= tol * (1 + |want|)` elementwise.
pub(crate) fn assert_close<T: Real>(got: &[T], want: &[T], tol: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths differ");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let (g, w) = (g.to_f64(), w.to_f64());
        assert!((g - w).abs() <= tol * (1.0 + w.abs()) || (g.is_nan() && w.is_nan()), "{what}: element {i} is {g}, expected {w}");
    }
}

    /// A random sparse matrix with some empty rows and a skewed row length distribution.
pub(crate) fn random_csr(seed: u64, rows: usize, cols: usize) -> CsrMatrix<f64> {
    let picks = random_vec::<f64>(seed, rows * 8 + 1);
    let vals = random_vec::<f64>(seed + 1, rows * cols.min(40) + 1);
    let mut triplets = Vec::new();
    let mut v = 0;
    for r in 0..rows {
        let len = if cols == 0 { 0 } else { ((picks[r].abs() * picks[r].abs() * 30.0) as usize).min(cols) };
        for t in 0..len {
            let c = ((picks[(r * 8 + t) % picks.len()].abs() * cols as f64) as usize + t * 7) % cols;
            triplets.push((r, c, vals[v % vals.len()]));
            v += 1;
        }
    }
    CsrMatrix::from_triplets(rows, cols, &triplets).unwrap()
}

