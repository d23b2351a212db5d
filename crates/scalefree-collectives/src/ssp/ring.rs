//! Ring-SSP: a segmented ring for large vectors, bandwidth-optimal (each rank sends
//! `2(p-1)/p` of the vector per call, as a ring allreduce does) where the hypercube sends
//! `log2 p` whole vectors and the sharded variants copy every increment into the shards and
//! every state back.
//!
//! The vector is cut into `p` segments. Segment `s` runs two chains around the ring, each
//! `p - 1` hops of one segment:
//!
//! * the *prefix* chain forward, from rank `s+1` to rank `s`: rank `s+k` receives the
//!   reduction of the histories of ranks `s+1 .. s+k-1`, adds its own and passes it on;
//! * the *suffix* chain backward, from rank `s` to rank `s+1`: rank `s+k` receives the
//!   reduction of ranks `s+k+1 .. s` (indices mod `p`), adds its own and passes it on.
//!
//! A rank's result for segment `s` is `prefix ⊕ own history ⊕ suffix`: every other rank
//! once, and its own history always current, for any operator (no subtraction of an old
//! copy of its own data, which would not exist for min/max and would round for floats).
//! The two chains together are exactly a ring reduce-scatter plus allgather in bytes
//! (`2(p-1)` messages of `1/p` of the vector per rank), but run in both directions of the
//! ring at once, so a call takes `p - 1` steps, not `2(p - 1)`.
//!
//! Staleness: every hop is a mailbox (triple buffer, see `mailbox.rs`) holding the
//! freshest partial received, with its age (the smallest clock of the histories in it).
//! Step `k` of a call takes the prefix and suffix of the segments at position `k` and
//! waits only while their age is below `clock - slack`; a stale partial is reused, and a
//! newer one supersedes it, which loses nothing because histories only grow. Step `k`
//! depends only on step `k - 1` of a neighbour, so no cycle of waits exists.

use std::time::{Duration, Instant};

use scalefree_transport::{Device, Result};

use super::mailbox::{Layout, Receiver, Sender};
use super::{Buf, Kind, Mesh, FINAL};
use crate::dense::share_bounds;
use crate::reduce::{DType, ReduceOp};

/// The two directions of the ring.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Dir {
    /// Prefix chain: received from rank `me - 1`, sent to `me + 1`; slot `s` for segment `s`.
    Forward,
    /// Suffix chain: received from rank `me + 1`, sent to `me - 1`; slot `p + s`.
    Backward,
}

pub(crate) struct Ring {
    mesh: Mesh,
    layout: Layout,
    kind: Kind,
    p: usize,
    me: usize,
    /// Byte range of each segment.
    seg: Vec<(usize, usize)>,
    /// This rank's history (the identity before the first call).
    history: Buf,
    /// By slot (`s` forward, `p + s` backward); `None` where the chain does not pass.
    outs: Vec<Option<Sender>>,
    ins: Vec<Option<Receiver>>,
    /// Staging for publishes to a partner on another host.
    tmp: Buf,
}

impl Ring {
    pub(crate) fn new(dev: &Device, count: usize, dtype: DType, op: ReduceOp) -> Result<Self> {
        let p = dev.size() as usize;
        let me = dev.rank() as usize;
        let esize = dtype.size_bytes();
        let seg: Vec<(usize, usize)> = (0..p as u32)
            .map(|s| {
                let (lo, hi) = share_bounds(count, p as u32, s);
                (lo * esize, hi * esize)
            })
            .collect();
        let seg_max = seg.iter().map(|(lo, hi)| hi - lo).max().unwrap_or(0);
        let layout = Layout { nbytes: seg_max };
        let mesh = Mesh::new_posting(dev, layout.slot(2 * p))?;
        let (next, prev) = ((me + 1) % p, (me + p - 1) % p);
        let mut outs: Vec<Option<Sender>> = (0..2 * p).map(|_| None).collect();
        let mut ins: Vec<Option<Receiver>> = (0..2 * p).map(|_| None).collect();
        if p > 1 {
            for s in 0..p {
                let kf = (me + p - s - 1) % p; // position in segment s's prefix chain
                let kb = (s + p - me) % p; // position in its suffix chain
                if kf >= 1 {
                    layout.init_slot(&mesh, s);
                    ins[s] = Some(Receiver::new(&mesh, &layout, prev, s));
                }
                if kf <= p - 2 {
                    outs[s] = Some(Sender::new(&mesh, &layout, next, s));
                }
                if kb >= 1 {
                    layout.init_slot(&mesh, p + s);
                    ins[p + s] = Some(Receiver::new(&mesh, &layout, next, p + s));
                }
                if kb <= p - 2 {
                    outs[p + s] = Some(Sender::new(&mesh, &layout, prev, p + s));
                }
            }
        }
        let mut history = Buf::new(count * esize);
        super::fill_identity(dtype, op, history.bytes_mut());
        // Peers may publish as soon as they return from here.
        dev.exchange_bytes(&[])?;
        Ok(Ring {
            mesh,
            layout,
            kind: Kind { dtype, op },
            p,
            me,
            seg,
            history,
            outs,
            ins,
            tmp: Buf::new(seg_max),
        })
    }

