//! Traffic counters: what this rank moved to and from each peer through its channels,
//! counted where the operations are issued (every one-sided write, post, notification and
//! read of a [`crate::Channel`], on either backend).
//!
//! A rank counts the operations *it* issues: bytes it wrote to a peer, bytes it read from
//! a peer, and operations (messages) aimed at that peer. What a peer wrote into this rank
//! shows in that peer's counters (gather them to see both directions). Loads and stores a
//! protocol makes directly in a mapped peer region of the same host (e.g. a doorbell) are
//! not channel operations and are not counted.

use std::sync::atomic::{AtomicU64, Ordering};

/// Totals for one peer, since the device was created.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PeerTraffic {
    /// Bytes this rank wrote into the peer's memory (writes, puts, posts).
    pub bytes_written: u64,
    /// Bytes this rank read from the peer's memory.
    pub bytes_read: u64,
    /// One-sided operations this rank issued to the peer (each write, post, notification
    /// or read counts once; a write with its notification is one).
    pub operations: u64,
}

pub(crate) struct Traffic {
    /// Per peer: bytes written, bytes read, operations.
    counts: Vec<[AtomicU64; 3]>,
}

impl Traffic {
    pub(crate) fn new(peers: usize) -> Self {
        Traffic { counts: (0..peers).map(|_| [AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)]).collect() }
    }
    pub(crate) fn wrote(&self, peer: u32, n: usize) {
        if let Some(c) = self.counts.get(peer as usize) {
            c[0].fetch_add(n as u64, Ordering::Relaxed);
            c[2].fetch_add(1, Ordering::Relaxed);
        }
    }
    pub(crate) fn read(&self, peer: u32, n: usize) {
        if let Some(c) = self.counts.get(peer as usize) {
            c[1].fetch_add(n as u64, Ordering::Relaxed);
            c[2].fetch_add(1, Ordering::Relaxed);
        }
    }
    pub(crate) fn snapshot(&self) -> Vec<PeerTraffic> {
        self.counts
            .iter()
            .map(|c| PeerTraffic {
                bytes_written: c[0].load(Ordering::Relaxed),
                bytes_read: c[1].load(Ordering::Relaxed),
                operations: c[2].load(Ordering::Relaxed),
            })
            .collect()
    }
}
