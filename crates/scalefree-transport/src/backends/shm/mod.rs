//! Shared-memory backend for ranks on one host.
//!
//! A region is an anonymous `memfd` (mode 0600, no name in any filesystem), so nothing
//! is left behind when processes crash: the memory is freed with the last mapping.
//! Peers map it through a file descriptor passed over the bootstrap socket
//! (`SCM_RIGHTS`) or opened via `/proc/<pid>/fd/<n>`. Ordinary process memory (a numpy
//! array that is not in a region) is reached with cross-memory attach
//! (`process_vm_readv` / `process_vm_writev`), one kernel copy.

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::ptr::NonNull;

use std::sync::atomic::Ordering;

use crate::backends::{Backend, Note, Request};
use crate::device::Device;
use crate::error::{Error, Result};
use crate::region::RemoteRegion;
use crate::wait::WaitPolicy;

/// A shared mapping of a memfd. Unmapped on drop.
#[derive(Debug)]
pub struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

unsafe impl Send for Mapping {}
unsafe impl Sync for Mapping {}

impl Mapping {
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        if self.len > 0 {
            unsafe { libc::munmap(self.ptr.as_ptr() as *mut libc::c_void, self.len) };
        }
    }
}

/// Creates a memfd of `len` bytes named `scalefree-<tag>` (the name is only a label).
pub fn create_memfd(tag: &str, len: usize) -> Result<OwnedFd> {
    let name = CString::new(format!("scalefree-{tag}")).expect("no NUL in tag");
    let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(Error::last_os(format!("memfd_create({tag})")));
    }
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // Owner-only, like a 0600 shm segment (a memfd has no name, but /proc exposes it).
    unsafe { libc::fchmod(fd.as_raw_fd(), 0o600) };
    if unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) } != 0 {
        return Err(Error::last_os(format!("ftruncate(memfd {tag}, {len})")));
    }
    Ok(fd)
}

/// Maps `len` bytes of `fd` shared and read-write. With `prefault`, pages are touched
/// now (`MAP_POPULATE`) so the first collective does not pay for page faults.
pub fn map_shared(fd: RawFd, len: usize, prefault: bool) -> Result<Mapping> {
    map_shared_flags(fd, len, if prefault { libc::MAP_POPULATE } else { 0 })
}

/// Maps a large sparse region without reserving swap for it (pages come on first touch).
pub fn map_sparse(fd: RawFd, len: usize) -> Result<Mapping> {
    map_shared_flags(fd, len, libc::MAP_NORESERVE)
}

fn map_shared_flags(fd: RawFd, len: usize, extra: libc::c_int) -> Result<Mapping> {
    if len == 0 {
        return Ok(Mapping {
            ptr: NonNull::dangling(),
            len: 0,
        });
    }
    let flags = libc::MAP_SHARED | extra;
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            flags,
            fd,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(Error::last_os(format!("mmap({len} bytes)")));
    }
    Ok(Mapping {
        ptr: NonNull::new(p as *mut u8).expect("mmap returned null"),
        len,
    })
}

