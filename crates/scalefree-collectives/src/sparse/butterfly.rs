//! The nested butterfly: `config` (indices down, maps saved), `reduce` (values down by the
//! saved maps, requested values up), `config_reduce` (both in one round per layer down).
//!
//! Ranks are numbered in mixed radix over the degrees `k1 × … × kd`. At layer `l` a rank's
//! group is the `k_l` ranks that differ from it only in digit `l`; they share one key range
//! (fixed by the digits above), split it into `k_l` sub-ranges, and member `j` receives
//! sub-range `j` from everyone. Every message of a layer is a contiguous slice of the
//! sender's sorted vector (or of one packed buffer), so one round is: expose the buffer
//! (registered region, cross-memory attach, or staging, as the dense collectives do), post
//! each peer a small metadata slot (offset, counts) inline with the call's header, and let
//! each receiver read its slice one-sidedly. Receivers combine each part as soon as it is
//! read, in group order starting after themselves.
//!
//! Memory: own data, the current layer's vectors and messages, and the maps of every layer
//! (one `usize` per key per layer) — never anything of the width of the index space.

use std::time::Instant;

use scalefree_transport::{Error, Result};

use crate::comm::{Communicator, Header, Kind};
use crate::reduce::{DType, ReduceOp};
use crate::sparse::direct::Direct;
use crate::sparse::hash::IndexHash;
use crate::sparse::kernels::{fill_identity, gather, scatter, SDType, SOp, NONE};
use crate::sparse::merge::tree_merge;
use crate::sparse::partition::{split_sorted, sub_range};
use crate::sparse::replica::Mailbox;
use crate::Algorithm;

/// Per-layer accounting of the last call (down and up summed).
#[derive(Clone, Debug, Default)]
pub struct LayerStats {
    pub degree: usize,
    /// Bytes this rank sent to other ranks (read by them) in this layer. The direct
    /// reduce (`sparse::direct`), where each rank pulls, counts the bytes this rank read
    /// from other ranks instead (and messages likewise): what its peers decide to pull from
    /// it is theirs to know.
    pub bytes_sent: u64,
    /// Non-empty messages this rank sent to other ranks.
    pub messages: u64,
    /// Largest single message (bytes).
    pub max_packet: u64,
    /// Merging / combining time (ns).
    pub merge_ns: u64,
    /// Time in the header exchange, waiting for peers and reading their data (ns).
    pub wait_ns: u64,
    /// Keys this rank holds after the layer's merge (out side and in side).
    pub out_keys: u64,
    pub in_keys: u64,
    /// The node's range was dense enough after this layer's merge that it is kept as a
    /// dense segment (every key of the range, no merge of keys below).
    pub dense: bool,
}

/// A merged range holding more than this fraction of its keys switches to a dense segment
/// (`SCALEFREE_SPARSE_DENSE`, default 0.5): a dense segment of width w costs w values
/// where the sparse one costs nnz values plus its maps, so past half full it is cheaper.
fn dense_threshold() -> f64 {
    std::env::var("SCALEFREE_SPARSE_DENSE").ok().and_then(|v| v.parse().ok()).unwrap_or(0.5)
}

pub(crate) struct Layer {
    pub(crate) members: Vec<u32>,
    pub(crate) digit: usize,
    pub(crate) out_split: Vec<usize>,
    pub(crate) out_maps: Vec<Vec<usize>>,
    pub(crate) out_after: usize,
    pub(crate) in_split: Vec<usize>,
    pub(crate) in_maps: Vec<Vec<usize>>,
    pub(crate) in_after: usize,
    pub(crate) dense: bool,
    /// Bounded staleness only (`sparse::ssp`), per member `j` (empty for this rank's own
    /// digit): for each key `j` requests here, its row in `j`'s message down to this rank
    /// (NONE: `j` sends no value for it) ...
    pub(crate) up_excl: Vec<Vec<usize>>,
    /// ... and for each key this rank requests from `j`, its row in this rank's vector of
    /// the layer (what it sends down), or NONE.
    pub(crate) up_own: Vec<Vec<usize>>,
}

/// Rounds through the mailboxes of [`crate::sparse::replica`] even without replication
/// (`SCALEFREE_SPARSE_MAILBOX=1`; one host only): one push per message and no group-wide
/// handshake per round.
fn mailbox_rounds() -> bool {
    std::env::var("SCALEFREE_SPARSE_MAILBOX").is_ok_and(|v| v == "1")
}

