//! Copies of the UCX backend: `write` is a lane write (a peer reached over a TCP lane) or
//! `ucp_put_nbx`, `read` is `ucp_get_nbx`; `write_notify` sends the data and the note as
//! one active message (eager, or rendezvous into the region for large data) whose handler
//! raises the note only once the data has landed.

use std::ffi::c_void;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::ffi::*;
use super::memory::rkey_of;
use super::net::{Net, Shared};
use super::progress::{finish_pending, recv_data_cb, Pending};
use crate::backends::wire::note_parts;
use crate::backends::{Note, RemoteKey, Request};
use crate::error::Result;
use crate::wait::WaitPolicy;

pub(super) const AM_WRITE: u32 = 0x5346_0002 & 0xffff;

/// Header of a write-with-notification active message.
#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct WriteHeader {
    pub(super) key: u64,
    pub(super) offset: u64,
    /// What to raise once the data is in place: `NOTE_*`, with `index` and `value`.
    pub(super) note: u64,
    pub(super) index: u64,
    pub(super) value: u32,
    pub(super) _pad: u32,
}


pub(super) unsafe extern "C" fn am_write(
    arg: *mut c_void,
    header: *const c_void,
    hlen: usize,
    data: *mut c_void,
    len: usize,
    param: *const ucp_am_recv_param_t,
) -> ucs_status_t {
    let sh_ptr = arg as *const Shared;
    let sh = unsafe { &*sh_ptr };
    if hlen != std::mem::size_of::<WriteHeader>() {
        return UCS_OK;
    }
    let h = unsafe { (header as *const WriteHeader).read_unaligned() };
    let target = sh.region_target(h.key, h.offset as usize, len);
    let Some((dst, raddr, rlen)) = target else {
        // A write to a region that is gone or out of its bounds: dropped (the sender checked
        // bounds against the handle; this only happens after the region was freed).
        return UCS_OK;
    };
    let rndv = unsafe { (*param).recv_attr } & UCP_AM_RECV_ATTR_FLAG_RNDV != 0;
    if !rndv {
        unsafe { std::ptr::copy_nonoverlapping(data as *const u8, dst as *mut u8, len) };
        sh.raise(raddr, rlen, h.note, h.index, h.value);
        return UCS_OK;
    }
    // Large data: receive it straight into the region, notify when it has landed.
    let strong = unsafe {
        Arc::increment_strong_count(sh_ptr);
        Arc::from_raw(sh_ptr)
    };
    let pending = Arc::new(Pending::new(Some(strong.clone()), Some((strong, raddr, rlen, h.note, h.index, h.value))));
    let mut p = ucp_request_param_t::zeroed();
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    p.cb = recv_data_cb as *const c_void;
    let user = Arc::into_raw(pending.clone());
    p.user_data = user as *mut c_void;
    sh.inflight.fetch_add(1, Ordering::SeqCst);
    let r = unsafe { (sh.ucp.am_recv_data_nbx)(sh.worker, data, dst as *mut c_void, len, &p) };
    if r.is_null() || ptr_is_err(r) {
        drop(unsafe { Arc::from_raw(user) });
        finish_pending(&pending, if r.is_null() { UCS_OK } else { ptr_status(r) });
    }
    UCS_INPROGRESS
}

impl Net {
    /// One-sided write of `n` bytes from `src` to `remote.addr + off`; returns once `src`
    /// may be reused.
    ///
    /// # Safety
    /// `src..src+n` must be readable.
    pub unsafe fn put(&self, src: *const u8, remote: &RemoteKey, key: u64, off: usize, n: usize, policy: &WaitPolicy) -> Result<()> {
        if self.lanes.as_ref().is_some_and(|l| l.has(remote.peer)) {
            // Over the peer's TCP lane, as posted writes go. Lanes carry writes to a peer
            // that UCX reaches only over TCP, where UCX has no RMA lane (its TCP memory
            // domain registers no memory): `ucp_put_nbx` is then "software emulation" (active
            // messages copied at both ends, each fragment waiting for the peer's progress),
            // measured 1.4-3x the lane's time from 64 B to 1 MiB (docs/transport.md). Sealed
            // lanes (SCALEFREE_ENCRYPT=1): nothing goes to another host over UCX anyway.
            return match unsafe { self.start_write_notify(remote.peer, src, n, key, off, Note::None)? } {
                None => Ok(()),
                Some(r) => self.wait_request(&r, policy),
            };
        }
        let ep = self.ep(remote.peer)?;
        let u = self.shared.ucp;
        self.run(remote.peer, "ucp_put_nbx", policy, &mut |p| unsafe {
            (u.put_nbx)(ep, src as *const c_void, n, remote.addr + off as u64, rkey_of(remote), p)
        })
    }

