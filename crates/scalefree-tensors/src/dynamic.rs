//! Dynamic placement: shapes that change from message to message.
//!
//! The sender writes a fixed-size metadata record into a slot the receiver preallocated
//! (ndim, shape, dtype, the region handle and offset of its data), then a sequence word. The
//! receiver allocates a destination, pulls the data with a one-sided read and writes an ack
//! into the sender's region: from then on the sender may reuse the source. Data that is not
//! in registered memory (a region or the arena) goes through a registered staging buffer:
//! one copy, counted in [`Stats::bytes_copied`].
//!
//! Record and ack travel as mesh posts (the data, then the word), so nothing of a peer needs
//! to be mapped: across hosts the record carries the packed UCX remote key of the data's
//! region and the receiver pulls with a UCX get.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use scalefree_transport::mesh::{Mesh, MESH_HEADER};
use scalefree_transport::{Device, Error, Region, RegionHandle, RemoteRegion, Result};

use crate::Stats;

/// Most dimensions a record carries.
pub const MAX_NDIM: usize = 32;

/// What a dynamic message holds: a dtype code and item size the caller chose, and a shape.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Meta {
    pub dtype: u32,
    pub itemsize: u32,
    pub shape: Vec<u64>,
}

impl Meta {
    pub fn nbytes(&self) -> Result<u64> {
        self.shape
            .iter()
            .try_fold(self.itemsize as u64, |a, &d| a.checked_mul(d))
            .ok_or_else(|| Error::InvalidArgument(format!("shape {:?} overflows 64 bits", self.shape)))
    }
}

// Record layout (in the receiver's region).
const REC_SEQ: usize = 0;
const REC_NDIM: usize = 8;
const REC_DTYPE: usize = 12;
const REC_ITEMSIZE: usize = 16;
const REC_NBYTES: usize = 24;
const REC_OFFSET: usize = 32;
const REC_HANDLE: usize = 40;
const REC_RKEY_LEN: usize = 80;
const REC_SHAPE: usize = 128;
const REC_RKEY: usize = REC_SHAPE + MAX_NDIM * 8;
/// Largest packed remote key a record carries (UCX packs a few dozen bytes per transport).
const MAX_RKEY: usize = 1024;
const REC_LEN: usize = REC_RKEY + MAX_RKEY;

/// This rank's end of a dynamic channel from `src` to `dst`.
pub struct DynamicChannel {
    dev: Device,
    mesh: Arc<Mesh>,
    src: u32,
    dst: u32,
    index: usize,
    rec: usize,
    ack: usize,
    count: u64,
    /// Sender: the region the last message's data lives in, kept alive until it is pulled.
    in_flight: Option<Region>,
    staging: Option<Region>,
    /// Receiver: the sender's region the last message came from, kept attached (a sender
    /// sends from the same staging region or arena again and again).
    source: Option<RemoteRegion>,
    /// Receiver: the record of the message being received.
    pending: Option<(Meta, u64, Option<Vec<u8>>, u64)>,
    stats: Arc<Stats>,
}

impl DynamicChannel {
    /// Collective: every rank passes the same `(src, dst)` pairs; returns this rank's end of
    /// each (`None` where it is not involved).
    pub fn create(dev: &Device, pairs: &[(u32, u32)]) -> Result<Vec<Option<DynamicChannel>>> {
        let n = dev.size();
        let me = dev.rank();
        let mut bytes = Vec::new();
        for (i, &(s, d)) in pairs.iter().enumerate() {
            if s >= n || d >= n || s == d {
                return Err(Error::InvalidArgument(format!("channel {i}: {s} -> {d} is not a pair of distinct ranks of {n}")));
            }
            bytes.extend_from_slice(&s.to_le_bytes());
            bytes.extend_from_slice(&d.to_le_bytes());
        }
        crate::agree(dev, "dynamic tensor channels", &bytes)?;
        let mut cursor = vec![MESH_HEADER; n as usize];
        let mut rec = Vec::new();
        let mut ack = Vec::new();
        for &(s, d) in pairs {
            rec.push(cursor[d as usize]);
            cursor[d as usize] += REC_LEN;
            ack.push(cursor[s as usize]);
            cursor[s as usize] += 64;
        }
        let mesh = Arc::new(Mesh::new_posting(dev, cursor[me as usize])?);
        Ok(pairs
            .iter()
            .enumerate()
            .map(|(i, &(s, d))| {
                (s == me || d == me).then(|| DynamicChannel {
                    dev: dev.clone(),
                    mesh: mesh.clone(),
                    src: s,
                    dst: d,
                    index: i,
                    rec: rec[i],
                    ack: ack[i],
                    count: 0,
                    in_flight: None,
                    staging: None,
                    source: None,
                    pending: None,
                    stats: Arc::new(Stats::default()),
                })
            })
            .collect())
    }

