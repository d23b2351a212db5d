//! Hypercube-SSP: recursive doubling in which each step reuses the last partial reduction
//! received from its partner while it is fresh enough, and waits only when it is not.
//!
//! Every rank keeps its *history* `H` (the reduction of all its own contributions), so a
//! newer partial always supersedes an older one: a partner may overwrite what it sent
//! before, and nothing is lost. Each step's inbox is a triple buffer (the writer always
//! has a free buffer; the reader keeps the one it took until a fresher one is published),
//! so partials are never torn and never block the writer.
//!
//! A world size that is not a power of two `q` folds the extra ranks `e >= q` into rank
//! `e - q`: the extra publishes its history to its partner, which includes it in what it
//! sends and returns the result *without* it, so the extra adds its own current history
//! (its own contributions are always in its result, whatever the op).

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use scalefree_transport::{Device, Error, Result};

use super::{Buf, Kind, Mesh, FINAL, MESH_HEADER};
use crate::reduce::{DType, ReduceOp};

const FRESH: u32 = 4;
const BUF_HDR: usize = 64;

/// Byte layout: `slots` triple buffers of `nbytes` each, after the mesh header.
struct Slots {
    nbytes: usize,
}

impl Slots {
    fn buf_stride(&self) -> usize {
        BUF_HDR + self.nbytes.next_multiple_of(64)
    }
    fn slot_stride(&self) -> usize {
        64 + 3 * self.buf_stride()
    }
    fn slot(&self, i: usize) -> usize {
        MESH_HEADER + i * self.slot_stride()
    }
    fn buf(&self, i: usize, b: u32) -> usize {
        self.slot(i) + 64 + b as usize * self.buf_stride()
    }
}

/// A slot this rank writes into at a peer (`back` is the writer's free buffer).
struct Out {
    peer: usize,
    slot: usize,
    back: u32,
}

/// A slot of this rank that a peer writes into (`front` is the buffer being read).
struct In {
    slot: usize,
    front: u32,
}

pub(crate) struct Hypercube {
    mesh: Mesh,
    slots: Slots,
    kind: Kind,
    /// This rank's history, and whether it holds anything yet.
    history: Buf,
    has_history: bool,
    /// Ranks below the power of two run the cube; the others fold into a partner.
    role: Role,
    tmp: Buf,
}

enum Role {
    Cube { steps: Vec<(Out, In)>, fold: Option<(In, Out)> },
    Extra { to_partner: Out, from_partner: In },
}

/// Slot numbers: 0..d for the cube steps, then the fold inbox (at a cube rank) and the
/// unfold inbox (at an extra rank) share the next slot.
impl Hypercube {
    pub(crate) fn new(dev: &Device, count: usize, dtype: DType, op: ReduceOp) -> Result<Self> {
        let p = dev.size() as usize;
        let me = dev.rank() as usize;
        let q = if p.is_power_of_two() { p } else { p.next_power_of_two() / 2 };
        let d = q.trailing_zeros() as usize;
        let nbytes = count * dtype.size_bytes();
        let slots = Slots { nbytes };
        // Partners swap slot words in each other's memory: one host only.
        let mesh = Mesh::new(dev, slots.slot(d + 1)).map_err(|e| match e {
            Error::Unsupported(_) => Error::Unsupported(
                "the hypercube SSP variant needs every rank on one host; across hosts use a sharded variant (the default, sharded_async_thread)".into(),
            ),
            e => e,
        })?;
        let fresh_out = |peer, slot| Out { peer, slot, back: 2 };
        let fresh_in = |slot| In { slot, front: 0 };
        // Initial triple-buffer state: reader holds 0, `latest` is 1 (not fresh), writer 2.
        for i in 0..=d {
            mesh.u32_at(me, slots.slot(i)).store(1, Ordering::Relaxed);
        }
        let role = if me < q {
            let steps = (0..d).map(|k| (fresh_out(me ^ (1 << k), k), fresh_in(k))).collect();
            let fold = (me + q < p).then(|| (fresh_in(d), fresh_out(me + q, d)));
            Role::Cube { steps, fold }
        } else {
            Role::Extra { to_partner: fresh_out(me - q, d), from_partner: fresh_in(d) }
        };
        // Peers may publish as soon as they return from here: make sure every inbox is
        // initialised first.
        dev.exchange_bytes(&[])?;
        Ok(Hypercube {
            mesh,
            kind: Kind { dtype, op },
            history: Buf::new(nbytes),
            has_history: false,
            role,
            tmp: Buf::new(nbytes),
            slots,
        })
    }

    /// Publishes `src` (with its age) into the peer's slot.
    fn publish(mesh: &Mesh, slots: &Slots, o: &mut Out, src: *const u8, age: u64) -> Result<()> {
        let b = slots.buf(o.slot, o.back);
        unsafe { mesh.put(o.peer, b + BUF_HDR, src, slots.nbytes) }?;
        mesh.u64_at(o.peer, b).store(age, Ordering::Relaxed);
        let old = mesh.u32_at(o.peer, slots.slot(o.slot)).swap(o.back | FRESH, Ordering::AcqRel);
        o.back = old & 3;
        mesh.ring(o.peer);
        Ok(())
    }