    /// One-sided read of `n` bytes at `remote.addr + off` into `dst`; returns once they are here.
    ///
    /// # Safety
    /// `dst..dst+n` must be writable.
    pub unsafe fn get(&self, remote: &RemoteKey, key: u64, off: usize, dst: *mut u8, n: usize, policy: &WaitPolicy) -> Result<()> {
        if let Some(l) = self.lanes.as_ref().filter(|l| l.sealed() && l.has(remote.peer)) {
            // Sealed lanes (SCALEFREE_ENCRYPT=1): nothing goes to another host over UCX.
            let r = unsafe { l.start_read(remote.peer, key, off as u64, dst, n) }.map_err(|e| self.lane_lost(e))?;
            return self.wait_request(&r, policy);
        }
        let ep = self.ep(remote.peer)?;
        let u = self.shared.ucp;
        self.run(remote.peer, "ucp_get_nbx", policy, &mut |p| unsafe {
            (u.get_nbx)(ep, dst as *mut c_void, n, remote.addr + off as u64, rkey_of(remote), p)
        })
    }

    /// [`Net::put`] without waiting: over a TCP lane, a queued lane write; else
    /// `ucp_put_nbx`. `src` must stay untouched until the returned request (if any)
    /// completes.
    ///
    /// # Safety
    /// `src..src+n` must stay readable until then.
    pub unsafe fn start_put(&self, src: *const u8, remote: &RemoteKey, key: u64, off: usize, n: usize) -> Result<Option<Request>> {
        if self.lanes.as_ref().is_some_and(|l| l.has(remote.peer)) {
            return unsafe { self.start_write_notify(remote.peer, src, n, key, off, Note::None) };
        }
        let ep = self.ep(remote.peer)?;
        let u = self.shared.ucp;
        self.start(remote.peer, "ucp_put_nbx", &mut |p| unsafe {
            (u.put_nbx)(ep, src as *const c_void, n, remote.addr + off as u64, rkey_of(remote), p)
        })
    }

    /// [`Net::get`] without waiting: `dst` holds the bytes once the returned request (if
    /// any) completes.
    ///
    /// # Safety
    /// `dst..dst+n` must stay writable (and unread) until then.
    pub unsafe fn start_get(&self, remote: &RemoteKey, key: u64, off: usize, dst: *mut u8, n: usize) -> Result<Option<Request>> {
        if let Some(l) = self.lanes.as_ref().filter(|l| l.sealed() && l.has(remote.peer)) {
            return unsafe { l.start_read(remote.peer, key, off as u64, dst, n) }.map(Some).map_err(|e| self.lane_lost(e));
        }
        let ep = self.ep(remote.peer)?;
        let u = self.shared.ucp;
        self.start(remote.peer, "ucp_get_nbx", &mut |p| unsafe {
            (u.get_nbx)(ep, dst as *mut c_void, n, remote.addr + off as u64, rkey_of(remote), p)
        })
    }
    /// Writes `n` bytes from `src` into `peer`'s region `key` at `off` and then raises
    /// `note`, as one active message.
    ///
    /// # Safety
    /// `src..src+n` must be readable.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn write_notify(&self, peer: u32, src: *const u8, n: usize, key: u64, off: usize, note: Note, policy: &WaitPolicy) -> Result<()> {
        match unsafe { self.start_write_notify(peer, src, n, key, off, note)? } {
            None => Ok(()),
            Some(r) => self.wait_request(&r, policy),
        }
    }

    /// [`Net::write_notify`] without waiting: `src` must stay untouched until the returned
    /// request (if any) completes.
    ///
    /// # Safety
    /// `src..src+n` must stay readable until then.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn start_write_notify(&self, peer: u32, src: *const u8, n: usize, key: u64, off: usize, note: Note) -> Result<Option<Request>> {
        let (note, index, value) = note_parts(note);
        if let Some(l) = self.lanes.as_ref().filter(|l| l.has(peer)) {
            return unsafe { l.start_write(peer, src, n, key, off as u64, note, index, value) }.map_err(|e| self.lane_lost(e));
        }
        let h = WriteHeader { key, offset: off as u64, note, index, value, _pad: 0 };
        let ep = self.ep(peer)?;
        let u = self.shared.ucp;
        self.start(peer, "ucp_am_send_nbx (write)", &mut |p| unsafe {
            let mut p2 = std::ptr::read(p);
            p2.op_attr_mask |= UCP_OP_ATTR_FIELD_FLAGS;
            p2.flags = UCP_AM_SEND_FLAG_COPY_HEADER;
            (u.am_send_nbx)(ep, AM_WRITE, &h as *const _ as *const c_void, std::mem::size_of::<WriteHeader>(), src as *const c_void, n, &p2)
        })
    }
}
