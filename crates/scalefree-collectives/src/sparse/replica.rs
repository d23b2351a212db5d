//! Replicated message rounds (section V of the paper): `M·r` ranks act as `M` logical
//! nodes, rank `p` being replica `p / M` of logical node `p % M` (replicas hold the same
//! data and compute the same messages). Every message for logical node `b` is written to
//! every live replica of `b`; a receiver takes the first copy of each message to arrive
//! and ignores the others, so a dead replica costs nothing while its siblings live: nobody
//! waits for it, and no timeout is on the path.
//!
//! Transport: one mailbox region per rank in shared memory, mapped by every rank of the
//! host (over the network this mode is unsupported). Layout:
//! ```text
//! 0      bell (u32)       rung by every sender after filling a slot for this rank
//! 64     waiters (u32)    futex waiter count for the bell and `done`
//! 128    done (u32)       last round this rank has finished reading
//! 4096   outbox[dst logical][round parity]: 64 B head (ready u32 = round, len u64,
//!        meta [u64; 4]) + capacity bytes of payload
//! ```
//! A message for logical node `b` is copied once, into the sender's own outbox slot for
//! `b`; every replica of `b` reads it there in place (the regions are mapped by every
//! rank, and stay readable after their owner dies). A sender fills the slot of parity
//! `t & 1` for round `t` only after every live replica of `b` has finished round `t - 2`
//! (its `done`), then rings their bells. So each sender copies a message once whatever
//! `r`, and a receiver merges straight from the first sender replica whose copy is ready.
//! Nothing here uses the group's communicator, so the group's own rule (any peer's death
//! raises `PeerLost`) is unchanged; only this collective survives it.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use scalefree_transport::wait::{publish, ring, seq_reached, wait_until};
use scalefree_transport::{Device, Error, Region, RemoteRegion, Result};

const OFF_BELL: usize = 0;
const OFF_WAITERS: usize = 64;
const OFF_DONE: usize = 128;
const HEAD: usize = 4096;
const SLOT_HEAD: usize = 64;

pub type Meta = [u64; 4];

/// Payload capacity of one slot (`SCALEFREE_REPLICA_SLOT`, default 32 MiB; address space
/// only until touched).
pub fn slot_capacity() -> usize {
    scalefree_transport::config::env_bytes("SCALEFREE_REPLICA_SLOT", 32 << 20)
}

/// The mailboxes of one replicated sparse allreduce.
pub struct Mailbox {
    dev: Device,
    m: u32,
    r: u32,
    me: u32,
    cap: usize,
    slot_bytes: usize,
    _own: Region,
    _peers: Vec<RemoteRegion>,
    base: Vec<*mut u8>,
    round: u32,
    dead: Vec<bool>,
}

// The raw pointers are mappings owned by `_own` / `_peers`, which move with the struct.
unsafe impl Send for Mailbox {}

impl Mailbox {
    /// Collective over every rank (while all are alive): allocates and exchanges mailboxes.
    pub fn new(dev: &Device, replicas: usize) -> Result<Self> {
        let n = dev.size();
        let r = replicas as u32;
        if r == 0 || !n.is_multiple_of(r) {
            return Err(Error::InvalidArgument(format!("replication={replicas} does not divide the {n} ranks of the group")));
        }
        let m = n / r;
        let cap = slot_capacity().next_multiple_of(64);
        let slot_bytes = SLOT_HEAD + cap;
        let own = dev.alloc_arena_region(HEAD + (m * 2) as usize * slot_bytes)?;
        let peers = dev.exchange_regions(&own)?;
        let mut base = Vec::with_capacity(n as usize);
        for (p, rr) in peers.iter().enumerate() {
            if p as u32 == dev.rank() {
                base.push(own.as_ptr());
            } else {
                base.push(rr.mapped_ptr().ok_or_else(|| {
                    Error::Unsupported(format!("replicated sparse allreduce: rank {p} is on another host (replication works within one host)"))
                })?);
            }
        }
        Ok(Mailbox { dev: dev.clone(), m, r, me: dev.rank(), cap, slot_bytes, _own: own, _peers: peers, base, round: 0, dead: vec![false; n as usize] })
    }

    /// (logical nodes, this rank's logical node, its replica index).
    pub fn logical(&self) -> (usize, usize, usize) {
        ((self.m) as usize, (self.me % self.m) as usize, (self.me / self.m) as usize)
    }

    fn word(&self, rank: u32, off: usize) -> &AtomicU32 {
        unsafe { &*(self.base[rank as usize].add(off) as *const AtomicU32) }
    }

    /// The outbox slot of `rank` for logical node `dst` in round `t`.
    fn slot(&self, rank: u32, dst: u32, t: u32) -> *mut u8 {
        let i = (dst * 2 + (t & 1)) as usize;
        unsafe { self.base[rank as usize].add(HEAD + i * self.slot_bytes) }
    }

