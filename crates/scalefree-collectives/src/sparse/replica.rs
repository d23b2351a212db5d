//! Replicated message rounds (section V of the paper): `M·r` ranks act as `M` logical
//! nodes, rank `p` being replica `p / M` of logical node `p % M` (replicas hold the same
//! data and compute the same messages). Every message for logical node `b` is written to
//! every live replica of `b`; a receiver takes the first copy of each message to arrive
//! and ignores the others, so a dead replica costs nothing while its siblings live: nobody
//! waits for it, and no timeout is on the path.
//!
//! Transport on one host: one mailbox region per rank in shared memory, mapped by every
//! rank of the host. Layout:
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
//!
//! Across hosts (some peer's region is not mapped here) messages are pushed instead: each
//! rank's region holds an inbox slot per sender rank and round parity, and a sender posts
//! (one write: header, payload, then the slot's word and the doorbell) a copy to every live
//! replica of the target, over UCX or a TCP lane (or by stores to a mapped peer). A sender
//! copies a message once (into its staging buffer) and sends it `r` times. Flow control:
//! after a round, a receiver posts "done with round t" into the region of every live
//! replica of each logical node it read from (an acknowledgement word per receiver); a
//! sender writes a slot of parity `t & 1` only once its previous message in that slot was
//! acknowledged. A peer is dead once UCX or its lane reports it lost (a host killed: its
//! connections reset) or, on this host, its process exited; writes to it are skipped.
//! ```text
//! 0      bell (u32), 64 waiters (u32)      (the mesh header: posts ring the bell)
//! 128    ack[receiver rank] (u64)          last round the receiver finished reading
//! PUSH   inbox[sender rank][round parity]: 64 B head (round u64, len u64, meta [u64; 4])
//!        + capacity bytes of payload
//! ```

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use scalefree_transport::wait::{publish, ring, seq_reached, wait_until, wait_until_hooked};
use scalefree_transport::{Channel, Completion, Device, Error, Region, RemoteRegion, Result};

const OFF_BELL: usize = 0;
const OFF_WAITERS: usize = 64;
const OFF_DONE: usize = 128;
const HEAD: usize = 4096;
const SLOT_HEAD: usize = 64;
/// Push mode: acknowledgement words, one per receiver rank.
const OFF_ACK: usize = 128;

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
    /// Across hosts: the push protocol's state (see the module docs).
    push: Option<Push>,
}

/// State of the push protocol (mailboxes across hosts).
struct Push {
    /// Offset of the inbox slots in every region.
    head: usize,
    /// A channel to every peer.
    chans: Vec<Channel>,
    /// Round count (not wrapping: acknowledgements compare it).
    tick: u64,
    /// Header and payload of the message being sent (u64 for alignment).
    stage: Vec<u64>,
    /// Per destination rank and round parity: the last round sent in that slot.
    last_sent: Vec<[u64; 2]>,
    /// Logical nodes read from in the current round (acknowledged at its end).
    read_from: Vec<u32>,
    /// Staging buffers of writes given up on (to a peer that died): never freed while this
    /// mailbox lives, in case the transport still reads one.
    abandoned: Vec<Vec<u64>>,
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
        // Decided alike on every rank before the exchange: push when any peer is on
        // another host (its region cannot be mapped here).
        let across = (0..n).any(|p| p != dev.rank() && !dev.is_local(p));
        let push_head = (OFF_ACK + 8 * n as usize).next_multiple_of(4096);
        let bytes = if across { push_head + (n * 2) as usize * slot_bytes } else { HEAD + (m * 2) as usize * slot_bytes };
        let own = dev.alloc_arena_region(bytes)?;
        let peers = dev.exchange_regions(&own)?;
        let mut base = Vec::with_capacity(n as usize);
        for (p, rr) in peers.iter().enumerate() {
            if p as u32 == dev.rank() {
                base.push(own.as_ptr());
            } else {
                match rr.mapped_ptr() {
                    Some(ptr) => base.push(ptr),
                    None if across => base.push(std::ptr::null_mut()),
                    None => return Err(Error::Unsupported(format!("replicated sparse allreduce: rank {p}'s mailbox is not mapped"))),
                }
            }
        }
        let push = if across {
            let chans = (0..n).map(|p| dev.channel(p)).collect::<Result<Vec<_>>>()?;
            Some(Push { head: push_head, chans, tick: 0, stage: Vec::new(), last_sent: vec![[0; 2]; n as usize], read_from: Vec::new(), abandoned: Vec::new() })
        } else {
            None
        };
        Ok(Mailbox { dev: dev.clone(), m, r, me: dev.rank(), cap, slot_bytes, _own: own, _peers: peers, base, round: 0, dead: vec![false; n as usize], push })
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