/// One sparse allreduce: the plan fixed at construction and the maps saved by `config`.
pub struct SparseAllreduce {
    pub(crate) dim: u64,
    pub(crate) op: SOp,
    pub(crate) degrees: Vec<usize>,
    pub(crate) hash: IndexHash,
    pub(crate) configured: bool,
    pub(crate) n_out: usize,
    pub(crate) n_in: usize,
    pub(crate) out_perm: Vec<usize>,
    /// When the out indices have no duplicates: the caller position of each sorted slot,
    /// so the local step is a gather (random reads) instead of a fill plus a scatter.
    pub(crate) out_src: Option<Vec<usize>>,
    pub(crate) n_out_u: usize,
    /// The caller's out indices are distinct and already in key order: its values are
    /// sent as they are (no gather into key order).
    pub(crate) out_ident: bool,
    pub(crate) in_pos: Vec<usize>,
    /// The caller's in indices are distinct and in key order: the last layer up writes
    /// into the caller's buffer (no final gather).
    pub(crate) in_ident: bool,
    pub(crate) layers: Vec<Layer>,
    pub(crate) bottom: Vec<usize>,
    pub(crate) bottom_out: usize,
    pub(crate) stats: Vec<LayerStats>,
    pub(crate) pool: Pool,
    /// Replicas per logical node (1: none); with more, rounds go through `mbox`.
    pub(crate) replication: usize,
    pub(crate) mbox: Option<Mailbox>,
    /// The reduce after config of a one-layer butterfly on shared memory (see
    /// [`crate::sparse::direct`]); None where the general path runs.
    pub(crate) direct: Option<Direct>,
    /// Build the maps of the bounded-staleness reduce at config ([`crate::sparse::ssp`]).
    pub(crate) ssp_maps: bool,
    /// Its mailboxes and clock, made by the first such reduce after config.
    pub(crate) ssp: Option<crate::sparse::ssp::SspState>,
}

/// Metadata slot sent inline to each peer: byte offset in the exposed buffer and counts.
type Meta = [u64; 4];

/// Sorts `idx` by hashed key, dropping duplicates: (unique sorted keys, slot of each input).
fn sort_keys(h: &IndexHash, idx: &[i64]) -> (Vec<u64>, Vec<usize>) {
    let mut pairs: Vec<(u64, usize)> = idx.iter().enumerate().map(|(i, &x)| (h.key(x as u64), i)).collect();
    pairs.sort_unstable();
    let mut keys = Vec::with_capacity(pairs.len());
    let mut slot = vec![0usize; idx.len()];
    for (k, i) in pairs {
        if keys.last() != Some(&k) {
            keys.push(k);
        }
        slot[i] = keys.len() - 1;
    }
    (keys, slot)
}

/// For each key of `a` (sorted), its position in `b` (sorted) plus `base`, or NONE.
fn join_keys(a: &[u64], b: &[u64], base: usize) -> Vec<usize> {
    let mut j = 0;
    a.iter()
        .map(|&key| {
            while j < b.len() && b[j] < key {
                j += 1;
            }
            if j < b.len() && b[j] == key { base + j } else { NONE }
        })
        .collect()
}

fn check_range(what: &str, idx: &[i64], dim: u64) -> Option<String> {
    idx.iter().position(|&x| x < 0 || x as u64 >= dim).map(|i| {
        format!("{what}[{i}] = {} is outside [0, dim={dim})", idx[i])
    })
}

/// A value buffer: 8-byte aligned storage of `rows × row_bytes`.
fn alloc_rows(dtype: SDType, op: SOp, rows: usize, w: usize) -> Vec<u64> {
    let n = rows * w;
    let mut v = vec![0u64; (n * dtype.size_bytes()).div_ceil(8)];
    unsafe { fill_identity(dtype, op, v.as_mut_ptr() as *mut u8, n) };
    v
}

/// Value buffers kept between calls: a reduce allocates nothing once warm (fresh large
/// allocations are fresh pages from the kernel, a page fault per 4 KiB).
#[derive(Default)]
pub(crate) struct Pool {
    free: Vec<Vec<u64>>,
    scratch: Vec<u64>,
}

impl Pool {
    fn get(&mut self, words: usize) -> Vec<u64> {
        let best = self.free.iter().enumerate().max_by_key(|(_, v)| v.capacity()).map(|(i, _)| i);
        let mut v = best.map(|i| self.free.swap_remove(i)).unwrap_or_default();
        // Stale contents are fine: every caller overwrites or fills what it reads. Only
        // growth is zeroed, so a warm pool costs no pass over memory.
        if v.len() < words {
            v.resize(words, 0);
        } else {
            v.truncate(words);
        }
        v
    }
    fn rows(&mut self, dtype: SDType, op: SOp, rows: usize, w: usize) -> Vec<u64> {
        let n = rows * w;
        let mut v = self.get((n * dtype.size_bytes()).div_ceil(8));
        unsafe { fill_identity(dtype, op, v.as_mut_ptr() as *mut u8, n) };
        v
    }
    fn put(&mut self, v: Vec<u64>) {
        if self.free.len() < 8 {
            self.free.push(v);
        }
    }
}

impl SparseAllreduce {
    /// A plan for `ranks` ranks. `degrees`: the layer degrees (product = ranks), or None
    /// for the automatic choice at config. `seed`: the index hash's seed, or None for no
    /// hash (keys are the indices; the caller spreads its heavy indices itself).
    /// `replication`: ranks per logical node (see [`crate::sparse::replica`]); the degrees
    /// then multiply to `ranks / replication`.
    pub fn new(dim: u64, op: SOp, degrees: Option<Vec<usize>>, ranks: usize, seed: Option<u64>, replication: usize) -> Result<Self> {
        if replication == 0 || !ranks.is_multiple_of(replication) {
            return Err(Error::InvalidArgument(format!("replication={replication} must divide the group size {ranks}")));
        }
        let ranks = ranks / replication;
        let degrees = match degrees {
            Some(d) => crate::sparse::plan::check_degrees(&d, ranks)?,
            None => Vec::new(),
        };
        Ok(SparseAllreduce {
            dim,
            op,
            degrees,
            hash: match seed {
                Some(s) => IndexHash::new(dim, s),
                None => IndexHash::identity(dim),
            },
            configured: false,
            n_out: 0,
            n_in: 0,
            out_perm: Vec::new(),
            out_src: None,
            n_out_u: 0,
            out_ident: false,
            in_pos: Vec::new(),
            in_ident: false,
            layers: Vec::new(),
            bottom: Vec::new(),
            bottom_out: 0,
            stats: Vec::new(),
            pool: Pool::default(),
            replication,
            mbox: None,
            direct: None,
            ssp_maps: false,
            ssp: None,
        })
    }

