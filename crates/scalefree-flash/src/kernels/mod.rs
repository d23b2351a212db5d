//! Kernels on flash-resident matrices, each with an in-memory twin used in tests.

pub mod blas;
pub mod block_gemm;
pub mod csr_gram;
pub mod csr_rows;
pub mod csrcsc;
pub mod csrgemv;
pub mod csrmm;
pub mod csrtmm;
pub mod gemm;
pub mod kmeans;
pub mod sort;
pub mod tiling;

pub use blas::ExternalBlas;
pub use block_gemm::{gemm_in_memory, gemm_in_memory_with};
pub use csr_gram::csr_gram_in_memory;
pub use csrcsc::{csrcsc, csrcsc_in_memory};
pub use csrgemv::{csrgemv, csrgemv_in_memory};
pub use csrmm::{csrmm, csrmm_in_memory, DenseInput, DenseOutput};
pub use csrtmm::{csrtmm, csrtmm_in_memory, TransposedProduct};
pub use gemm::{gemm, gemm_tiled, GemmTiles};
pub use kmeans::{kmeans, KmeansOptions, KmeansResult};
pub use sort::sort;
pub use tiling::GemmStream;

#[cfg(test)]
pub(crate) mod test_support;
#[cfg(test)]
mod wide_indices_tests;

/// Runs `$body` with `$ix` bound to the column indices in task buffer `$slot`, as `&[u64]` if
/// `$wide` (the matrix's indices are 64-bit) and `&[u32]` otherwise; the body is compiled for
/// each width, so the 32-bit path is the code it was before 64-bit indices existed.
macro_rules! with_indices {
    ($wide:expr, $buffers:expr, $slot:expr, |$ix:ident| $body:expr) => {
        if $wide {
            let $ix = $buffers.read::<u64>($slot);
            $body
        } else {
            let $ix = $buffers.read::<u32>($slot);
            $body
        }
    };
}
pub(crate) use with_indices;

use crate::dense::Transpose;
use crate::element::Real;
use crate::error::Result;
use crate::file::{FlashCsrMatrix, FlashMatrix, FlashPtr};
use crate::runtime::Runtime;
use crate::sched::RunStats;

/// The kernels as methods of the runtime (the same functions as [`gemm`], [`csrmm`],
/// [`csrgemv`]).
impl Runtime {
    /// `C := alpha op(A) op(B) + beta C` with A, B, C on flash (see [`gemm()`]).
    #[allow(clippy::too_many_arguments)]
    pub fn gemm<T: Real>(&self, trans_a: Transpose, trans_b: Transpose, alpha: T, a: &FlashMatrix<T>, b: &FlashMatrix<T>, beta: T, c: &FlashMatrix<T>) -> Result<RunStats> {
        gemm::gemm(self, trans_a, trans_b, alpha, a, b, beta, c)
    }

    /// `C := alpha A op(B) + beta C` with CSR A on flash (see [`csrmm()`]).
    pub fn csrmm<T: Real>(&self, alpha: T, a: &FlashCsrMatrix<T>, trans_b: Transpose, b: DenseInput<'_, T>, beta: T, c: DenseOutput<'_, T>) -> Result<RunStats> {
        csrmm::csrmm(self, alpha, a, trans_b, b, beta, c)
    }

    /// `y := op(A) x` with CSR A on flash (see [`csrgemv()`]).
    pub fn csrgemv<T: Real>(&self, transpose: Transpose, a: &FlashCsrMatrix<T>, x: &[T], y: &mut [T]) -> Result<RunStats> {
        csrgemv::csrgemv(self, transpose, a, x, y)
    }

    /// `Z := Aᵀ X` or `Z := Aᵀ A X` with CSR A on flash, in one pass over A (see [`csrtmm()`]).
    pub fn csrtmm<T: Real>(&self, product: TransposedProduct, a: &FlashCsrMatrix<T>, x: &[T], n: usize, z: &mut [T]) -> Result<RunStats> {
        csrtmm::csrtmm(self, product, a, x, n, z)
    }

    /// `Aᵀ` (A's CSC form) as a new CSR matrix on flash (see [`csrcsc()`]).
    pub fn csrcsc<T: Real>(&self, a: &FlashCsrMatrix<T>) -> Result<(FlashCsrMatrix<T>, RunStats)> {
        csrcsc::csrcsc(self, a)
    }

    /// Lloyd's k-means on the rows of a flash matrix (see [`kmeans()`]).
    pub fn kmeans<T: Real>(&self, x: &FlashMatrix<T>, options: kmeans::KmeansOptions) -> Result<kmeans::KmeansResult<T>> {
        kmeans::kmeans(self, x, options)
    }

