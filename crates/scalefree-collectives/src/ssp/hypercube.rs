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

use std::time::{Duration, Instant};

use scalefree_transport::{Device, Result};

use super::mailbox::{Layout, Receiver, Sender};
use super::{Buf, Kind, Mesh, FINAL};
use crate::reduce::{DType, ReduceOp};

pub(crate) struct Hypercube {
    mesh: Mesh,
    layout: Layout,
    kind: Kind,
    /// This rank's history, and whether it holds anything yet.
    history: Buf,
    has_history: bool,
    /// Outgoing and incoming mailboxes, by slot: the cube steps `0..d`, then slot `d` for
    /// the fold (a cube rank with an extra partner) or the unfold (an extra rank).
    outs: Vec<Sender>,
    ins: Vec<Receiver>,
    /// Ranks below the power of two run the cube; the others fold into a partner.
    role: Role,
    tmp: Buf,
    /// Delta mode at two ranks ([`Hypercube::pair_delta`]): the partner's history as of
    /// the previous call, and the age of a publish of this rank's history not yet made.
    seen: Option<Buf>,
    deferred: Option<u64>,
}

#[derive(Clone, Copy)]
enum Role {
    /// `d` cube steps, and whether an extra rank folds into this one (slot `d`).
    Cube { d: usize, fold: bool },
    /// Publishes its history into slot `d` of its partner, reads the result from its own.
    Extra { d: usize },
}

impl Hypercube {
    pub(crate) fn new(dev: &Device, count: usize, dtype: DType, op: ReduceOp) -> Result<Self> {
        let p = dev.size() as usize;
        let me = dev.rank() as usize;
        let q = if p.is_power_of_two() { p } else { p.next_power_of_two() / 2 };
        let d = q.trailing_zeros() as usize;
        let nbytes = count * dtype.size_bytes();
        let layout = Layout { nbytes };
        // Partners on this host swap slot words in each other's memory; partners on other
        // hosts post into each other's region (see `mailbox.rs`).
        let mesh = Mesh::new_posting(dev, layout.slot(d + 1))?;
        for i in 0..=d {
            layout.init_slot(&mesh, i);
        }
        let link = |peer, slot| (Sender::new(&mesh, &layout, peer, slot), Receiver::new(&mesh, &layout, peer, slot));
        let (role, links): (Role, Vec<_>) = if me < q {
            let fold = me + q < p;
            let mut links: Vec<_> = (0..d).map(|k| link(me ^ (1 << k), k)).collect();
            if fold {
                links.push(link(me + q, d));
            }
            (Role::Cube { d, fold }, links)
        } else {
            (Role::Extra { d }, vec![link(me - q, d)])
        };
        let (outs, ins) = links.into_iter().unzip();
        // Peers may publish as soon as they return from here: make sure every inbox is
        // initialised first.
        dev.exchange_bytes(&[])?;
        Ok(Hypercube {
            mesh,
            layout,
            kind: Kind { dtype, op },
            history: Buf::new(nbytes),
            has_history: false,
            outs,
            ins,
            role,
            tmp: Buf::new(nbytes),
            seen: None,
            deferred: None,
        })
    }

    /// Whether [`Hypercube::pair_delta`] applies: two ranks (one cube step, no fold), sum.
    pub(crate) fn pair(&self) -> bool {
        matches!(self.role, Role::Cube { d: 1, fold: false }) && self.kind.op == ReduceOp::Sum
    }

    /// Delta mode at two ranks, in one pass over the data: the result is this rank's
    /// history plus the partner's, so its change since the previous call is the
    /// contribution plus the change of the partner's history. `inout` holds the
    /// contribution and receives that change times `scale`.
    ///
    /// Unless it must wait, the call does not publish this rank's new history: the caller
    /// publishes it right after using the result ([`Hypercube::publish_deferred`]; the
    /// next call does it first otherwise), so the publish is off the caller's critical
    /// path. Before waiting for the partner it publishes first, so two ranks never wait
    /// for each other.
    pub(crate) fn pair_delta(&mut self, inout: &mut [u8], clock: u64, slack: u64, scale: f64) -> Result<(Duration, u64)> {
        self.publish_deferred()?;
        let dtype = self.kind.dtype;
        let need = clock.saturating_sub(slack);
        let mut waited = Duration::ZERO;
        let mut seen = self.seen.take().unwrap_or_else(|| Buf::new(self.layout.nbytes));
        let mut age = self.receive(0, need, false, &mut waited)?;
        if age >= need {
            let p = (age > 0).then(|| self.data(0));
            unsafe { super::delta::pair_step(dtype, inout, p, &mut seen, Some(&mut self.history), scale) };
            self.deferred = Some(clock);
        } else {
            self.kind.acc(self.history.mut_ptr(), inout.as_ptr(), inout.len());
            self.publish(0, self.history.ptr(), clock)?;
            age = self.receive(0, need, true, &mut waited)?;
            let p = (age > 0).then(|| self.data(0));
            unsafe { super::delta::pair_step(dtype, inout, p, &mut seen, None, scale) };
        }
        self.seen = Some(seen);
        self.has_history = true;
        Ok((waited, age.min(clock)))
    }

    /// Publishes the history [`Hypercube::pair_delta`] left unpublished, if any.
    pub(crate) fn publish_deferred(&mut self) -> Result<()> {
        if let Some(age) = self.deferred.take() {
            self.publish(0, self.history.ptr(), age)?;
        }
        Ok(())
    }