    pub fn degrees(&self) -> &[usize] {
        &self.degrees
    }
    pub fn stats(&self) -> &[LayerStats] {
        &self.stats
    }
    pub fn n_out(&self) -> usize {
        self.n_out
    }
    pub fn n_in(&self) -> usize {
        self.n_in
    }
    pub fn configured(&self) -> bool {
        self.configured
    }
    /// Whether reduce runs the direct path (one layer on shared memory, see
    /// [`crate::sparse::direct`]) rather than the general one.
    /// Builds, at config, the maps the bounded-staleness reduce needs
    /// ([`SparseAllreduce::reduce_ssp`]); call before `config`.
    pub fn enable_ssp(&mut self) {
        self.ssp_maps = true;
    }
    pub fn direct(&self) -> bool {
        self.direct.is_some()
    }

    /// Logical nodes and this rank's logical node (the ranks themselves without replication).
    pub(crate) fn logical(&self, c: &Communicator) -> (usize, usize) {
        let m = c.size() as usize / self.replication;
        (m, c.rank() as usize % m)
    }

    /// Every rank says what it is calling and whether its input is valid, in one small
    /// allreduce, so bad input or disagreement raises on every rank instead of hanging.
    pub(crate) fn agree(&self, c: &mut Communicator, call: i64, err: Option<String>, dtype: i64, width: i64) -> Result<()> {
        const F: usize = 6;
        let n = c.size() as usize;
        let me = c.rank() as usize;
        let mine = [err.is_some() as i64, call, self.dim as i64, self.op as i64, dtype, width];
        if n > 1 {
            let mut v = vec![0i64; F * n];
            v[me * F..me * F + F].copy_from_slice(&mine);
            unsafe { c.allreduce(v.as_mut_ptr() as *mut u8, v.len(), DType::I64, ReduceOp::Sum, Algorithm::Auto)? };
            if let Some(e) = err {
                return Err(Error::InvalidArgument(e));
            }
            let call_name = |c: i64| ["?", "config", "reduce", "config_reduce"][c.clamp(0, 3) as usize];
            let describe = |r: &[i64]| {
                let dt = SDType::from_u32(r[4] as u32).map(|d| d.name()).unwrap_or("-");
                let op = SOp::from_u32(r[3] as u32).map(|o| o.name()).unwrap_or("?");
                format!("sparse_allreduce.{}(dim={}, op={op}, dtype={dt}, width={})", call_name(r[1]), r[2], r[5])
            };
            for r in 0..n {
                if v[r * F] != 0 {
                    return Err(Error::InvalidArgument(format!("rank {r} passed invalid input to sparse_allreduce (see its error)")));
                }
            }
            for r in 1..n {
                if v[r * F + 1..r * F + F] != v[1..F] {
                    return Err(Error::Mismatch(format!(
                        "rank 0 called {} but rank {r} called {}",
                        describe(&v[0..F]),
                        describe(&v[r * F..r * F + F])
                    )));
                }
            }
        } else if let Some(e) = err {
            return Err(Error::InvalidArgument(e));
        }
        Ok(())
    }

    fn choose_degrees(&mut self, c: &mut Communicator, nnz: usize) -> Result<()> {
        if (self.replication > 1 || mailbox_rounds()) && self.mbox.is_none() && c.size() > 1 {
            self.mbox = Some(Mailbox::new(c.device(), self.replication)?);
        }
        let n = self.logical(c).0;
        if self.degrees.iter().product::<usize>() == n {
            return Ok(());
        }
        // Auto: agree on the largest contribution, so every rank picks the same degrees.
        let mut v = [nnz as i64];
        if n > 1 {
            unsafe { c.allreduce(v.as_mut_ptr() as *mut u8, 1, DType::I64, ReduceOp::Max, Algorithm::Auto)? };
        }
        let bytes = v[0] as f64 * 8.0;
        let floor = crate::sparse::plan::PACKET_FLOOR_BYTES;
        self.degrees = match host_block(c.device()).filter(|_| self.replication == 1) {
            // Several hosts of p ranks each, numbered host by host: the first layer is the
            // host (shared memory), so only host-merged data crosses the network.
            Some(p) => std::iter::once(p).chain(crate::sparse::plan::auto_degrees(n / p, bytes, floor)).collect(),
            None => crate::sparse::plan::auto_degrees(n, bytes, floor),
        };
        Ok(())
    }

    /// Group of layer `l` for rank `me`: member ranks (by digit) and my digit.
    fn group(&self, me: usize, l: usize) -> (Vec<u32>, usize) {
        let stride: usize = self.degrees[..l].iter().product();
        let k = self.degrees[l];
        let digit = (me / stride) % k;
        let base = me - digit * stride;
        ((0..k).map(|j| (base + j * stride) as u32).collect(), digit)
    }

