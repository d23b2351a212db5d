//! Matrix factorization R ≈ P Qᵀ by stochastic gradient descent (Rima paper, eqs. 3–7).
//!
//! - [`data`]: readers for the common rating formats (plain or gzip), dense id remapping,
//!   a seeded train/test split and a binary cache.
//! - [`kernel`]: the per-rating SGD update: AVX-512 / AVX2 intrinsics picked at run time, a
//!   portable vectorised loop, and a scalar reference used by the tests.
//! - [`local`]: one-process, multi-threaded block-parallel SGD (FPSGD-style scheduling).
//! - [`stream`]: the same data in bounded memory: a streaming rating-file → cache pass and
//!   the split's test indices without an index array (ratings larger than memory).
//! - [`model`]: the factors with their id maps; prediction and atomic save/load.

pub mod data;
pub mod error;
pub mod kernel;
pub mod local;
pub mod model;
pub mod rng;
pub mod stream;
#[cfg(target_arch = "x86_64")]
mod simd_x86;

pub use data::Ratings;
pub use error::MfError;
pub use kernel::{Isa, Schedule, SgdParams};
pub use local::{LocalOptions, LocalTrainer, TrainerState};
pub use model::Model;