    fn slot(&self, dir: Dir, s: usize) -> usize {
        match dir {
            Dir::Forward => s,
            Dir::Backward => self.p + s,
        }
    }

    /// Sends what waits for a partner to free a buffer (partners on other hosts).
    fn service(&mut self) -> Result<()> {
        for o in self.outs.iter_mut().flatten() {
            o.service(&self.mesh, &self.layout)?;
        }
        Ok(())
    }

    /// Takes from `slot` until its age reaches `need` (`block`), or once (not `block`).
    fn receive(&mut self, slot: usize, need: u64, block: bool, waited: &mut Duration) -> Result<u64> {
        loop {
            let seen = self.mesh.my_bell();
            self.service()?;
            let age = self.ins[slot].as_mut().expect("the chain passes here").take(&self.mesh, &self.layout)?;
            if age >= need || !block {
                return Ok(age);
            }
            let (p, me) = (self.p, self.me);
            let what = || {
                let (dir, peer, s) = if slot < p { ("prefix", (me + p - 1) % p, slot) } else { ("suffix", (me + 1) % p, slot - p) };
                format!("the SSP ring {dir} of segment {s} from rank {peer} (age >= {need})")
            };
            let t = Instant::now();
            self.mesh.wait_bell(seen, None, &what, &|| Ok(()), true)?;
            *waited += t.elapsed();
        }
    }

    /// The partial held in `slot`, if one was ever received (`age > 0`).
    fn held(&self, slot: usize, age: u64) -> Option<*const u8> {
        (age > 0).then(|| self.ins[slot].as_ref().expect("the chain passes here").data(&self.mesh, &self.layout))
    }

    /// Publishes `partial ⊕ history` of segment `s` (or the history alone) on `slot`,
    /// computed straight into the partner's buffer when it is mapped; with `update` (this
    /// call's contribution, at the segment's first hop of the call) the history takes it in
    /// the same pass. Returns the published data when it stays readable for the rest of the
    /// call (a mapped partner's buffer: only this rank writes it, and not before its next
    /// publish on the slot).
    fn send(&mut self, slot: usize, s: usize, partial: Option<*const u8>, age: u64, update: Option<*const u8>) -> Result<Option<*const u8>> {
        let (lo, hi) = self.seg[s];
        let n = hi - lo;
        let h = unsafe { self.history.mut_ptr().add(lo) };
        let kind = self.kind;
        let out = self.outs[slot].as_mut().expect("the chain passes here");
        let back = out.back(&self.mesh, &self.layout);
        let dst = back.unwrap_or(self.tmp.mut_ptr());
        match (update, partial) {
            (Some(c), _) => kind.update(h, unsafe { c.add(lo) }, partial, dst, n),
            (None, Some(q)) => kind.acc3(dst, q, h, n),
            (None, None) => unsafe { std::ptr::copy_nonoverlapping(h, dst, n) },
        }
        match back {
            Some(b) => {
                out.commit(&self.mesh, &self.layout, age);
                Ok(Some(b as *const u8))
            }
            None => out.publish(&self.mesh, &self.layout, self.tmp.ptr(), age).map(|_| None),
        }
    }

