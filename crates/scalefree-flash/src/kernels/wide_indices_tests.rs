//! 64-bit column indices: every flash CSR kernel gives the 32-bit result on the same matrix
//! stored with 8-byte indices, and a matrix of 2^32 + 10 columns (a handful of entries) is
//! stored, reopened and multiplied.

use crate::dense::{DenseMut, DenseRef, Layout, Transpose};
use crate::error::FlashError;
use crate::file::{FileOptions, FlashCsrMatrix, FlashPtr, OpenMode};
use crate::kernels::test_support::{assert_close, random_csr, random_vec};
use crate::kernels::{csrcsc, csrgemv, csrmm, csrtmm, DenseInput, DenseOutput, TransposedProduct};
use crate::runtime::{Runtime, RuntimeOptions};
use crate::sparse::CsrMatrix;

/// The same matrix with its indices stored as `u64`.
fn widened(rt: &Runtime, a: &CsrMatrix<f64>) -> FlashCsrMatrix<f64> {
    let o = rt.file_options();
    let wide: Vec<u64> = a.indices.iter().map(|&c| c as u64).collect();
    let m = FlashCsrMatrix::from_parts(
        a.rows,
        a.cols,
        FlashPtr::from_slice(rt.dir(), &a.indptr, &o).unwrap(),
        FlashPtr::from_slice(rt.dir(), &wide, &o).unwrap(),
        FlashPtr::from_slice(rt.dir(), &a.values, &o).unwrap(),
    )
    .unwrap();
    assert!(m.indices().is_wide());
    m.validate().unwrap();
    m
}

#[test]
fn kernels_give_the_32_bit_result_with_64_bit_indices() {
    // A small budget, so the matrix is read in many row blocks.
    let rt = Runtime::new(RuntimeOptions { memory_budget_bytes: 8 << 10, compute_threads: 2, io_threads: 2, max_tasks_in_flight: 3, ..RuntimeOptions::default() }).unwrap();
    for &(rows, cols, n) in &[(0usize, 0usize, 1usize), (1, 1, 1), (37, 23, 3), (301, 41, 5)] {
        let a = random_csr(rows as u64 * 5 + 1, rows, cols);
        let narrow = FlashCsrMatrix::from_csr(rt.dir(), a.view(), &rt.file_options()).unwrap();
        let wide = widened(&rt, &a);
        assert_eq!(wide.to_csr_wide().unwrap(), narrow.to_csr_wide().unwrap());
        assert_eq!(wide.size_bytes(), narrow.size_bytes() + 4 * a.indices.len() as u64);
        for transpose in [Transpose::No, Transpose::Yes] {
            let (xl, yl) = if transpose == Transpose::No { (cols, rows) } else { (rows, cols) };
            let x = random_vec::<f64>(3, xl);
            let (mut want, mut got) = (vec![f64::NAN; yl], vec![f64::NAN; yl]);
            csrgemv(&rt, transpose, &narrow, &x, &mut want).unwrap();
            csrgemv(&rt, transpose, &wide, &x, &mut got).unwrap();
            assert_close(&got, &want, 1e-13, &format!("csrgemv {rows}x{cols} {transpose:?}"));
        }
        let b = random_vec::<f64>(4, cols * n);
        let (mut want, mut got) = (vec![0.0; rows * n], vec![0.0; rows * n]);
        for (a_m, c) in [(&narrow, &mut want), (&wide, &mut got)] {
            let bv = DenseRef::packed(&b, cols, n, Layout::RowMajor).unwrap();
            csrmm(&rt, 1.5, a_m, Transpose::No, DenseInput::Memory(bv), 0.0, DenseOutput::Memory(DenseMut::packed(c, rows, n, Layout::RowMajor).unwrap())).unwrap();
        }
        assert_close(&got, &want, 1e-13, &format!("csrmm {rows}x{cols}"));
        for (product, xr) in [(TransposedProduct::Transpose, rows), (TransposedProduct::Gram, cols)] {
            let x = random_vec::<f64>(5, xr * n);
            let (mut want, mut got) = (vec![f64::NAN; cols * n], vec![f64::NAN; cols * n]);
            csrtmm(&rt, product, &narrow, &x, n, &mut want).unwrap();
            csrtmm(&rt, product, &wide, &x, n, &mut got).unwrap();
            assert_close(&got, &want, 1e-12, &format!("csrtmm {product:?} {rows}x{cols}"));
        }
    }
    // 64-bit indices in memory, few columns: stored as 32-bit.
    let a = random_csr(9, 20, 30);
    let wide_mem = CsrMatrix::<f64, u64> { rows: a.rows, cols: a.cols, indptr: a.indptr.clone(), indices: a.indices.iter().map(|&c| c as u64).collect(), values: a.values.clone() };
    let stored = FlashCsrMatrix::from_csr(rt.dir(), wide_mem.view(), &rt.file_options()).unwrap();
    assert!(!stored.indices().is_wide());
    assert_eq!(stored.to_csr().unwrap(), a);
    let err = csrcsc(&rt, &widened(&rt, &a)).unwrap_err();
    assert!(err.to_string().contains("64-bit column indices"), "{err}");
}

