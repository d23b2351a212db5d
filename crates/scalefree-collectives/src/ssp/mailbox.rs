//! Latest-value mailboxes between two ranks, for the hypercube SSP reduction: a writer
//! publishes partials (with their age) as often as it likes, never blocking on the reader;
//! the reader takes the freshest one published, never a torn one.
//!
//! * **Mapped** (the partner's region is mapped here: same host): a triple buffer. The
//!   writer fills its free buffer and swaps its index into the slot word, the reader swaps
//!   its own out; nothing is copied on either side.
//! * **Posted** (the partner is on another host): three buffers at the reader, each with a
//!   version word that the writer's post raises after the data has landed
//!   ([`Mesh::post`]). The reader copies the freshest one out and acknowledges its
//!   version into the writer's region; the writer only overwrites a buffer whose version
//!   the reader has acknowledged (it will never read it again). When all three are still
//!   unacknowledged the publish is kept and sent by [`Sender::service`] once an
//!   acknowledgement comes (it rings the writer's bell); a newer publish replaces a kept
//!   one, which loses nothing because every partial includes all older ones.
//!
//! A rank that has flushed waits, before it returns, until each partner says it has flushed
//! too ([`Sender::say_done`]): a partner may still acknowledge a partial, and must not post
//! to a rank that has gone. (The "done" word holds a count, so a protocol that goes on after
//! a flush can say it once per flush.)
//!
//! Slot `i` of a rank's mesh region: a 64-byte header (the triple buffer's word at 0; the
//! acknowledgement word for this rank's own outgoing slot `i` at [`ACK`]; the partner's
//! "done" at [`DONE`]) and three buffers,
//! each a [`BUF_HDR`]-byte header (version at 0, age at 8, length of a posted partial at
//! [`LEN`]) and the data. A rank's outgoing and incoming slot `i` face the same partner, so
//! both kinds share one layout. A partial may be shorter than the slot
//! ([`Sender::publish_len`]): a posted one then sends and copies only its own bytes.

use std::sync::atomic::Ordering;

use scalefree_transport::Result;

use super::{Buf, Mesh, MESH_HEADER};

const FRESH: u32 = 4;
const BUF_HDR: usize = 64;
/// Offset, in a slot header, of the acknowledgement word (posted mailboxes).
const ACK: usize = 8;
/// Offset, in a slot header, of the word a partner sets when it has flushed and will
/// post nothing more into this region.
const DONE: usize = 16;
/// Offset, in a buffer header, of the age (the version is at 0).
const AGE: usize = 8;
/// Offset, in a buffer header, of the length of a posted partial.
const LEN: usize = 16;

/// Byte layout of the slots, after the mesh header.
pub(crate) struct Layout {
    pub nbytes: usize,
}

impl Layout {
    fn buf_stride(&self) -> usize {
        BUF_HDR + self.nbytes.next_multiple_of(64)
    }
    fn slot_stride(&self) -> usize {
        64 + 3 * self.buf_stride()
    }
    pub fn slot(&self, i: usize) -> usize {
        MESH_HEADER + i * self.slot_stride()
    }
    fn buf(&self, i: usize, b: u32) -> usize {
        self.slot(i) + 64 + b as usize * self.buf_stride()
    }
    /// Prepares this rank's incoming slot `i` (before any partner may publish into it).
    pub fn init_slot(&self, mesh: &Mesh, i: usize) {
        // Triple buffer: the reader holds 0, the latest is 1 (not fresh), the writer has 2.
        mesh.u32_at(mesh.me, self.slot(i)).store(1, Ordering::Relaxed);
        mesh.u64_at(mesh.me, self.slot(i) + ACK).store(0, Ordering::Relaxed);
        mesh.u64_at(mesh.me, self.slot(i) + DONE).store(0, Ordering::Relaxed);
        for b in 0..3 {
            mesh.u64_at(mesh.me, self.buf(i, b)).store(0, Ordering::Relaxed);
        }
    }
}

/// The writing end of slot `slot` at `peer`.
pub(crate) enum Sender {
    Mapped { peer: usize, slot: usize, back: u32 },
    Posted(Posted),
}

pub(crate) struct Posted {
    peer: usize,
    slot: usize,
    /// Version held by each of the reader's three buffers (0: none); the newest is the
    /// last one sent.
    versions: [u64; 3],
    /// Age, padding and data, laid out as they land at `buf + AGE`.
    stage: Buf,
    pending: bool,
    /// Age of the last publish sent: a final partial never changes, so it is sent once.
    sent_age: u64,
}