    /// Config: see module docs. `vals` (config_reduce) travel with the out keys.
    fn config_down(
        &mut self,
        c: &mut Communicator,
        out_idx: &[i64],
        vals: Option<(&[u8], SDType, usize)>,
        in_idx: &[i64],
    ) -> Result<Option<Vec<u64>>> {
        let t0 = Instant::now();
        let (mut okeys, out_perm) = sort_keys(&self.hash, out_idx);
        let (mut ikeys, in_pos) = sort_keys(&self.hash, in_idx);
        self.n_out = out_idx.len();
        self.n_in = in_idx.len();
        self.n_out_u = okeys.len();
        self.out_src = (okeys.len() == out_perm.len()).then(|| {
            let mut src = vec![0usize; out_perm.len()];
            for (i, &slot) in out_perm.iter().enumerate() {
                src[slot] = i;
            }
            src
        });
        self.out_ident = self.out_src.as_ref().is_some_and(|s| s.iter().enumerate().all(|(i, &j)| i == j));
        self.in_ident = ikeys.len() == in_pos.len() && in_pos.iter().enumerate().all(|(i, &j)| i == j);
        self.out_perm = out_perm;
        self.in_pos = in_pos;
        self.layers.clear();
        self.direct = None;
        self.ssp = None;
        self.configured = false;
        let (nl, me) = self.logical(c);
        let mut cur_vals = vals.map(|(v, dt, w)| {
            let mut acc = alloc_rows(dt, self.op, okeys.len(), w);
            unsafe { scatter(dt, self.op, acc.as_mut_ptr() as *mut u8, v.as_ptr(), &self.out_perm, w) };
            acc
        });
        let (vdt, w) = vals.map(|(_, d, w)| (d, w)).unwrap_or((SDType::U64, 1));
        let rb = vdt.size_bytes() * w;
        let mut lo = 0u64;
        let mut hi = self.dim;
        self.stats = vec![LayerStats::default(); self.degrees.len()];
        let local_ns = t0.elapsed().as_nanos() as u64;
        for l in 0..self.degrees.len() {
            let k = self.degrees[l];
            let (members, digit) = self.group(me, l);
            let out_split = split_sorted(&okeys, lo, hi, k);
            let in_split = split_sorted(&ikeys, lo, hi, k);
            // Pack: per member j, [out keys][in keys][values, padded to 8 bytes].
            let mut metas = vec![[0u64; 4]; nl];
            let mut total = 0usize;
            let vwords = |n: usize| (n * rb).div_ceil(8) * cur_vals.is_some() as usize;
            for j in 0..k {
                let no = out_split[j + 1] - out_split[j];
                let ni = in_split[j + 1] - in_split[j];
                metas[members[j] as usize] = [(total * 8) as u64, no as u64, ni as u64, ((no + ni + vwords(no)) * 8) as u64];
                total += no + ni + vwords(no);
            }
            let mut buf = vec![0u64; total];
            for j in 0..k {
                let m = metas[members[j] as usize];
                let at = m[0] as usize / 8;
                let (no, ni) = (m[1] as usize, m[2] as usize);
                buf[at..at + no].copy_from_slice(&okeys[out_split[j]..out_split[j + 1]]);
                buf[at + no..at + no + ni].copy_from_slice(&ikeys[in_split[j]..in_split[j + 1]]);
                if let Some(cv) = &cur_vals {
                    unsafe {
                        std::ptr::copy_nonoverlapping(
                            (cv.as_ptr() as *const u8).add(out_split[j] * rb),
                            buf.as_mut_ptr().add(at + no + ni) as *mut u8,
                            no * rb,
                        )
                    };
                }
            }
            let mut parts_out: Vec<Vec<u64>> = vec![Vec::new(); k];
            let mut parts_in: Vec<Vec<u64>> = vec![Vec::new(); k];
            let mut parts_val: Vec<Vec<u64>> = vec![Vec::new(); k];
            let has_vals = cur_vals.is_some();
            let st = &mut self.stats[l];
            st.degree = k;
            unsafe {
                round(c, self.mbox.as_mut(), self.dim, (l as u32) << 2, &members, digit, buf.as_ptr() as *const u8, total * 8, &metas, st, &mut self.pool.scratch, &mut |j, m, fetch| {
                    let (no, ni) = (m[1] as usize, m[2] as usize);
                    let nb = (no + ni) * 8 + if has_vals { no * rb } else { 0 };
                    let p = fetch(m[0] as usize, nb)? as *const u64;
                    parts_out[j] = std::slice::from_raw_parts(p, no).to_vec();
                    parts_in[j] = std::slice::from_raw_parts(p.add(no), ni).to_vec();
                    if has_vals {
                        let mut v = vec![0u64; (no * rb).div_ceil(8)];
                        std::ptr::copy_nonoverlapping(p.add(no + ni) as *const u8, v.as_mut_ptr() as *mut u8, no * rb);
                        parts_val[j] = v;
                    }
                    Ok(())
                })?;
            }
            drop(buf);
            let tm = Instant::now();
            (lo, hi) = sub_range(lo, hi, k, digit);
            let total_out: usize = parts_out.iter().map(|p| p.len()).sum();
            let width = (hi - lo) as usize;
            let dense = width > 0 && total_out as f64 > dense_threshold() * width as f64;
            let (uo, out_maps) = if dense {
                // Dense segment: positions are key offsets in the range; no key merge.
                let maps = parts_out.iter().map(|p| p.iter().map(|&x| (x - lo) as usize).collect()).collect();
                ((lo..hi).collect::<Vec<u64>>(), maps)
            } else {
                tree_merge(&parts_out.iter().map(|p| p.as_slice()).collect::<Vec<_>>())
            };
            st.dense = dense;
            let (ui, in_maps) = tree_merge(&parts_in.iter().map(|p| p.as_slice()).collect::<Vec<_>>());
            if has_vals {
                let mut acc = alloc_rows(vdt, self.op, uo.len(), w);
                for j in 0..k {
                    unsafe { scatter(vdt, self.op, acc.as_mut_ptr() as *mut u8, parts_val[j].as_ptr() as *const u8, &out_maps[j], w) };
                }
                cur_vals = Some(acc);
            }
            let (mut up_excl, mut up_own) = (Vec::new(), Vec::new());
            if self.ssp_maps {
                for j in 0..k {
                    let mine = j == digit;
                    up_excl.push(if mine { Vec::new() } else { join_keys(&parts_in[j], &parts_out[j], 0) });
                    up_own.push(if mine {
                        Vec::new()
                    } else {
                        join_keys(&ikeys[in_split[j]..in_split[j + 1]], &okeys[out_split[j]..out_split[j + 1]], out_split[j])
                    });
                }
            }
            st.merge_ns += tm.elapsed().as_nanos() as u64;
            st.out_keys = uo.len() as u64;
            st.in_keys = ui.len() as u64;
            self.layers.push(Layer {
                members,
                digit,
                out_split,
                out_maps,
                out_after: uo.len(),
                in_split,
                in_maps,
                in_after: ui.len(),
                dense,
                up_excl,
                up_own,
            });
            okeys = uo;
            ikeys = ui;
        }
        // Bottom: each requested key → its position among the reduced keys (merge join).
        let tb = Instant::now();
        let mut bottom = vec![NONE; ikeys.len()];
        let mut j = 0;
        for (i, &key) in ikeys.iter().enumerate() {
            while j < okeys.len() && okeys[j] < key {
                j += 1;
            }
            if j < okeys.len() && okeys[j] == key {
                bottom[i] = j;
            }
        }
        self.bottom = bottom;
        self.bottom_out = okeys.len();
        if let Some(s) = self.stats.last_mut() {
            s.merge_ns += tb.elapsed().as_nanos() as u64 + local_ns;
        }
        self.configured = true;
        Ok(cur_vals)
    }

