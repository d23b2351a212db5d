//! Rating data in bounded memory, for training on ratings larger than memory.
//!
//! - [`write_cache`]: a rating file (any format of [`crate::data`]) → the binary rating cache
//!   (the format [`crate::data::load`] writes and reads), parsed and id-remapped in one
//!   streaming pass: the ids go through hash maps (O(users + items)), the ratings straight to
//!   three column files on disk, which are then concatenated behind the header and the id maps.
//!   Never more than the id maps and a few buffers in memory, whatever the number of ratings.
//! - [`split_test_indices`]: which ratings [`Ratings::split`](crate::Ratings::split) puts into
//!   the test set, without its O(ratings) index array: O(test set) memory, O(ratings) time.
//!
//! The split shuffles the rating indices with a backward Fisher–Yates pass (step i = n−1 … 1
//! swaps positions i and j_i ≤ i, j_i from draw n−1−i of SplitMix64) and takes positions
//! [0, n_test). Position p ≥ 1 is written for the last time at step p, with what position j_p
//! held after steps n−1 … p+1 (position 0: what it holds after all of them). What position q
//! holds after steps n−1 … s is q's original index unless a step i ≥ s swapped into it — the
//! smallest such i, the last in time — and then it is what position i held just before step i,
//! i.e. the same question for (i, i+1). [`split_test_indices`] answers all n_test of these
//! questions in one pass over the steps in increasing i (the generator is a counter, so draw t
//! is reachable directly): a question waits under its position until a step swaps into it,
//! then moves to that step's position; whatever still waits at the end keeps its position's
//! original index. Questions waiting at one position get one answer, so they share an entry.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::fs::File;
use std::io::{BufWriter, Read, Seek, Write};
use std::path::{Path, PathBuf};

use crate::data::{dense_base, parse_ratings, DenseIds, CACHE_MAGIC, CACHE_MAGIC_WIDE};
use crate::error::{MfError, Result};
use crate::rng::Rng;

/// A rating position as [`split_test_indices`] returns it and [`read_cache_subset`] takes
/// it: `u32` (half the memory) while every position fits, `u64` past 2^32 ratings.
pub trait Position: Copy + Ord + std::hash::Hash + Send + Sync + 'static {
    const MAX: u64;
    fn of(x: usize) -> Self;
    fn at(self) -> usize;
}

impl Position for u32 {
    const MAX: u64 = u32::MAX as u64;
    #[inline(always)]
    fn of(x: usize) -> Self {
        x as u32
    }
    #[inline(always)]
    fn at(self) -> usize {
        self as usize
    }
}

impl Position for u64 {
    const MAX: u64 = u64::MAX;
    #[inline(always)]
    fn of(x: usize) -> Self {
        x as u64
    }
    #[inline(always)]
    fn at(self) -> usize {
        self as usize
    }
}

/// Whether the positions of `n` ratings fit a `u32` (else [`split_test_indices`] on `n`
/// needs `u64`): the one rule the bindings and Python use to pick the width.
pub fn positions_fit_u32(n: usize) -> bool {
    n as u64 <= u32::MAX as u64 + 1
}