impl Sender {
    pub fn new(mesh: &Mesh, layout: &Layout, peer: usize, slot: usize) -> Self {
        if mesh.is_mapped(peer) {
            Sender::Mapped { peer, slot, back: 2 }
        } else {
            Sender::Posted(Posted {
                peer,
                slot,
                versions: [0; 3],
                stage: Buf::new(BUF_HDR - AGE + layout.nbytes),
                pending: false,
                sent_age: 0,
            })
        }
    }

    /// The partner, and the slot this writes at the partner.
    fn ends(&self) -> (usize, usize) {
        match self {
            Sender::Mapped { peer, slot, .. } => (*peer, *slot),
            Sender::Posted(p) => (p.peer, p.slot),
        }
    }

    pub fn peer(&self) -> usize {
        self.ends().0
    }

    /// Publishes `layout.nbytes` at `src` with its `age`.
    pub fn publish(&mut self, mesh: &Mesh, layout: &Layout, src: *const u8, age: u64) -> Result<()> {
        self.publish_len(mesh, layout, src, layout.nbytes, age)
    }

    /// Publishes the first `n` bytes (at most `layout.nbytes`) at `src` with its `age`; the
    /// reader sees the slot's other bytes undefined.
    pub fn publish_len(&mut self, mesh: &Mesh, layout: &Layout, src: *const u8, n: usize, age: u64) -> Result<()> {
        debug_assert!(n <= layout.nbytes);
        match self {
            Sender::Mapped { peer, slot, back } => {
                let b = layout.buf(*slot, *back);
                unsafe { mesh.put(*peer, b + BUF_HDR, src, n) }?;
                self.commit(mesh, layout, age);
                Ok(())
            }
            Sender::Posted(p) => {
                if age == super::FINAL && p.sent_age == super::FINAL && !p.pending {
                    return Ok(());
                }
                let stage = p.stage.mut_ptr();
                unsafe {
                    (stage as *mut u64).write(age);
                    (stage.add(LEN - AGE) as *mut u64).write(n as u64);
                    std::ptr::copy_nonoverlapping(src, stage.add(BUF_HDR - AGE), n);
                }
                p.pending = true;
                self.service(mesh, layout)
            }
        }
    }

    /// A mapped sender's free buffer (`layout.nbytes` bytes at the partner), to compute the
    /// next publish in place and then [`Sender::commit`] it: no staging copy. `None` for a
    /// partner on another host (use [`Sender::publish`]).
    pub fn back(&self, mesh: &Mesh, layout: &Layout) -> Option<*mut u8> {
        match self {
            Sender::Mapped { peer, slot, back } => Some(unsafe { mesh.base(*peer).add(layout.buf(*slot, *back) + BUF_HDR) }),
            Sender::Posted(_) => None,
        }
    }

    /// Publishes, with its `age`, what was written into [`Sender::back`] (mapped senders).
    pub fn commit(&mut self, mesh: &Mesh, layout: &Layout, age: u64) {
        if let Sender::Mapped { peer, slot, back } = self {
            let b = layout.buf(*slot, *back);
            mesh.u64_at(*peer, b + AGE).store(age, Ordering::Relaxed);
            let old = mesh.u32_at(*peer, layout.slot(*slot)).swap(*back | FRESH, Ordering::AcqRel);
            *back = old & 3;
            mesh.ring(*peer);
        }
    }

    /// Sends a kept publish if the reader has freed a buffer for it.
    pub fn service(&mut self, mesh: &Mesh, layout: &Layout) -> Result<()> {
        let Sender::Posted(p) = self else { return Ok(()) };
        if !p.pending {
            return Ok(());
        }
        let acked = mesh.u64_at(mesh.me, layout.slot(p.slot) + ACK).load(Ordering::Acquire);
        let Some(b) = (0..3).filter(|&b| p.versions[b] <= acked).min_by_key(|&b| p.versions[b]) else {
            return Ok(());
        };
        let v = p.versions.iter().max().unwrap() + 1;
        let at = layout.buf(p.slot, b as u32);
        let n = unsafe { (p.stage.ptr().add(LEN - AGE) as *const u64).read() } as usize;
        unsafe { mesh.post(p.peer, at + AGE, p.stage.ptr(), BUF_HDR - AGE + n, at, v)? };
        p.versions[b] = v;
        p.pending = false;
        p.sent_age = unsafe { (p.stage.ptr() as *const u64).read() };
        Ok(())
    }

