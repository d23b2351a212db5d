//! Notifications of the UCX backend: an active message whose handler stores the value in
//! the target's notification slot and wakes a parked waiter. `notify` after `write` flushes
//! the endpoint first (remote completion of the put), so the data is in place before the
//! notification is seen: ordering by flush.

use std::ffi::c_void;
use std::sync::atomic::{AtomicU32, Ordering};

use super::ffi::*;
use super::net::{Net, Shared};
use crate::backends::wire::{post_value, NOTE_POST, NOTE_SLOT, NOTE_WORD};
use crate::error::Result;
use crate::wait::{self, WaitPolicy};

pub(super) const AM_NOTIFY: u32 = 0x5346_0001 & 0xffff;

/// Header of a notification active message.
#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct NotifyHeader {
    pub(super) slot: u32,
    pub(super) value: u32,
}

impl Shared {
    pub(super) fn slot(&self, slot: u32) -> Option<&AtomicU32> {
        ((slot as usize) < self.nslots).then(|| unsafe { &*self.slots.add(slot as usize) })
    }
    /// Raises `slot` to `value` (sequence order: a late, smaller value never lowers it) and
    /// wakes waiters.
    pub(super) fn publish(&self, slot: u32, value: u32) {
        if let Some(w) = self.slot(slot) {
            raise_word(w, value);
            wait::wake_if_waiting(w, unsafe { &*self.waiters });
            self.kick();
        }
    }
    /// Wakes callers parked in `poll` on the lanes, if any (after a word was raised).
    pub(super) fn kick(&self) {
        if self.pollers.load(Ordering::SeqCst) > 0 {
            let one = 1u64;
            unsafe { libc::write(self.kick_fd, &one as *const u64 as *const c_void, 8) };
        }
    }
    pub(super) fn raise(&self, region_addr: usize, region_len: usize, note: u64, index: u64, value: u32) {
        match note {
            NOTE_SLOT => self.publish(index as u32, value),
            n if n & 0xffff_ffff == NOTE_POST && index.checked_add(8).is_some_and(|e| e as usize <= region_len) && index.is_multiple_of(8)
                && region_len >= crate::mesh::MESH_HEADER =>
            {
                let v = post_value(n, value);
                // The data has landed already: only the word and the doorbell are left.
                unsafe { crate::mesh::post_mapped(region_addr as *mut u8, 0, std::ptr::null(), 0, index as usize, v) };
                self.kick();
            }
            NOTE_WORD if index.checked_add(4).is_some_and(|e| e as usize <= region_len) && index.is_multiple_of(4) => {
                let w = unsafe { &*((region_addr + index as usize) as *const AtomicU32) };
                raise_word(w, value);
                wait::wake_all(w);
                self.kick();
            }
            _ => {}
        }
    }
}

/// Raises `w` to `value` in sequence order (a late, smaller value never lowers it).
pub(super) fn raise_word(w: &AtomicU32, value: u32) {
    let mut cur = w.load(Ordering::Acquire);
    while cur == 0 || wait::seq_reached(value, cur) {
        match w.compare_exchange_weak(cur, value, Ordering::SeqCst, Ordering::Acquire) {
            Ok(_) => break,
            Err(v) => cur = v,
        }
    }
}

header_handler!(am_notify, |sh, h| {
    if h.len() == std::mem::size_of::<NotifyHeader>() {
        let n = unsafe { (h.as_ptr() as *const NotifyHeader).read_unaligned() };
        sh.publish(n.slot, n.value);
    }
});

impl Net {
    /// Waits until every operation issued to `peer` has completed at the peer.
    pub fn flush(&self, peer: u32) -> Result<()> {
        let ep = self.ep(peer)?;
        if let Some(f) = self.unflushed.get(peer as usize) {
            // Cleared before the flush is issued: it covers every operation issued before;
            // one issued meanwhile sets it again (see `start`).
            f.store(false, Ordering::SeqCst);
        }
        let u = self.shared.ucp;
        let policy = WaitPolicy::for_load(1, std::time::Duration::from_secs(3600));
        match self.start_unmarked(peer, "ucp_ep_flush_nbx", &mut |p| unsafe { (u.ep_flush_nbx)(ep, p) })? {
            None => Ok(()),
            Some(req) => self.wait_request(&req, &policy),
        }
    }

    /// [`Net::flush`] if an operation went to `peer` over UCX since the last one.
    pub(super) fn flush_if_needed(&self, peer: u32) -> Result<()> {
        match self.unflushed.get(peer as usize) {
            Some(f) if !f.load(Ordering::SeqCst) => Ok(()),
            _ => self.flush(peer),
        }
    }

    /// Delivers `value` into `peer`'s notification `slot`, after every earlier write to
    /// that peer has landed (flush first, if anything went to it over UCX since the last).
    pub fn notify(&self, peer: u32, slot: u32, value: u32, policy: &WaitPolicy) -> Result<()> {
        // Only when an operation went to `peer` over UCX since the last flush: a flush over
        // UCX's tcp transport is a round trip through both ranks' progress, which cost 8
        // posted 1 MiB lane writes and their notification about 0.3-0.5 ms per round
        // between 2 simulated hosts (`docs/benchmarks/collectives.md`).
        self.flush_if_needed(peer)?;
        if let Some(l) = self.lanes.as_ref().filter(|l| l.has(peer)) {
            // Behind every lane write to this peer (same socket), after the puts (flushed).
            return match l.notify(peer, slot, value).map_err(|e| self.lane_lost(e))? {
                None => Ok(()),
                Some(r) => self.wait_request(&r, policy),
            };
        }
        let h = NotifyHeader { slot, value };
        let ep = self.ep(peer)?;
        let u = self.shared.ucp;
        self.run(peer, "ucp_am_send_nbx (notify)", policy, &mut |p| unsafe {
            let mut p2 = std::ptr::read(p);
            p2.op_attr_mask |= UCP_OP_ATTR_FIELD_FLAGS;
            p2.flags = UCP_AM_SEND_FLAG_COPY_HEADER;
            (u.am_send_nbx)(ep, AM_NOTIFY, &h as *const _ as *const c_void, std::mem::size_of::<NotifyHeader>(), std::ptr::null(), 0, &p2)
        })
    }
}