/// The test-set rating indices of `Ratings::split(test_fraction, seed)` on `n` ratings,
/// ascending (the order the split keeps them in), as `P` (an error names the width when a
/// position of `n` ratings does not fit it).
pub fn split_test_indices<P: Position>(n: usize, test_fraction: f64, seed: u64) -> Result<Vec<P>> {
    if !(0.0..1.0).contains(&test_fraction) {
        return Err(MfError::InvalidArgument(format!("test fraction must be in [0, 1), got {test_fraction}")));
    }
    if n > 0 && (n - 1) as u64 > P::MAX {
        return Err(MfError::InvalidArgument(format!("{n} ratings: positions past {} need 64-bit indices", P::MAX)));
    }
    let n_test = ((n as f64 * test_fraction).round() as usize).min(n);
    if n_test == 0 {
        return Ok(Vec::new());
    }
    // The questions in passes of at most PASS test positions: each pass walks the steps from its
    // first question on, with a map of at most PASS entries (small: cache-friendly, and the
    // memory is O(PASS) plus the answers rather than a map of every test position). Group
    // numbers stay below PASS, so they are u32 whatever n is.
    const PASS: usize = 1 << 18;
    let draw = |i: usize| -> P {
        // Step i uses draw n − 1 − i, the rule of `Rng::shuffle`.
        P::of(Rng::after(seed, (n - 1 - i) as u64).swap_index(i))
    };
    let mut out: Vec<P> = Vec::with_capacity(n_test);
    let mut waiting: HashMap<P, u32, BuildHasherDefault<MulHash>> = HashMap::with_capacity_and_hasher(PASS.min(n_test), Default::default());
    let mut group_of: Vec<u32> = Vec::with_capacity(PASS.min(n_test));
    let mut answer: Vec<P> = Vec::with_capacity(PASS.min(n_test));
    for a in (0..n_test).step_by(PASS) {
        let b = (a + PASS).min(n_test);
        waiting.clear();
        group_of.clear();
        // waiting[position] = group; group_of[p − a] = the group answering test position p.
        let mut groups = 0u32;
        let mut ask = |waiting: &mut HashMap<P, u32, BuildHasherDefault<MulHash>>, p: usize, group_of: &mut Vec<u32>| {
            let q = if p == 0 { P::of(0) } else { draw(p) };
            let g = *waiting.entry(q).or_insert_with(|| {
                groups += 1;
                groups - 1
            });
            group_of.push(g);
        };
        for i in a + 1..n {
            // Test position p = i − 1 asks (q, s = i): q = 0 for p = 0, else j_p.
            if i - 1 < b {
                ask(&mut waiting, i - 1, &mut group_of);
            }
            let j = draw(i);
            if j.at() != i {
                if let Some(g) = waiting.remove(&j) {
                    // Step i swapped into j: the answer is what position i held before step i.
                    waiting.insert(P::of(i), g);
                }
            }
        }
        // Test positions asking after the last step (p ≥ n − 1): nothing swaps into them any more.
        for p in a + group_of.len()..b {
            ask(&mut waiting, p, &mut group_of);
        }
        answer.clear();
        answer.resize(groups as usize, P::of(0));
        for (&q, &g) in waiting.iter() {
            answer[g as usize] = q;
        }
        out.extend(group_of.iter().map(|&g| answer[g as usize]));
    }
    out.sort_unstable();
    Ok(out)
}

/// The ratings at `indices` (ascending) of the rating cache `path`, with its id maps: the test
/// set of a streamed split, read a column chunk at a time (memory: the result and one chunk).
pub fn read_cache_subset<P: Position>(path: &Path, indices: &[P]) -> Result<crate::Ratings> {
    let info = cache_header(path)?;
    let (n, nu, ni) = (info.ratings as usize, info.users as usize, info.items as usize);
    if indices.windows(2).any(|w| w[0] >= w[1]) || indices.last().is_some_and(|&x| x.at() >= n) {
        return Err(MfError::InvalidArgument(format!("indices must be ascending and below {n}")));
    }
    let mut f = File::open(path).map_err(|e| MfError::io(path, e))?;
    let mut read_u64s = |count: usize| -> Result<Vec<u64>> {
        let mut b = vec![0u8; count * 8];
        f.read_exact(&mut b).map_err(|e| MfError::io(path, e))?;
        Ok(b.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap())).collect())
    };
    read_u64s(info.header_bytes as usize / 8)?; // the header, checked above
    let user_ids = read_u64s(nu)?;
    let item_ids = read_u64s(ni)?;
    // Three columns of n words (dense ids of `id_bytes`, ratings of 4): pick `indices` from
    // each, a chunk at a time.
    let w = info.id_bytes as usize;
    let mut cols: [Vec<u64>; 3] = Default::default();
    const CHUNK: usize = 1 << 18;
    let mut buf = vec![0u8; CHUNK * 8];
    for (c_no, col) in cols.iter_mut().enumerate() {
        let w = if c_no == 2 { 4 } else { w };
        col.reserve_exact(indices.len());
        let mut at = 0usize; // next index to pick
        for s in (0..n).step_by(CHUNK) {
            let c = CHUNK.min(n - s);
            f.read_exact(&mut buf[..c * w]).map_err(|e| MfError::io(path, e))?;
            while at < indices.len() && indices[at].at() < s + c {
                let o = (indices[at].at() - s) * w;
                col.push(if w == 4 { u32::from_le_bytes(buf[o..o + 4].try_into().unwrap()) as u64 } else { u64::from_le_bytes(buf[o..o + 8].try_into().unwrap()) });
                at += 1;
            }
        }
    }
    let [users, items, values] = cols;
    let base = info.base;
    let out = |d: u64, count: usize| d < base || d - base >= count as u64;
    if users.iter().any(|&u| out(u, nu)) || items.iter().any(|&i| out(i, ni)) {
        return Err(MfError::Format { path: path.into(), msg: "corrupt rating cache: id out of range".into() });
    }
    let values = values.into_iter().map(|x| f32::from_bits(x as u32)).collect();
    Ok(crate::Ratings { users: DenseIds::from_u64s(users), items: DenseIds::from_u64s(items), values, user_ids, item_ids, base })
}

