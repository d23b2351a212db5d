//! Copies of the shared-memory backend: through the peer's mapping when its region is
//! mapped here, else by cross-memory attach (`process_vm_readv` / `process_vm_writev`, one
//! kernel copy) for ordinary process memory (a numpy array that is not in a region).

use std::sync::atomic::Ordering;

use super::Shm;
use crate::device::Device;
use crate::error::Result;
use crate::region::RemoteRegion;

/// Copies `len` bytes from `remote_addr` in process `pid` into `local`.
/// Returns `ESRCH` as an `io::Error` when the process is gone.
pub fn cma_read(pid: u32, remote_addr: usize, local: *mut u8, len: usize) -> std::io::Result<()> {
    cma(pid, remote_addr, local, len, false)
}

/// Copies `len` bytes from `local` into `remote_addr` in process `pid`.
pub fn cma_write(pid: u32, remote_addr: usize, local: *const u8, len: usize) -> std::io::Result<()> {
    cma(pid, remote_addr, local as *mut u8, len, true)
}

fn cma(pid: u32, remote_addr: usize, local: *mut u8, len: usize, write: bool) -> std::io::Result<()> {
    let mut done = 0usize;
    while done < len {
        let l = libc::iovec {
            iov_base: unsafe { local.add(done) } as *mut libc::c_void,
            iov_len: len - done,
        };
        let r = libc::iovec {
            iov_base: (remote_addr + done) as *mut libc::c_void,
            iov_len: len - done,
        };
        let n = unsafe {
            if write {
                libc::process_vm_writev(pid as libc::pid_t, &l, 1, &r, 1, 0)
            } else {
                libc::process_vm_readv(pid as libc::pid_t, &l, 1, &r, 1, 0)
            }
        };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "process_vm copy made no progress",
            ));
        }
        done += n as usize;
    }
    Ok(())
}

impl Shm {
    /// `n` bytes from `src` into `remote[off..]` through the mapping, else by
    /// `process_vm_writev`; then a release fence.
    ///
    /// # Safety
    /// `src..src+n` must be readable.
    pub(crate) unsafe fn copy_to(dev: &Device, peer: u32, src: *const u8, remote: &RemoteRegion, off: usize, n: usize) -> Result<()> {
        match remote.mapped_ptr() {
            Some(p) => unsafe { std::ptr::copy_nonoverlapping(src, p.add(off), n) },
            None => cma_write(remote.handle.pid, remote.handle.addr as usize + off, src, n)
                .map_err(|e| dev.peer_error(peer, "process_vm_writev", e))?,
        }
        std::sync::atomic::fence(Ordering::Release);
        Ok(())
    }

    /// `n` bytes of `remote[off..]` into `dst`, after an acquire fence.
    ///
    /// # Safety
    /// `dst..dst+n` must be writable and not overlap the source.
    pub(crate) unsafe fn copy_from(dev: &Device, peer: u32, remote: &RemoteRegion, off: usize, dst: *mut u8, n: usize) -> Result<()> {
        std::sync::atomic::fence(Ordering::Acquire);
        match remote.mapped_ptr() {
            Some(p) => unsafe { std::ptr::copy_nonoverlapping(p.add(off), dst, n) },
            None => cma_read(remote.handle.pid, remote.handle.addr as usize + off, dst, n)
                .map_err(|e| dev.peer_error(peer, "process_vm_readv", e))?,
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backends::shm::cma_permitted;

    #[test]
    fn cma_reads_own_memory() {
        let src: Vec<u8> = (0..10_000).map(|i| i as u8).collect();
        let mut dst = vec![0u8; 10_000];
        let pid = std::process::id();
        if !cma_permitted(pid, src.as_ptr() as usize) {
            eprintln!("CMA not permitted here; skipping");
            return;
        }
        cma_read(pid, src.as_ptr() as usize, dst.as_mut_ptr(), src.len()).unwrap();
        assert_eq!(src, dst);
    }
}