    /// Takes the freshest partial in `i`, if a fresher one was published; returns the age of
    /// the one now held (0: nothing was ever received).
    fn take(mesh: &Mesh, slots: &Slots, i: &mut In) -> u64 {
        let w = mesh.u32_at(mesh.me, slots.slot(i.slot));
        if w.load(Ordering::Acquire) & FRESH != 0 {
            let old = w.swap(i.front, Ordering::AcqRel);
            i.front = old & 3;
        }
        mesh.u64_at(mesh.me, slots.buf(i.slot, i.front)).load(Ordering::Relaxed)
    }

    fn data(mesh: &Mesh, slots: &Slots, i: &In) -> *const u8 {
        unsafe { mesh.base(mesh.me).add(slots.buf(i.slot, i.front) + BUF_HDR) }
    }

    /// Takes from `i` until its age reaches `need` (`block`), or once (not `block`).
    fn receive(&self, i: &mut In, need: u64, block: bool, waited: &mut Duration, what: &dyn Fn() -> String) -> Result<u64> {
        loop {
            let seen = self.mesh.my_bell();
            let age = Self::take(&self.mesh, &self.slots, i);
            if age >= need || !block {
                return Ok(age);
            }
            let t = Instant::now();
            self.mesh.wait_bell(seen, None, what, &|| Ok(()), true)?;
            *waited += t.elapsed();
        }
    }

    /// One pass over the cube. `own_age` is the age of this rank's history; returns the
    /// age of the result in `out`.
    fn round(&mut self, out: &mut [u8], own_age: u64, need: u64, block: bool, waited: &mut Duration) -> Result<u64> {
        let n = self.slots.nbytes;
        let kind = self.kind;
        let mut role = std::mem::replace(&mut self.role, Role::Cube { steps: Vec::new(), fold: None });
        let r = (|| -> Result<u64> {
            match &mut role {
                Role::Extra { to_partner, from_partner } => {
                    Self::publish(&self.mesh, &self.slots, to_partner, self.history.ptr(), own_age)?;
                    let peer = to_partner.peer;
                    let age = self.receive(from_partner, need, block, waited, &|| {
                        format!("the SSP reduction from rank {peer} (age >= {need})")
                    })?;
                    let src = Self::data(&self.mesh, &self.slots, from_partner);
                    if age == 0 {
                        out.copy_from_slice(self.history.bytes());
                    } else {
                        kind.acc3(out.as_mut_ptr(), src, self.history.ptr(), n);
                    }
                    Ok(age.min(own_age))
                }
                Role::Cube { steps, fold } => {
                    // `out` accumulates everything but the folded extra; `tmp` is what is sent.
                    out.copy_from_slice(self.history.bytes());
                    let mut age_x = own_age;
                    let mut age_f = FINAL;
                    let mut with_fold = false;
                    if let Some((fin, _)) = fold.as_mut() {
                        let peer = self.mesh.me + (1usize << steps.len());
                        age_f = self.receive(fin, need, block, waited, &|| {
                            format!("the SSP history of rank {peer} (age >= {need})")
                        })?;
                        with_fold = age_f > 0;
                    }
                    for (o, i) in steps.iter_mut() {
                        let src = if with_fold {
                            kind.acc3(self.tmp.mut_ptr(), out.as_ptr(), Self::data(&self.mesh, &self.slots, &fold.as_ref().unwrap().0), n);
                            self.tmp.ptr()
                        } else {
                            out.as_ptr()
                        };
                        Self::publish(&self.mesh, &self.slots, o, src, age_x.min(age_f))?;
                        let peer = o.peer;
                        let age = self.receive(i, need, block, waited, &|| {
                            format!("the SSP partial of rank {peer} (age >= {need})")
                        })?;
                        if age > 0 {
                            kind.acc(out.as_mut_ptr(), Self::data(&self.mesh, &self.slots, i), n);
                        }
                        age_x = age_x.min(age);
                    }
                    if let Some((fin, fout)) = fold.as_mut() {
                        Self::publish(&self.mesh, &self.slots, fout, out.as_ptr(), age_x)?;
                        if with_fold {
                            kind.acc(out.as_mut_ptr(), Self::data(&self.mesh, &self.slots, fin), n);
                        }
                    }
                    Ok(age_x.min(age_f))
                }
            }
        })();
        self.role = role;
        r
    }

    pub(crate) fn allreduce(&mut self, contribution: &[u8], out: &mut [u8], clock: u64, slack: u64) -> Result<(Duration, u64)> {
        if self.has_history {
            self.kind.acc(self.history.mut_ptr(), contribution.as_ptr(), contribution.len());
        } else {
            self.history.bytes_mut().copy_from_slice(contribution);
            self.has_history = true;
        }
        let mut waited = Duration::ZERO;
        let age = self.round(out, clock, clock.saturating_sub(slack), true, &mut waited)?;
        Ok((waited, age.min(clock)))
    }

    /// Rounds that never block (so no rank waits on a flushing one) until every partial
    /// received is final.
    pub(crate) fn flush(&mut self, out: &mut [u8], clock: u64) -> Result<()> {
        if !self.has_history {
            super::fill_identity(self.kind.dtype, self.kind.op, self.history.bytes_mut());
            self.has_history = true;
        }
        let _ = clock;
        let mut waited = Duration::ZERO;
        loop {
            let seen = self.mesh.my_bell();
            if self.round(out, FINAL, FINAL, false, &mut waited)? == FINAL {
                // Partners may still need our final partials: they were all published.
                return Ok(());
            }
            self.mesh.wait_bell(seen, None, &|| "every rank to flush its SSP reduction".to_string(), &|| Ok(()), true)?;
        }
    }
}