    /// One pass around the ring: `p - 1` steps, each the forward and the backward hop of
    /// the segments at that position. `own_age` is the age of this rank's history, which
    /// takes `contribution` in at each segment's first hop; returns the age of the result
    /// written into `out`.
    fn round(&mut self, out: &mut [u8], contribution: Option<&[u8]>, own_age: u64, need: u64, block: bool, waited: &mut Duration) -> Result<u64> {
        let (p, me) = (self.p, self.me);
        // Age of the partial received on each slot (FINAL: none on this slot).
        let mut ages = vec![FINAL; 2 * p];
        // Whether segment s of the history has taken the contribution; what was sent forward.
        let mut updated = vec![contribution.is_none(); p];
        let mut forwarded: Vec<Option<*const u8>> = vec![None; p];
        let c = contribution.map(|c| c.as_ptr());
        for k in 0..p {
            for dir in [Dir::Forward, Dir::Backward] {
                let s = match dir {
                    Dir::Forward => (me + 2 * p - 1 - k) % p,
                    Dir::Backward => (me + k) % p,
                };
                let slot = self.slot(dir, s);
                let mut age = own_age;
                let mut partial = None;
                if k >= 1 {
                    let a = self.receive(slot, need, block, waited)?;
                    ages[slot] = a;
                    partial = self.held(slot, a);
                    age = age.min(a);
                }
                if k + 2 <= p {
                    let update = (!updated[s]).then_some(c).flatten();
                    updated[s] = true;
                    let sent = self.send(slot, s, partial, age, update)?;
                    if dir == Dir::Forward {
                        forwarded[s] = sent;
                    }
                }
            }
        }
        for s in (0..p).filter(|&s| !updated[s]) {
            // No hop this call (one rank): the contribution goes in on its own.
            let (lo, hi) = self.seg[s];
            let c = c.expect("not updated: a contribution");
            self.kind.acc(unsafe { self.history.mut_ptr().add(lo) }, unsafe { c.add(lo) }, hi - lo);
        }
        let mut age = own_age;
        for s in 0..p {
            let (lo, hi) = self.seg[s];
            let (f, b) = (self.slot(Dir::Forward, s), self.slot(Dir::Backward, s));
            let mut srcs = Vec::with_capacity(3);
            match forwarded[s] {
                // prefix ⊕ history as sent on: one input less to read.
                Some(fw) => srcs.push(fw),
                None => {
                    srcs.extend(self.ins[f].is_some().then(|| self.held(f, ages[f])).flatten());
                    srcs.push(unsafe { self.history.ptr().add(lo) });
                }
            }
            srcs.extend(self.ins[b].is_some().then(|| self.held(b, ages[b])).flatten());
            self.kind.combine(unsafe { out.as_mut_ptr().add(lo) }, &srcs, hi - lo);
            age = age.min(ages[f]).min(ages[b]);
        }
        Ok(age)
    }

    pub(crate) fn allreduce(&mut self, contribution: &[u8], out: &mut [u8], clock: u64, slack: u64) -> Result<(Duration, u64)> {
        let mut waited = Duration::ZERO;
        let age = self.round(out, Some(contribution), clock, clock.saturating_sub(slack), true, &mut waited)?;
        Ok((waited, age.min(clock)))
    }

    /// Rounds that never block (so no rank waits on a flushing one) until every partial
    /// received is final and every one of ours was sent; then waits until every partner
    /// has flushed too (it may still acknowledge ours, so this rank's region must stay).
    pub(crate) fn flush(&mut self, out: &mut [u8]) -> Result<()> {
        let mut waited = Duration::ZERO;
        let what = || "every rank to flush its SSP reduction".to_string();
        loop {
            let seen = self.mesh.my_bell();
            if self.round(out, None, FINAL, FINAL, false, &mut waited)? == FINAL && !self.outs.iter().flatten().any(Sender::pending) {
                break;
            }
            self.mesh.wait_bell(seen, None, &what, &|| Ok(()), true)?;
        }
        for o in self.outs.iter().flatten() {
            o.say_done(&self.mesh, &self.layout, 1)?;
        }
        loop {
            let seen = self.mesh.my_bell();
            if self.ins.iter().flatten().all(|i| i.partner_done(&self.mesh, &self.layout, 1)) {
                return Ok(());
            }
            self.mesh.wait_bell(seen, None, &what, &|| Ok(()), true)?;
        }
    }
}
