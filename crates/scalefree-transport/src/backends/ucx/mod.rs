//! UCX backend: ranks on different hosts (or any ranks, with `SCALEFREE_TRANSPORT=ucx`).
//!
//! The same pieces as the shared-memory backend, a file each:
//! * `memory.rs`: a region is a local memfd mapping registered with `ucp_mem_map`; its packed
//!   remote key travels beside the handle;
//! * `copies.rs`: `write` is `ucp_put_nbx`, `read` is `ucp_get_nbx`; `write_notify` sends the
//!   data and the notification as one active message (eager, or rendezvous into the region
//!   for large data), whose handler publishes the notification only once the data has landed;
//! * `notify.rs`: an active message whose handler stores the value in the target's
//!   notification slot and wakes a parked waiter; `notify` after `write` flushes the endpoint
//!   first (remote completion of the put), so the data is in place before the notification
//!   is seen: ordering by flush;
//! * `progress.rs`: a caller spins briefly calling `ucp_worker_progress`, then parks on the
//!   same futex words as the shared-memory backend; a progress thread sleeps on the worker's
//!   event file descriptor (`ucp_worker_arm` + `poll`) and runs the handlers when traffic
//!   arrives, so nobody busy-polls the network without bound;
//! * `peers.rs`: endpoint errors, heartbeats, and losses told to every peer.
//!
//! `net.rs` holds the endpoint set ([`Net`]) and its set-up; bulk writes to peers that UCX
//! reaches only over TCP go over [`crate::backends::lanes`]. Peers on this host are reached
//! through mapped memory, as on [`Shm`].

/// An active-message handler that reads only the message header: `$body` gets the device's
/// An active-message handler that reads only the message header: `$body` gets the device's
/// shared state and the header bytes, and the generated callback returns `UCS_OK`.
macro_rules! header_handler {
    ($name:ident, |$sh:ident, $h:ident| $body:block) => {
        pub(super) unsafe extern "C" fn $name(
            arg: *mut c_void,
            header: *const c_void,
            hlen: usize,
            _data: *mut c_void,
            _len: usize,
            _param: *const ucp_am_recv_param_t,
        ) -> ucs_status_t {
            let $sh = unsafe { &*(arg as *const Shared) };
            let $h: &[u8] = if hlen == 0 { &[] } else { unsafe { std::slice::from_raw_parts(header as *const u8, hlen) } };
            $body
            UCS_OK
        }
    };
}

mod copies;
pub mod ffi;
mod memory;
mod net;
mod notify;
mod peers;
mod progress;

pub use net::{Exchange, Net};

use std::sync::atomic::AtomicU32;
use std::sync::Arc;
use std::time::Duration;

use crate::backends::lanes;
use crate::backends::shm::Shm;
use crate::backends::{Backend, DirectLanding, Note, Registration, RemoteKey, Request, Setup, Window};
use crate::device::Device;
use crate::error::Result;
use crate::region::{check_range, RemoteRegion};
use crate::wait::{SpinHook, WaitPolicy};

/// What UCX was found and what it offers, for `scalefree info` and error messages.
pub fn describe() -> Result<String> {
    let u = ffi::ucp()?;
    Ok(format!("UCX {}.{}.{} ({})", u.version.0, u.version.1, u.version.2, u.path))
}

/// Collective: the UCX backend of a job that spans hosts (or of every job, with
/// `SCALEFREE_TRANSPORT=ucx`). Peers on other hosts over UCX, peers on this host over shared
/// memory (every peer over UCX with `Transport::Ucx`, which gives every rank a host of its
/// own); remote peers' notifications arrive as active messages in this rank's slots.
/// Regions are memfds registered with UCX, so either kind of peer can reach them.
///
/// # Safety
/// `setup`'s slot and waiter words must stay valid while the backend lives.
pub(crate) unsafe fn open(setup: Setup<'_>) -> Result<Box<dyn Backend>> {
    let Setup { job, rendezvous: rv, hosts, slots, nslots, waiters, connect_timeout } = setup;
    let me = job.rank;
    // The interface between hosts: the user's choice (checked before UCX sees it), else
    // the one this rank reached the rendezvous through.
    let ip = match crate::config::ifname() {
        Some(name) => crate::config::interface_ip(&name)?,
        None => rv.local_ip().unwrap_or(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST)),
    };
    let remote: Vec<bool> = (0..job.size as usize).map(|r| hosts[r] != hosts[me as usize]).collect();
    // Sealed (SCALEFREE_ENCRYPT=1): peers on other hosts over their sealed lane only, no UCX.
    let reach: Vec<bool> = remote.iter().map(|&far| !(far && job.sealed)).collect();
    // Peers on other hosts reached over UCX are watched with heartbeats from the wire-up on:
    // a host cut off during set-up is lost after SCALEFREE_PEER_TIMEOUT, like later.
    let beat: Vec<bool> = (0..job.size as usize).map(|r| remote[r] && reach[r]).collect();
    let mut net = unsafe {
        Net::new(me, job.size, slots, nslots, waiters, &reach, &beat, &mut |b| {
            Ok(rv.exchange(b, None)?.into_iter().map(|i| i.bytes).collect())
        })?
    };
    // Set-up waits for the lanes watch the rendezvous' connections: a host cut off fails its
    // own within SCALEFREE_PEER_TIMEOUT at rank 0, whose end closes every rank's.
    let watch = rv.watcher()?;
    let alive: lanes::Alive = Arc::new(move || watch.check());
    net.open_lanes(ip, &remote, &job.token, &job.job_id, job.sealed, connect_timeout, alive, &mut |b| {
        Ok(rv.exchange(b, None)?.into_iter().map(|i| i.bytes).collect())
    })?;
    // Peers on other hosts are watched with heartbeats; this host's by their process ids.
    net.watch(remote);
    Ok(Box::new(Ucx { net }))
}

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
            Some(rk) => unsafe { self.net.put(src, rk, remote.handle.key, off, n, dev.policy()) },
            None => unsafe { Shm::copy_to(dev, peer, src, remote, off, n) },
        }
    }
    unsafe fn read(&self, dev: &Device, peer: u32, remote: &RemoteRegion, off: usize, dst: *mut u8, n: usize) -> Result<()> {
        match &remote.rkey {
            Some(rk) => unsafe { self.net.get(rk, remote.handle.key, off, dst, n, dev.policy()) },
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
            Some(rk) => unsafe { self.net.start_get(rk, remote.handle.key, off, dst, n) },
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
    fn routes(&self, peer: u32) -> Result<Vec<String>> {
        self.net.transports(peer)
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
