//! Sparse allreduce (Kylix): config/reduce over a nested, heterogeneous butterfly.
//!
//! Every rank contributes values at a sparse set of indices ("out") and requests the
//! reduced values at another sparse set ("in"). Indices are hashed by a seeded bijection
//! ([`hash`]) so that power-law hot spots spread over ranks, kept sorted in hashed order,
//! and split layer by layer into contiguous key ranges ([`partition`]). Down the layers each
//! node merges the sorted parts it receives with a pairwise tree merge ([`merge`]); `config`
//! saves the position maps of every merge so `reduce` moves and combines values only, and
//! the up phase sends back exactly the requested values through the same nodes.
//! Layer degrees come from [`plan`]; the collective itself is in [`butterfly`].

pub mod butterfly;
pub mod direct;
pub mod hash;
pub mod kernels;
pub mod merge;
pub mod partition;
pub mod plan;
pub mod replica;
pub mod ssp;

pub use butterfly::{LayerStats, SparseAllreduce};
pub use kernels::{SDType, SOp};