    /// Values down by the saved maps: the reduced values of this rank's final key range.
    fn reduce_down(&mut self, c: &mut Communicator, vals: &[u8], dt: SDType, w: usize) -> Result<Vec<u64>> {
        let rb = dt.size_bytes() * w;
        let nl = self.logical(c).0;
        let t0 = Instant::now();
        // The first layer sends straight from the caller's buffer when it is in key order.
        let direct = self.out_ident && !self.layers.is_empty() && (vals.as_ptr() as usize).is_multiple_of(8);
        let mut cur = if direct {
            Vec::new()
        } else {
            match &self.out_src {
                Some(_) if self.out_ident => {
                    let mut cur = self.pool.get((self.n_out_u * rb).div_ceil(8));
                    unsafe { std::ptr::copy_nonoverlapping(vals.as_ptr(), cur.as_mut_ptr() as *mut u8, self.n_out_u * rb) };
                    cur
                }
                Some(src) => {
                    let mut cur = self.pool.get((self.n_out_u * rb).div_ceil(8));
                    unsafe { gather(dt, self.op, cur.as_mut_ptr() as *mut u8, vals.as_ptr(), src, w) };
                    cur
                }
                None => {
                    let mut cur = self.pool.rows(dt, self.op, self.n_out_u, w);
                    unsafe { scatter(dt, self.op, cur.as_mut_ptr() as *mut u8, vals.as_ptr(), &self.out_perm, w) };
                    cur
                }
            }
        };
        self.stats = vec![LayerStats::default(); self.layers.len()];
        if let Some(s) = self.stats.first_mut() {
            s.merge_ns += t0.elapsed().as_nanos() as u64;
        }
        for l in 0..self.layers.len() {
            let layer = &self.layers[l];
            let k = layer.members.len();
            let mut metas = vec![[0u64; 4]; nl];
            for j in 0..k {
                let (a, b) = (layer.out_split[j], layer.out_split[j + 1]);
                metas[layer.members[j] as usize] = [(a * rb) as u64, (b - a) as u64, 0, ((b - a) * rb) as u64];
            }
            let (send, send_bytes) = if l == 0 && direct {
                (vals.as_ptr(), vals.len())
            } else {
                (cur.as_ptr() as *const u8, cur.len() * 8)
            };
            let mut acc = self.pool.rows(dt, self.op, layer.out_after, w);
            let st = &mut self.stats[l];
            st.degree = k;
            st.out_keys = layer.out_after as u64;
            st.in_keys = layer.in_after as u64;
            st.dense = layer.dense;
            let op = self.op;
            let accp = acc.as_mut_ptr() as *mut u8;
            let mut merge_ns = 0u64;
            unsafe {
                round(c, self.mbox.as_mut(), self.dim, ((l as u32) << 2) | 1, &layer.members, layer.digit, send, send_bytes, &metas, st, &mut self.pool.scratch, &mut |j, m, fetch| {
                    let n = m[1] as usize;
                    let p = fetch(m[0] as usize, n * rb)?;
                    let t = Instant::now();
                    scatter(dt, op, accp, p, &layer.out_maps[j], w);
                    merge_ns += t.elapsed().as_nanos() as u64;
                    Ok(())
                })?;
            }
            st.merge_ns += merge_ns;
            st.wait_ns = st.wait_ns.saturating_sub(merge_ns);
            let old = std::mem::replace(&mut cur, acc);
            if !old.is_empty() {
                self.pool.put(old);
            }
        }
        Ok(cur)
    }

