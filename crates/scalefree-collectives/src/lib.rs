//! Dense collectives, written once against the device API of `scalefree-transport`.
//!
//! A [`Communicator`] spans every rank of a [`Device`](scalefree_transport::Device). Its
//! calls work in place on caller memory; see `docs/algorithms.md` for steps and bytes
//! moved per algorithm:
//!
//! * [`Algorithm::OneShot`] — small messages: every rank writes its data into every peer's
//!   inbox (one step), every rank reduces all contributions in rank order. Between hosts
//!   the allreduce and the barrier go by recursive doubling instead (`dense::doubling`:
//!   log2 H rounds of one message per host, through each host's first rank when hosts hold
//!   several ranks).
//! * [`Algorithm::Direct`] — large messages: reduce-scatter then allgather by one-sided
//!   reads of each peer's buffer, pipelined in pieces with progress counters.
//! * [`Algorithm::Ring`] — the pipelined ring: the same one-sided reads, but each rank only
//!   reads from its left neighbour, N-1 steps each way.

pub mod comm;
pub mod dense;
pub mod reduce;
pub mod ssp;
pub mod sparse;

pub use comm::{CommOptions, Communicator};
pub use scalefree_transport::config::parse_bytes;
pub use reduce::{DType, ReduceOp};

/// Which algorithm a collective uses. `Auto` chooses by message size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum Algorithm {
    Auto = 0,
    OneShot = 1,
    Direct = 2,
    Ring = 3,
    /// Across hosts with several ranks each: within the host over shared memory, between
    /// hosts over the network (`dense::hierarchical`). `auto` picks it when the job has that shape.
    Hierarchical = 4,
}

impl Algorithm {
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::Auto => "auto",
            Algorithm::OneShot => "one_shot",
            Algorithm::Direct => "direct",
            Algorithm::Ring => "ring",
            Algorithm::Hierarchical => "hierarchical",
        }
    }
    pub fn parse(s: &str) -> scalefree_transport::Result<Self> {
        Ok(match s {
            "auto" => Algorithm::Auto,
            "one_shot" => Algorithm::OneShot,
            "direct" => Algorithm::Direct,
            "ring" => Algorithm::Ring,
            "hierarchical" => Algorithm::Hierarchical,
            _ => {
                return Err(scalefree_transport::Error::InvalidArgument(format!(
                    "unknown algorithm {s:?}: expected one of auto, one_shot, direct, ring, hierarchical"
                )))
            }
        })
    }
    pub fn from_u32(v: u32) -> Option<Self> {
        Some(match v {
            0 => Algorithm::Auto,
            1 => Algorithm::OneShot,
            2 => Algorithm::Direct,
            3 => Algorithm::Ring,
            4 => Algorithm::Hierarchical,
            _ => return None,
        })
    }
}
