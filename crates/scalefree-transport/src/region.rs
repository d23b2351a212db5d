//! Registered memory: local regions, their serializable handles, and attached remote regions.

use std::os::fd::OwnedFd;
use std::sync::Arc;

use crate::backends::shm::Mapping;
use crate::error::{Error, Result};

/// How a region's bytes can be reached by a peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum RegionKind {
    /// A memfd mapping: peers map it too and copy with plain loads and stores.
    Shm = 1,
    /// Ordinary process memory: peers reach it by cross-memory attach (one kernel copy).
    Process = 2,
    /// Memory registered with a backend that reaches regions by key (UCX): peers reach it
    /// with one-sided puts and gets.
    Keyed = 3,
    /// A shared-memory file its owner mapped itself (e.g. a torch storage moved to shared
    /// memory): peers on the host map the same file. `key` is the file's inode.
    File = 4,
}

/// What a peer needs to address a region: 48 bytes, see [`RegionHandle::to_bytes`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RegionHandle {
    pub owner: u32,
    pub pid: u32,
    pub kind: RegionKind,
    /// The owner's descriptor number (Shm), for attaching through `/proc`.
    pub fd: i32,
    /// The address in the owner's address space.
    pub addr: u64,
    pub len: u64,
    /// A random identity, checked on attach and used as a cache key.
    pub key: u64,
}

impl RegionHandle {
    pub const BYTES: usize = 40;

    pub fn to_bytes(&self) -> [u8; Self::BYTES] {
        let mut b = [0u8; Self::BYTES];
        b[0..4].copy_from_slice(&self.owner.to_le_bytes());
        b[4..8].copy_from_slice(&self.pid.to_le_bytes());
        b[8..12].copy_from_slice(&(self.kind as u32).to_le_bytes());
        b[12..16].copy_from_slice(&self.fd.to_le_bytes());
        b[16..24].copy_from_slice(&self.addr.to_le_bytes());
        b[24..32].copy_from_slice(&self.len.to_le_bytes());
        b[32..40].copy_from_slice(&self.key.to_le_bytes());
        b
    }

    pub fn from_bytes(b: &[u8]) -> Result<Self> {
        if b.len() != Self::BYTES {
            return Err(Error::InvalidArgument(format!(
                "a region handle is {} bytes, got {}",
                Self::BYTES,
                b.len()
            )));
        }
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap());
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap());
        let kind = match u32_at(8) {
            1 => RegionKind::Shm,
            2 => RegionKind::Process,
            3 => RegionKind::Keyed,
            4 => RegionKind::File,
            k => return Err(Error::InvalidArgument(format!("unknown region kind {k} in handle"))),
        };
        Ok(RegionHandle {
            owner: u32_at(0),
            pid: u32_at(4),
            kind,
            fd: u32_at(12) as i32,
            addr: u64_at(16),
            len: u64_at(24),
            key: u64_at(32),
        })
    }
}

pub(crate) enum Backing {
    Shm { map: Mapping, _fd: OwnedFd },
    /// Caller-owned memory registered for the lifetime of the region.
    Process { ptr: *mut u8 },
    /// Caller-owned shared mapping of a file (a duplicate of its descriptor kept here).
    File { ptr: *mut u8, _fd: OwnedFd },
}

pub(crate) struct RegionInner {
    /// The backend's registration, when it reaches memory by key (dropped before the memory it covers).
    pub(crate) reg: Option<crate::backends::Registration>,
    pub(crate) backing: Backing,
    pub(crate) handle: RegionHandle,
}

unsafe impl Send for RegionInner {}
unsafe impl Sync for RegionInner {}

/// Local registered memory that peers can address through its [`RegionHandle`].
/// Cloning is cheap (shared ownership); the memory lives until the last clone drops.
#[derive(Clone)]
pub struct Region {
    pub(crate) inner: Arc<RegionInner>,
}

impl std::fmt::Debug for Region {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Region({:?}, {} bytes)", self.inner.handle.kind, self.len())
    }
}

