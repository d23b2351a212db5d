//! A device's regions: memory allocated or registered here (and made reachable by the
//! backend, by key where it needs one), peers' regions attached here (mapped on this host,
//! by key elsewhere), and the collective exchange of regions between ranks.

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::{random_u64, Device};
use crate::backends::shm;
use crate::error::{Error, Result};
use crate::region::{Backing, Region, RegionHandle, RegionInner, RegionKind, RemoteRegion};

impl Device {
    /// Allocates `nbytes` of shared memory (pre-faulted) that peers can map.
    pub fn alloc_region(&self, nbytes: usize) -> Result<Region> {
        self.make_region(nbytes, false)
    }

    /// Allocates a large sparse region for an [`crate::Arena`]: address space only, pages
    /// are backed when first touched.
    pub fn alloc_arena_region(&self, nbytes: usize) -> Result<Region> {
        self.make_region(nbytes, true)
    }

    fn make_region(&self, nbytes: usize, sparse: bool) -> Result<Region> {
        let key = self.inner.next_key.fetch_add(2, Ordering::Relaxed) ^ random_u64().rotate_left(17);
        let fd = shm::create_memfd(&format!("r{}-{key:016x}", self.rank()), nbytes)?;
        let mut map = if sparse { shm::map_sparse(fd.as_raw_fd(), nbytes)? } else { shm::map_shared(fd.as_raw_fd(), nbytes, true)? };
        let reg = self.inner.backend.register(map.as_ptr(), nbytes, key)?;
        if reg.is_some() {
            // Peers on other hosts may write it with UCX: see `Mapping::hold_address`.
            map.hold_address();
        }
        let handle = RegionHandle {
            owner: self.rank(),
            pid: std::process::id(),
            kind: if reg.is_some() { RegionKind::Keyed } else { RegionKind::Shm },
            fd: fd.as_raw_fd(),
            addr: map.as_ptr() as u64,
            len: nbytes as u64,
            key,
        };
        let inner = Arc::new(RegionInner { reg, backing: Backing::Shm { map, _fd: fd }, handle });
        let mut regs = self.inner.local_regions.lock().unwrap();
        regs.retain(|(_, _, w)| w.strong_count() > 0);
        regs.push((handle.addr as usize, nbytes, Arc::downgrade(&inner)));
        Ok(Region { inner })
    }

    /// The shared-memory region allocated here that contains `ptr..ptr+len`, and the
    /// offset of `ptr` in it. Lets collectives use a registered buffer without copies.
    pub fn find_region(&self, ptr: *const u8, len: usize) -> Option<(Region, usize)> {
        let p = ptr as usize;
        let regs = self.inner.local_regions.lock().unwrap();
        for (addr, n, w) in regs.iter() {
            if p >= *addr && p + len <= addr + n {
                if let Some(inner) = w.upgrade() {
                    return Some((Region { inner }, p - addr));
                }
            }
        }
        None
    }

    /// Registers ordinary memory so peers can read and write it by cross-memory attach.
    ///
    /// # Safety
    /// `ptr..ptr+len` must stay valid while the region (or a peer's use of its handle) lives.
    pub unsafe fn register(&self, ptr: *mut u8, len: usize) -> Result<Region> {
        let mut handle = self.process_handle(ptr, len);
        let reg = if self.inner.backend.keyed() {
            handle.key = self.inner.next_key.fetch_add(2, Ordering::Relaxed) ^ random_u64().rotate_left(17);
            handle.kind = RegionKind::Keyed;
            self.inner.backend.register(ptr, len, handle.key)?
        } else {
            None
        };
        Ok(Region { inner: Arc::new(RegionInner { reg, backing: Backing::Process { ptr }, handle }) })
    }