/// Opens another process's descriptor through `/proc` (same user, ptrace-permitted).
pub fn open_peer_fd(pid: u32, fd: i32) -> Result<OwnedFd> {
    let path = CString::new(format!("/proc/{pid}/fd/{fd}")).unwrap();
    let r = unsafe { libc::open(path.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    if r < 0 {
        return Err(Error::last_os(format!("open /proc/{pid}/fd/{fd}")));
    }
    Ok(unsafe { OwnedFd::from_raw_fd(r) })
}

/// The label of an open descriptor (`/memfd:scalefree-... (deleted)` for a memfd).
pub fn fd_label(fd: RawFd) -> String {
    std::fs::read_link(format!("/proc/self/fd/{fd}"))
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Inode number and size of the file behind `fd`.
pub fn fd_identity(fd: RawFd) -> Result<(u64, u64)> {
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(Error::last_os("fstat"));
    }
    Ok((st.st_ino as u64, st.st_size as u64))
}

/// Size of the file behind `fd`.
pub fn fd_len(fd: RawFd) -> Result<usize> {
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(Error::last_os("fstat"));
    }
    Ok(st.st_size as usize)
}

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

/// Whether cross-memory attach works towards `pid` (tested with a real one-word read of
/// the peer's `probe_addr`). `SCALEFREE_CMA=0` turns it off for testing the fallback.
pub fn cma_permitted(pid: u32, probe_addr: usize) -> bool {
    if std::env::var("SCALEFREE_CMA").map(|v| v == "0").unwrap_or(false) {
        return false;
    }
    let mut word = 0u64;
    cma_read(pid, probe_addr, &mut word as *mut u64 as *mut u8, 8).is_ok()
}

/// A pidfd: becomes readable when the process exits (works for non-children).
#[derive(Debug)]
pub struct PidWatch {
    pub pid: u32,
    fd: Option<OwnedFd>,
}

impl PidWatch {
    pub fn new(pid: u32) -> Self {
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
        let fd = if fd >= 0 {
            Some(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
        } else {
            None
        };
        PidWatch { pid, fd }
    }

    /// True while the process exists and has not exited (a zombie counts as exited).
    pub fn alive(&self) -> bool {
        match &self.fd {
            Some(fd) => {
                let mut p = libc::pollfd {
                    fd: fd.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                };
                let r = unsafe { libc::poll(&mut p, 1, 0) };
                !(r > 0 && p.revents != 0)
            }
            None => {
                // No pidfd support: fall back to /proc state.
                match std::fs::read_to_string(format!("/proc/{}/stat", self.pid)) {
                    Ok(s) => {
                        let state = s.rsplit(')').next().and_then(|r| r.trim().chars().next());
                        !matches!(state, Some('Z') | Some('X'))
                    }
                    Err(_) => false,
                }
            }
        }
    }
}

/// The shared-memory backend: every peer's region is mapped here (a memfd) or reached by
/// cross-memory attach (ordinary process memory); notifications are stores into the peer's
/// mapped control segment and a futex wake. Copies complete before the call returns.
pub struct Shm;

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

    /// Raises `peer`'s slot in its mapped control segment.
    pub(crate) fn publish(dev: &Device, peer: u32, slot: u32, value: u32) {
        crate::wait::publish(dev.slot_of(peer, slot as usize), dev.waiters_of(peer), value);
    }

    /// Write then note, through memory.
    ///
    /// # Safety
    /// `src..src+n` must be readable.
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn write_then_note(dev: &Device, peer: u32, src: *const u8, remote: &RemoteRegion, off: usize, n: usize, note: Note,
                                         notify: impl FnOnce(u32, u32) -> Result<()>) -> Result<()> {
        match note {
            Note::None => {
                if n > 0 {
                    unsafe { Self::copy_to(dev, peer, src, remote, off, n)? };
                }
                Ok(())
            }
            Note::Slot(slot, value) => {
                if n > 0 {
                    unsafe { Self::copy_to(dev, peer, src, remote, off, n)? };
                }
                notify(slot, value)
            }
            Note::Word(word_off, value) => {
                let Some(base) = remote.mapped_ptr() else {
                    return Err(Error::Unsupported("a raised word needs a mapped region or a keyed one".into()));
                };
                if n > 0 {
                    unsafe { Self::copy_to(dev, peer, src, remote, off, n)? };
                }
                crate::wait::raise(unsafe { &*(base.add(word_off as usize) as *const std::sync::atomic::AtomicU32) }, value);
                Ok(())
            }
            Note::Post(word_off, value) => {
                let p = remote.mapped_ptr().ok_or_else(|| Error::Unsupported("mesh post to a peer whose region is not mapped".into()))?;
                unsafe { crate::mesh::post_mapped(p, off, src, n, word_off as usize, value) };
                Ok(())
            }
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memfd_maps_twice_to_same_memory() {
        let fd = create_memfd("test", 8192).unwrap();
        let a = map_shared(fd.as_raw_fd(), 8192, true).unwrap();
        let b = map_shared(fd.as_raw_fd(), 8192, false).unwrap();
        unsafe { *a.as_ptr().add(4000) = 42 };
        assert_eq!(unsafe { *b.as_ptr().add(4000) }, 42);
        assert!(fd_label(fd.as_raw_fd()).contains("scalefree-test"));
        assert_eq!(fd_len(fd.as_raw_fd()).unwrap(), 8192);
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        assert_eq!(unsafe { libc::fstat(fd.as_raw_fd(), &mut st) }, 0);
        assert_eq!(st.st_mode & 0o777, 0o600);
    }

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

    #[test]
    fn pidwatch_sees_exit() {
        let mut child = std::process::Command::new("sleep").arg("0.1").spawn().unwrap();
        let w = PidWatch::new(child.id());
        assert!(w.alive());
        let _ = child.wait();
        // After reaping the pid may be reused, but the pidfd still reports the exit.
        assert!(!w.alive());
    }
}