/// `len` zeroed elements in pages the kernel maps only when touched (`MAP_NORESERVE`: not
/// counted against the machine's memory), unmapped on drop.
struct Sparse<T> {
    ptr: *mut T,
    len: usize,
}

impl<T> Sparse<T> {
    fn zeroed(len: usize) -> Self {
        let bytes = len * std::mem::size_of::<T>();
        // SAFETY: a fresh private anonymous mapping; checked for failure below.
        let ptr = unsafe { libc::mmap(std::ptr::null_mut(), bytes, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE, -1, 0) };
        assert_ne!(ptr, libc::MAP_FAILED, "mmap of {bytes} bytes");
        Sparse { ptr: ptr.cast(), len }
    }

    fn slice(&mut self) -> &mut [T] {
        // SAFETY: the mapping holds `len` zeroed (valid for f32/f64) elements and lives as long as `self`.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl<T> Drop for Sparse<T> {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `zeroed`, unmapped once.
        unsafe { libc::munmap(self.ptr.cast(), self.len * std::mem::size_of::<T>()) };
    }
}

#[test]
fn a_matrix_of_2_32_plus_10_columns() {
    let cols = (1usize << 32) + 10;
    let rows = 5;
    let entries: [(usize, u64, f32); 7] = [(0, 3, 1.0), (0, 1 << 32, 2.0), (1, (1 << 32) + 9, 3.0), (3, 0, 4.0), (3, 3, 5.0), (3, (1 << 32) + 9, 6.0), (4, u32::MAX as u64, 7.0)];
    let mut indptr = vec![0u64; rows + 1];
    for &(r, _, _) in &entries {
        indptr[r + 1] += 1;
    }
    for r in 0..rows {
        indptr[r + 1] += indptr[r];
    }
    let a = CsrMatrix::<f32, u64> { rows, cols, indptr, indices: entries.iter().map(|e| e.1).collect(), values: entries.iter().map(|e| e.2).collect() };
    let rt = Runtime::new(RuntimeOptions { memory_budget_bytes: 1 << 20, compute_threads: 2, io_threads: 1, ..RuntimeOptions::default() }).unwrap();
    let path = rt.dir().join("wide.sfcsr");
    FlashCsrMatrix::create_file(&path, a.view(), &FileOptions::default()).unwrap();
    assert_eq!(&std::fs::read(&path).unwrap()[..8], b"SFCSR\0\0\x02");
    let m = FlashCsrMatrix::<f32>::open(&path, OpenMode::ReadOnly, &FileOptions::default()).unwrap();
    assert!(m.indices().is_wide() && m.cols() == cols);
    m.validate().unwrap();
    assert_eq!(m.to_csr_wide().unwrap(), a);
    assert!(m.to_csr().unwrap_err().to_string().contains("64-bit"));
    // y = A x and C = A B with x, B of 2^32 + 10 rows that are zero but at the used columns.
    let used: Vec<u64> = {
        let mut u: Vec<u64> = a.indices.clone();
        u.sort_unstable();
        u.dedup();
        u
    };
    let mut x = Sparse::<f32>::zeroed(cols);
    let n = 2;
    let mut b = Sparse::<f32>::zeroed(cols * n);
    for (k, &c) in used.iter().enumerate() {
        x.slice()[c as usize] = (k + 1) as f32;
        b.slice()[c as usize * n] = k as f32 - 1.0;
        b.slice()[c as usize * n + 1] = 0.5 * k as f32;
    }
    let mut want_y = vec![0f32; rows];
    let mut want_c = vec![0f32; rows * n];
    for (r, w) in a.indptr.windows(2).enumerate() {
        for e in w[0] as usize..w[1] as usize {
            let k = used.binary_search(&a.indices[e]).unwrap();
            want_y[r] += a.values[e] * (k + 1) as f32;
            want_c[r * n] += a.values[e] * (k as f32 - 1.0);
            want_c[r * n + 1] += a.values[e] * 0.5 * k as f32;
        }
    }
    let mut y = vec![f32::NAN; rows];
    csrgemv(&rt, Transpose::No, &m, x.slice(), &mut y).unwrap();
    assert_close(&y, &want_y, 1e-6, "y = A x");
    let mut c = vec![0f32; rows * n];
    let bv = DenseRef::packed(b.slice(), cols, n, Layout::RowMajor).unwrap();
    csrmm(&rt, 1.0, &m, Transpose::No, DenseInput::Memory(bv), 0.0, DenseOutput::Memory(DenseMut::packed(&mut c, rows, n, Layout::RowMajor).unwrap())).unwrap();
    assert_close(&c, &want_c, 1e-6, "C = A B");
    // 32-bit indices cannot describe it.
    let err = FlashCsrMatrix::from_parts(rows, cols, m.indptr().clone(), FlashPtr::<u32>::scratch(rt.dir(), 7, &rt.file_options()).unwrap(), m.values().clone()).unwrap_err();
    assert!(matches!(err, FlashError::InvalidArgument(_)), "{err}");
}