    /// Registers memory that is already a shared mapping, at `ptr`, of the first `len`
    /// bytes of the file open as `fd` (a shared-memory file, e.g. a torch storage after
    /// `share_memory_()`). Peers on this host map the same file, so collectives on buffers
    /// inside it read and write them with plain loads and stores. The descriptor is
    /// duplicated; the mapping itself stays the caller's.
    ///
    /// # Safety
    /// `ptr..ptr+len` must stay mapped to that file while the region lives.
    pub unsafe fn register_shared(&self, ptr: *mut u8, len: usize, fd: std::os::fd::RawFd) -> Result<Region> {
        if self.inner.backend.keyed() {
            return Err(Error::Unsupported("register_shared is for shared memory on one host".into()));
        }
        let dup = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
        if dup < 0 {
            return Err(Error::last_os(format!("dup(fd {fd})")));
        }
        let dup = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(dup) };
        let (ino, size) = shm::fd_identity(dup.as_raw_fd())?;
        if size < len as u64 {
            return Err(Error::InvalidArgument(format!("register_shared: the file holds {size} bytes, fewer than {len}")));
        }
        let handle = RegionHandle {
            owner: self.rank(),
            pid: std::process::id(),
            kind: RegionKind::File,
            fd: dup.as_raw_fd(),
            addr: ptr as u64,
            len: len as u64,
            key: ino,
        };
        let inner = Arc::new(RegionInner { reg: None, backing: Backing::File { ptr, _fd: dup }, handle });
        let mut regs = self.inner.local_regions.lock().unwrap();
        regs.retain(|(_, _, w)| w.strong_count() > 0);
        regs.push((ptr as usize, len, Arc::downgrade(&inner)));
        Ok(Region { inner })
    }

    /// A peer's `RegionKind::File` region, mapped once: the mapping stays cached while unused
    /// (up to `FILE_CACHE_BYTES` of unused ones), so a buffer used every step maps once.
    fn attach_file(&self, handle: &RegionHandle) -> Result<RemoteRegion> {
        /// Unused mappings of peers' files kept at most (they keep the peer's memory alive).
        const FILE_CACHE_BYTES: usize = 1 << 30;
        let k = (handle.owner, handle.key);
        let mut cache = self.inner.attached_files.lock().unwrap();
        if let Some(m) = cache.get(&k) {
            if m.len() as u64 >= handle.len {
                return Ok(RemoteRegion { handle: *handle, map: Some(m.clone()), rkey: None });
            }
        }
        let gone = || Error::InvalidArgument(format!("rank {} no longer has that region (freed?)", handle.owner));
        let fd = shm::open_peer_fd(handle.pid, handle.fd).map_err(|e| match e {
            Error::Io { source, .. } if source.raw_os_error() == Some(libc::ENOENT) => gone(),
            e => e,
        })?;
        let (ino, size) = shm::fd_identity(fd.as_raw_fd())?;
        if ino != handle.key || size < handle.len {
            return Err(gone());
        }
        let m = Arc::new(shm::map_shared(fd.as_raw_fd(), handle.len as usize, false)?);
        let unused: usize = cache.values().filter(|v| Arc::strong_count(v) == 1).map(|v| v.len()).sum();
        if unused + m.len() > FILE_CACHE_BYTES {
            cache.retain(|_, v| Arc::strong_count(v) > 1);
        }
        cache.insert(k, m.clone());
        Ok(RemoteRegion { handle: *handle, map: Some(m), rkey: None })
    }

    /// The handle of ordinary memory of this process, reachable by cross-memory attach.
    pub fn process_handle(&self, ptr: *const u8, len: usize) -> RegionHandle {
        RegionHandle {
            owner: self.rank(),
            pid: std::process::id(),
            kind: RegionKind::Process,
            fd: -1,
            addr: ptr as u64,
            len: len as u64,
            key: 0,
        }
    }

    /// Makes a peer's region addressable here. Shared-memory regions are mapped (and the
    /// mapping cached); process memory needs cross-memory attach to that peer.
    pub fn attach(&self, handle: &RegionHandle) -> Result<RemoteRegion> {
        let owner = handle.owner;
        if owner >= self.size() {
            return Err(Error::InvalidArgument(format!("handle names rank {owner} of a job of {}", self.size())));
        }
        let peer = &self.inner.peers[owner as usize];
        if handle.pid != peer.pid {
            return Err(Error::InvalidArgument(format!(
                "handle names pid {} but rank {owner} is pid {}", handle.pid, peer.pid
            )));
        }
        match handle.kind {
            RegionKind::Keyed if self.is_local(owner) && owner != self.rank() && handle.fd >= 0 => {
                if let Some(m) = self.inner.attached.lock().unwrap().get(&(owner, handle.key)) {
                    return Ok(RemoteRegion { handle: *handle, map: Some(m.clone()), rkey: None });
                }
                let fd = shm::open_peer_fd(handle.pid, handle.fd)?;
                self.map_checked(handle, fd)
            }
            RegionKind::Keyed => {
                let known = self.inner.rkeys.lock().unwrap().get(&(owner, handle.key)).and_then(|w| w.upgrade());
                match known {
                    Some(rk) => Ok(RemoteRegion { handle: *handle, map: None, rkey: Some(rk) }),
                    None => Err(Error::Unsupported(format!(
                        "rank {owner}'s {name} region {:016x} is not known here: pass {name} regions through exchange_regions", handle.key,
                        name = self.transport_name().to_ascii_uppercase()
                    ))),
                }
            }
            RegionKind::File => self.attach_file(handle),
            RegionKind::Process => {
                if !peer.cma {
                    return Err(Error::Unsupported(format!(
                        "cross-memory attach to rank {owner} is not permitted; use a region from alloc_region"
                    )));
                }
                Ok(RemoteRegion { handle: *handle, map: None, rkey: None })
            }
            RegionKind::Shm => {
                let k = (owner, handle.key);
                if let Some(m) = self.inner.attached.lock().unwrap().get(&k) {
                    if m.len() as u64 == handle.len {
                        return Ok(RemoteRegion { handle: *handle, map: Some(m.clone()), rkey: None });
                    }
                }
                let fd = shm::open_peer_fd(handle.pid, handle.fd).map_err(|e| match e {
                    Error::Io { source, .. } if source.raw_os_error() == Some(libc::ENOENT) => Error::InvalidArgument(
                        format!("rank {owner} no longer has that region (freed?)"),
                    ),
                    e => e,
                })?;
                self.map_checked(handle, fd)
            }
        }
    }

    /// [`Device::attach`] from [`Region::serialized`] bytes (which carry the packed key of a
    /// keyed region on another host).
    pub fn attach_serialized(&self, bytes: &[u8]) -> Result<RemoteRegion> {
        if bytes.len() < RegionHandle::BYTES {
            return Err(Error::InvalidArgument(format!(
                "a region handle is at least {} bytes, got {}", RegionHandle::BYTES, bytes.len()
            )));
        }
        let h = RegionHandle::from_bytes(&bytes[..RegionHandle::BYTES])?;
        let rkey = &bytes[RegionHandle::BYTES..];
        if let (true, RegionKind::Keyed) = (self.inner.backend.keyed(), h.kind) {
            if h.owner < self.size() && !self.is_local(h.owner) {
                if h.pid != self.pid_of(h.owner) && self.pid_of(h.owner) != 0 {
                    return Err(Error::InvalidArgument(format!(
                        "handle names pid {} but rank {} is pid {}", h.pid, h.owner, self.pid_of(h.owner)
                    )));
                }
                if rkey.is_empty() {
                    return self.attach(&h);
                }
                let rk = self.inner.backend.remote_key(h.owner, h.addr, rkey)?;
                let mut cache = self.inner.rkeys.lock().unwrap();
                cache.retain(|_, w| w.strong_count() > 0);
                cache.insert((h.owner, h.key), Arc::downgrade(&rk));
                return Ok(RemoteRegion { handle: h, map: None, rkey: Some(rk) });
            }
        }
        self.attach(&h)
    }

    fn map_checked(&self, handle: &RegionHandle, fd: OwnedFd) -> Result<RemoteRegion> {
        let label = shm::fd_label(fd.as_raw_fd());
        if !label.contains(&format!("{:016x}", handle.key)) {
            return Err(Error::InvalidArgument(format!(
                "rank {} no longer has that region (descriptor now points at {label:?})", handle.owner
            )));
        }
        let m = Arc::new(shm::map_shared(fd.as_raw_fd(), handle.len as usize, false)?);
        let mut cache = self.inner.attached.lock().unwrap();
        cache.retain(|_, v| Arc::strong_count(v) > 1);
        cache.insert((handle.owner, handle.key), m.clone());
        Ok(RemoteRegion { handle: *handle, map: Some(m), rkey: None })
    }

    /// Collective: every rank passes one of its regions and gets every rank's, attached.
    /// Descriptors travel over the bootstrap socket, so this works without `/proc` access.
    pub fn exchange_regions(&self, region: &Region) -> Result<Vec<RemoteRegion>> {
        let h = region.handle();
        if self.inner.backend.keyed() {
            // Handle and packed remote key travel together.
            let Some(reg) = &region.inner.reg else {
                return Err(Error::InvalidArgument("exchange_regions needs a region of this device".into()));
            };
            let mut bytes = h.to_bytes().to_vec();
            bytes.extend_from_slice(&reg.packed_key);
            let fd = match &region.inner.backing {
                Backing::Shm { _fd, .. } | Backing::File { _fd, .. } => Some(_fd.as_raw_fd()),
                Backing::Process { .. } => None,
            };
            let items = self.inner.rendezvous.lock().unwrap().exchange(&bytes, fd)?;
            let mut out = Vec::with_capacity(items.len());
            for it in items {
                let b = &it.bytes;
                if b.len() < RegionHandle::BYTES {
                    return Err(Error::Bootstrap("a rank sent a short region handle".into()));
                }
                let ph = RegionHandle::from_bytes(&b[..RegionHandle::BYTES])?;
                if ph.owner != self.rank() && self.is_local(ph.owner) && ph.fd >= 0 {
                    // A peer of this host: map its memfd (passed, else through /proc).
                    let fd = match it.fd {
                        Some(fd) => fd,
                        None => shm::open_peer_fd(ph.pid, ph.fd)?,
                    };
                    let m = Arc::new(shm::map_sparse(fd.as_raw_fd(), ph.len as usize)?);
                    self.inner.attached.lock().unwrap().insert((ph.owner, ph.key), m.clone());
                    out.push(RemoteRegion { handle: ph, map: Some(m), rkey: None });
                    continue;
                }
                let rk = self.inner.backend.remote_key(ph.owner, ph.addr, &b[RegionHandle::BYTES..])?;
                let mut cache = self.inner.rkeys.lock().unwrap();
                cache.retain(|_, w| w.strong_count() > 0);
                cache.insert((ph.owner, ph.key), Arc::downgrade(&rk));
                out.push(RemoteRegion { handle: ph, map: None, rkey: Some(rk) });
            }
            return Ok(out);
        }
        let fd = match &region.inner.backing {
            Backing::Shm { _fd, .. } | Backing::File { _fd, .. } => Some(_fd.as_raw_fd()),
            Backing::Process { .. } => None,
        };
        let items = self.inner.rendezvous.lock().unwrap().exchange(&h.to_bytes(), fd)?;
        let mut out = Vec::with_capacity(items.len());
        for it in items {
            let h = RegionHandle::from_bytes(&it.bytes)?;
            match (h.kind, it.fd) {
                (RegionKind::Shm, Some(fd)) => {
                    let m = Arc::new(shm::map_sparse(fd.as_raw_fd(), h.len as usize)?);
                    // Later `attach` calls for this region find the mapping here.
                    self.inner.attached.lock().unwrap().insert((h.owner, h.key), m.clone());
                    out.push(RemoteRegion { handle: h, map: Some(m), rkey: None });
                }
                _ => out.push(self.attach(&h)?),
            }
        }
        Ok(out)
    }

    /// Collective: creates this rank's registered arena and maps every peer's, so buffers
    /// allocated from it are addressable by all ranks without copies. Keep the returned
    /// remote regions alive as long as peers' arena buffers may be used. Over UCX the arena
    /// is registered like any region (`ucp_mem_map` of its address space): peers on this host
    /// map it, peers on other hosts reach it by its remote key.
    pub fn create_arena(&self, opts: &crate::arena::ArenaOptions) -> Result<(Arc<crate::arena::Arena>, Vec<RemoteRegion>)> {
        // Every rank learns whether every rank could reserve its arena, so that a failure on
        // one (e.g. an address-space limit) is the same error everywhere instead of a hang.
        let mine = self.alloc_arena_region(opts.capacity_bytes);
        let status = self.exchange_bytes(&[mine.is_ok() as u8])?;
        let region = match mine {
            Ok(r) => r,
            Err(e) => return Err(Error::Unsupported(format!("no arena of {} bytes on rank {}: {e}", opts.capacity_bytes, self.rank()))),
        };
        if let Some(r) = status.iter().position(|s| s.first() != Some(&1)) {
            return Err(Error::Unsupported(format!("rank {r} could not reserve its arena")));
        }
        let peers = self.exchange_regions(&region)?;
        Ok((Arc::new(crate::arena::Arena::new(region, opts)), peers))
    }
}
