//! IO: access specifiers, aligned buffers, direct positional IO and the IO executor.

pub mod access;
pub mod aligned_buffer;
pub mod direct;
pub mod executor;
pub mod write_locks;

pub use access::{Access, AccessMode, AccessSpec};
pub use aligned_buffer::{AlignedBuf, SECTOR_BYTES};
pub use executor::{IoExecutor, IoOptions, IoTicket};
