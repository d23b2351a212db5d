//! Tensor transfer between two ranks over the device API, the two ways of the RDMA tensor
//! paper (§3.2–3.3):
//!
//! * [`StaticSlot`] — a fixed shape and dtype, set up once: the receiver's buffer lives in a
//!   region the sender writes into with one one-sided write followed by a sequence word;
//!   the receiver uses the buffer itself (no copy) and hands a credit back when it is done
//!   with it, so a fast sender never overwrites what a slow receiver reads.
//! * [`DynamicChannel`] — any shape: the sender writes a fixed-size metadata record (shape,
//!   dtype, where its data lives); the receiver allocates, pulls the data with a one-sided
//!   read and tells the sender the source may be reused. Data outside registered memory is
//!   first copied into a registered staging buffer, and counted ([`Stats::bytes_copied`]).
//!
//! Both are set up collectively from a list of specs that every rank passes identically
//! (the address distribution the paper does before the computation).

pub mod apply;
mod dynamic;
mod static_slot;

pub use dynamic::{DynamicChannel, Meta, MAX_NDIM};
pub use static_slot::{StaticSlot, StaticSpec};

use std::sync::atomic::{AtomicU64, Ordering};

/// Bytes moved by a slot or channel, by path.
#[derive(Debug, Default)]
pub struct Stats {
    /// Sent straight from registered memory (or written into the receiver's buffer).
    pub bytes_zero_copy: AtomicU64,
    /// Sent through a staging copy because the source was not registered.
    pub bytes_copied: AtomicU64,
    pub transfers: AtomicU64,
}

impl Stats {
    pub fn snapshot(&self) -> (u64, u64, u64) {
        (
            self.bytes_zero_copy.load(Ordering::Relaxed),
            self.bytes_copied.load(Ordering::Relaxed),
            self.transfers.load(Ordering::Relaxed),
        )
    }
}

/// Checks that every rank passed the same specs (their serialized form).
pub(crate) fn agree(dev: &scalefree_transport::Device, what: &str, mine: &[u8]) -> scalefree_transport::Result<()> {
    let all = dev.exchange_bytes(mine)?;
    for (r, theirs) in all.iter().enumerate() {
        if theirs != mine {
            return Err(scalefree_transport::Error::Mismatch(format!(
                "{what}: rank {} and rank {r} passed different specs (every rank must pass the same list)",
                dev.rank()
            )));
        }
    }
    Ok(())
}
