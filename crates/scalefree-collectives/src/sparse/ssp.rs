//! Bounded staleness on the butterfly: the sparse allreduce's reduce, where a layer message
//! a peer has not sent yet is replaced by the last one it sent, as long as that one is at
//! most `slack` reductions old (see `docs/algorithms.md`, "SSP sparse allreduce").
//!
//! Every layer message (down or up, per member and phase) goes through a latest-value
//! mailbox of [`crate::ssp::mailbox`] (a triple buffer in the reader's region: the writer
//! never blocks, the reader takes the freshest one, never a torn one). A message carries
//! its *age*: the oldest reduction any contribution in it comes from (a rank's own
//! contribution to call `t` has age `t`; combining takes the minimum). A rank at call `t`
//! uses a member's message when its age is at least `t - slack` and waits for a fresher one
//! otherwise.
//!
//! Conservation: at a layer, member `j`'s message down stands for the contributions of a
//! fixed set of ranks (its subtree), disjoint from every other member's, so swapping it
//! for an older one swaps that whole set for older versions — no contribution is counted
//! twice or dropped. The up phase keeps this rank's own contributions current: with `sum`,
//! the owner of a key range answers a member with the total *minus* the message that member
//! sent it (the version it used), and the member adds its own current partial back
//! (`Layer::up_excl` / `Layer::up_own`). With max, min and or (idempotent) the owner sends
//! the total and the member combines its current partial into it: its current contribution
//! is in the result, next to possibly an older one of its own (the same value when the
//! contributions only grow, as HADI's registers do).
//!
//! `flush` is the synchronous reduce of every rank's latest contribution: the exact result.
//!
//! A member on this host is reached through mapped shared memory (a triple buffer); one on
//! another host through posted mailboxes (the dense SSP's: the writer posts into one of
//! three buffers the reader has acknowledged, and keeps a publish when none is free, sending
//! it once an acknowledgement comes). A kept publish needs its writer to come back: every
//! wait here sends the kept ones, and `flush` first drains them — each rank sends what it
//! kept and acknowledges what it receives until every partner across hosts says it has
//! nothing left — so no rank waits on a partial that sits at a rank already in the
//! synchronous reduce. Across hosts, call `flush` after the last reduce with slack (before
//! any other collective): a publish still kept then would never be sent.

use std::time::{Duration, Instant};

use scalefree_transport::mesh::Mesh;
use scalefree_transport::{Error, Result};

use crate::comm::Communicator;
use crate::reduce::{DType, ReduceOp};
use crate::sparse::butterfly::{LayerStats, SparseAllreduce};
use crate::sparse::kernels::{fill_identity, gather, gather_combine, gather_subtract, scatter, SDType, SOp};
use crate::ssp::mailbox::{Layout, Receiver, Sender};
use crate::ssp::CallStats;
use crate::Algorithm;

const DOWN: usize = 0;
const UP: usize = 1;

/// The mailboxes, buffers and clock of the bounded-staleness reduce of one configured
/// sparse allreduce (made by its first such reduce).
pub(crate) struct SspState {
    mesh: Mesh,
    layout: Layout,
    dt: SDType,
    w: usize,
    /// Per layer and phase, per member digit (empty for this rank's own), per replica.
    outs: Vec<[Vec<Vec<Sender>>; 2]>,
    ins: Vec<[Vec<Vec<Receiver>>; 2]>,
    replicas: usize,
    logical: usize,
    clock: u64,
    /// The last contribution (caller order), for `flush`.
    latest: Vec<u64>,
    /// Layer vectors down (`cur[0]`: this rank's values in key order; `cur[l + 1]`: after
    /// layer `l`), the up vectors (`upv[l]`: this rank's requested keys of layer `l`), and
    /// the packed answers up; each padded so a mailbox may read a full slot from any row.
    cur: Vec<Vec<u64>>,
    upv: Vec<Vec<u64>>,
    send: Vec<Vec<u64>>,
    stats: Vec<CallStats>,
    /// Flushes so far (the count partners across hosts say when they have drained).
    flushes: u64,
    /// Whether any member is on another host (posted mailboxes: `flush` drains them).
    posted: bool,
}