    fn alive(&mut self, rank: u32) -> bool {
        if !self.dead[rank as usize] && !self.dev.rank_alive(rank) {
            self.dead[rank as usize] = true;
        }
        !self.dead[rank as usize]
    }

    /// Starts the next round (every rank runs the same sequence of rounds).
    pub fn begin(&mut self) -> u32 {
        self.round = self.round.wrapping_add(1);
        if self.round == 0 {
            self.round = 1;
        }
        self.round
    }

    /// Publishes `len` bytes at `data` with `meta` for every live replica of logical node
    /// `b` (one copy, into this rank's outbox). Returns the replicas it is for.
    ///
    /// # Safety
    /// `data` valid for `len` bytes.
    pub unsafe fn send(&mut self, t: u32, b: usize, meta: &Meta, data: *const u8, len: usize) -> Result<u64> {
        if len > self.cap {
            return Err(Error::InvalidArgument(format!(
                "replicated sparse allreduce: a message of {len} bytes exceeds the slot capacity of {} bytes (raise SCALEFREE_REPLICA_SLOT)",
                self.cap
            )));
        }
        let mut live = Vec::with_capacity(self.r as usize);
        for q in 0..self.r {
            let dst = b as u32 + q * self.m;
            if !self.alive(dst) {
                continue;
            }
            if t > 2 {
                // The slot of this parity is free once every reader finished round t - 2.
                let prev = t.wrapping_sub(2);
                let dev = self.dev.clone();
                let what = || format!("rank {dst} to finish round {prev} of a replicated sparse allreduce");
                let w = self.word(dst, OFF_DONE);
                let waiters = self.word(dst, OFF_WAITERS);
                let r = wait_until(w, waiters, |v| v != 0 && seq_reached(v, prev), dev.policy(), &what, &|| {
                    if dev.rank_alive(dst) { Ok(()) } else { Err(Error::PeerLost { rank: dst, pid: dev.pid_of(dst), detail: "the process exited".into() }) }
                });
                match r {
                    Ok(_) => {}
                    Err(Error::PeerLost { .. }) => {
                        self.dead[dst as usize] = true;
                        continue;
                    }
                    Err(e) => return Err(e),
                }
            }
            live.push(dst);
        }
        if live.is_empty() {
            return Ok(0);
        }
        let s = self.slot(self.me, b as u32, t);
        unsafe {
            (*(s.add(8) as *const AtomicU64)).store(len as u64, Ordering::Relaxed);
            std::ptr::copy_nonoverlapping(meta.as_ptr() as *const u8, s.add(16), 32);
            if len > 0 {
                std::ptr::copy_nonoverlapping(data, s.add(SLOT_HEAD), len);
            }
            (*(s as *const AtomicU32)).store(t, Ordering::SeqCst);
        }
        for &dst in &live {
            ring(self.word(dst, OFF_BELL), self.word(dst, OFF_WAITERS));
        }
        Ok(live.len() as u64)
    }

    /// Waits for the first copy of round `t`'s message from logical node `a`: its meta, a
    /// pointer to its payload (valid until this rank calls `end(t)`) and its length. Errors
    /// only when every replica of `a` is dead.
    pub fn recv(&mut self, t: u32, a: usize) -> Result<(Meta, *const u8, usize)> {
        let me = self.me;
        let me_l = me % self.m;
        let find = |mb: &Mailbox| {
            (0..mb.r).find(|&q| unsafe { (*(mb.slot(a as u32 + q * mb.m, me_l, t) as *const AtomicU32)).load(Ordering::Acquire) } == t)
        };
        let q = match find(self) {
            Some(q) => q,
            None => {
                let dev = self.dev.clone();
                let (m, r) = (self.m, self.r);
                let what = || format!("any replica of logical node {a} to send round {t} of a replicated sparse allreduce");
                let this = &*self;
                wait_until(this.word(me, OFF_BELL), this.word(me, OFF_WAITERS), |_| find(this).is_some(), dev.policy(), &what, &|| {
                    if (0..r).any(|q| dev.rank_alive(a as u32 + q * m)) {
                        Ok(())
                    } else {
                        Err(Error::PeerLost { rank: a as u32, pid: dev.pid_of(a as u32), detail: format!("every replica of logical node {a} has exited") })
                    }
                })?;
                find(self).expect("ready")
            }
        };
        let s = self.slot(a as u32 + q * self.m, me_l, t);
        let mut meta = [0u64; 4];
        unsafe { std::ptr::copy_nonoverlapping(s.add(16), meta.as_mut_ptr() as *mut u8, 32) };
        let len = unsafe { (*(s.add(8) as *const AtomicU64)).load(Ordering::Relaxed) } as usize;
        Ok((meta, unsafe { s.add(SLOT_HEAD) as *const u8 }, len))
    }

    /// Ends round `t`: senders may reuse this rank's slots of round `t`'s parity at `t + 2`.
    pub fn end(&self, t: u32) {
        publish(self.word(self.me, OFF_DONE), self.word(self.me, OFF_WAITERS), t);
    }
}