impl Region {
    pub fn handle(&self) -> RegionHandle {
        self.inner.handle
    }
    /// The handle as bytes for a peer's [`crate::Device::attach_serialized`]: the 40-byte
    /// [`RegionHandle`], followed by the packed UCX remote key when the region is registered
    /// with UCX (peers on other hosts need it to write and read).
    pub fn serialized(&self) -> Vec<u8> {
        let mut b = self.inner.handle.to_bytes().to_vec();
        if let Some(reg) = &self.inner.reg {
            b.extend_from_slice(&reg.packed_key);
        }
        b
    }
    pub fn len(&self) -> usize {
        self.inner.handle.len as usize
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The memfd behind a shared-memory region.
    pub fn fd(&self) -> Option<std::os::fd::RawFd> {
        use std::os::fd::AsRawFd;
        match &self.inner.backing {
            Backing::Shm { _fd, .. } | Backing::File { _fd, .. } => Some(_fd.as_raw_fd()),
            Backing::Process { .. } => None,
        }
    }
    pub fn as_ptr(&self) -> *mut u8 {
        match &self.inner.backing {
            Backing::Shm { map, .. } => map.as_ptr(),
            Backing::Process { ptr, .. } | Backing::File { ptr, .. } => *ptr,
        }
    }
    /// The bytes, for reading. Peers may write concurrently: synchronise with notifications.
    ///
    /// # Safety
    /// No one may write the returned range while the slice is alive.
    pub unsafe fn as_slice(&self) -> &[u8] {
        unsafe { std::slice::from_raw_parts(self.as_ptr(), self.len()) }
    }
    pub(crate) fn check_range(&self, off: usize, n: usize, what: &str) -> Result<()> {
        check_range(self.len(), off, n, what)
    }
}

pub(crate) fn check_range(len: usize, off: usize, n: usize, what: &str) -> Result<()> {
    if off.checked_add(n).is_none_or(|end| end > len) {
        return Err(Error::InvalidArgument(format!(
            "{what}: bytes [{off}, {off}+{n}) are outside a region of {len} bytes"
        )));
    }
    Ok(())
}

/// A peer's region as seen from here: mapped when it is shared memory.
#[derive(Clone)]
pub struct RemoteRegion {
    pub handle: RegionHandle,
    pub(crate) map: Option<Arc<Mapping>>,
    /// The unpacked remote key, for a peer's region reached by key (over the network).
    pub(crate) rkey: Option<Arc<crate::backends::RemoteKey>>,
}

impl std::fmt::Debug for RemoteRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RemoteRegion(rank {}, {:?}, {} bytes)", self.handle.owner, self.handle.kind, self.handle.len)
    }
}

impl RemoteRegion {
    pub fn len(&self) -> usize {
        self.handle.len as usize
    }
    pub fn is_empty(&self) -> bool {
        self.handle.len == 0
    }
    pub fn owner(&self) -> u32 {
        self.handle.owner
    }
    /// The peer's bytes mapped here, when they are shared memory (loads and stores work).
    pub fn mapped_ptr(&self) -> Option<*mut u8> {
        self.map.as_ref().map(|m| m.as_ptr())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handle_round_trips() {
        let h = RegionHandle { owner: 3, pid: 1234, kind: RegionKind::Shm, fd: 17, addr: 0xdead_beef, len: 1 << 40, key: 99 };
        assert_eq!(RegionHandle::from_bytes(&h.to_bytes()).unwrap(), h);
        let f = RegionHandle { kind: RegionKind::File, ..h };
        assert_eq!(RegionHandle::from_bytes(&f.to_bytes()).unwrap(), f);
        assert!(RegionHandle::from_bytes(&[0u8; 3]).is_err());
    }

    #[test]
    fn range_checks() {
        assert!(check_range(10, 0, 10, "x").is_ok());
        assert!(check_range(10, 5, 6, "x").is_err());
        assert!(check_range(10, usize::MAX, 2, "x").is_err());
        assert!(check_range(0, 0, 0, "x").is_ok());
    }
}
