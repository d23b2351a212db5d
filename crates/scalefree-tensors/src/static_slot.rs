//! Static placement: a receive buffer of fixed size in the receiver's region, written by the
//! sender with one one-sided write, then a sequence word (the data is visible before it).
//!
//! Layout, after the mesh header of each rank's region: for every spec this rank receives, a
//! 64-byte header (`seq`: messages written) and the buffer; for every spec this rank sends,
//! a 64-byte credit line (`released`: messages the receiver is done with), written by the
//! receiver. One message is in flight per slot: the sender waits for the credit of the
//! previous one before writing.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use scalefree_transport::mesh::{Mesh, MESH_HEADER};
use scalefree_transport::{Device, Error, Result};

use crate::Stats;

/// One slot: `src` sends `nbytes` at a time to `dst`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StaticSpec {
    pub src: u32,
    pub dst: u32,
    pub nbytes: u64,
}

/// This rank's end of a static slot.
pub struct StaticSlot {
    mesh: Arc<Mesh>,
    spec: StaticSpec,
    index: usize,
    sending: bool,
    /// Offset of the header (buffer at +64) in the receiver's region.
    hdr: usize,
    /// Offset of the credit line in the sender's region.
    credit: usize,
    /// Messages sent (sender) or taken (receiver), and released (receiver).
    count: u64,
    released: u64,
    stats: Arc<Stats>,
}

const HDR: usize = 64;

/// The same layout formulas on every rank: each slot's header (then its buffer) in the
/// receiver's region and its credit word in the sender's, and each rank's region size. Byte
/// offsets are 64-bit: a slot may carry more than 4 GiB.
fn layout(n: usize, specs: &[StaticSpec]) -> Result<(Vec<usize>, Vec<usize>, Vec<usize>)> {
    let mut cursor = vec![MESH_HEADER; n];
    let mut hdr = Vec::with_capacity(specs.len());
    let too_big = |i: usize| Error::InvalidArgument(format!("slot {i}: {} bytes do not fit this machine's address space", specs[i].nbytes));
    for (i, s) in specs.iter().enumerate() {
        let c = &mut cursor[s.dst as usize];
        hdr.push(*c);
        let size = usize::try_from(s.nbytes).ok().and_then(|b| b.checked_next_multiple_of(64)).ok_or_else(|| too_big(i))?;
        *c = c.checked_add(HDR + size).ok_or_else(|| too_big(i))?;
    }
    let mut credit = Vec::with_capacity(specs.len());
    for s in specs {
        let c = &mut cursor[s.src as usize];
        credit.push(*c);
        *c += 64;
    }
    Ok((hdr, credit, cursor))
}

impl StaticSlot {
    /// Collective: every rank passes the same specs; returns this rank's end of each spec
    /// (`None` where it is neither sender nor receiver).
    pub fn create(dev: &Device, specs: &[StaticSpec]) -> Result<Vec<Option<StaticSlot>>> {
        let n = dev.size();
        let me = dev.rank();
        let mut bytes = Vec::with_capacity(specs.len() * 16);
        for (i, s) in specs.iter().enumerate() {
            if s.src >= n || s.dst >= n {
                return Err(Error::InvalidArgument(format!("slot {i}: ranks {} -> {} outside a job of {n}", s.src, s.dst)));
            }
            if s.src == s.dst {
                return Err(Error::InvalidArgument(format!("slot {i}: rank {} cannot send to itself", s.src)));
            }
            bytes.extend_from_slice(&s.src.to_le_bytes());
            bytes.extend_from_slice(&s.dst.to_le_bytes());
            bytes.extend_from_slice(&s.nbytes.to_le_bytes());
        }
        crate::agree(dev, "static tensor slots", &bytes)?;
        let (hdr, credit, cursor) = layout(n as usize, specs)?;
        // Peers are reached only by posts (data, then a counter) and each rank reads only its
        // own region: works across hosts too.
        let mesh = Arc::new(Mesh::new_posting(dev, cursor[me as usize])?);
        Ok(specs
            .iter()
            .enumerate()
            .map(|(i, s)| {
                (s.src == me || s.dst == me).then(|| StaticSlot {
                    mesh: mesh.clone(),
                    spec: *s,
                    index: i,
                    sending: s.src == me,
                    hdr: hdr[i],
                    credit: credit[i],
                    count: 0,
                    released: 0,
                    stats: Arc::new(Stats::default()),
                })
            })
            .collect())
    }