    /// After a wait on `rank`: Ok(true) when it was lost (now marked dead, so the caller
    /// skips it), Ok(false) when the wait succeeded, other errors as they are.
    fn lost_in(&mut self, r: Result<()>, rank: u32) -> Result<bool> {
        match r {
            Ok(()) => Ok(false),
            Err(Error::PeerLost { .. }) => {
                self.dead[rank as usize] = true;
                Ok(true)
            }
            Err(e) => Err(e),
        }
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
        if let Some(p) = self.push.as_mut() {
            p.tick += 1;
            p.read_from.clear();
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
        if self.push.is_some() {
            return unsafe { self.push_send(b, meta, data, len) };
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
                let r = wait_until(w, waiters, |v| v != 0 && seq_reached(v, prev), dev.policy(), &what, &|| alive_or_lost(&dev, dst));
                if self.lost_in(r.map(|_| ()), dst)? {
                    continue;
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
        if self.push.is_some() {
            return self.push_recv(a);
        }
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
    pub fn end(&mut self, t: u32) -> Result<()> {
        if self.push.is_some() {
            return self.push_end();
        }
        publish(self.word(self.me, OFF_DONE), self.word(self.me, OFF_WAITERS), t);
        Ok(())
    }

    /// Push mode: the offset of the inbox slot for sender `s` and round parity `parity`.
    fn inbox(&self, s: u32, parity: u64) -> usize {
        self.push.as_ref().expect("push mode").head + (s as usize * 2 + parity as usize) * self.slot_bytes
    }

    /// This rank's 64-bit word at `off` of its own region.
    fn own_u64(&self, off: usize) -> &AtomicU64 {
        unsafe { &*(self.base[self.me as usize].add(off) as *const AtomicU64) }
    }

    /// Parks on this rank's doorbell until `ready()` holds, driving arrivals over the
    /// network meanwhile; `liveness` errors once what the wait needs is gone.
    fn wait_own(&self, what: &dyn Fn() -> String, ready: &dyn Fn() -> bool, liveness: &dyn Fn() -> Result<()>) -> Result<()> {
        let dev = &self.dev;
        let backend = dev.backend();
        let drives = backend.drives_progress();
        loop {
            let bell = self.word(self.me, OFF_BELL);
            let seen = bell.load(Ordering::SeqCst);
            if ready() {
                return Ok(());
            }
            wait_until_hooked(bell, self.word(self.me, OFF_WAITERS), |v| {
                if v != seen || ready() {
                    return true;
                }
                if drives {
                    backend.progress();
                }
                drives && ready()
            }, dev.policy(), what, liveness, backend.spin_hook())?;
        }
    }

    /// Waits for posts in flight (their staging buffer is then free again); those to a
    /// peer that died meanwhile are given up (its connection fails them).
    fn finish_posts(&mut self, mut posts: Vec<(u32, Completion)>) -> Result<()> {
        let mut spins = 0u32;
        while !posts.is_empty() {
            let before = posts.len();
            let mut i = 0;
            while i < posts.len() {
                let dst = posts[i].0;
                if posts[i].1.test() {
                    drop(posts.swap_remove(i));
                } else if !self.alive(dst) {
                    let (_, c) = posts.swap_remove(i);
                    if !c.test() {
                        // Its failing connection ends it; until then it may still read the
                        // staging buffer, so that buffer is kept and a new one used.
                        let p = self.push.as_mut().unwrap();
                        let old = std::mem::take(&mut p.stage);
                        p.abandoned.push(old);
                    }
                    drop(c); // does not wait: the peer is lost
                } else {
                    i += 1;
                }
            }
            if posts.len() == before {
                spins += 1;
                if spins < 64 {
                    std::thread::yield_now();
                } else {
                    std::thread::sleep(std::time::Duration::from_micros(100));
                }
            }
        }
        Ok(())
    }

    /// Push mode: [`Mailbox::send`] (see the module docs).
    unsafe fn push_send(&mut self, b: usize, meta: &Meta, data: *const u8, len: usize) -> Result<u64> {
        let (tick, parity) = {
            let p = self.push.as_ref().unwrap();
            (p.tick, p.tick & 1)
        };
        let mut live = Vec::with_capacity(self.r as usize);
        for q in 0..self.r {
            let dst = b as u32 + q * self.m;
            if !self.alive(dst) {
                continue;
            }
            let last = self.push.as_ref().unwrap().last_sent[dst as usize][parity as usize];
            if last > 0 {
                let ack = self.own_u64(OFF_ACK + 8 * dst as usize);
                if ack.load(Ordering::Acquire) < last {
                    let dev = self.dev.clone();
                    let what = || format!("rank {dst} to finish round {last} of a replicated sparse allreduce");
                    let r = self.wait_own(&what, &|| ack.load(Ordering::Acquire) >= last, &|| alive_or_lost(&dev, dst));
                    if self.lost_in(r, dst)? {
                        continue;
                    }
                }
            }
            live.push(dst);
        }
        if live.is_empty() {
            return Ok(0);
        }
        // Staging: len, meta, padding to the slot head, then the payload; written from
        // offset 8 of the slot (its first word is the posted round).
        let body = SLOT_HEAD - 8 + len;
        let stage = {
            let p = self.push.as_mut().unwrap();
            p.stage.resize(body.div_ceil(8), 0);
            p.stage.as_mut_ptr() as *mut u8
        };
        unsafe {
            *(stage as *mut u64) = len as u64;
            std::ptr::copy_nonoverlapping(meta.as_ptr() as *const u8, stage.add(8), 32);
            if len > 0 {
                std::ptr::copy_nonoverlapping(data, stage.add(SLOT_HEAD - 8), len);
            }
        }
        let mut posts = Vec::new();
        let mut sent = 0u64;
        for &dst in &live {
            let off = self.inbox(self.me, parity);
            let chan = self.push.as_ref().unwrap().chans[dst as usize].clone();
            match unsafe { chan.start_write_post(stage, &self._peers[dst as usize], off + 8, body, off, tick) } {
                Ok(c) => posts.push((dst, c)),
                Err(Error::PeerLost { .. }) if !self.alive(dst) => continue,
                Err(e) => return Err(e),
            }
            self.push.as_mut().unwrap().last_sent[dst as usize][parity as usize] = tick;
            sent += 1;
        }
        self.finish_posts(posts)?;
        Ok(sent)
    }

    /// Push mode: [`Mailbox::recv`].
    fn push_recv(&mut self, a: usize) -> Result<(Meta, *const u8, usize)> {
        let tick = self.push.as_ref().unwrap().tick;
        let parity = tick & 1;
        let find = |mb: &Mailbox| (0..mb.r).find(|&q| mb.own_u64(mb.inbox(a as u32 + q * mb.m, parity)).load(Ordering::Acquire) == tick);
        let q = match find(self) {
            Some(q) => q,
            None => {
                let dev = self.dev.clone();
                let (m, r) = (self.m, self.r);
                let what = || format!("any replica of logical node {a} to send round {tick} of a replicated sparse allreduce");
                self.wait_own(&what, &|| find(self).is_some(), &|| {
                    if (0..r).any(|q| dev.rank_alive(a as u32 + q * m)) {
                        Ok(())
                    } else {
                        Err(Error::PeerLost { rank: a as u32, pid: dev.pid_of(a as u32), detail: format!("every replica of logical node {a} is lost") })
                    }
                })?;
                find(self).expect("ready")
            }
        };
        self.push.as_mut().unwrap().read_from.push(a as u32);
        let s = unsafe { self.base[self.me as usize].add(self.inbox(a as u32 + q * self.m, parity)) };
        let mut meta = [0u64; 4];
        unsafe { std::ptr::copy_nonoverlapping(s.add(16), meta.as_mut_ptr() as *mut u8, 32) };
        let len = unsafe { (*(s.add(8) as *const AtomicU64)).load(Ordering::Relaxed) } as usize;
        Ok((meta, unsafe { s.add(SLOT_HEAD) as *const u8 }, len))
    }

    /// Push mode: [`Mailbox::end`]: acknowledges the round to every live replica of each
    /// logical node read from.
    fn push_end(&mut self) -> Result<()> {
        let p = self.push.as_mut().unwrap();
        let (tick, from) = (p.tick, std::mem::take(&mut p.read_from));
        let mut posts = Vec::new();
        for a in from {
            for q in 0..self.r {
                let s = a + q * self.m;
                if !self.alive(s) {
                    continue;
                }
                let chan = self.push.as_ref().unwrap().chans[s as usize].clone();
                let word = OFF_ACK + 8 * self.me as usize;
                match unsafe { chan.start_write_post(std::ptr::null(), &self._peers[s as usize], word, 0, word, tick) } {
                    Ok(c) => posts.push((s, c)),
                    Err(Error::PeerLost { .. }) if !self.alive(s) => {}
                    Err(e) => return Err(e),
                }
            }
        }
        self.finish_posts(posts)
    }
}

/// A liveness check for waits on `rank`: `PeerLost` once the transport says it is gone.
fn alive_or_lost(dev: &Device, rank: u32) -> Result<()> {
    if dev.rank_alive(rank) {
        Ok(())
    } else {
        Err(Error::PeerLost { rank, pid: dev.pid_of(rank), detail: "the process exited or its host was lost".into() })
    }
}
