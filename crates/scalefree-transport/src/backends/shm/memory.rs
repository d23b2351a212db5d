//! Memory of the shared-memory backend: a region is an anonymous `memfd` (mode 0600, no
//! name in any filesystem), mapped by its owner and by every peer on the host (through a
//! descriptor passed over the bootstrap socket, or opened via `/proc/<pid>/fd/<n>`).

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::ptr::NonNull;

use crate::error::{Error, Result};

/// A shared mapping of a memfd. Unmapped on drop (see [`Mapping::hold_address`]).
#[derive(Debug)]
pub struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
    hold: bool,
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
    /// On drop, keeps the address range for a while instead of unmapping it: for a region
    /// peers on other hosts write with UCX. UCX's software RMA (the tcp transport, and any
    /// transport without hardware RMA) lands a put in the target's progress thread at the raw
    /// address, checking no registration; a put still on its way when the region is dropped
    /// (its origin had not flushed before the step that let this rank drop it) would write
    /// into unmapped memory (SIGSEGV) or into whatever is mapped there next. The range is
    /// replaced by private zero pages at once (the region's memory is freed; a late put
    /// lands in pages nobody reads), and unmapped by the first such drop at least
    /// [`HOLD_PEER_TIMEOUTS`] peer timeouts later (see [`retire`]).
    pub fn hold_address(&mut self) {
        self.hold = true;
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        if self.len > 0 && !(self.hold && retire(self.ptr.as_ptr(), self.len)) {
            unsafe { libc::munmap(self.ptr.as_ptr() as *mut libc::c_void, self.len) };
        }
    }
}

/// How many peer timeouts a dropped region's address range stays reserved
/// ([`Mapping::hold_address`]). A software put is delivered within a round trip unless the
/// network between the hosts stalls, and a stall of a peer timeout has the peer declared lost
/// (its heartbeats, at least one a second, stop arriving) and its endpoint closed; twice the
/// peer timeout leaves every put in flight at the drop time a margin to land or be dropped.
/// (An argument, not a test: a late put cannot be made to arrive on demand.)
pub const HOLD_PEER_TIMEOUTS: u32 = 2;

/// Ranges of dropped regions still held, with when they were dropped.
static HELD: std::sync::Mutex<Vec<(usize, usize, std::time::Instant)>> = std::sync::Mutex::new(Vec::new());

/// Replaces `len` bytes at `ptr` (a whole mapping) with private zero pages that reserve no
/// swap, held until [`HOLD_PEER_TIMEOUTS`] peer timeouts have passed (ranges held longer
/// are unmapped now). False (nothing done) when the kernel refuses: the caller unmaps.
fn retire(ptr: *mut u8, len: usize) -> bool {
    let hold = crate::wait::peer_timeout_from_env() * HOLD_PEER_TIMEOUTS;
    let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED | libc::MAP_NORESERVE;
    let p = unsafe { libc::mmap(ptr as *mut libc::c_void, len, libc::PROT_READ | libc::PROT_WRITE, flags, -1, 0) };
    if p == libc::MAP_FAILED {
        return false;
    }
    let now = std::time::Instant::now();
    let mut held = HELD.lock().unwrap_or_else(|e| e.into_inner());
    held.retain(|&(a, n, t)| {
        let keep = now.duration_since(t) < hold;
        if !keep {
            unsafe { libc::munmap(a as *mut libc::c_void, n) };
        }
        keep
    });
    held.push((ptr as usize, len, now));
    true
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
            hold: false,
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
        hold: false,
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
}