// Raw pointers into mapped regions owned by `mesh`, which moves with the struct.
unsafe impl Send for SspState {}

fn words(bytes: usize) -> usize {
    bytes.div_ceil(8)
}

impl SspState {
    fn new(sa: &SparseAllreduce, c: &mut Communicator, dt: SDType, w: usize) -> Result<Self> {
        let rb = dt.size_bytes() * w;
        let (m, me_l) = sa.logical(c);
        let replicas = sa.replication;
        let me_q = c.rank() as usize / m;
        // Largest message of any slot, agreed: every rank lays out its slots alike.
        let mut big = 0usize;
        for layer in &sa.layers {
            for j in 0..layer.members.len() {
                big = big.max((layer.out_split[j + 1] - layer.out_split[j]) * rb);
                big = big.max(layer.out_maps[j].len() * rb);
                big = big.max(layer.in_maps[j].len() * rb);
                big = big.max((layer.in_split[j + 1] - layer.in_split[j]) * rb);
            }
        }
        let mut v = [big as i64];
        if c.size() > 1 {
            unsafe { c.allreduce(v.as_mut_ptr() as *mut u8, 1, DType::I64, ReduceOp::Max, Algorithm::Auto)? };
        }
        let layout = Layout { nbytes: (v[0] as usize).max(8) };
        let kmax = sa.layers.iter().map(|l| l.members.len()).max().unwrap_or(1);
        let nslots = sa.layers.len() * 2 * kmax * replicas;
        let slot = |l: usize, ph: usize, digit: usize, q: usize| ((l * 2 + ph) * kmax + digit) * replicas + q;
        // Members on this host swap slot words in each other's memory; members on other
        // hosts post into each other's region (see `ssp::mailbox`).
        let mesh = Mesh::new_posting(c.device(), layout.slot(nslots))?;
        for i in 0..nslots {
            layout.init_slot(&mesh, i);
        }
        let mut outs = Vec::new();
        let mut ins = Vec::new();
        for (l, layer) in sa.layers.iter().enumerate() {
            let mut o: [Vec<Vec<Sender>>; 2] = [Vec::new(), Vec::new()];
            let mut i: [Vec<Vec<Receiver>>; 2] = [Vec::new(), Vec::new()];
            for ph in [DOWN, UP] {
                for (j, &b) in layer.members.iter().enumerate() {
                    if j == layer.digit {
                        o[ph].push(Vec::new());
                        i[ph].push(Vec::new());
                        continue;
                    }
                    let peers = (0..replicas).map(|q| b as usize + q * m);
                    o[ph].push(peers.clone().map(|p| Sender::new(&mesh, &layout, p, slot(l, ph, layer.digit, me_q))).collect());
                    i[ph].push(peers.enumerate().map(|(q, p)| Receiver::new(&mesh, &layout, p, slot(l, ph, j, q))).collect());
                }
            }
            outs.push(o);
            ins.push(i);
        }
        debug_assert!(sa.layers.iter().all(|l| l.members[l.digit] as usize == me_l));
        // Peers publish as soon as they return from here: every inbox is initialised first.
        c.device().exchange_bytes(&[])?;
        let pad = layout.nbytes;
        let mut cur = vec![vec![0u64; words(sa.n_out_u * rb + pad)]];
        let mut upv = Vec::new();
        let mut send = Vec::new();
        for layer in &sa.layers {
            cur.push(vec![0u64; words(layer.out_after * rb + pad)]);
            upv.push(vec![0u64; words(layer.in_split[layer.members.len()] * rb)]);
            let total: usize = layer.in_maps.iter().map(|m| m.len()).sum();
            send.push(vec![0u64; words(total * rb + pad)]);
        }
        upv.push(vec![0u64; words(sa.bottom.len() * rb)]);
        let posted = outs.iter().flat_map(|o| o.iter().flatten().flatten()).any(|s| !s.mapped());
        Ok(SspState {
            mesh,
            layout,
            dt,
            w,
            outs,
            ins,
            replicas,
            logical: m,
            clock: 0,
            latest: vec![0u64; words(sa.n_out * rb)],
            cur,
            upv,
            send,
            stats: Vec::new(),
            flushes: 0,
            posted,
        })
    }