    /// Requested values up through the same nodes; writes `in_vals` (caller order).
    fn up(&mut self, c: &mut Communicator, reduced: &[u64], dt: SDType, w: usize, in_vals: &mut [u8]) -> Result<()> {
        let rb = dt.size_bytes() * w;
        let nl = self.logical(c).0;
        let t0 = Instant::now();
        debug_assert!(self.layers.last().map(|l| l.in_after == self.bottom.len()).unwrap_or(true));
        // The last copy lands in the caller's buffer when it wants its values in key order.
        let direct = self.in_ident;
        if direct && self.layers.is_empty() {
            unsafe { gather(dt, self.op, in_vals.as_mut_ptr(), reduced.as_ptr() as *const u8, &self.bottom, w) };
            return Ok(());
        }
        let mut cur = self.pool.get((self.bottom.len() * rb).div_ceil(8));
        unsafe { gather(dt, self.op, cur.as_mut_ptr() as *mut u8, reduced.as_ptr() as *const u8, &self.bottom, w) };
        if let Some(s) = self.stats.last_mut() {
            s.merge_ns += t0.elapsed().as_nanos() as u64;
        }
        for l in (0..self.layers.len()).rev() {
            let layer = &self.layers[l];
            let k = layer.members.len();
            // Pack what each member asked for, in its order.
            let tg = Instant::now();
            let mut metas = vec![[0u64; 4]; nl];
            let mut total = 0usize;
            for j in 0..k {
                metas[layer.members[j] as usize] = [total as u64, layer.in_maps[j].len() as u64, 0, (layer.in_maps[j].len() * rb) as u64];
                total += (layer.in_maps[j].len() * rb).next_multiple_of(8);
            }
            let mut send = self.pool.get(total / 8);
            for j in 0..k {
                let off = metas[layer.members[j] as usize][0] as usize;
                unsafe {
                    gather(dt, self.op, (send.as_mut_ptr() as *mut u8).add(off), cur.as_ptr() as *const u8, &layer.in_maps[j], w)
                };
            }
            let before = layer.in_split[k];
            let into_caller = direct && l == 0;
            let mut prev = if into_caller { Vec::new() } else { self.pool.get((before * rb).div_ceil(8)) };
            let prevp = if into_caller { in_vals.as_mut_ptr() } else { prev.as_mut_ptr() as *mut u8 };
            let st = &mut self.stats[l];
            st.merge_ns += tg.elapsed().as_nanos() as u64;
            unsafe {
                round(c, self.mbox.as_mut(), self.dim, ((l as u32) << 2) | 2, &layer.members, layer.digit, send.as_ptr() as *const u8, total, &metas, st, &mut self.pool.scratch, &mut |j, m, fetch| {
                    let n = m[1] as usize;
                    let (a, b) = (layer.in_split[j], layer.in_split[j + 1]);
                    if n != b - a {
                        return Err(Error::Mismatch(format!("sparse_allreduce: member {j} answered {n} values for {} requested", b - a)));
                    }
                    let p = fetch(m[0] as usize, n * rb)?;
                    std::ptr::copy_nonoverlapping(p, prevp.add(a * rb), n * rb);
                    Ok(())
                })?;
            }
            self.pool.put(send);
            self.pool.put(std::mem::replace(&mut cur, prev));
        }
        if direct {
            return Ok(());
        }
        let t1 = Instant::now();
        unsafe { gather(dt, self.op, in_vals.as_mut_ptr(), cur.as_ptr() as *const u8, &self.in_pos, w) };
        if let Some(s) = self.stats.first_mut() {
            s.merge_ns += t1.elapsed().as_nanos() as u64;
        }
        self.pool.put(cur);
        Ok(())
    }

    pub(crate) fn check_values(&self, what: &str, bytes: usize, rows: usize, dt: SDType, w: usize) -> Option<String> {
        let want = rows * w * dt.size_bytes();
        (bytes != want).then(|| format!("{what} holds {bytes} bytes but {rows} rows of {w} {} need {want}", dt.name()))
    }

    /// Saves the maps for this sparsity pattern. Collective.
    pub fn config(&mut self, c: &mut Communicator, out_idx: &[i64], in_idx: &[i64]) -> Result<()> {
        let err = check_range("out_indices", out_idx, self.dim).or_else(|| check_range("in_indices", in_idx, self.dim));
        self.agree(c, 1, err, 0, 0)?;
        self.choose_degrees(c, out_idx.len().max(in_idx.len()))?;
        self.config_down(c, out_idx, None, in_idx)?;
        self.build_direct(c)
    }

