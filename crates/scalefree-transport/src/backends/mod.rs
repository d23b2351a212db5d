//! Backends implement how bytes move between ranks. Each has the same set of pieces:
//! memory (how a region is made addressable by peers) and copies (how a write or read
//! reaches a peer's region).

pub mod shm;
pub mod ucx;
