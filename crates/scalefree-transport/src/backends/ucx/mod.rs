//! [`Ucx`]: the [`Backend`] over [`Net`]. Regions that carry a remote key (a peer on another
//! host, or every peer with `SCALEFREE_TRANSPORT=ucx`) are reached through UCX and the TCP
//! lanes; regions mapped here (a peer on this host) through memory, as on [`Shm`].

use std::sync::atomic::AtomicU32;
use std::sync::Arc;
use std::time::Duration;

use super::{Net, Note, RemoteKey, Request, Registration, Window};
use crate::backends::shm::Shm;
use crate::backends::{Backend, DirectLanding};
use crate::device::Device;
use crate::error::Result;
use crate::region::{check_range, RemoteRegion};
use crate::wait::{SpinHook, WaitPolicy};

/// The UCX backend: a rank's UCX endpoints (and TCP lanes) to its peers.
pub struct Ucx {
    pub net: Net,
}

impl Backend for Ucx {
    fn name(&self) -> &'static str {
        "ucx"
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
    fn keyed(&self) -> bool {
        true
    }
    fn drives_progress(&self) -> bool {
        true
    }
    fn progress(&self) {
        self.net.progress();
    }
    fn spin_hook(&self) -> Option<&dyn SpinHook> {
        self.net.spin_hook()
    }
    fn reads_own_from(&self, peer: u32) -> bool {
        self.net.reads_own_from(peer)
    }
    fn wait_reading(
        &self,
        word: &AtomicU32,
        ready: &mut dyn FnMut(u32) -> bool,
        policy: &WaitPolicy,
        what: &dyn Fn() -> String,
        liveness: &dyn Fn() -> Result<()>,
    ) -> Result<u32> {
        self.net.wait_reading(word, ready, policy, what, liveness)
    }
    fn check_alive(&self) -> Result<()> {
        self.net.check_alive()
    }
    fn note_lost(&self, rank: u32, why: String) {
        self.net.note_lost(rank, why)
    }
    fn is_lost(&self, rank: u32) -> bool {
        self.net.is_lost(rank)
    }
    fn register(&self, ptr: *mut u8, len: usize, key: u64) -> Result<Option<Registration>> {
        self.net.register(ptr, len, key).map(Some)
    }
    fn remote_key(&self, peer: u32, addr: u64, packed: &[u8]) -> Result<Arc<RemoteKey>> {
        self.net.remote_key(peer, addr, packed)
    }

    unsafe fn write(&self, dev: &Device, peer: u32, src: *const u8, remote: &RemoteRegion, off: usize, n: usize) -> Result<()> {
        match &remote.rkey {
            Some(rk) => unsafe { self.net.put(src, rk, off, n, dev.policy()) },
            None => unsafe { Shm::copy_to(dev, peer, src, remote, off, n) },
        }
    }
    unsafe fn read(&self, dev: &Device, peer: u32, remote: &RemoteRegion, off: usize, dst: *mut u8, n: usize) -> Result<()> {
        match &remote.rkey {
            Some(rk) => unsafe { self.net.get(rk, off, dst, n, dev.policy()) },
            None => unsafe { Shm::copy_from(dev, peer, remote, off, dst, n) },
        }
    }
    unsafe fn start_write(&self, dev: &Device, peer: u32, src: *const u8, remote: &RemoteRegion, off: usize, n: usize) -> Result<Option<Request>> {
        match &remote.rkey {
            Some(rk) => unsafe { self.net.start_put(src, rk, remote.handle.key, off, n) },
            None => unsafe { Shm::copy_to(dev, peer, src, remote, off, n).map(|()| None) },
        }
    }
    unsafe fn start_read(&self, dev: &Device, peer: u32, remote: &RemoteRegion, off: usize, dst: *mut u8, n: usize) -> Result<Option<Request>> {
        match &remote.rkey {
            Some(rk) => unsafe { self.net.start_get(rk, off, dst, n) },
            None => unsafe { Shm::copy_from(dev, peer, remote, off, dst, n).map(|()| None) },
        }
    }
    fn notify(&self, dev: &Device, peer: u32, slot: u32, value: u32) -> Result<()> {
        if dev.is_local(peer) {
            Shm::publish(dev, peer, slot, value);
            return Ok(());
        }
        self.net.notify(peer, slot, value, dev.policy())
    }
    unsafe fn write_notify(&self, dev: &Device, peer: u32, src: *const u8, remote: &RemoteRegion, off: usize, n: usize, note: Note) -> Result<()> {
        if remote.rkey.is_some() {
            check_range(remote.len(), off, n, "write target")?;
            if let Note::Slot(..) = note {
                return unsafe { self.net.write_notify(peer, src, n, remote.handle.key, off, note, dev.policy()) };
            }
            return match unsafe { self.net.start_write_notify(peer, src, n, remote.handle.key, off, note)? } {
                None => Ok(()),
                Some(r) => self.net.wait_request(&r, dev.policy()),
            };
        }
        unsafe { Shm::write_then_note(dev, peer, src, remote, off, n, note, |slot, value| self.notify(dev, peer, slot, value)) }
    }
    unsafe fn start_write_notify(&self, dev: &Device, peer: u32, src: *const u8, remote: &RemoteRegion, off: usize, n: usize, note: Note) -> Result<Option<Request>> {
        if remote.rkey.is_some() {
            check_range(remote.len(), off, n, "write target")?;
            return unsafe { self.net.start_write_notify(peer, src, n, remote.handle.key, off, note) };
        }
        unsafe { Shm::write_then_note(dev, peer, src, remote, off, n, note, |slot, value| self.notify(dev, peer, slot, value))? };
        Ok(None)
    }
    fn wait_request(&self, req: &Request, policy: &WaitPolicy) -> Result<()> {
        self.net.wait_request(req, policy)
    }
    fn direct_landing(&self) -> Option<&dyn DirectLanding> {
        Some(self)
    }
}

impl DirectLanding for Ucx {
    unsafe fn set(&self, key: u64, windows: &[Window], flag_delta: usize) {
        unsafe { self.net.set_direct(key, windows, flag_delta) }
    }
    fn clear(&self, timeout: Duration) {
        self.net.clear_direct(timeout)
    }
    fn landed_bytes(&self) -> (u64, u64) {
        self.net.direct_landed_bytes()
    }
}
