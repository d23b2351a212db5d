//! BLAS-on-flash for scalefree: SSD-resident dense and CSR matrices, a task-DAG runtime with
//! a program cache under a hard memory budget and prioritized prefetch, and kernels that run
//! at close to in-memory speed (see `papers/blas-on-flash.md`).
//!
//! Layers, bottom up:
//! * [`file`] — [`FlashFile`], typed [`FlashPtr`], [`FlashMatrix`] (dense), [`FlashCsrMatrix`].
//! * [`io`] — access specifiers ([`AccessSpec`]), aligned direct IO, the [`IoExecutor`].
//! * [`cache`] — the program cache: one buffer per access specifier, hard memory budget;
//!   [`CacheReader`] drives it for consumers that compute on their own threads (MF trainers).
//! * [`sched`] — [`Task`]s, the [`Dag`] and its run loop, the prioritizer.
//! * [`Runtime`] — owns all of it; no global state.

pub mod cache;
pub mod dense;
pub mod element;
pub mod error;
pub mod file;
pub mod io;
pub mod kernels;
pub mod runtime;
pub mod sched;
pub mod sparse;

pub use dense::{DenseMut, DenseRef, DenseShape, Layout, Transpose};
pub use element::{Element, Real};
pub use error::{FlashError, Result};
pub use file::{default_scratch_dir, FileOptions, FlashCsrMatrix, FlashFile, FlashMatrix, FlashPtr, IoMode, OpenMode, docword_input_to_flash, docword_to_flash, read_docword, read_docword_input, FlashDocword, read_matrix_market, TextMatrix, DOCWORD_CHUNK_ENTRIES};
pub use io::{Access, AccessMode, AccessSpec, IoExecutor, IoOptions};
pub use sparse::{needs_wide_indices, ColIndex, CsrMatrix, CsrRef};
pub use cache::{CacheReader, CacheStats, CachedBlock, EntryTag, ReaderStats};
pub use runtime::{parse_bytes, Progress, ProgressSnapshot, Runtime, RuntimeOptions};
pub use sched::{Dag, FnTask, Injector, Priority, RunStats, Task, TaskBuffers, TaskContext, TaskId};
pub use kernels::{csr_gram_in_memory, csrcsc, csrgemv, csrgemv_in_memory, csrmm, csrmm_in_memory, csrtmm, csrtmm_in_memory, TransposedProduct, gemm, gemm_in_memory, gemm_in_memory_with, gemm_tiled, ExternalBlas, sort, DenseInput, DenseOutput, GemmStream, GemmTiles, kmeans, KmeansOptions, KmeansResult};
