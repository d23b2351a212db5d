//! Shared-memory backend for ranks on one host.
//!
//! A region is an anonymous `memfd` (mode 0600, no name in any filesystem), so nothing
//! is left behind when processes crash: the memory is freed with the last mapping.
//! Peers map it through a file descriptor passed over the bootstrap socket
//! (`SCM_RIGHTS`) or opened via `/proc/<pid>/fd/<n>`. Ordinary process memory (a numpy
//! array that is not in a region) is reached with cross-memory attach
//! (`process_vm_readv` / `process_vm_writev`), one kernel copy.
//!
//! The pieces, as in every backend: `memory.rs`, `copies.rs`, `notify.rs`, `peers.rs`. There is
//! no progress to drive: every copy completes before the call returns.

mod copies;
mod memory;
mod notify;
mod peers;

pub use copies::{cma_read, cma_write};
pub use memory::{create_memfd, fd_identity, fd_label, fd_len, map_shared, map_sparse, open_peer_fd, Mapping};
pub use peers::{cma_permitted, PidWatch};

use crate::backends::{Backend, Note, Request, Setup};
use crate::device::Device;
use crate::error::Result;
use crate::region::RemoteRegion;
use crate::wait::WaitPolicy;

/// The shared-memory backend: every peer's region is mapped here (a memfd) or reached by
/// cross-memory attach (ordinary process memory); notifications are stores into the peer's
/// mapped control segment and a futex wake. Copies complete before the call returns.
pub struct Shm;

/// The backend of a job whose ranks are all on this host: nothing to set up beyond the
/// device's control segments.
pub(crate) fn open(_setup: Setup<'_>) -> Result<Box<dyn Backend>> {
    Ok(Box::new(Shm))
}

impl Backend for Shm {
    fn name(&self) -> &'static str {
        "shm"
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
    unsafe fn write(&self, dev: &Device, peer: u32, src: *const u8, remote: &RemoteRegion, off: usize, n: usize) -> Result<()> {
        unsafe { Self::copy_to(dev, peer, src, remote, off, n) }
    }
    unsafe fn read(&self, dev: &Device, peer: u32, remote: &RemoteRegion, off: usize, dst: *mut u8, n: usize) -> Result<()> {
        unsafe { Self::copy_from(dev, peer, remote, off, dst, n) }
    }
    fn notify(&self, dev: &Device, peer: u32, slot: u32, value: u32) -> Result<()> {
        Self::publish(dev, peer, slot, value);
        Ok(())
    }
    unsafe fn write_notify(&self, dev: &Device, peer: u32, src: *const u8, remote: &RemoteRegion, off: usize, n: usize, note: Note) -> Result<()> {
        unsafe {
            Self::write_then_note(dev, peer, src, remote, off, n, note, |slot, value| {
                Self::publish(dev, peer, slot, value);
                Ok(())
            })
        }
    }
    fn wait_request(&self, _req: &Request, _policy: &WaitPolicy) -> Result<()> {
        // Shared-memory copies complete before they return: no request is ever made here.
        Ok(())
    }
}