    pub fn is_sender(&self) -> bool {
        self.src == self.dev.rank()
    }
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// Waits until the receiver has pulled every message sent so far (their sources may
    /// then be reused).
    pub fn wait_sent(&mut self, timeout: Option<Duration>) -> Result<()> {
        let a = self.mesh.u64_at(self.mesh.me, self.ack);
        let count = self.count;
        let dst = self.dst;
        self.mesh.wait_for(timeout, &|| format!("rank {dst} to pull message {count} of channel {}", self.index), || {
            a.load(Ordering::Acquire) >= count
        })?;
        self.in_flight = None;
        Ok(())
    }

    /// Sends `meta.nbytes()` bytes at `data`. Returns once the record is written, with
    /// whether the data went through the staging copy (it was not in registered memory);
    /// the source must stay unchanged until [`DynamicChannel::wait_sent`] (the next `send`
    /// waits for it first).
    ///
    /// # Safety
    /// `data..data+nbytes` must be readable and stay valid until the message is pulled.
    pub unsafe fn send(&mut self, data: *const u8, meta: &Meta, timeout: Option<Duration>) -> Result<bool> {
        if !self.is_sender() {
            return Err(Error::InvalidArgument(format!("channel {}: this rank receives on it, it cannot send", self.index)));
        }
        if meta.shape.len() > MAX_NDIM {
            return Err(Error::InvalidArgument(format!("{} dimensions; at most {MAX_NDIM} are supported", meta.shape.len())));
        }
        let nbytes = meta.nbytes()?;
        self.wait_sent(timeout)?;
        let mut staged = false;
        let (handle, offset) = if nbytes == 0 {
            (None, 0)
        } else if let Some((region, off)) = self.dev.find_region(data, nbytes as usize) {
            self.stats.bytes_zero_copy.fetch_add(nbytes, Ordering::Relaxed);
            let h = region.serialized();
            self.in_flight = Some(region);
            (Some(h), off as u64)
        } else {
            let need = nbytes as usize;
            if self.staging.as_ref().is_none_or(|s| s.len() < need) {
                self.staging = Some(self.dev.alloc_region(need.next_power_of_two().max(4096))?);
            }
            let st = self.staging.as_ref().unwrap();
            unsafe { std::ptr::copy_nonoverlapping(data, st.as_ptr(), need) };
            self.stats.bytes_copied.fetch_add(nbytes, Ordering::Relaxed);
            staged = true;
            (Some(st.serialized()), 0)
        };
        let dst = self.dst as usize;
        let mut rec = [0u8; REC_LEN];
        rec[REC_NDIM..REC_NDIM + 4].copy_from_slice(&(meta.shape.len() as u32).to_le_bytes());
        rec[REC_DTYPE..REC_DTYPE + 4].copy_from_slice(&meta.dtype.to_le_bytes());
        rec[REC_ITEMSIZE..REC_ITEMSIZE + 4].copy_from_slice(&meta.itemsize.to_le_bytes());
        rec[REC_NBYTES..REC_NBYTES + 8].copy_from_slice(&nbytes.to_le_bytes());
        rec[REC_OFFSET..REC_OFFSET + 8].copy_from_slice(&offset.to_le_bytes());
        if let Some(h) = handle {
            let (h, rkey) = h.split_at(RegionHandle::BYTES);
            if rkey.len() > MAX_RKEY {
                return Err(Error::Unsupported(format!("a packed remote key of {} bytes (at most {MAX_RKEY} fit a record)", rkey.len())));
            }
            rec[REC_HANDLE..REC_HANDLE + RegionHandle::BYTES].copy_from_slice(h);
            rec[REC_RKEY_LEN..REC_RKEY_LEN + 4].copy_from_slice(&(rkey.len() as u32).to_le_bytes());
            rec[REC_RKEY..REC_RKEY + rkey.len()].copy_from_slice(rkey);
        }
        for (k, d) in meta.shape.iter().enumerate() {
            rec[REC_SHAPE + 8 * k..REC_SHAPE + 8 * k + 8].copy_from_slice(&d.to_le_bytes());
        }
        // Everything but the sequence word (and the unused end of the key area), then the
        // sequence word.
        let used = REC_RKEY + handle_len(&rec);
        self.count += 1;
        unsafe { self.mesh.post(dst, self.rec + 8, rec[8..].as_ptr(), used - 8, self.rec + REC_SEQ, self.count) }?;
        self.stats.transfers.fetch_add(1, Ordering::Relaxed);
        Ok(staged)
    }