    /// Sends the publishes kept for members on other hosts whose buffers have been freed
    /// (replicated: not to a replica that is gone).
    fn service(&mut self) -> Result<()> {
        let replicated = self.replicas > 1;
        for s in self.outs.iter_mut().flat_map(|o| o.iter_mut().flatten().flatten()) {
            if replicated && s.pending() && !self.mesh.dev.rank_alive(s.peer() as u32) {
                continue;
            }
            match s.service(&self.mesh, &self.layout) {
                Err(Error::PeerLost { .. }) if replicated => {}
                r => r?,
            }
        }
        Ok(())
    }

    /// Publishes the first `n` bytes at `src` with `age` to every replica of member `j` of
    /// layer `l`, phase `ph`. Replicated, a replica on another host that is gone is skipped.
    fn publish(&mut self, l: usize, ph: usize, j: usize, src: *const u8, n: usize, age: u64) -> Result<()> {
        let replicated = self.replicas > 1;
        for s in self.outs[l][ph][j].iter_mut() {
            if replicated && !s.mapped() && !self.mesh.dev.rank_alive(s.peer() as u32) {
                continue;
            }
            match s.publish_len(&self.mesh, &self.layout, src, n, age) {
                Err(Error::PeerLost { .. }) if replicated => {}
                r => r?,
            }
        }
        Ok(())
    }

    /// Before a flush: sends every publish kept for a member on another host and
    /// acknowledges what such members post, until each of them says it has done the same
    /// (replicated: each one still alive). Afterwards no member waits for a partial this
    /// rank still keeps.
    fn drain(&mut self) -> Result<()> {
        if !self.posted {
            return Ok(());
        }
        self.flushes += 1;
        let f = self.flushes;
        let r = self.replicas;
        let mut said = false;
        let what = || "every rank across hosts to send what it kept of the sparse_allreduce with slack (flush)".to_string();
        loop {
            let seen = self.mesh.my_bell();
            self.service()?;
            let dev = self.mesh.dev.clone();
            let gone = |p: usize| r > 1 && !dev.rank_alive(p as u32);
            let mut waiting = Vec::new();
            for i in self.ins.iter_mut().flat_map(|x| x.iter_mut().flatten().flatten()) {
                let Some(p) = i.posted_from() else { continue };
                // A partner that is done keeps nothing that waits for an acknowledgement (and,
                // replicated, may be gone already: it need not wait for every replica).
                if gone(p) || i.partner_done(&self.mesh, &self.layout, f) {
                    continue;
                }
                waiting.push(p);
                match i.take(&self.mesh, &self.layout) {
                    Err(Error::PeerLost { .. }) if r > 1 => {}
                    x => {
                        x?;
                    }
                }
            }
            let senders = || self.outs.iter().flat_map(|o| o.iter().flatten().flatten()).filter(|s| !s.mapped() && !gone(s.peer()));
            if !said && !senders().any(|s| s.pending()) {
                for s in senders() {
                    match s.say_done(&self.mesh, &self.layout, f) {
                        Err(Error::PeerLost { .. }) if r > 1 => {}
                        x => x?,
                    }
                }
                said = true;
            }
            if said && waiting.is_empty() {
                return Ok(());
            }
            if r == 1 {
                self.mesh.wait_bell(seen, None, &what, &|| Ok(()), true)?;
                continue;
            }
            // Replicated: a partner that goes meanwhile ends the wait (it is skipped next time).
            let lost = || match waiting.iter().find(|&&p| gone(p)) {
                Some(&p) => Err(Error::PeerLost { rank: p as u32, pid: dev.pid_of(p as u32), detail: "gone".into() }),
                None => Ok(()),
            };
            match self.mesh.wait_bell_surviving(seen, &what, &lost) {
                Err(Error::PeerLost { .. }) => {}
                x => x?,
            }
        }
    }

