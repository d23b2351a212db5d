//! The reduce after `config` when the butterfly is one layer on shared memory (what `auto`
//! picks on one host): values only, pulled by saved maps, two synchronisations per call.
//!
//! `config` composes every map of the general path into one pair per member (see
//! [`Direct::build`]). There the owner of each key range also finds the keys that one rank
//! alone contributes and no other rank requests: those are private to that rank, which
//! reads their results from its own values, and nothing of them moves (in a power-law
//! workload most of the tail is private). A reduce is then:
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
//!    acc_j[owner_rows[i]]`; and its private keys from its own values.
//!
//! No key is compared, no buffer is allocated once warm (the header exchange keeps a few
//! small vectors), and no value is copied other than by these two passes (plus the
//! key-ordered copy when the values cannot be read in place).
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
    /// Down: rows of this rank's accumulator that rows of the member's slice land in.
    acc_rows: RowMap,
    /// Down: where those rows are in the member's caller buffer (None: the member has
    /// duplicate indices and always sends a key-ordered copy).
    caller_rows: Option<RowMap>,
    /// Down: the same rows in the member's key-ordered copy.
    copy_rows: RowMap,
    /// Up: positions in this rank's result and the member's accumulator rows they read.
    out_rows: RowMap,
    owner_rows: RowMap,
}

/// An answer of the config round: the key is private to the asking rank (it alone
/// contributes it and no other rank requests it), so the asker reads it from its own values
/// (low bits: the key's place in the asker's slice for this owner) and nothing moves.
const PRIVATE: u32 = 1 << 31;