    /// Sorts a flash array in place, in IEEE total order (see [`sort()`]).
    pub fn sort<T: Real>(&self, data: &FlashPtr<T>) -> Result<RunStats> {
        sort::sort(self, data)
    }
}

#[cfg(test)]
mod bench {
    use super::*;
    use crate::dense::{DenseMut, DenseRef, Layout};
    use crate::kernels::test_support::random_vec;
    use crate::runtime::RuntimeOptions;
    use std::time::Instant;

    /// Timing, not correctness: `cargo test -p scalefree-flash --release -- --ignored
    /// gemm_speed --nocapture` (set SCALEFREE_BENCH_N, default 4096). Budget: 25 % of the data.
    #[test]
    #[ignore]
    fn gemm_speed_against_in_memory() {
        let n: usize = std::env::var("SCALEFREE_BENCH_N").ok().and_then(|v| v.parse().ok()).unwrap_or(4096);
        let data_bytes = (3 * n * n * 4) as u64;
        // SCALEFREE_FLASH_COMPUTE_NICENESS etc. apply (see RuntimeOptions::from_env).
        let rt = Runtime::new(RuntimeOptions { memory_budget_bytes: data_bytes / 4, ..RuntimeOptions::from_env().unwrap() }).unwrap();
        let a_data = random_vec::<f32>(1, n * n);
        let b_data = random_vec::<f32>(2, n * n);
        let mut c_mem = vec![0f32; n * n];
        let a = FlashMatrix::from_slice(rt.dir(), &a_data, n, n, Layout::RowMajor, &rt.file_options()).unwrap();
        let b = FlashMatrix::from_slice(rt.dir(), &b_data, n, n, Layout::RowMajor, &rt.file_options()).unwrap();
        let c = FlashMatrix::<f32>::scratch(rt.dir(), n, n, Layout::RowMajor, &rt.file_options()).unwrap();
        let t = Instant::now();
        rt.install(|| {
            let av = DenseRef::packed(&a_data, n, n, Layout::RowMajor).unwrap();
            let bv = DenseRef::packed(&b_data, n, n, Layout::RowMajor).unwrap();
            gemm_in_memory(Transpose::No, Transpose::No, 1.0, av, bv, 0.0, DenseMut::packed(&mut c_mem, n, n, Layout::RowMajor).unwrap(), rt.options().compute_threads).unwrap();
        });
        let in_memory = t.elapsed().as_secs_f64();
        let t = Instant::now();
        // SCALEFREE_BENCH_TILES=m,n,k overrides the tiles chosen from the budget.
        let tiles: Option<Vec<usize>> = std::env::var("SCALEFREE_BENCH_TILES").ok().map(|v| v.split(',').map(|x| x.trim().parse().unwrap()).collect());
        let stats = match tiles.as_deref() {
            Some(&[m, n, k]) => gemm_tiled(&rt, Transpose::No, Transpose::No, 1.0, &a, &b, 0.0, &c, GemmTiles { m, n, k, stream: GemmStream::ARows }).unwrap(),
            _ => rt.gemm(Transpose::No, Transpose::No, 1.0, &a, &b, 0.0, &c).unwrap(),
        };
        let flash = t.elapsed().as_secs_f64();
        let flops = 2.0 * (n as f64).powi(3);
        println!(
            "n={n} budget={} MiB in-memory {:.2}s ({:.0} GFLOP/s) flash {:.2}s ({:.0} GFLOP/s) ratio {:.2} tasks {} read {} MiB written {} MiB peak {} MiB io {:?} compute busy {:.2}s idle {:.2}s",
            (data_bytes / 4) >> 20,
            in_memory,
            flops / in_memory / 1e9,
            flash,
            flops / flash / 1e9,
            in_memory / flash,
            stats.tasks_completed,
            stats.cache.bytes_prefetched >> 20,
            stats.cache.bytes_written_back >> 20,
            stats.cache.peak_resident_bytes >> 20,
            a.data().file().io_mode(),
            stats.compute_busy.as_secs_f64(),
            stats.compute_idle.as_secs_f64(),
        );
        assert!(stats.cache.peak_resident_bytes <= data_bytes / 4);
        let got = c.read_block(n / 2, 0, 1, n).unwrap();
        crate::kernels::test_support::assert_close(&got, &c_mem[(n / 2) * n..(n / 2 + 1) * n], 1e-4, "flash gemm against in-memory");
    }
}
