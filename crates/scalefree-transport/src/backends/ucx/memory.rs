//! Memory of the UCX backend: a region is a local memfd mapping registered with
//! `ucp_mem_map`; its packed remote key travels beside the handle, and a peer's unpacked key
//! is what puts and gets name.

use std::ffi::c_void;
use std::sync::Arc;

use super::ffi::*;
use super::net::{Net, Shared};
use crate::backends::{Registration, RemoteKey};
use crate::error::Result;

/// This backend's hold on a registered region: unregistered on drop.
pub(super) struct Registered {
    pub(super) shared: Arc<Shared>,
    pub(super) memh: ucp_mem_h,
    pub(super) key: u64,
}
unsafe impl Send for Registered {}
unsafe impl Sync for Registered {}

impl Drop for Registered {
    fn drop(&mut self) {
        self.shared.regions.lock().unwrap().remove(&self.key);
        unsafe { (self.shared.ucp.mem_unmap)(self.shared.ctx, self.memh) };
    }
}

/// A peer's region key unpacked here; destroyed on drop.
pub(super) struct Unpacked {
    pub(super) shared: Arc<Shared>,
    pub(super) rkey: ucp_rkey_h,
}
unsafe impl Send for Unpacked {}
unsafe impl Sync for Unpacked {}

impl Drop for Unpacked {
    fn drop(&mut self) {
        unsafe { (self.shared.ucp.rkey_destroy)(self.rkey) };
    }
}

/// The unpacked UCX key of `remote` (one this backend made: [`Net::remote_key`]).
pub(super) fn rkey_of(remote: &RemoteKey) -> ucp_rkey_h {
    remote.unpacked.downcast_ref::<Unpacked>().expect("a remote key of the UCX backend").rkey
}

pub(super) struct LocalReg {
    addr: usize,
    len: usize,
}

impl Shared {
    /// Where `len` bytes at `offset` of this rank's region `key` go: (address, region
    /// address, region length); `None` when the region is gone or too short.
    pub(super) fn region_target(&self, key: u64, offset: usize, len: usize) -> Option<(usize, usize, usize)> {
        let regs = self.regions.lock().unwrap();
        regs.get(&key).and_then(|r| {
            let end = offset.checked_add(len)?;
            (end <= r.len).then_some((r.addr + offset, r.addr, r.len))
        })
    }
}

impl Net {
    /// Registers `len` bytes at `addr` (a region's mapping) under `key`.
    pub fn register(&self, addr: *mut u8, len: usize, key: u64) -> Result<Registration> {
        let u = self.shared.ucp;
        let mut mp: ucp_mem_map_params_t = unsafe { std::mem::zeroed() };
        mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
        mp.address = addr as *mut c_void;
        mp.length = len.max(1);
        let mut memh: ucp_mem_h = std::ptr::null_mut();
        u.check(unsafe { (u.mem_map)(self.shared.ctx, &mp, &mut memh) }, "ucp_mem_map")?;
        let mut buf: *mut c_void = std::ptr::null_mut();
        let mut n = 0usize;
        if let Err(e) = u.check(unsafe { (u.rkey_pack)(self.shared.ctx, memh, &mut buf, &mut n) }, "ucp_rkey_pack") {
            unsafe { (u.mem_unmap)(self.shared.ctx, memh) };
            return Err(e);
        }
        let rkey = unsafe { std::slice::from_raw_parts(buf as *const u8, n) }.to_vec();
        unsafe { (u.rkey_buffer_release)(buf) };
        self.shared.regions.lock().unwrap().insert(key, LocalReg { addr: addr as usize, len });
        Ok(Registration { packed_key: rkey, _hold: Box::new(Registered { shared: self.shared.clone(), memh, key }) })
    }

    /// Unpacks a peer's packed remote key for its region at `addr`.
    pub fn remote_key(&self, peer: u32, addr: u64, packed: &[u8]) -> Result<Arc<RemoteKey>> {
        if self.shared.eps.get().and_then(|v| v.get(peer as usize)).is_some_and(|e| e.is_null())
            && self.lanes.as_ref().is_some_and(|l| l.sealed() && l.has(peer))
        {
            // A peer reached over its sealed lane only: its regions are named by key and
            // offset in the lane's frames, no UCX key to unpack.
            return Ok(Arc::new(RemoteKey { peer, addr, unpacked: Box::new(()) }));
        }
        let u = self.shared.ucp;
        let mut rkey: ucp_rkey_h = std::ptr::null_mut();
        let ep = self.ep(peer)?;
        u.check(unsafe { (u.ep_rkey_unpack)(ep, packed.as_ptr() as *const c_void, &mut rkey) }, &format!("ucp_ep_rkey_unpack (rank {peer})"))?;
        Ok(Arc::new(RemoteKey { peer, addr, unpacked: Box::new(Unpacked { shared: self.shared.clone(), rkey }) }))
    }
}