    /// After `config_down`: the direct reduce's maps when the butterfly is one layer on
    /// shared memory (`SCALEFREE_SPARSE_DIRECT=0` keeps the general path). Collective; every
    /// rank decides alike (the conditions are properties of the job and the plan).
    fn build_direct(&mut self, c: &mut Communicator) -> Result<()> {
        let off = std::env::var("SCALEFREE_SPARSE_DIRECT").is_ok_and(|v| v.trim() == "0");
        if off || self.layers.len() != 1 || c.is_networked() || self.mbox.is_some() || self.replication != 1 {
            return Ok(());
        }
        let l = &self.layers[0];
        // The direct maps hold 31-bit row positions (the SIMD kernels gather by signed 32-bit
        // offsets): with 2^31 rows or more on any rank every rank keeps the general path, whose
        // maps are 64-bit (agreed, since the choice must be alike everywhere).
        let rows = self.n_out.max(self.n_in).max(l.out_after).max(self.bottom.len()).max(self.in_pos.len());
        let mut big = [(rows >= i32::MAX as usize) as i64];
        if c.size() > 1 {
            unsafe { c.allreduce(big.as_mut_ptr() as *mut u8, 1, DType::I64, ReduceOp::Max, Algorithm::Auto)? };
        }
        if big[0] != 0 {
            return Ok(());
        }
        let d = Direct::build(
            c,
            self.dim,
            &l.members,
            l.digit,
            &l.out_split,
            &l.out_maps,
            l.out_after,
            &l.in_split,
            &l.in_maps,
            &self.bottom,
            self.out_src.as_deref(),
            &self.out_perm,
            &self.in_pos,
            &mut self.pool.scratch,
        )?;
        self.direct = Some(d);
        Ok(())
    }

    /// Reduces `out_vals` (rows for the configured out indices) and writes the result for
    /// the configured in indices into `in_vals`. Collective.
    pub fn reduce(&mut self, c: &mut Communicator, out_vals: &[u8], in_vals: &mut [u8], dt: SDType, w: usize) -> Result<()> {
        let err = if !self.configured {
            Some("sparse_allreduce.reduce called before config".to_string())
        } else {
            self.check_values("out_values", out_vals.len(), self.n_out, dt, w)
                .or_else(|| self.check_values("in_values", in_vals.len(), self.n_in, dt, w))
                .or_else(|| self.op.check(dt).err().map(|e| e.to_string()))
        };
        if let Some(d) = self.direct.as_mut() {
            if self.stats.len() != 1 {
                self.stats = vec![LayerStats::default()];
            }
            self.stats[0] = LayerStats { out_keys: self.bottom_out as u64, in_keys: self.bottom.len() as u64, dense: self.layers[0].dense, ..LayerStats::default() };
            return d.reduce(c, self.dim, self.op, err, out_vals, in_vals, dt, w, &mut self.stats[0]);
        }
        if self.replication > 1 {
            // Replicated: no group-wide check (it would wait for dead ranks); a rank with
            // bad input raises here, and its peers fail once all of its replicas are gone.
            if let Some(e) = err {
                return Err(Error::InvalidArgument(e));
            }
        } else {
            self.agree(c, 2, err, dt as i64, w as i64)?;
        }
        let reduced = self.reduce_down(c, out_vals, dt, w)?;
        let r = self.up(c, &reduced, dt, w, in_vals);
        self.pool.put(reduced);
        r
    }

    /// `config` and `reduce` in one pass down (values travel with the indices).
    #[allow(clippy::too_many_arguments)]
    pub fn config_reduce(&mut self, c: &mut Communicator, out_idx: &[i64], out_vals: &[u8], in_idx: &[i64], in_vals: &mut [u8], dt: SDType, w: usize) -> Result<()> {
        let err = check_range("out_indices", out_idx, self.dim)
            .or_else(|| check_range("in_indices", in_idx, self.dim))
            .or_else(|| self.check_values("out_values", out_vals.len(), out_idx.len(), dt, w))
            .or_else(|| self.check_values("in_values", in_vals.len(), in_idx.len(), dt, w))
            .or_else(|| self.op.check(dt).err().map(|e| e.to_string()));
        self.agree(c, 3, err, dt as i64, w as i64)?;
        self.choose_degrees(c, out_idx.len().max(in_idx.len()))?;
        let reduced = self.config_down(c, out_idx, Some((out_vals, dt, w)), in_idx)?.unwrap();
        self.up(c, &reduced, dt, w, in_vals)?;
        self.build_direct(c)
    }
}

/// Ranks per host when the group spans several hosts of `p > 1` ranks each and every host
/// holds `p` consecutive ranks (the launcher's numbering), so a first layer of degree `p`
/// stays within each host.
fn host_block(dev: &scalefree_transport::Device) -> Option<usize> {
    let n = dev.size() as usize;
    let p = (0..n).take_while(|&r| dev.host_of(r as u32) == dev.host_of(0)).count();
    let blocked = (0..n).all(|r| dev.host_of(r as u32) as usize == r / p);
    (p > 1 && p < n && n.is_multiple_of(p) && blocked).then_some(p)
}

