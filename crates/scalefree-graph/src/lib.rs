//! Graph kernels, single-threaded (in a multi-rank job every rank shares the cores with the
//! others, so CPU work per rank is what counts):
//!
//! - [`edges`]: the set-up of a partitioned load: every edge to the rank that owns it (a
//!   hash of the edge; one counting sort) and, there, the edges sorted with duplicates
//!   dropped (an LSD radix sort of packed keys).
//! - [`keys`]: the same exchange on packed `u64` edge keys (ids below 2^32), in place: the
//!   keys grouped by owner, then sorted and deduplicated in the buffer they arrived in.
//! - [`local`]: a rank's local PageRank state from its distinct edges in one pass: the
//!   compact out/in key sets and the CSR the SpMV runs on.
//! - [`pagerank`]: the per-iteration kernels (the value-free CSR SpMV, the owned update).
//! - [`hadi`]: HADI's hop on HyperLogLog registers (register-wise max over edges).
//! - [`flash_rows`]: a rank's edges on flash, streamed once per iteration or hop through the
//!   flash runtime for both kernels (`graph pagerank/diameter --memory-budget`).
//!
//! The algorithms around them are in `python/scalefree/graph/` (`io.py`, `pagerank.py`, `hadi.py`).

pub mod edges;
pub mod flash_rows;
pub mod hadi;
pub mod keys;
pub mod local;
pub mod pagerank;

/// Vertex id types the kernels take: unsigned 32- or 64-bit ids, or int64 as numpy
/// writes them (non-negative; a negative id reads as its two's-complement u64).
pub trait Id: Copy + Ord + Default + Send + Sync + 'static {
    /// The id as u64 (what the edge hash and the range checks see).
    fn u64(self) -> u64;
    /// The id from a u64 that the caller checked fits.
    fn of_u64(x: u64) -> Self;
    /// The largest id the type holds, as u64.
    const MAX_U64: u64;
}

impl Id for u32 {
    #[inline(always)]
    fn u64(self) -> u64 {
        self as u64
    }
    #[inline(always)]
    fn of_u64(x: u64) -> Self {
        x as u32
    }
    const MAX_U64: u64 = u32::MAX as u64;
}

impl Id for u64 {
    #[inline(always)]
    fn u64(self) -> u64 {
        self
    }
    #[inline(always)]
    fn of_u64(x: u64) -> Self {
        x
    }
    const MAX_U64: u64 = u64::MAX;
}

impl Id for i64 {
    #[inline(always)]
    fn u64(self) -> u64 {
        self as u64
    }
    #[inline(always)]
    fn of_u64(x: u64) -> Self {
        x as i64
    }
    const MAX_U64: u64 = i64::MAX as u64;
}

/// Prefetches the cache line at `p` (a hint only: any address may be prefetched, nothing
/// is dereferenced).
#[inline(always)]
pub(crate) fn prefetch<T>(p: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: prefetching is a hint that never faults, whatever the address.
    unsafe {
        std::arch::x86_64::_mm_prefetch(p as *const i8, std::arch::x86_64::_MM_HINT_T0)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}
