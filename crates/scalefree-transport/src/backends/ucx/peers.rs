//! Peers of the UCX backend: a peer is lost when its endpoint fails, when it is silent for
//! longer than the peer timeout (heartbeats), or when a peer says so; the first loss is what
//! every rank reports.

use std::ffi::c_void;
use std::sync::atomic::Ordering;

use super::ffi::*;
use super::net::{free_cb, Net, Shared};
use crate::error::{Error, Result};
use crate::wait;

pub(super) const AM_HEARTBEAT: u32 = 0x5346_0003 & 0xffff;
/// "Rank N is lost": sent by the rank that saw it to every other peer, so that the first
/// failure is what everybody reports (not the exit of a peer that stopped because of it).
pub(super) const AM_LOST: u32 = 0x5346_0004 & 0xffff;
/// The longest reason an `AM_LOST` carries.
pub(super) const LOST_WHY_MAX: usize = 240;

pub(super) unsafe extern "C" fn err_cb(arg: *mut c_void, _ep: ucp_ep_h, status: ucs_status_t) {
    // `arg` is a pointer to (Shared, peer) made at endpoint creation.
    let (sh, peer) = unsafe { &*(arg as *const (std::sync::Weak<Shared>, u32)) };
    if let Some(sh) = sh.upgrade() {
        let why = format!("UCX endpoint failed: {}", sh.ucp.status(status));
        sh.mark_lost(*peer as usize, why);
    }
}

header_handler!(am_heartbeat, |sh, h| {
    if let Ok(from) = <[u8; 4]>::try_from(h) {
        if let Some(t) = sh.last_heard.get(u32::from_ne_bytes(from) as usize) {
            t.store(sh.epoch.elapsed().as_millis() as u64, Ordering::Relaxed);
        }
    }
});

header_handler!(am_lost, |sh, h| {
    if h.len() >= 8 {
        let from = u32::from_le_bytes(h[0..4].try_into().unwrap());
        let peer = u32::from_le_bytes(h[4..8].try_into().unwrap()) as usize;
        if peer < sh.lost.len() && peer as u32 != sh.me {
            let why = String::from_utf8_lossy(&h[8..]);
            sh.mark_lost_as(peer, format!("{why} (seen by rank {from})"), false);
        }
    }
});

impl Shared {
    /// Tells every peer still here about the losses seen here (outside any UCX callback).
    pub(super) fn announce_losses(&self) {
        let lost: Vec<u32> = std::mem::take(&mut *self.to_announce.lock().unwrap());
        self.announcing.store(false, Ordering::Relaxed);
        let Some(eps) = self.eps.get() else { return };
        for peer in lost {
            let why = self.lost[peer as usize].lock().unwrap().clone().unwrap_or_default();
            let mut h = Vec::with_capacity(8 + LOST_WHY_MAX);
            h.extend_from_slice(&self.me.to_le_bytes());
            h.extend_from_slice(&peer.to_le_bytes());
            let mut n = why.len().min(LOST_WHY_MAX);
            while !why.is_char_boundary(n) {
                n -= 1;
            }
            h.extend_from_slice(&why.as_bytes()[..n]);
            for (r, &ep) in eps.iter().enumerate() {
                if r as u32 == self.me || r as u32 == peer || ep.is_null() || self.lost[r].lock().unwrap().is_some() {
                    continue;
                }
                let mut p = ucp_request_param_t::zeroed();
                p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_FLAGS;
                p.cb = free_cb as *const c_void;
                p.flags = UCP_AM_SEND_FLAG_COPY_HEADER;
                // Completes (and is freed) in its callback, or at once; best effort.
                let _ = unsafe { (self.ucp.am_send_nbx)(ep, AM_LOST, h.as_ptr() as *const c_void, h.len(), std::ptr::null(), 0, &p) };
            }
        }
    }
    /// Marks `peer` lost (once), tells the other peers, and wakes every waiter so it
    /// re-checks liveness now.
    pub(super) fn mark_lost(&self, peer: usize, why: String) {
        self.mark_lost_as(peer, why, true);
    }

    /// [`Shared::mark_lost`]; `seen`: this rank saw it (rather than being told), so it
    /// tells the others.
    pub(super) fn mark_lost_as(&self, peer: usize, why: String, seen: bool) {
        let mut l = self.lost[peer].lock().unwrap();
        if l.is_some() {
            return;
        }
        *l = Some(why);
        drop(l);
        self.first_lost.lock().unwrap().get_or_insert(peer as u32);
        if seen {
            self.to_announce.lock().unwrap().push(peer as u32);
            self.announcing.store(true, Ordering::Relaxed);
        }
        self.any_lost.store(true, Ordering::SeqCst);
        // A caller blocked writing to its lane (a host cut off: the socket would block for
        // minutes) gets an error now.
        for &fd in self.lane_fds.lock().unwrap().get(peer).into_iter().flatten() {
            unsafe { libc::shutdown(fd, libc::SHUT_RDWR) };
        }
        for s in 0..self.nslots {
            let w = unsafe { &*self.slots.add(s) };
            wait::wake_if_waiting(w, unsafe { &*self.waiters });
        }
    }