/// One message round of a layer (see module docs). `recv(j, meta, fetch)` is called for
/// every member `j` of the group, this rank included; `fetch(off, n)` returns a pointer to
/// `n` bytes of that member's buffer at `off`, valid until the next fetch.
///
/// # Safety
/// `send` valid for `send_bytes` and untouched until the round returns.
#[allow(clippy::too_many_arguments, clippy::type_complexity)]
pub(crate) unsafe fn round(
    c: &mut Communicator,
    mbox: Option<&mut Mailbox>,
    dim: u64,
    tag: u32,
    members: &[u32],
    digit: usize,
    send: *const u8,
    send_bytes: usize,
    metas: &[Meta],
    st: &mut LayerStats,
    scratch: &mut Vec<u64>,
    recv: &mut dyn FnMut(usize, Meta, &dyn Fn(usize, usize) -> Result<*const u8>) -> Result<()>,
) -> Result<()> {
    let t0 = Instant::now();
    if let Some(mb) = mbox {
        unsafe { replicated_round(mb, members, digit, send, metas, st, recv)? };
        st.wait_ns += t0.elapsed().as_nanos() as u64;
        return Ok(());
    }
    let me = c.rank();
    let k = members.len();
    for &q in members {
        if q != me {
            let nb = metas[q as usize][3];
            st.bytes_sent += nb;
            st.messages += (nb > 0) as u64;
            st.max_packet = st.max_packet.max(nb);
        }
    }
    let mut hdr = Header::new(Kind::Sparse, DType::U8, None, dim as usize, tag, Algorithm::Auto);
    if send_bytes > 0 {
        c.expose_with(&mut hdr, send, send_bytes, c.opts.stage_max_bytes);
    }
    let headers = c.post(hdr, &|p| (metas[p as usize].as_ptr() as *const u8, std::mem::size_of::<Meta>()))?;
    let exposed = c.resolve(&headers)?;
    if send_bytes > 0 {
        unsafe { c.stage_in(&hdr, send, &[(0, send_bytes)])? };
    }
    let scratch = std::cell::RefCell::new(scratch);
    for i in 0..k {
        let j = (digit + i) % k;
        let q = members[j];
        if q == me {
            let m = metas[me as usize];
            let fetch = |off: usize, n: usize| -> Result<*const u8> {
                let _ = n;
                Ok(unsafe { send.add(off) })
            };
            recv(j, m, &fetch)?;
            continue;
        }
        c.await_peer_data(&headers, q)?;
        let m: Meta = unsafe { std::ptr::read_unaligned(c.inbox_payload(q) as *const Meta) };
        let src = exposed[q as usize].as_ref();
        let cref = &*c;
        let fetch = |off: usize, n: usize| -> Result<*const u8> {
            if n == 0 {
                return Ok(std::ptr::NonNull::<u64>::dangling().as_ptr() as *const u8);
            }
            let src = src.ok_or_else(|| Error::Mismatch(format!("rank {q} announced data but exposed none")))?;
            let mut s = scratch.borrow_mut();
            if s.len() * 8 < n {
                s.resize(n.div_ceil(8), 0);
            }
            unsafe { cref.peer_bytes(q, src, off, n, s.as_mut_ptr() as *mut u8) }
        };
        recv(j, m, &fetch)?;
    }
    c.finish()?;
    st.wait_ns += t0.elapsed().as_nanos() as u64;
    Ok(())
}

/// `round` over the replicas' mailboxes: members are logical nodes; each message goes to
/// every live replica of its target and the first copy of each incoming one is used.
///
/// # Safety
/// As for `round`.
#[allow(clippy::type_complexity)]
unsafe fn replicated_round(
    mb: &mut Mailbox,
    members: &[u32],
    digit: usize,
    send: *const u8,
    metas: &[Meta],
    st: &mut LayerStats,
    recv: &mut dyn FnMut(usize, Meta, &dyn Fn(usize, usize) -> Result<*const u8>) -> Result<()>,
) -> Result<()> {
    let t = mb.begin();
    let k = members.len();
    for (j, &b) in members.iter().enumerate() {
        if j != digit {
            let m = metas[b as usize];
            let nb = m[3] as usize;
            let copies = unsafe { mb.send(t, b as usize, &m, send.add(m[0] as usize), nb)? };
            st.bytes_sent += nb as u64 * copies;
            st.messages += copies * (nb > 0) as u64;
            st.max_packet = st.max_packet.max(nb as u64);
        }
    }
    for i in 0..k {
        let j = (digit + i) % k;
        if j == digit {
            let m = metas[members[j] as usize];
            recv(j, m, &|off: usize, _n: usize| Ok(unsafe { send.add(off) }))?;
            continue;
        }
        let (m, p, len) = mb.recv(t, members[j] as usize)?;
        let (base, a) = (m[0] as usize, members[j]);
        recv(j, m, &|off: usize, n: usize| {
            // Replicated calls skip the group-wide agreement, so a rank that disagrees on
            // dtype or width shows up here, as a message shorter than this rank reads.
            if off < base || off - base + n > len {
                return Err(Error::Mismatch(format!(
                    "replicated sparse_allreduce: logical node {a} sent {len} bytes where this rank reads {n} at {} (ranks disagree on dtype or width?)",
                    off.wrapping_sub(base)
                )));
            }
            Ok(unsafe { p.add(off - base) })
        })?;
    }
    mb.end(t)?;
    Ok(())
}
