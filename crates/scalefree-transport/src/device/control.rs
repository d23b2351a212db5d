//! A device's control segment: one memfd per rank holding its notification slots and their
//! waiter count, mapped by every peer on its host (a peer elsewhere raises them through the
//! backend). Set up collectively when the device opens: each rank announces its pid and its
//! segment, and maps those of its host's peers.

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::AtomicU32;

use super::Device;
use crate::backends::shm::{self, Mapping, PidWatch};
use crate::bootstrap::rendezvous::Rendezvous;
use crate::bootstrap::JobInfo;
use crate::error::{Error, Result};

/// Number of notification slots per device (`write_notify` targets one of them).
pub const NOTIFY_SLOTS: usize = 1024;

/// Layout of a device's control segment.
const CTRL_MAGIC: u64 = 0x5343_4c46_4354_524c;
const OFF_WAITERS: usize = 64;
const OFF_SLOTS: usize = 4096;
const CTRL_LEN: usize = OFF_SLOTS + NOTIFY_SLOTS * 4;

pub(crate) struct PeerInfo {
    pub(crate) pid: u32,
    /// The peer's control segment, mapped here (a peer on this host).
    pub(crate) ctrl: Option<Mapping>,
    pub(crate) watch: Option<PidWatch>,
    pub(crate) cma: bool,
}

/// Collective: creates this rank's control segment and maps those of the peers on its host
/// (`hosts[r]` is rank `r`'s host); returns the segment's descriptor and every rank's entry.
pub(super) fn open(job: &JobInfo, rv: &mut Rendezvous, hosts: &[u32]) -> Result<(OwnedFd, Vec<PeerInfo>)> {
    let me = job.rank;
    let ctrl_fd = shm::create_memfd(&format!("ctrl-r{me}"), CTRL_LEN)?;
    let ctrl = shm::map_shared(ctrl_fd.as_raw_fd(), CTRL_LEN, true)?;
    unsafe { (ctrl.as_ptr() as *mut u64).write(CTRL_MAGIC) };
    // Announce pid and the address of our control segment (a CMA probe target).
    let mut hello = Vec::with_capacity(16);
    hello.extend_from_slice(&std::process::id().to_le_bytes());
    hello.extend_from_slice(&(ctrl.as_ptr() as u64).to_le_bytes());
    hello.extend_from_slice(&ctrl_fd.as_raw_fd().to_le_bytes());
    let items = rv.exchange(&hello, Some(ctrl_fd.as_raw_fd()))?;
    let mut peers = Vec::with_capacity(items.len());
    let mut my_ctrl = Some(ctrl);
    for (r, it) in items.into_iter().enumerate() {
        let b = &it.bytes;
        if b.len() < 16 {
            return Err(Error::Bootstrap(format!("rank {r} sent a short hello")));
        }
        let pid = u32::from_le_bytes(b[0..4].try_into().unwrap());
        let probe = u64::from_le_bytes(b[4..12].try_into().unwrap());
        let peer_fd = i32::from_le_bytes(b[12..16].try_into().unwrap());
        if r as u32 == me {
            peers.push(PeerInfo { pid, ctrl: my_ctrl.take(), watch: None, cma: true });
        } else if hosts[r] == hosts[me as usize] {
            // Same host: map its control segment. The descriptor travels over a Unix
            // rendezvous; over TCP it is opened via /proc.
            let fd = match it.fd {
                Some(fd) => fd,
                None => shm::open_peer_fd(pid, peer_fd).map_err(|e| Error::Bootstrap(format!("rank {r}'s control segment: {e}")))?,
            };
            let map = shm::map_shared(fd.as_raw_fd(), CTRL_LEN, false)?;
            let magic = unsafe { (map.as_ptr() as *const u64).read_volatile() };
            if magic != CTRL_MAGIC {
                return Err(Error::Bootstrap(format!("rank {r}'s control segment is not a scalefree device")));
            }
            peers.push(PeerInfo { pid, ctrl: Some(map), watch: Some(PidWatch::new(pid)), cma: shm::cma_permitted(pid, probe as usize) });
        } else {
            peers.push(PeerInfo { pid, ctrl: None, watch: None, cma: false });
        }
    }
    Ok((ctrl_fd, peers))
}

/// This rank's notification slots and their waiter count, in its mapped control segment.
pub(super) fn words(ctrl: &Mapping) -> (*const AtomicU32, *const AtomicU32) {
    let p = ctrl.as_ptr();
    unsafe { (p.add(OFF_SLOTS) as *const AtomicU32, p.add(OFF_WAITERS) as *const AtomicU32) }
}

impl Device {
    pub(crate) fn slot_of(&self, rank: u32, slot: usize) -> &AtomicU32 {
        let m = self.inner.peers[rank as usize].ctrl.as_ref().expect("peer's control segment is mapped (shared memory)");
        unsafe { &*(m.as_ptr().add(OFF_SLOTS + slot * 4) as *const AtomicU32) }
    }
    pub(crate) fn waiters_of(&self, rank: u32) -> &AtomicU32 {
        let m = self.inner.peers[rank as usize].ctrl.as_ref().expect("peer's control segment is mapped (shared memory)");
        unsafe { &*(m.as_ptr().add(OFF_WAITERS) as *const AtomicU32) }
    }
}