    /// Tells the partner that this rank has made its `flushes`-th flush: nothing more will
    /// come from it until its next publish.
    pub fn say_done(&self, mesh: &Mesh, layout: &Layout, flushes: u64) -> Result<()> {
        let (peer, slot) = self.ends();
        unsafe { mesh.post(peer, 0, std::ptr::null(), 0, layout.slot(slot) + DONE, flushes) }
    }

    /// Whether the partner's slot is in its mapped region (no acknowledgements, never pending).
    pub fn mapped(&self) -> bool {
        matches!(self, Sender::Mapped { .. })
    }

    /// Whether a publish is kept, waiting for the reader to free a buffer.
    pub fn pending(&self) -> bool {
        matches!(self, Sender::Posted(p) if p.pending)
    }
}

/// The reading end of this rank's slot `slot`, written by `peer`.
pub(crate) enum Receiver {
    Mapped { slot: usize, front: u32 },
    Posted { peer: usize, slot: usize, taken: u64, front: Buf, age: u64 },
}

impl Receiver {
    pub fn new(mesh: &Mesh, layout: &Layout, peer: usize, slot: usize) -> Self {
        if mesh.is_mapped(peer) {
            Receiver::Mapped { slot, front: 0 }
        } else {
            Receiver::Posted { peer, slot, taken: 0, front: Buf::new(layout.nbytes), age: 0 }
        }
    }

    /// Takes the freshest partial, if a fresher one was published; returns the age of the
    /// one now held (0: nothing was ever received).
    pub fn take(&mut self, mesh: &Mesh, layout: &Layout) -> Result<u64> {
        match self {
            Receiver::Mapped { slot, front } => {
                let w = mesh.u32_at(mesh.me, layout.slot(*slot));
                if w.load(Ordering::Acquire) & FRESH != 0 {
                    let old = w.swap(*front, Ordering::AcqRel);
                    *front = old & 3;
                }
                Ok(mesh.u64_at(mesh.me, layout.buf(*slot, *front) + AGE).load(Ordering::Relaxed))
            }
            Receiver::Posted { peer, slot, taken, front, age } => {
                let newest = (0..3u32)
                    .map(|b| (mesh.u64_at(mesh.me, layout.buf(*slot, b)).load(Ordering::Acquire), b))
                    .max()
                    .filter(|&(v, _)| v > *taken);
                if let Some((v, b)) = newest {
                    let at = layout.buf(*slot, b);
                    let base = mesh.base(mesh.me);
                    let n = (mesh.u64_at(mesh.me, at + LEN).load(Ordering::Relaxed) as usize).min(layout.nbytes);
                    // The writer leaves this buffer alone until we acknowledge `v`.
                    unsafe { std::ptr::copy_nonoverlapping(base.add(at + BUF_HDR), front.mut_ptr(), n) };
                    *age = mesh.u64_at(mesh.me, at + AGE).load(Ordering::Relaxed);
                    *taken = v;
                    unsafe { mesh.post(*peer, 0, std::ptr::null(), 0, layout.slot(*slot) + ACK, v)? };
                }
                Ok(*age)
            }
        }
    }

    /// Whether the partner has made its `flushes`-th flush ([`Sender::say_done`]).
    pub fn partner_done(&self, mesh: &Mesh, layout: &Layout, flushes: u64) -> bool {
        let slot = match self {
            Receiver::Mapped { slot, .. } | Receiver::Posted { slot, .. } => *slot,
        };
        mesh.u64_at(mesh.me, layout.slot(slot) + DONE).load(Ordering::Acquire) >= flushes
    }

    /// The partner that writes this slot, when it posts from another host.
    pub fn posted_from(&self) -> Option<usize> {
        match self {
            Receiver::Posted { peer, .. } => Some(*peer),
            Receiver::Mapped { .. } => None,
        }
    }

    /// The data of the partial held (valid after [`Receiver::take`] returned an age > 0).
    pub fn data(&self, mesh: &Mesh, layout: &Layout) -> *const u8 {
        match self {
            Receiver::Mapped { slot, front } => unsafe { mesh.base(mesh.me).add(layout.buf(*slot, *front) + BUF_HDR) },
            Receiver::Posted { front, .. } => front.ptr(),
        }
    }
}
