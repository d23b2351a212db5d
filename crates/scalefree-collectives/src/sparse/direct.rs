//! The reduce after `config` when the butterfly is one layer on shared memory (what `auto`
//! picks on one host): values only, pulled by saved maps, two synchronisations per call.
//!
//! `config` composes every map of the general path into one pair per member (see
//! [`Direct::build`]), so a reduce is:
//!
//! 1. one header exchange with every rank (the call's agreement rides in it: op, dtype,
//!    width and every rank's input check, so bad input raises on every rank before any data
//!    moves). Each rank's header exposes its values where they are — the caller's buffer
//!    when it lies in a registered region (the arena) and the indices have no duplicates,
//!    else a key-ordered copy in a region of its own — and carries the handle of its
//!    accumulator;
//! 2. down: each rank fills its accumulator (the keys of its range, plus one row holding
//!    the identity for keys nobody contributed) and combines into it, straight from every
//!    member's mapped values, the rows that member holds in its range:
//!    `acc[acc_rows[i]] op= values_j[caller_rows[i]]`; then it raises its progress word;
//! 3. up: for every member, once its accumulator is complete, this rank copies what it
//!    requested from it straight into the caller's result: `out[out_rows[i]] =
//!    acc_j[owner_rows[i]]`.
//!
//! No key is compared, nothing is allocated once warm, and no value is copied other than
//! by these two passes (plus the key-ordered copy when the values cannot be read in place).
//! Safety of the buffers without a closing barrier: a rank leaves the call only after every
//! member's accumulator is complete, i.e. after every member has read its values; and it
//! writes its accumulator again only after the next call's header exchange, i.e. after
//! every member has left this call (and so has read it).

use std::time::Instant;

use scalefree_transport::{Error, Region, RegionHandle, RemoteRegion, Result};

use crate::comm::{Communicator, Header, Kind};
use crate::reduce::DType;
use crate::sparse::butterfly::{round, LayerStats};
use crate::sparse::kernels::{combine_rows, copy_rows, fill_identity, gather, scatter, RowMap, SDType, SOp};
use crate::Algorithm;

/// Round tag of the direct reduce (other sparse rounds use `layer << 2 | phase`, phase < 3).
const TAG: u32 = 0x00d1_ec73;

/// Words of the per-call payload: error flag, call, dim, op, dtype, width (agreed), where
/// this rank's values are (0 caller buffer, 1 key-ordered copy), then the accumulator's
/// handle.
const AGREED: usize = 6;
const PAYLOAD_WORDS: usize = AGREED + 1 + RegionHandle::BYTES.div_ceil(8);

/// What this rank pulls from one member (by its digit in the layer).
struct Pull {
    /// Down: rows of this rank's accumulator that the member's slice lands in.
    acc_rows: RowMap,
    /// Down: where those rows are in the member's caller buffer (None: the member has
    /// duplicate indices and always sends a key-ordered copy).
    caller_rows: Option<RowMap>,
    /// Down: the same rows in the member's key-ordered copy (a run).
    copy_rows: RowMap,
    /// Up: positions in this rank's result and the member's accumulator rows they read.
    out_rows: RowMap,
    owner_rows: RowMap,
}

/// The saved plan of the direct reduce (built by `config` on one host, one layer).
pub(crate) struct Direct {
    members: Vec<u32>,
    digit: usize,
    pulls: Vec<Pull>,
    /// Rows of this rank's accumulator: its reduced keys, then the identity row.
    acc_rows: usize,
    /// This rank's caller values into key order (when they cannot be read in place).
    key_src: Option<Vec<usize>>,
    key_perm: Vec<usize>,
    keys_out: usize,
    /// Rows other ranks read from this rank per call (down, up) and their messages.
    rows_read_down: usize,
    rows_read_up: usize,
    messages: u64,
    max_rows: usize,
    acc: Option<Region>,
    copy: Option<Region>,
    /// Every rank's payload of the current call, and every member's accumulator.
    words: Vec<u64>,
    peer_accs: Vec<Option<RemoteRegion>>,
    /// Members whose accumulator this rank has yet to read (kept between calls).
    pending: Vec<usize>,
}