    pub fn spec(&self) -> StaticSpec {
        self.spec
    }
    pub fn is_sender(&self) -> bool {
        self.sending
    }
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// The receiver's buffer (receiving end only).
    pub fn buffer(&self) -> *mut u8 {
        unsafe { self.mesh.base(self.mesh.me).add(self.hdr + HDR) }
    }

    /// Writes `data` (exactly the slot's size) into the receiver's buffer, after waiting for
    /// the receiver to release the previous message.
    pub fn send(&mut self, data: &[u8], timeout: Option<Duration>) -> Result<()> {
        if !self.sending {
            return Err(Error::InvalidArgument(format!("slot {}: this rank receives on it, it cannot send", self.index)));
        }
        if data.len() as u64 != self.spec.nbytes {
            return Err(Error::InvalidArgument(format!(
                "slot {}: {} bytes given, the slot carries {}",
                self.index,
                data.len(),
                self.spec.nbytes
            )));
        }
        let (mesh, me, dst) = (&*self.mesh, self.mesh.me, self.spec.dst as usize);
        let credit = mesh.u64_at(me, self.credit);
        let count = self.count;
        self.mesh.wait_for(timeout, &|| format!("rank {dst} to release slot {}", self.index), || credit.load(Ordering::Acquire) >= count)?;
        unsafe { mesh.post(dst, self.hdr + HDR, data.as_ptr(), data.len(), self.hdr, count + 1) }?;
        self.count += 1;
        self.stats.bytes_zero_copy.fetch_add(data.len() as u64, Ordering::Relaxed);
        self.stats.transfers.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Releases the message taken last, if it was not released yet (returns the credit).
    pub fn release(&mut self) {
        if self.released == self.count {
            return;
        }
        self.released = self.count;
        let src = self.spec.src as usize;
        // A credit back to the sender; a failure here (sender gone) shows at the next wait.
        let _ = unsafe { self.mesh.post(src, 0, std::ptr::null(), 0, self.credit, self.released) };
    }

    /// Releases the previous message and waits for the next one; returns the buffer that
    /// holds it (valid until the next `release` or `recv`).
    pub fn recv(&mut self, timeout: Option<Duration>) -> Result<*mut u8> {
        if self.sending {
            return Err(Error::InvalidArgument(format!("slot {}: this rank sends on it, it cannot receive", self.index)));
        }
        self.release();
        let me = self.mesh.me;
        let seq = self.mesh.u64_at(me, self.hdr);
        let want = self.count + 1;
        let src = self.spec.src;
        self.mesh.wait_for(timeout, &|| format!("a message from rank {src} on slot {}", self.index), || seq.load(Ordering::Acquire) >= want)?;
        self.count = want;
        self.stats.bytes_zero_copy.fetch_add(self.spec.nbytes, Ordering::Relaxed);
        self.stats.transfers.fetch_add(1, Ordering::Relaxed);
        Ok(self.buffer())
    }

    /// True if a message is waiting (receiving end).
    pub fn poll(&self) -> bool {
        !self.sending && self.mesh.u64_at(self.mesh.me, self.hdr).load(Ordering::Acquire) > self.count
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Slots of more than 4 GiB: headers, buffers and credits past 2^32 bytes, nothing wraps.
    #[test]
    fn layout_offsets_past_4_gib() {
        let big = (5u64 << 30) + 3;
        let specs = [
            StaticSpec { src: 0, dst: 1, nbytes: big },
            StaticSpec { src: 2, dst: 1, nbytes: big },
            StaticSpec { src: 1, dst: 0, nbytes: 1 },
            StaticSpec { src: 0, dst: 1, nbytes: 0 },
        ];
        let (hdr, credit, cursor) = layout(3, &specs).unwrap();
        let slot = HDR + ((5usize << 30) + 64);
        assert_eq!(hdr, vec![MESH_HEADER, MESH_HEADER + slot, MESH_HEADER, MESH_HEADER + 2 * slot]);
        assert!(hdr[3] > u32::MAX as usize);
        assert_eq!(cursor[1], MESH_HEADER + 2 * slot + HDR + 64);
        assert_eq!(credit, vec![MESH_HEADER + HDR + 64, MESH_HEADER, cursor[1] - 64, MESH_HEADER + HDR + 64 + 64]);
        assert_eq!(cursor, vec![MESH_HEADER + HDR + 64 + 128, cursor[1], MESH_HEADER + 64]);
        let huge = [StaticSpec { src: 0, dst: 1, nbytes: u64::MAX - 10 }];
        assert!(layout(2, &huge).unwrap_err().to_string().contains("slot 0"));
    }
}