    /// The result of the last [`Hypercube::pair_delta`] call (this rank's history plus the
    /// partner's as then seen) into `out`.
    pub(crate) fn pair_last(&self, out: &mut Buf) {
        match &self.seen {
            Some(seen) => super::delta::sum_into(self.kind.dtype, out, &self.history, seen),
            None => out.bytes_mut().copy_from_slice(self.history.bytes()),
        }
    }

    /// Index into `outs`/`ins` of slot `slot`.
    fn at(&self, slot: usize) -> usize {
        match self.role {
            Role::Extra { .. } => 0,
            Role::Cube { .. } => slot,
        }
    }

    fn publish(&mut self, slot: usize, src: *const u8, age: u64) -> Result<()> {
        let k = self.at(slot);
        self.outs[k].publish(&self.mesh, &self.layout, src, age)
    }

    /// Sends what waits for a partner to free a buffer.
    fn service(&mut self) -> Result<()> {
        for o in self.outs.iter_mut() {
            o.service(&self.mesh, &self.layout)?;
        }
        Ok(())
    }

    fn data(&self, slot: usize) -> *const u8 {
        self.ins[self.at(slot)].data(&self.mesh, &self.layout)
    }

    /// Takes from slot `slot` until its age reaches `need` (`block`), or once (not `block`).
    fn receive(&mut self, slot: usize, need: u64, block: bool, waited: &mut Duration) -> Result<u64> {
        let k = self.at(slot);
        loop {
            let seen = self.mesh.my_bell();
            self.service()?;
            let age = self.ins[k].take(&self.mesh, &self.layout)?;
            if age >= need || !block {
                return Ok(age);
            }
            let peer = self.outs[k].peer();
            let what = || match self.role {
                Role::Cube { d, .. } if slot < d => format!("the SSP partial of rank {peer} (age >= {need})"),
                Role::Cube { .. } => format!("the SSP history of rank {peer} (age >= {need})"),
                Role::Extra { .. } => format!("the SSP reduction from rank {peer} (age >= {need})"),
            };
            let t = Instant::now();
            self.mesh.wait_bell(seen, None, &what, &|| Ok(()), true)?;
            *waited += t.elapsed();
        }
    }

    /// One pass over the cube. `own_age` is the age of this rank's history; returns the
    /// age of the result in `out`.
    fn round(&mut self, out: &mut [u8], own_age: u64, need: u64, block: bool, waited: &mut Duration) -> Result<u64> {
        let n = self.layout.nbytes;
        let kind = self.kind;
        match self.role {
            Role::Extra { d } => {
                self.publish(d, self.history.ptr(), own_age)?;
                let age = self.receive(d, need, block, waited)?;
                if age == 0 {
                    out.copy_from_slice(self.history.bytes());
                } else {
                    kind.acc3(out.as_mut_ptr(), self.data(d), self.history.ptr(), n);
                }
                Ok(age.min(own_age))
            }
            Role::Cube { d, fold } => {
                // `out` accumulates everything but the folded extra; `tmp` is what is sent.
                out.copy_from_slice(self.history.bytes());
                let mut age_x = own_age;
                let mut age_f = FINAL;
                let mut with_fold = false;
                if fold {
                    age_f = self.receive(d, need, block, waited)?;
                    with_fold = age_f > 0;
                }
                for k in 0..d {
                    let src = if with_fold {
                        kind.acc3(self.tmp.mut_ptr(), out.as_ptr(), self.data(d), n);
                        self.tmp.ptr()
                    } else {
                        out.as_ptr()
                    };
                    self.publish(k, src, age_x.min(age_f))?;
                    let age = self.receive(k, need, block, waited)?;
                    if age > 0 {
                        kind.acc(out.as_mut_ptr(), self.data(k), n);
                    }
                    age_x = age_x.min(age);
                }
                if fold {
                    self.publish(d, out.as_ptr(), age_x)?;
                    if with_fold {
                        kind.acc(out.as_mut_ptr(), self.data(d), n);
                    }
                }
                Ok(age_x.min(age_f))
            }
        }
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
    /// received is final and every one of ours was sent; then waits until every partner
    /// has flushed too (it may still acknowledge ours, so this rank's region must stay).
    pub(crate) fn flush(&mut self, out: &mut [u8], clock: u64) -> Result<()> {
        // The rounds below publish the whole history.
        self.deferred = None;
        if !self.has_history {
            super::fill_identity(self.kind.dtype, self.kind.op, self.history.bytes_mut());
            self.has_history = true;
        }
        let _ = clock;
        let mut waited = Duration::ZERO;
        let what = || "every rank to flush its SSP reduction".to_string();
        loop {
            let seen = self.mesh.my_bell();
            if self.round(out, FINAL, FINAL, false, &mut waited)? == FINAL && !self.outs.iter().any(Sender::pending) {
                break;
            }
            self.mesh.wait_bell(seen, None, &what, &|| Ok(()), true)?;
        }
        for o in &self.outs {
            o.say_done(&self.mesh, &self.layout, 1)?;
        }
        loop {
            let seen = self.mesh.my_bell();
            if self.ins.iter().all(|i| i.partner_done(&self.mesh, &self.layout, 1)) {
                return Ok(());
            }
            self.mesh.wait_bell(seen, None, &what, &|| Ok(()), true)?;
        }
    }
}