fn read_u32s(p: *const u8, at: usize, n: usize) -> impl ExactSizeIterator<Item = usize> {
    (0..n).map(move |i| unsafe { std::ptr::read_unaligned((p as *const u32).add(at + i)) } as usize)
}

impl Direct {
    /// Collective (one round): composes this rank's maps of the one-layer butterfly with its
    /// members'. Each member `j` sends this rank, for the keys of its slice in this rank's
    /// range, where they sit in its caller buffer (`out_src`), and, for the keys this rank
    /// requested in its own range, which row of its accumulator holds them (its in-map of
    /// this rank through its `bottom` map).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn build(
        c: &mut Communicator,
        dim: u64,
        members: &[u32],
        digit: usize,
        out_split: &[usize],
        out_maps: &[Vec<usize>],
        out_after: usize,
        in_split: &[usize],
        in_maps: &[Vec<usize>],
        bottom: &[usize],
        out_src: Option<&[usize]>,
        out_perm: &[usize],
        in_pos: &[usize],
        scratch: &mut Vec<u64>,
    ) -> Result<Direct> {
        let k = members.len();
        let nl = c.size() as usize;
        let identity_row = out_after;
        // Message to member j: [has_src, slice start, n_src, n_up] as u32, then the caller
        // positions of my keys in j's range, then j's requested keys' rows of my accumulator.
        let mut metas = vec![[0u64; 4]; nl];
        let mut words = 0usize;
        for j in 0..k {
            let n_src = if out_src.is_some() { out_split[j + 1] - out_split[j] } else { 0 };
            let n = 4 + n_src + in_maps[j].len();
            metas[members[j] as usize] = [(words * 4) as u64, n_src as u64, in_maps[j].len() as u64, (n * 4) as u64];
            words += n.next_multiple_of(2);
        }
        let mut buf = vec![0u32; words];
        for j in 0..k {
            let m = metas[members[j] as usize];
            let at = m[0] as usize / 4;
            let (n_src, n_up) = (m[1] as usize, m[2] as usize);
            buf[at..at + 4].copy_from_slice(&[out_src.is_some() as u32, out_split[j] as u32, n_src as u32, n_up as u32]);
            if let Some(src) = out_src {
                for (d, &s) in buf[at + 4..at + 4 + n_src].iter_mut().zip(&src[out_split[j]..out_split[j + 1]]) {
                    *d = s as u32;
                }
            }
            for (d, &r) in buf[at + 4 + n_src..at + 4 + n_src + n_up].iter_mut().zip(&in_maps[j]) {
                let b = bottom[r];
                *d = if b == crate::sparse::kernels::NONE { identity_row as u32 } else { b as u32 };
            }
        }
        let mut pulls = Vec::with_capacity(k);
        let mut owner_of_slot: Vec<(usize, RowMap)> = Vec::with_capacity(k);
        let mut st = LayerStats::default();
        unsafe {
            round(c, None, dim, TAG, members, digit, buf.as_ptr() as *const u8, buf.len() * 4, &metas, &mut st, scratch, &mut |j, m, fetch| {
                let nb = m[3] as usize;
                let p = fetch(m[0] as usize, nb)?;
                let head: Vec<usize> = read_u32s(p, 0, 4).collect();
                let (has_src, start, n_src, n_up) = (head[0] != 0, head[1], head[2], head[3]);
                let n_rows = out_maps[j].len();
                if (has_src && n_src != n_rows) || n_up != in_split[j + 1] - in_split[j] {
                    return Err(Error::Mismatch(format!(
                        "sparse_allreduce config: member {j} sent {n_src} rows / {n_up} answers where this rank expects {n_rows} / {}",
                        in_split[j + 1] - in_split[j]
                    )));
                }
                pulls.push((j, has_src.then(|| RowMap::from_positions(read_u32s(p, 4, n_src))), start, n_rows));
                owner_of_slot.push((j, RowMap::from_positions(read_u32s(p, 4 + n_src, n_up))));
                Ok(())
            })?;
        }
        // Up: for each caller position, its owner and the owner's row.
        let mut answers: Vec<Option<RowMap>> = (0..k).map(|_| None).collect();
        for (j, r) in owner_of_slot {
            answers[j] = Some(r);
        }
        let mut out_pos: Vec<Vec<usize>> = vec![Vec::new(); k];
        let mut owner_pos: Vec<Vec<usize>> = vec![Vec::new(); k];
        for (p, &slot) in in_pos.iter().enumerate() {
            let j = in_split.partition_point(|&b| b <= slot) - 1;
            let ans = answers[j].as_ref().unwrap();
            let i = slot - in_split[j];
            out_pos[j].push(p);
            owner_pos[j].push(match ans {
                RowMap::Contig { start, .. } => start + i,
                RowMap::Idx(v) => v[i] as usize,
            });
        }
        let mut by_j: Vec<Option<Pull>> = (0..k).map(|_| None).collect();
        for (j, caller_rows, start, n_rows) in pulls {
            by_j[j] = Some(Pull {
                acc_rows: RowMap::from_positions(out_maps[j].iter().copied()),
                caller_rows,
                copy_rows: RowMap::Contig { start, len: n_rows },
                out_rows: RowMap::from_positions(std::mem::take(&mut out_pos[j]).into_iter()),
                owner_rows: RowMap::from_positions(std::mem::take(&mut owner_pos[j]).into_iter()),
            });
        }
        let pulls: Vec<Pull> = by_j.into_iter().map(|p| p.expect("every member answered")).collect();
        let others = (0..k).filter(|&j| j != digit);
        let rows_read_down = others.clone().map(|j| out_split[j + 1] - out_split[j]).sum();
        let rows_read_up = others.clone().map(|j| in_maps[j].len()).sum();
        let messages = others.clone().map(|j| (out_split[j + 1] > out_split[j]) as u64 + (!in_maps[j].is_empty()) as u64).sum();
        let max_rows = others.map(|j| (out_split[j + 1] - out_split[j]).max(in_maps[j].len())).max().unwrap_or(0);
        Ok(Direct {
            members: members.to_vec(),
            digit,
            pulls,
            acc_rows: out_after + 1,
            key_src: out_src.map(|s| s.to_vec()),
            key_perm: out_perm.to_vec(),
            keys_out: *out_split.last().unwrap_or(&0),
            rows_read_down,
            rows_read_up,
            messages,
            max_rows,
            acc: None,
            copy: None,
            words: Vec::new(),
            peer_accs: Vec::new(),
            pending: Vec::new(),
        })
    }

    /// Collective: one reduce (see module docs). `err` is this rank's input check, agreed
    /// with every rank before any data moves.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn reduce(
        &mut self,
        c: &mut Communicator,
        dim: u64,
        op: SOp,
        err: Option<String>,
        vals: &[u8],
        in_vals: &mut [u8],
        dt: SDType,
        w: usize,
        st: &mut LayerStats,
    ) -> Result<()> {
        let t0 = Instant::now();
        let es = dt.size_bytes();
        let rb = es * w;
        let me = c.rank() as usize;
        let n = c.size() as usize;
        // Where peers read this rank's values: in place, or a key-ordered copy.
        let in_place = err.is_none()
            && self.key_src.is_some()
            && (vals.as_ptr() as usize).is_multiple_of(es)
            && (vals.is_empty() || c.device().find_region(vals.as_ptr(), vals.len()).is_some());
        if err.is_none() {
            let acc_bytes = (self.acc_rows * rb).next_multiple_of(8).max(8);
            if self.acc.as_ref().is_none_or(|r| r.len() < acc_bytes) {
                self.acc = Some(c.device().alloc_region(acc_bytes)?);
            }
            if !in_place {
                let copy_bytes = (self.keys_out * rb).next_multiple_of(8).max(8);
                if self.copy.as_ref().is_none_or(|r| r.len() < copy_bytes) {
                    self.copy = Some(c.device().alloc_region(copy_bytes)?);
                }
                let dst = self.copy.as_ref().unwrap().as_ptr();
                unsafe {
                    match &self.key_src {
                        Some(src) => gather(dt, op, dst, vals.as_ptr(), src, w),
                        None => {
                            fill_identity(dt, op, dst, self.keys_out * w);
                            scatter(dt, op, dst, vals.as_ptr(), &self.key_perm, w);
                        }
                    }
                }
            }
        }
        let mut payload = [0u64; PAYLOAD_WORDS];
        payload[..AGREED].copy_from_slice(&[err.is_some() as u64, 2, dim, op as u64, dt as u64, w as u64]);
        payload[AGREED] = (!in_place) as u64;
        if let Some(acc) = &self.acc {
            let h = acc.handle().to_bytes();
            unsafe { std::ptr::copy_nonoverlapping(h.as_ptr(), payload[AGREED + 1..].as_mut_ptr() as *mut u8, h.len()) };
        }
        let mut hdr = Header::new(Kind::Sparse, DType::U8, None, dim as usize, TAG, Algorithm::Auto);
        let (src, src_bytes) = match (&self.copy, in_place) {
            (_, true) => (vals.as_ptr(), vals.len()),
            (Some(r), false) if err.is_none() => (r.as_ptr() as *const u8, self.keys_out * rb),
            _ => (std::ptr::null(), 0),
        };
        if src_bytes > 0 {
            c.expose(&mut hdr, src, src_bytes);
        }
        let tp = Instant::now();
        let headers = c.post(hdr, &|_| (payload.as_ptr() as *const u8, PAYLOAD_WORDS * 8))?;
        st.wait_ns += tp.elapsed().as_nanos() as u64;
        // Every rank's payload, copied out of the inboxes (kept between calls).
        self.words.resize(n * PAYLOAD_WORDS, 0);
        for r in 0..n {
            let dst = &mut self.words[r * PAYLOAD_WORDS..(r + 1) * PAYLOAD_WORDS];
            if r == me {
                dst.copy_from_slice(&payload);
            } else {
                let p = c.inbox_payload(r as u32) as *const u64;
                for (i, x) in dst.iter_mut().enumerate() {
                    *x = unsafe { std::ptr::read_unaligned(p.add(i)) };
                }
            }
        }
        let words = std::mem::take(&mut self.words);
        let word = |r: usize, i: usize| -> u64 { words[r * PAYLOAD_WORDS + i] };
        // The agreement, as `SparseAllreduce::agree` words it.
        if let Some(e) = err {
            return Err(Error::InvalidArgument(e));
        }
        if let Some(r) = (0..n).find(|&r| word(r, 0) != 0) {
            return Err(Error::InvalidArgument(format!("rank {r} passed invalid input to sparse_allreduce (see its error)")));
        }
        let describe = |r: usize| {
            let dt = SDType::from_u32(word(r, 4) as u32).map(|d| d.name()).unwrap_or("-");
            let op = SOp::from_u32(word(r, 3) as u32).map(|o| o.name()).unwrap_or("?");
            format!("sparse_allreduce.reduce(dim={}, op={op}, dtype={dt}, width={})", word(r, 2), word(r, 5))
        };
        if let Some(r) = (1..n).find(|&r| (1..AGREED).any(|i| word(r, i) != word(0, i))) {
            return Err(Error::Mismatch(format!("rank 0 called {} but rank {r} called {}", describe(0), describe(r))));
        }
        let exposed = c.resolve(&headers)?;
        // Every member's accumulator is mapped now, before this rank's own is complete: its
        // owner cannot leave the call (nor free it) before then, and the mapping outlives it.
        let mut accs = std::mem::take(&mut self.peer_accs);
        accs.clear();
        for &q in &self.members {
            let q = q as usize;
            if q == me {
                accs.push(None);
                continue;
            }
            let mut h = [0u8; RegionHandle::BYTES];
            for (b, x) in h.chunks_mut(8).enumerate() {
                x.copy_from_slice(&word(q, AGREED + 1 + b).to_ne_bytes()[..x.len()]);
            }
            accs.push(Some(c.device().attach(&RegionHandle::from_bytes(&h)?)?));
        }
        let accp = self.acc.as_ref().unwrap().as_ptr();
        // Down: my accumulator from every member's values, mine first.
        let k = self.members.len();
        let mut compute_ns = 0u64;
        let tc = Instant::now();
        unsafe { fill_identity(dt, op, accp, self.acc_rows * w) };
        for i in 0..k {
            let j = (self.digit + i) % k;
            let q = self.members[j] as usize;
            let pull = &self.pulls[j];
            if pull.acc_rows.is_empty() {
                continue;
            }
            let base = if q == me {
                src
            } else {
                let e = exposed[q].as_ref().ok_or_else(|| Error::Mismatch(format!("rank {q} announced values but exposed none")))?;
                let p = e.remote.mapped_ptr().ok_or_else(|| Error::Unsupported(format!("rank {q}'s values are not mapped here")))?;
                unsafe { p.add(e.offset) as *const u8 }
            };
            let rows = if word(q, AGREED) == 0 {
                pull.caller_rows.as_ref().ok_or_else(|| Error::Mismatch(format!("rank {q} sent its values in place but has duplicate indices")))?
            } else {
                &pull.copy_rows
            };
            unsafe { combine_rows(dt, op, accp, &pull.acc_rows, base, rows, w) };
        }
        compute_ns += tc.elapsed().as_nanos() as u64;
        c.publish_progress(1);
        // Up: what I requested, from every member's accumulator once complete, taking
        // members in the order they finish (a descheduled one does not hold up the rest).
        // My own part comes first, unless my result overlaps my values (peers may still
        // be reading them): then it waits for every member like the rest.
        let out = in_vals.as_mut_ptr();
        let overlaps = (out as usize) < vals.as_ptr() as usize + vals.len() && (vals.as_ptr() as usize) < out as usize + in_vals.len();
        let mut pending = std::mem::take(&mut self.pending);
        pending.clear();
        pending.extend((1..k).map(|i| (self.digit + i) % k));
        let mut own_done = false;
        loop {
            let j = if !own_done && !overlaps {
                self.digit
            } else if let Some(at) = pending.iter().position(|&j| c.progress_reached(self.members[j], 1)) {
                pending.swap_remove(at)
            } else if let Some(&j) = pending.first() {
                let tw = Instant::now();
                c.wait_progress(self.members[j], 1)?;
                st.wait_ns += tw.elapsed().as_nanos() as u64;
                continue;
            } else if !own_done {
                self.digit
            } else {
                break;
            };
            let pull = &self.pulls[j];
            let accq = if j == self.digit {
                own_done = true;
                accp as *const u8
            } else {
                // Every member is waited for, even one this rank requests nothing from:
                // it may still be reading this rank's values until its accumulator is complete.
                if pull.out_rows.is_empty() {
                    continue;
                }
                let q = self.members[j];
                let remote = accs[j].as_ref().expect("attached above");
                remote.mapped_ptr().ok_or_else(|| Error::Unsupported(format!("rank {q}'s accumulator is not mapped here")))? as *const u8
            };
            let tc = Instant::now();
            unsafe { copy_rows(dt, out, &pull.out_rows, accq, &pull.owner_rows, w) };
            compute_ns += tc.elapsed().as_nanos() as u64;
        }
        self.pending = pending;
        st.degree = k;
        st.bytes_sent = ((self.rows_read_down + self.rows_read_up) * rb) as u64;
        st.messages = self.messages;
        st.max_packet = (self.max_rows * rb) as u64;
        st.merge_ns = compute_ns + (tp - t0).as_nanos() as u64;
        st.wait_ns = (t0.elapsed().as_nanos() as u64).saturating_sub(st.merge_ns);
        self.words = words;
        self.peer_accs = accs;
        Ok(())
    }
}