    /// Takes member `j`'s freshest message of layer `l`, phase `ph` (from whichever replica
    /// has the freshest), waiting until its age reaches `need`: (age, data).
    fn take(&mut self, l: usize, ph: usize, j: usize, b: u32, need: u64, waited: &mut Duration) -> Result<(u64, *const u8)> {
        let (m, r) = (self.logical, self.replicas);
        loop {
            let seen = self.mesh.my_bell();
            self.service()?;
            let mut best = (0u64, 0usize);
            for q in 0..r {
                let a = match self.ins[l][ph][j][q].take(&self.mesh, &self.layout) {
                    // Its acknowledgement could not go to a replica that is gone; what it
                    // posted before is still good (a second take posts nothing).
                    Err(Error::PeerLost { .. }) if r > 1 => self.ins[l][ph][j][q].take(&self.mesh, &self.layout)?,
                    x => x?,
                };
                if a > best.0 {
                    best = (a, q);
                }
            }
            if best.0 >= need {
                return Ok((best.0, self.ins[l][ph][j][best.1].data(&self.mesh, &self.layout)));
            }
            let what = || {
                let phase = if ph == DOWN { "down" } else { "up" };
                format!("layer {l} ({phase}) of rank {b} at age >= {need} (sparse_allreduce with slack)")
            };
            let dev = &self.mesh.dev;
            let alive = || {
                if (0..r).any(|q| dev.rank_alive((b as usize + q * m) as u32)) {
                    Ok(())
                } else {
                    Err(Error::PeerLost { rank: b, pid: dev.pid_of(b), detail: format!("every replica of logical node {b} has exited") })
                }
            };
            let t = Instant::now();
            // Unreplicated: any peer's death raises (and Ctrl-C); replicated: only the loss
            // of every replica of this member.
            if r == 1 {
                self.mesh.wait_bell(seen, None, &what, &alive, true)?;
            } else {
                self.mesh.wait_bell_surviving(seen, &what, &alive)?;
            }
            *waited += t.elapsed();
        }
    }
}

impl SparseAllreduce {
    /// Bounded-staleness reduce (collective in the SSP sense: every rank calls it as often,
    /// but none waits for data at most `slack` reductions old). Needs [`Self::enable_ssp`]
    /// before `config`; the first call fixes `dt` and `w`. Returns the call's statistics.
    pub fn reduce_ssp(&mut self, c: &mut Communicator, out_vals: &[u8], in_vals: &mut [u8], dt: SDType, w: usize, slack: u64) -> Result<CallStats> {
        let mut err = if !self.configured {
            Some("sparse_allreduce.reduce called before config".to_string())
        } else if !self.ssp_maps {
            Some("sparse_allreduce: reduce with slack needs slack= when the allreduce is made".to_string())
        } else {
            self.check_values("out_values", out_vals.len(), self.n_out, dt, w)
                .or_else(|| self.check_values("in_values", in_vals.len(), self.n_in, dt, w))
                .or_else(|| self.op.check(dt).err().map(|e| e.to_string()))
        };
        if let Some(s) = &self.ssp {
            if err.is_none() && (s.dt != dt || s.w != w) {
                err = Some(format!(
                    "sparse_allreduce with slack runs {} x {} values since its first reduce, got {} x {w}",
                    s.dt.name(),
                    s.w,
                    dt.name()
                ));
            }
            if let Some(e) = err {
                return Err(Error::InvalidArgument(e));
            }
        } else {
            // The first call agrees (every rank raises alike) and lays out the mailboxes.
            if self.replication > 1 {
                if let Some(e) = err {
                    return Err(Error::InvalidArgument(e));
                }
            } else {
                self.agree(c, 2, err, dt as i64, w as i64)?;
            }
            self.ssp = Some(SspState::new(self, c, dt, w)?);
        }
        let mut st = self.ssp.take().expect("made above");
        let r = self.run_ssp(&mut st, out_vals, in_vals, slack);
        self.ssp = Some(st);
        r
    }