    /// Waits for the next message's record and returns what it holds; then call
    /// [`DynamicChannel::recv_into`] with a destination of `meta.nbytes()` bytes.
    pub fn recv_meta(&mut self, timeout: Option<Duration>) -> Result<Meta> {
        if self.is_sender() {
            return Err(Error::InvalidArgument(format!("channel {}: this rank sends on it, it cannot receive", self.index)));
        }
        if let Some((m, ..)) = &self.pending {
            return Ok(m.clone());
        }
        let me = self.mesh.me;
        let seq = self.mesh.u64_at(me, self.rec + REC_SEQ);
        let want = self.count + 1;
        let src = self.src;
        self.mesh.wait_for(timeout, &|| format!("a message from rank {src} on channel {}", self.index), || {
            seq.load(Ordering::Acquire) >= want
        })?;
        let rec = unsafe { std::slice::from_raw_parts(self.mesh.base(me).add(self.rec), REC_LEN) };
        let u32_at = |o: usize| u32::from_le_bytes(rec[o..o + 4].try_into().unwrap());
        let u64_at = |o: usize| u64::from_le_bytes(rec[o..o + 8].try_into().unwrap());
        let ndim = u32_at(REC_NDIM) as usize;
        if ndim > MAX_NDIM {
            return Err(Error::InvalidArgument(format!("channel {}: a record with {ndim} dimensions", self.index)));
        }
        let meta = Meta { dtype: u32_at(REC_DTYPE), itemsize: u32_at(REC_ITEMSIZE), shape: (0..ndim).map(|k| u64_at(REC_SHAPE + 8 * k)).collect() };
        let nbytes = u64_at(REC_NBYTES);
        if meta.nbytes()? != nbytes {
            return Err(Error::InvalidArgument(format!("channel {}: the record's shape and byte count disagree", self.index)));
        }
        let handle = if nbytes == 0 {
            None
        } else {
            let h = RegionHandle::from_bytes(&rec[REC_HANDLE..REC_HANDLE + RegionHandle::BYTES])?;
            if h.owner != self.src {
                return Err(Error::InvalidArgument(format!(
                    "channel {}: the record names a region of rank {}, not of the sender {}",
                    self.index, h.owner, self.src
                )));
            }
            let k = handle_len(rec);
            if k > MAX_RKEY {
                return Err(Error::InvalidArgument(format!("channel {}: a record with a {k}-byte remote key", self.index)));
            }
            let mut b = rec[REC_HANDLE..REC_HANDLE + RegionHandle::BYTES].to_vec();
            b.extend_from_slice(&rec[REC_RKEY..REC_RKEY + k]);
            Some(b)
        };
        self.pending = Some((meta.clone(), nbytes, handle, u64_at(REC_OFFSET)));
        Ok(meta)
    }

    /// Pulls the pending message into `dst` (its `nbytes`) and acknowledges it.
    ///
    /// # Safety
    /// `dst..dst+nbytes` must be writable.
    pub unsafe fn recv_into(&mut self, dst: *mut u8, len: usize) -> Result<()> {
        let Some((_, nbytes, handle, offset)) = self.pending.take() else {
            return Err(Error::InvalidArgument(format!("channel {}: no message is pending (call recv_meta first)", self.index)));
        };
        if len as u64 != nbytes {
            self.pending = Some((Meta { dtype: 0, itemsize: 1, shape: vec![nbytes] }, nbytes, handle, offset));
            return Err(Error::InvalidArgument(format!("channel {}: destination has {len} bytes, the message {nbytes}", self.index)));
        }
        if let Some(handle) = handle {
            let h = RegionHandle::from_bytes(&handle[..RegionHandle::BYTES])?;
            let remote = match self.source.take() {
                Some(r) if r.handle == h => r,
                _ => self.dev.attach_serialized(&handle)?,
            };
            if offset.checked_add(nbytes).is_none_or(|e| e > remote.len() as u64) {
                return Err(Error::InvalidArgument(format!("channel {}: the record points outside the sender's region", self.index)));
            }
            let ch = &self.mesh.chans[self.src as usize];
            unsafe { ch.read_into(&remote, offset as usize, dst, nbytes as usize)? };
            self.source = Some(remote);
        }
        self.count += 1;
        let none = std::ptr::NonNull::<u8>::dangling().as_ptr();
        unsafe { self.mesh.post(self.src as usize, self.ack, none, 0, self.ack, self.count) }?;
        self.stats.bytes_zero_copy.fetch_add(nbytes, Ordering::Relaxed);
        self.stats.transfers.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

/// Length of the packed remote key a record carries.
fn handle_len(rec: &[u8]) -> usize {
    u32::from_le_bytes(rec[REC_RKEY_LEN..REC_RKEY_LEN + 4].try_into().unwrap()) as usize
}