    /// Sends a heartbeat to every watched peer and declares lost the ones silent for longer
    /// than the peer timeout (a host cut off: no error from the socket for minutes).
    pub(super) fn heartbeat(&self) {
        let now = self.epoch.elapsed().as_millis() as u64;
        let watched = self.watched.lock().unwrap().clone();
        let Some(eps) = self.eps.get() else { return };
        for (r, w) in watched.iter().enumerate() {
            if !*w || self.lost[r].lock().unwrap().is_some() {
                continue;
            }
            let me = self.me;
            if eps[r].is_null() {
                // Reached over a sealed lane only: its frames (and the lane's beats) count as
                // heard; only the silence is checked here.
                self.declare_if_silent(r, now);
                continue;
            }
            let mut p = ucp_request_param_t::zeroed();
            p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_FLAGS;
            p.cb = free_cb as *const c_void;
            p.flags = UCP_AM_SEND_FLAG_COPY_HEADER;
            let req = unsafe { (self.ucp.am_send_nbx)(eps[r], AM_HEARTBEAT, &me as *const u32 as *const c_void, 4, std::ptr::null(), 0, &p) };
            let _ = req; // completes (and is freed) in its callback, or at once
            self.declare_if_silent(r, now);
        }
    }

    /// Declares `r` lost if nothing was heard from it for longer than the peer timeout
    /// (`now`: ms since the epoch).
    fn declare_if_silent(&self, r: usize, now: u64) {
        let heard = self.last_heard[r].load(Ordering::Relaxed);
        let silent = std::time::Duration::from_millis(now.saturating_sub(heard));
        if silent > self.peer_timeout {
            self.mark_lost(r, format!(
                "nothing heard for {:.0} s (SCALEFREE_PEER_TIMEOUT): its host is unreachable or the process is stopped",
                silent.as_secs_f64()
            ));
        }
    }
}

impl Net {
    /// `PeerLost` for the first peer lost.
    pub fn check_alive(&self) -> Result<()> {
        if !self.shared.any_lost.load(Ordering::SeqCst) {
            return Ok(());
        }
        let first = *self.shared.first_lost.lock().unwrap();
        match first {
            Some(first) => Err(self.lost_report(first, "")),
            None => Ok(()),
        }
    }

    /// Whether `peer` is known lost (its endpoint or lane failed, it fell silent, or a peer
    /// said so).
    pub fn is_lost(&self, peer: u32) -> bool {
        self.shared.lost.get(peer as usize).is_some_and(|l| l.lock().unwrap().is_some())
    }

    /// Records `peer` (on this host) as lost and tells the peers on other hosts.
    pub fn note_lost(&self, peer: u32, why: String) {
        self.shared.mark_lost(peer as usize, why);
        self.shared.announce_losses();
    }

    /// `PeerLost` for an operation on `peer` that failed because it is gone: names the
    /// first peer lost, which may be another one (`peer` stopped because of it).
    pub(super) fn lost_report(&self, peer: u32, what: &str) -> Error {
        let sh = &self.shared;
        let why = |r: u32| {
            let why = sh.lost[r as usize].lock().unwrap().clone().unwrap_or_default();
            if what.is_empty() { why } else { format!("{what}: {why}") }
        };
        let first = sh.first_lost.lock().unwrap().unwrap_or(peer);
        if first == peer {
            return Error::PeerLost { rank: peer, pid: 0, detail: why(peer) };
        }
        Error::PeerLost { rank: first, pid: 0, detail: format!("{}; then rank {peer} went away too ({})", why(first), why(peer)) }
    }

    /// A lane's `PeerLost` for `peer`, recorded as a loss and reported as the first one.
    pub(super) fn lane_lost(&self, e: Error) -> Error {
        match e {
            Error::PeerLost { rank, detail, .. } => {
                self.shared.mark_lost(rank as usize, detail);
                self.lost_report(rank, "TCP lane")
            }
            e => e,
        }
    }

    pub(super) fn lost_error(&self, peer: u32, what: &str, status: ucs_status_t) -> Error {
        if self.shared.lost[peer as usize].lock().unwrap().is_some() {
            return self.lost_report(peer, what);
        }
        Error::Io {
            what: format!("{what} (rank {peer})"),
            source: std::io::Error::other(self.shared.ucp.status(status)),
        }
    }
    /// Watches `peers` (true: on another host) with heartbeats; the others are watched by
    /// the shared-memory backend (their process ids).
    pub fn watch(&self, peers: Vec<bool>) {
        let now = self.shared.epoch.elapsed().as_millis() as u64;
        for (r, w) in peers.iter().enumerate() {
            if *w {
                self.shared.last_heard[r].store(now, Ordering::Relaxed);
            }
        }
        *self.shared.watched.lock().unwrap() = peers;
    }
}

/// Silence after which a peer on another host counts as lost (`SCALEFREE_PEER_TIMEOUT`
/// seconds, default 30; on one host the same silence from a live peer is a warning).
pub(super) fn peer_timeout() -> std::time::Duration {
    crate::wait::peer_timeout_from_env()
}