/// The saved plan of the direct reduce (built by `config` on one host, one layer).
pub(crate) struct Direct {
    members: Vec<u32>,
    digit: usize,
    pulls: Vec<Pull>,
    /// Keys private to this rank, read from its own values: result positions, and where
    /// the values are in the caller's buffer (None: duplicate indices) and in key order.
    local_out: RowMap,
    local_caller: Option<RowMap>,
    local_key: RowMap,
    /// Rows of this rank's accumulator: the reduced keys some other rank takes part in,
    /// then the identity row.
    acc_rows: usize,
    /// This rank's caller values into key order (when they cannot be read in place).
    key_src: Option<Vec<usize>>,
    key_perm: Vec<usize>,
    keys_out: usize,
    /// Rows this rank reads from other ranks per call (down and up), and messages.
    rows_read: usize,
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
    /// members'. As the owner of a key range, this rank first sorts its reduced keys: a key
    /// that one member alone contributes and no other member requests is private to that
    /// member (it never moves); a key nobody requests is dropped; the others get a row of
    /// the accumulator, in key order. Then each member `j` sends this rank, for the keys of
    /// its slice in this rank's range, where they sit in its caller buffer (`out_src`), and,
    /// for the keys this rank requested in `j`'s range, the accumulator row holding each
    /// (the identity row for keys nobody contributed) or `PRIVATE` with its place.
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
        const NOBODY: u32 = u32::MAX;
        const SEVERAL: u32 = u32::MAX - 1;
        // Per reduced key of my range: its contributor (or several) and that contributor's
        // place for it, and its requester (or several, or nobody).
        let mut contributor = vec![NOBODY; out_after];
        let mut place = vec![0u32; out_after];
        for (j, m) in out_maps.iter().enumerate() {
            for (t, &r) in m.iter().enumerate() {
                contributor[r] = if contributor[r] == NOBODY { j as u32 } else { SEVERAL };
                place[r] = t as u32;
            }
        }
        let mut requester = vec![NOBODY; out_after];
        for (j, m) in in_maps.iter().enumerate() {
            for &u in m {
                let r = bottom[u];
                if r != crate::sparse::kernels::NONE {
                    requester[r] = if requester[r] == NOBODY || requester[r] == j as u32 { j as u32 } else { SEVERAL };
                }
            }
        }
        // `SCALEFREE_SPARSE_PRIVATE=0`: every key goes through its owner (for comparison).
        let keep_private = std::env::var("SCALEFREE_SPARSE_PRIVATE").map_or(true, |v| v.trim() != "0");
        let private = |r: usize| keep_private && contributor[r] < SEVERAL && (requester[r] == NOBODY || requester[r] == contributor[r]);
        // Accumulator rows: requested, not private.
        let mut row = vec![u32::MAX; out_after];
        let mut acc_rows = 0usize;
        for r in 0..out_after {
            if requester[r] != NOBODY && !private(r) {
                row[r] = acc_rows as u32;
                acc_rows += 1;
            }
        }
        let identity_row = acc_rows as u32;
        // Message to member j: [has_src, start, n_src, n_up] as u32 (start: where my slice
        // for j begins in my key order), then the caller positions of my keys in j's range,
        // then j's requested keys' rows of my accumulator.
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
            for (d, &u) in buf[at + 4 + n_src..at + 4 + n_src + n_up].iter_mut().zip(&in_maps[j]) {
                let r = bottom[u];
                *d = if r == crate::sparse::kernels::NONE {
                    identity_row
                } else if private(r) {
                    debug_assert_eq!(contributor[r], j as u32);
                    PRIVATE | place[r]
                } else {
                    row[r]
                };
            }
        }
        let mut answers: Vec<Option<Vec<u32>>> = (0..k).map(|_| None).collect();
        let mut by_j: Vec<Option<Pull>> = (0..k).map(|_| None).collect();
        let mut st = LayerStats::default();
        unsafe {
            round(c, None, dim, TAG, members, digit, buf.as_ptr() as *const u8, buf.len() * 4, &metas, &mut st, scratch, &mut |j, m, fetch| {
                let p = fetch(m[0] as usize, m[3] as usize)?;
                let head: Vec<usize> = read_u32s(p, 0, 4).collect();
                let (has_src, start, n_src, n_up) = (head[0] != 0, head[1], head[2], head[3]);
                let n_rows = out_maps[j].len();
                if (has_src && n_src != n_rows) || n_up != in_split[j + 1] - in_split[j] {
                    return Err(Error::Mismatch(format!(
                        "sparse_allreduce config: member {j} sent {n_src} rows / {n_up} answers where this rank expects {n_rows} / {}",
                        in_split[j + 1] - in_split[j]
                    )));
                }
                // The rows of j's slice that go through my accumulator.
                let kept: Vec<usize> = (0..n_rows).filter(|&t| row[out_maps[j][t]] != u32::MAX).collect();
                let caller = has_src.then(|| {
                    let all: Vec<usize> = read_u32s(p, 4, n_src).collect();
                    RowMap::from_positions(kept.iter().map(|&t| all[t]))
                });
                by_j[j] = Some(Pull {
                    acc_rows: RowMap::from_positions(kept.iter().map(|&t| row[out_maps[j][t]] as usize)),
                    caller_rows: caller,
                    copy_rows: RowMap::from_positions(kept.iter().map(|&t| start + t)),
                    out_rows: RowMap::Contig { start: 0, len: 0 },
                    owner_rows: RowMap::Contig { start: 0, len: 0 },
                });
                answers[j] = Some(read_u32s(p, 4 + n_src, n_up).map(|a| a as u32).collect());
                Ok(())
            })?;
        }
        drop((contributor, place, requester, row));
        // Up: each caller position's owner and the owner's row, or a private key's place in
        // my own values.
        let mut out_pos: Vec<Vec<usize>> = vec![Vec::new(); k];
        let mut owner_pos: Vec<Vec<usize>> = vec![Vec::new(); k];
        let (mut local_out, mut local_key) = (Vec::new(), Vec::new());
        for (p, &slot) in in_pos.iter().enumerate() {
            let j = in_split.partition_point(|&b| b <= slot) - 1;
            let a = answers[j].as_ref().expect("every member answered")[slot - in_split[j]];
            if a & PRIVATE != 0 {
                local_out.push(p);
                local_key.push(out_split[j] + (a & !PRIVATE) as usize);
            } else {
                out_pos[j].push(p);
                owner_pos[j].push(a as usize);
            }
        }
        let mut pulls = Vec::with_capacity(k);
        for (j, pull) in by_j.into_iter().enumerate() {
            let mut pull = pull.expect("every member answered");
            pull.out_rows = RowMap::from_positions(std::mem::take(&mut out_pos[j]).into_iter());
            pull.owner_rows = RowMap::from_positions(std::mem::take(&mut owner_pos[j]).into_iter());
            pulls.push(pull);
        }
        let others = || (0..k).filter(|&j| j != digit);
        let rows_read = others().map(|j| pulls[j].acc_rows.len() + pulls[j].out_rows.len()).sum();
        let messages = others().map(|j| (!pulls[j].acc_rows.is_empty()) as u64 + (!pulls[j].out_rows.is_empty()) as u64).sum();
        let max_rows = others().map(|j| pulls[j].acc_rows.len().max(pulls[j].out_rows.len())).max().unwrap_or(0);
        Ok(Direct {
            members: members.to_vec(),
            digit,
            pulls,
            local_caller: out_src.map(|s| RowMap::from_positions(local_key.iter().map(|&t| s[t]))),
            local_out: RowMap::from_positions(local_out.into_iter()),
            local_key: RowMap::from_positions(local_key.into_iter()),
            acc_rows: acc_rows + 1,
            key_src: out_src.map(|s| s.to_vec()),
            key_perm: out_perm.to_vec(),
            keys_out: *out_split.last().unwrap_or(&0),
            rows_read,
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
            if j == self.digit && !self.local_out.is_empty() {
                // Keys private to this rank: straight from its own values.
                match &self.local_caller {
                    Some(rows) => unsafe { copy_rows(dt, out, &self.local_out, vals.as_ptr(), rows, w) },
                    None => unsafe { copy_rows(dt, out, &self.local_out, src, &self.local_key, w) },
                }
            }
            compute_ns += tc.elapsed().as_nanos() as u64;
        }
        self.pending = pending;
        st.degree = k;
        st.bytes_sent = (self.rows_read * rb) as u64;
        st.messages = self.messages;
        st.max_packet = (self.max_rows * rb) as u64;
        st.merge_ns = compute_ns + (tp - t0).as_nanos() as u64;
        st.wait_ns = (t0.elapsed().as_nanos() as u64).saturating_sub(st.merge_ns);
        self.words = words;
        self.peer_accs = accs;
        Ok(())
    }
}
