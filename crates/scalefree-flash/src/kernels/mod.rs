//! Kernels on flash-resident matrices, each with an in-memory twin used in tests.

pub mod block_gemm;
pub mod gemm;
pub mod tiling;

pub use block_gemm::gemm_in_memory;
pub use gemm::{gemm, gemm_tiled, GemmTiles};

#[cfg(test)]
pub(crate) mod test_support;