/// A multiplicative hash for the positions of [`split_test_indices`] (they are random
/// already; SipHash's protection against chosen keys is not needed, its cost is).
#[derive(Default)]
struct MulHash(u64);

impl Hasher for MulHash {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    fn write_u32(&mut self, x: u32) {
        self.0 = (x as u64 ^ self.0).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
    fn write_u64(&mut self, x: u64) {
        self.0 = (x ^ self.0).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

/// Removes the listed files when dropped (the temporaries of [`write_cache`], on every path).
struct Cleanup(Vec<PathBuf>);

impl Drop for Cleanup {
    fn drop(&mut self) {
        for p in &self.0 {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// What [`write_cache`] wrote.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CacheInfo {
    pub ratings: u64,
    pub users: u64,
    pub items: u64,
    /// Bytes of the header: 32 (version 1) or 40 (version 2, with the dense base).
    pub header_bytes: u64,
    /// Bytes per dense id of the user and item columns: 4 (version 1) or 8 (version 2).
    pub id_bytes: u64,
    /// The dense id of the first user and item (0 but under the test knob).
    pub base: u64,
}

/// One column of dense ids on its way to a temporary file: 4 bytes per id while every id fits,
/// rewritten once at 8 bytes per id when one does not (or when [`IdColumn::widen`] is called).
struct IdColumn {
    w: BufWriter<File>,
    path: PathBuf,
    wide: bool,
}

impl IdColumn {
    fn create(path: &Path) -> Result<IdColumn> {
        let f = File::create(path).map_err(|e| MfError::io(path, e))?;
        Ok(IdColumn { w: BufWriter::with_capacity(1 << 20, f), path: path.into(), wide: false })
    }
    fn push(&mut self, d: u64) -> Result<()> {
        if !self.wide && d > u32::MAX as u64 {
            self.widen()?;
        }
        let r = if self.wide { self.w.write_all(&d.to_le_bytes()) } else { self.w.write_all(&(d as u32).to_le_bytes()) };
        r.map_err(|e| MfError::io(&self.path, e))
    }
    /// From here on 8 bytes per id; what was written at 4 is rewritten at 8 (once).
    fn widen(&mut self) -> Result<()> {
        if self.wide {
            return Ok(());
        }
        let io = |e| MfError::io(&self.path, e);
        self.w.flush().map_err(io)?;
        let wide_path = self.path.with_extension("wide");
        let mut out = BufWriter::with_capacity(1 << 20, File::create(&wide_path).map_err(io)?);
        let mut src = std::io::BufReader::with_capacity(1 << 20, File::open(&self.path).map_err(io)?);
        let mut word = [0u8; 4];
        loop {
            match src.read_exact(&mut word) {
                Ok(()) => out.write_all(&(u32::from_le_bytes(word) as u64).to_le_bytes()).map_err(io)?,
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => break,
                Err(e) => return Err(io(e)),
            }
        }
        out.flush().map_err(io)?;
        drop((out, src));
        std::fs::rename(&wide_path, &self.path).map_err(io)?;
        let mut f = std::fs::OpenOptions::new().append(true).open(&self.path).map_err(io)?;
        f.seek(std::io::SeekFrom::End(0)).map_err(io)?;
        self.w = BufWriter::with_capacity(1 << 20, f);
        self.wide = true;
        Ok(())
    }
    fn finish(self) -> Result<()> {
        self.w.into_inner().map_err(|e| MfError::io(&self.path, e.into_error()))?;
        Ok(())
    }
}

/// Parse `path` (any supported text format, gzip ok) into the binary rating cache `out`, in
/// bounded memory (see the module doc). Written atomically: temporaries next to `out`, fsync,
/// rename; nothing is left behind on an error. Parse errors name the file and line.
pub fn write_cache(path: &Path, out: &Path) -> Result<CacheInfo> {
    let dir = out.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(|e| MfError::io(dir, e))?;
    let name = out.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let pid = std::process::id();
    let col = |c: &str| dir.join(format!(".{name}.{c}.tmp.{pid}"));
    let (cu, ci, cv, tmp) = (col("users"), col("items"), col("values"), dir.join(format!(".{name}.tmp.{pid}")));
    let _cleanup = Cleanup(vec![cu.clone(), ci.clone(), cv.clone(), tmp.clone()]);
    let create = |p: &Path| -> Result<BufWriter<File>> { Ok(BufWriter::with_capacity(1 << 20, File::create(p).map_err(|e| MfError::io(p, e))?)) };
    let (mut wu, mut wi, mut wv) = (IdColumn::create(&cu)?, IdColumn::create(&ci)?, create(&cv)?);
    let (mut umap, mut imap) = (HashMap::<u64, u64>::new(), HashMap::<u64, u64>::new());
    let (mut user_ids, mut item_ids) = (Vec::<u64>::new(), Vec::<u64>::new());
    let base = dense_base();
    let n = parse_ratings(path, |u, i, r| {
        let du = crate::data::dense_id(&mut umap, &mut user_ids, u, base, "user")?;
        let di = crate::data::dense_id(&mut imap, &mut item_ids, i, base, "item")?;
        wu.push(du)?;
        wi.push(di)?;
        wv.write_all(&r.to_le_bytes()).map_err(|e| MfError::io(&cv, e))
    })?;
    drop((umap, imap));
    // Version 1 unless an id did not fit 4 bytes (or the base is not 0): then both columns
    // at 8 bytes, version 2.
    let wide = base != 0 || wu.wide || wi.wide;
    if wide {
        wu.widen()?;
        wi.widen()?;
    }
    wu.finish()?;
    wi.finish()?;
    wv.into_inner().map_err(|e| MfError::io(&cv, e.into_error()))?;
    let io = |e| MfError::io(&tmp, e);
    let mut f = BufWriter::with_capacity(1 << 20, File::create(&tmp).map_err(io)?);
    f.write_all(if wide { CACHE_MAGIC_WIDE } else { CACHE_MAGIC }).map_err(io)?;
    let head: &[u64] = if wide { &[n as u64, user_ids.len() as u64, item_ids.len() as u64, base] } else { &[n as u64, user_ids.len() as u64, item_ids.len() as u64] };
    for x in head.iter().chain(&user_ids).chain(&item_ids) {
        f.write_all(&x.to_le_bytes()).map_err(io)?;
    }
    for p in [&cu, &ci, &cv] {
        let mut src = File::open(p).map_err(|e| MfError::io(p, e))?;
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let k = src.read(&mut buf).map_err(|e| MfError::io(p, e))?;
            if k == 0 {
                break;
            }
            f.write_all(&buf[..k]).map_err(io)?;
        }
        drop(src);
        let _ = std::fs::remove_file(p);
    }
    let f = f.into_inner().map_err(|e| io(e.into_error()))?;
    f.sync_all().map_err(io)?;
    drop(f);
    std::fs::rename(&tmp, out).map_err(|e| MfError::io(out, e))?;
    let (header_bytes, id_bytes) = if wide { (40, 8) } else { (32, 4) };
    Ok(CacheInfo { ratings: n as u64, users: user_ids.len() as u64, items: item_ids.len() as u64, header_bytes, id_bytes, base })
}

/// The header of a rating cache: (ratings, users, items), checked against the file's size so
/// that a truncated or foreign file is an error naming it.
pub fn cache_header(path: &Path) -> Result<CacheInfo> {
    let bad = |msg: String| MfError::Format { path: path.into(), msg: format!("not a complete rating cache: {msg}") };
    let mut f = File::open(path).map_err(|e| MfError::io(path, e))?;
    let mut h = [0u8; 40];
    f.read_exact(&mut h[..32]).map_err(|_| bad("shorter than its header".into()))?;
    let wide = &h[..8] == CACHE_MAGIC_WIDE;
    if !wide && &h[..8] != CACHE_MAGIC {
        return Err(bad("bad magic".into()));
    }
    if wide {
        f.read_exact(&mut h[32..]).map_err(|_| bad("shorter than its header".into()))?;
    }
    let rd = |o: usize| u64::from_le_bytes(h[o..o + 8].try_into().unwrap());
    let (header_bytes, id_bytes, base) = if wide { (40, 8, rd(32)) } else { (32, 4, 0) };
    let info = CacheInfo { ratings: rd(8), users: rd(16), items: rd(24), header_bytes, id_bytes, base };
    let need = (info.users as u128 + info.items as u128) * 8 + info.ratings as u128 * (2 * id_bytes as u128 + 4) + header_bytes as u128;
    let len = f.metadata().map_err(|e| MfError::io(path, e))?.len() as u128;
    if need != len {
        return Err(bad(format!("{} ratings, {} users and {} items need {need} bytes, the file has {len}", info.ratings, info.users, info.items)));
    }
    Ok(info)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::{load, read_ratings};
    use crate::Ratings;

    fn positions(r: &Ratings, test: &Ratings) -> Vec<u32> {
        // Ratings here are distinct by value: find each test rating's index in r.
        test.values.iter().map(|v| r.values.iter().position(|x| x == v).unwrap() as u32).collect()
    }

    #[test]
    fn split_indices_match_the_in_memory_split() {
        for n in [0usize, 1, 2, 3, 5, 10, 11, 97, 1000, 4099] {
            let users: Vec<u64> = (0..n as u64).map(|x| x % 13).collect();
            let items: Vec<u64> = (0..n as u64).map(|x| x % 7).collect();
            let values: Vec<f32> = (0..n).map(|x| x as f32).collect();
            let r = Ratings::from_triples(&users, &items, &values).unwrap();
            for frac in [0.0, 0.1, 0.25, 0.5, 0.6, 0.9, 0.99] {
                for seed in [0u64, 1, 42] {
                    let (_, test) = r.split(frac, seed).unwrap();
                    let got = split_test_indices::<u32>(n, frac, seed).unwrap();
                    assert_eq!(got, positions(&r, &test), "n={n} frac={frac} seed={seed}");
                    let wide = split_test_indices::<u64>(n, frac, seed).unwrap();
                    assert_eq!(wide, got.iter().map(|&x| x as u64).collect::<Vec<_>>());
                }
            }
        }
    }

    #[test]
    fn split_indices_in_several_passes_match_the_in_memory_split() {
        // More test positions than one pass takes (1 << 18): three passes.
        let n = (1usize << 20) + 7;
        let ids: Vec<u64> = (0..n as u64).map(|x| x % 1000).collect();
        let values: Vec<f32> = (0..n).map(|x| x as f32).collect(); // exact below 2^24: the index
        let r = Ratings::from_triples(&ids, &ids, &values).unwrap();
        let (_, test) = r.split(0.6, 9).unwrap();
        let want: Vec<u32> = test.values.iter().map(|&v| v as u32).collect();
        assert_eq!(split_test_indices::<u32>(n, 0.6, 9).unwrap(), want);
    }

    #[test]
    fn split_indices_reject_a_bad_fraction() {
        assert!(split_test_indices::<u32>(10, 1.0, 0).is_err());
        assert!(split_test_indices::<u32>(10, -0.1, 0).is_err());
    }

    #[test]
    fn split_indices_past_2_pow_32_need_u64() {
        // 2^32 ratings: positions up to 2^32 − 1 still fit u32; one more does not.
        assert!(positions_fit_u32(1 << 32) && !positions_fit_u32((1 << 32) + 1));
        assert!(split_test_indices::<u32>(1 << 32, 0.0, 1).unwrap().is_empty());
        let e = split_test_indices::<u32>((1 << 32) + 1, 0.0, 1).unwrap_err().to_string();
        assert!(e.contains("64-bit"), "{e}");
        assert!(split_test_indices::<u64>((1 << 40) + 3, 0.0, 1).unwrap().is_empty());
    }

    #[test]
    fn swap_steps_past_2_pow_32_reach_every_position() {
        // The multiply-shift reaches 2^32 values only: past it the step draws 64 bits, so
        // positions above u32::MAX are swapped in (and the split's draw is the shuffle's).
        let i = (1usize << 40) + 5;
        let js: Vec<usize> = (0..64).map(|t| Rng::after(7, t).swap_index(i)).collect();
        assert!(js.iter().all(|&j| j <= i));
        assert!(js.iter().filter(|&&j| j > u32::MAX as usize).count() > 32);
        let mut a = Rng::new(3);
        let mut v: Vec<u32> = (0..50).collect();
        a.shuffle(&mut v);
        let mut w: Vec<u32> = (0..50).collect();
        let mut b = Rng::new(3);
        for i in (1..50).rev() {
            let j = b.swap_index(i);
            w.swap(i, j);
        }
        assert_eq!(v, w);
    }

    #[test]
    fn streamed_cache_is_the_in_memory_cache() {
        let dir = std::env::temp_dir().join(format!("sf-mf-stream-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let src = dir.join("r.csv");
        let mut text = String::from("userId,movieId,rating,timestamp\n");
        for n in 0..5000u64 {
            text += &format!("{},{},{}.5,0\n", (n * 7919) % 311 + 1_000_000, (n * 104_729) % 97, n % 5);
        }
        std::fs::write(&src, &text).unwrap();
        let out = dir.join("r.sfr");
        let info = write_cache(&src, &out).unwrap();
        let want = read_ratings(&src).unwrap();
        assert_eq!(info, CacheInfo { ratings: 5000, users: want.n_users() as u64, items: want.n_items() as u64, header_bytes: 32, id_bytes: 4, base: 0 });
        assert_eq!(std::fs::read(&out).unwrap(), crate::data::encode(&want));
        assert_eq!(cache_header(&out).unwrap(), info);
        // Any subset of it, read a chunk at a time, is the in-memory subset.
        let idx: Vec<u32> = (0..5000).filter(|x| x % 7 == 3 || *x == 0 || *x == 4999).collect();
        let sub = read_cache_subset(&out, &idx).unwrap();
        assert_eq!(sub.user_ids, want.user_ids);
        assert_eq!(sub.users.iter().collect::<Vec<_>>(), idx.iter().map(|&x| want.users.get(x as usize)).collect::<Vec<_>>());
        assert_eq!(sub.items.iter().collect::<Vec<_>>(), idx.iter().map(|&x| want.items.get(x as usize)).collect::<Vec<_>>());
        assert_eq!(sub.users.width(), 4);
        assert_eq!(sub.values, idx.iter().map(|&x| want.values[x as usize]).collect::<Vec<_>>());
        assert!(read_cache_subset(&out, &[3u32, 2]).is_err());
        assert!(read_cache_subset(&out, &[5000u32]).is_err());
        assert_eq!(read_cache_subset::<u32>(&out, &[]).unwrap().len(), 0);
        let wide: Vec<u64> = idx.iter().map(|&x| x as u64).collect();
        let sub64 = read_cache_subset(&out, &wide).unwrap();
        assert_eq!((sub64.users, sub64.items, sub64.values), (sub.users.clone(), sub.items.clone(), sub.values.clone()));
        assert!(read_cache_subset(&out, &[1u64 << 33]).is_err());
        // A cache is itself a rating file for the loaders.
        assert_eq!(read_ratings(&out).unwrap(), want);
        assert_eq!(load(&out, Some(&dir.join("cache"))).unwrap(), want);
        assert!(!dir.join("cache").exists());
        // Only the cache is left: no temporaries.
        let mut names: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name()).collect();
        names.sort();
        assert_eq!(names, vec![std::ffi::OsString::from("r.csv"), "r.sfr".into()]);
        // Errors name file and line and leave nothing behind.
        let bad = dir.join("bad.txt");
        std::fs::write(&bad, "1 2 3\n4 5 x\n").unwrap();
        let e = write_cache(&bad, &dir.join("bad.sfr")).unwrap_err().to_string();
        assert!(e.contains("bad.txt:2") && e.contains("not a number"), "{e}");
        std::fs::write(&bad, "").unwrap();
        assert!(write_cache(&bad, &dir.join("bad.sfr")).unwrap_err().to_string().contains("empty"));
        let mut names: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name()).collect();
        names.sort();
        assert_eq!(names, vec![std::ffi::OsString::from("bad.txt"), "r.csv".into(), "r.sfr".into()]);
        // A truncated cache is an error naming it.
        let b = std::fs::read(&out).unwrap();
        std::fs::write(dir.join("t.sfr"), &b[..b.len() - 1]).unwrap();
        assert!(cache_header(&dir.join("t.sfr")).unwrap_err().to_string().contains("t.sfr"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn id_column_widens_once_past_u32_and_keeps_what_it_had() {
        let dir = std::env::temp_dir().join(format!("sf-mf-idcol-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("col");
        let want: Vec<u64> = vec![0, 7, u32::MAX as u64, (1 << 32) + 3, 5, u64::MAX];
        let mut c = IdColumn::create(&p).unwrap();
        for &d in &want[..3] {
            c.push(d).unwrap();
        }
        assert!(!c.wide);
        for &d in &want[3..] {
            c.push(d).unwrap();
        }
        assert!(c.wide);
        c.widen().unwrap(); // a second widen is nothing
        c.finish().unwrap();
        let got: Vec<u64> = std::fs::read(&p).unwrap().chunks_exact(8).map(|b| u64::from_le_bytes(b.try_into().unwrap())).collect();
        assert_eq!(got, want);
        // Narrow all along: 4 bytes each.
        let mut c = IdColumn::create(&p).unwrap();
        (0..5u64).for_each(|d| c.push(d).unwrap());
        c.finish().unwrap();
        assert_eq!(std::fs::read(&p).unwrap().len(), 20);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn wide_cache_round_trips_and_its_subsets_read_past_2_pow_32() {
        use crate::data::{decode, encode, DenseIds};
        let dir = std::env::temp_dir().join(format!("sf-mf-wide-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let base = (1u64 << 33) + 11;
        let narrow = Ratings::from_triples(&[5, 9, 5, 2], &[1, 1, 3, 4], &[1.0, 2.0, 3.0, 4.5]).unwrap();
        let shift = |d: &DenseIds| DenseIds::Wide(d.iter().map(|x| x + base).collect());
        let wide = Ratings { users: shift(&narrow.users), items: shift(&narrow.items), base, ..narrow.clone() };
        assert_eq!(wide.rows().collect::<Vec<_>>(), narrow.rows().collect::<Vec<_>>());
        let bytes = encode(&wide);
        assert_eq!(&bytes[..8], CACHE_MAGIC_WIDE);
        assert_eq!(decode(&bytes, Path::new("x")).unwrap(), wide);
        let out = dir.join("w.sfr");
        std::fs::write(&out, &bytes).unwrap();
        let info = cache_header(&out).unwrap();
        assert_eq!((info.header_bytes, info.id_bytes, info.base, info.users), (40, 8, base, 3));
        let sub = read_cache_subset(&out, &[1u32, 3]).unwrap();
        assert_eq!(sub.users.iter().collect::<Vec<_>>(), vec![base + 1, base + 2]);
        assert_eq!((sub.base, sub.user_row(1), sub.item_row(1)), (base, 2, 2));
        // An id below the base or past the maps is a corrupt cache, not a wrap.
        let mut bad = bytes.clone();
        let col = 40 + 8 * (3 + 3);
        bad[col..col + 8].copy_from_slice(&(base - 1).to_le_bytes());
        assert!(decode(&bad, Path::new("x")).unwrap_err().to_string().contains("id out of range"));
        // Aligning onto the wide set keeps its base; the narrow set's ids are rows there.
        let (al, unseen) = narrow.align_to(&wide);
        assert_eq!((al.base, unseen.ratings), (base, 0));
        assert_eq!(al.users, wide.users);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