    fn run_ssp(&mut self, st: &mut SspState, out_vals: &[u8], in_vals: &mut [u8], slack: u64) -> Result<CallStats> {
        let t0 = Instant::now();
        let (dt, w, op) = (st.dt, st.w, self.op);
        let rb = dt.size_bytes() * w;
        st.clock += 1;
        let clock = st.clock;
        let need = clock.saturating_sub(slack).max(1);
        let mut waited = Duration::ZERO;
        st.service()?;
        unsafe { std::ptr::copy_nonoverlapping(out_vals.as_ptr(), st.latest.as_mut_ptr() as *mut u8, out_vals.len()) };
        // This rank's values in key order.
        {
            let c0 = st.cur[0].as_mut_ptr() as *mut u8;
            let src = st.latest.as_ptr() as *const u8;
            unsafe {
                match &self.out_src {
                    Some(s) => gather(dt, op, c0, src, s, w),
                    None => {
                        fill_identity(dt, op, c0, self.n_out_u * w);
                        scatter(dt, op, c0, src, &self.out_perm, w);
                    }
                }
            }
        }
        let nl = self.layers.len();
        self.stats = vec![LayerStats::default(); nl];
        // Down: ages[l] is the age of cur[l]; used[l][j] the message of member j combined.
        let mut ages = vec![clock; nl + 1];
        let mut used: Vec<Vec<*const u8>> = Vec::with_capacity(nl);
        for l in 0..nl {
            let tl = Instant::now();
            let waited_before = waited;
            let layer = &self.layers[l];
            let k = layer.members.len();
            let (lo, hi) = st.cur.split_at_mut(l + 1);
            let (src, acc) = (lo[l].as_ptr() as *const u8, hi[0].as_mut_ptr() as *mut u8);
            for j in (0..k).filter(|&j| j != layer.digit) {
                let n = (layer.out_split[j + 1] - layer.out_split[j]) * rb;
                st.publish(l, DOWN, j, unsafe { src.add(layer.out_split[j] * rb) }, n, ages[l])?;
            }
            let mut age = ages[l];
            let mut got = vec![std::ptr::null(); k];
            unsafe {
                fill_identity(dt, op, acc, layer.out_after * w);
                scatter(dt, op, acc, src.add(layer.out_split[layer.digit] * rb), &layer.out_maps[layer.digit], w);
            }
            for i in 1..k {
                let j = (layer.digit + i) % k;
                let (a, p) = st.take(l, DOWN, j, layer.members[j], need, &mut waited)?;
                unsafe { scatter(dt, op, acc, p, &layer.out_maps[j], w) };
                got[j] = p;
                age = age.min(a);
            }
            ages[l + 1] = age;
            used.push(got);
            let s = &mut self.stats[l];
            s.degree = k;
            s.out_keys = layer.out_after as u64;
            s.in_keys = layer.in_after as u64;
            s.dense = layer.dense;
            s.wait_ns += (waited - waited_before).as_nanos() as u64;
            s.merge_ns += tl.elapsed().saturating_sub(waited - waited_before).as_nanos() as u64;
        }
        // Up: the requested keys of this rank's final range, then layer by layer.
        unsafe { gather(dt, op, st.upv[nl].as_mut_ptr() as *mut u8, st.cur[nl].as_ptr() as *const u8, &self.bottom, w) };
        let mut age_up = ages[nl];
        for l in (0..nl).rev() {
            let tl = Instant::now();
            let waited_before = waited;
            let layer = &self.layers[l];
            let k = layer.members.len();
            let sendp = st.send[l].as_mut_ptr() as *mut u8;
            let mut offs = Vec::with_capacity(k);
            let mut off = 0usize;
            for j in 0..k {
                offs.push(off);
                let part = unsafe { sendp.add(off) };
                unsafe { gather(dt, op, part, st.upv[l + 1].as_ptr() as *const u8, &layer.in_maps[j], w) };
                if j != layer.digit && op == SOp::Sum {
                    unsafe { gather_subtract(dt, part, used[l][j], &layer.up_excl[j], w) };
                }
                off += layer.in_maps[j].len() * rb;
            }
            for j in (0..k).filter(|&j| j != layer.digit) {
                st.publish(l, UP, j, unsafe { sendp.add(offs[j]) }, layer.in_maps[j].len() * rb, age_up)?;
            }
            let prev = st.upv[l].as_mut_ptr() as *mut u8;
            let own = st.cur[l].as_ptr() as *const u8;
            let (a0, b0) = (layer.in_split[layer.digit], layer.in_split[layer.digit + 1]);
            unsafe { std::ptr::copy_nonoverlapping(sendp.add(offs[layer.digit]), prev.add(a0 * rb), (b0 - a0) * rb) };
            let mut age = age_up.min(ages[l]);
            for i in 1..k {
                let j = (layer.digit + i) % k;
                let (a, p) = st.take(l, UP, j, layer.members[j], need, &mut waited)?;
                let (aj, bj) = (layer.in_split[j], layer.in_split[j + 1]);
                unsafe {
                    std::ptr::copy_nonoverlapping(p, prev.add(aj * rb), (bj - aj) * rb);
                    gather_combine(dt, op, prev.add(aj * rb), own, &layer.up_own[j], w);
                }
                age = age.min(a);
            }
            age_up = age;
            let s = &mut self.stats[l];
            s.wait_ns += (waited - waited_before).as_nanos() as u64;
            s.merge_ns += tl.elapsed().saturating_sub(waited - waited_before).as_nanos() as u64;
        }
        unsafe { gather(dt, op, in_vals.as_mut_ptr(), st.upv[0].as_ptr() as *const u8, &self.in_pos, w) };
        let stats = CallStats {
            clock,
            seconds: t0.elapsed().as_secs_f64(),
            wait_seconds: waited.as_secs_f64(),
            age_diff: clock.saturating_sub(age_up),
        };
        st.stats.push(stats);
        Ok(stats)
    }

    /// Collective: the exact reduction of every rank's latest contribution (the last one
    /// passed to [`Self::reduce_ssp`]) into `in_vals`, by the synchronous reduce. Reduces
    /// with slack may follow.
    pub fn flush_ssp(&mut self, c: &mut Communicator, in_vals: &mut [u8]) -> Result<()> {
        let Some(st) = self.ssp.as_mut() else {
            return Err(Error::InvalidArgument("sparse_allreduce.flush: no reduce with slack since config".into()));
        };
        st.drain()?;
        let (dt, w) = (st.dt, st.w);
        let n = self.n_out * w * dt.size_bytes();
        let latest = std::mem::take(&mut st.latest);
        let bytes = unsafe { std::slice::from_raw_parts(latest.as_ptr() as *const u8, n) };
        let r = self.reduce(c, bytes, in_vals, dt, w);
        if let Some(st) = self.ssp.as_mut() {
            st.latest = latest;
        }
        r
    }

    /// Statistics of every reduce with slack since config, oldest first.
    pub fn ssp_stats(&self) -> &[CallStats] {
        self.ssp.as_ref().map(|s| s.stats.as_slice()).unwrap_or(&[])
    }

    /// Reduces with slack since config.
    pub fn ssp_clock(&self) -> u64 {
        self.ssp.as_ref().map_or(0, |s| s.clock)
    }
}
