//! Rating data: readers, dense id remapping, seeded split, binary cache.
//!
//! Accepted formats (each also gzip-compressed, detected by the gzip magic bytes):
//! MovieLens `u.data` (whitespace `user item rating [timestamp]`), LIBMF text (`u i r`),
//! MovieLens `ratings.dat` (`user::item::rating::timestamp`), `ratings.csv` (comma separated,
//! optional header line), Matrix Market coordinate (`%%MatrixMarket` banner, size line).
//! Original ids are kept (`user_ids`, `item_ids`) so models answer in the user's ids.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};

use scalefree_io::ratings::{RatingLine, RatingSyntax};

use crate::error::{MfError, Result};
use crate::rng::Rng;

/// One side's dense ids, one per rating: 4 bytes each while every id fits (the common case,
/// and the layout of the rating cache's version 1), 8 bytes once one does not (more than 2^32
/// distinct users or items, or a dense base past 2^32: [`dense_base`]). A push past
/// `u32::MAX` widens the column once; readers take either through [`DenseIds::get`] /
/// [`DenseIds::iter`].
#[derive(Clone, Debug)]
pub enum DenseIds {
    Narrow(Vec<u32>),
    Wide(Vec<u64>),
}

impl Default for DenseIds {
    fn default() -> Self {
        DenseIds::Narrow(Vec::new())
    }
}

/// Equal when the ids are, whatever their width.
impl PartialEq for DenseIds {
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}

/// The ids of a [`DenseIds`] as `u64`.
pub enum DenseIter<'a> {
    Narrow(std::slice::Iter<'a, u32>),
    Wide(std::slice::Iter<'a, u64>),
}

impl Iterator for DenseIter<'_> {
    type Item = u64;
    #[inline]
    fn next(&mut self) -> Option<u64> {
        match self {
            DenseIter::Narrow(it) => it.next().map(|&x| x as u64),
            DenseIter::Wide(it) => it.next().copied(),
        }
    }
    fn size_hint(&self) -> (usize, Option<usize>) {
        match self {
            DenseIter::Narrow(it) => it.size_hint(),
            DenseIter::Wide(it) => it.size_hint(),
        }
    }
}

impl DenseIds {
    /// Narrow when every id fits 4 bytes.
    pub fn from_u64s(v: Vec<u64>) -> DenseIds {
        if v.iter().all(|&x| x <= u32::MAX as u64) {
            DenseIds::Narrow(v.into_iter().map(|x| x as u32).collect())
        } else {
            DenseIds::Wide(v)
        }
    }
    pub fn len(&self) -> usize {
        match self {
            DenseIds::Narrow(v) => v.len(),
            DenseIds::Wide(v) => v.len(),
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Bytes per id: 4 or 8.
    pub fn width(&self) -> usize {
        match self {
            DenseIds::Narrow(_) => 4,
            DenseIds::Wide(_) => 8,
        }
    }
    #[inline]
    pub fn get(&self, n: usize) -> u64 {
        match self {
            DenseIds::Narrow(v) => v[n] as u64,
            DenseIds::Wide(v) => v[n],
        }
    }
    pub fn iter(&self) -> DenseIter<'_> {
        match self {
            DenseIds::Narrow(v) => DenseIter::Narrow(v.iter()),
            DenseIds::Wide(v) => DenseIter::Wide(v.iter()),
        }
    }
    /// Appends `d`, widening the column first if `d` does not fit 4 bytes.
    #[inline]
    pub fn push(&mut self, d: u64) {
        match self {
            DenseIds::Narrow(v) if d <= u32::MAX as u64 => v.push(d as u32),
            DenseIds::Narrow(v) => {
                let mut w: Vec<u64> = Vec::with_capacity(v.capacity().max(v.len() + 1));
                w.extend(v.iter().map(|&x| x as u64));
                w.push(d);
                *self = DenseIds::Wide(w);
            }
            DenseIds::Wide(v) => v.push(d),
        }
    }
    /// An empty column of this width with room for `n` ids.
    pub fn with_capacity_like(&self, n: usize) -> DenseIds {
        match self {
            DenseIds::Narrow(_) => DenseIds::Narrow(Vec::with_capacity(n)),
            DenseIds::Wide(_) => DenseIds::Wide(Vec::with_capacity(n)),
        }
    }
    /// The ids at positions `ix`, at this width.
    pub fn pick(&self, ix: impl Iterator<Item = usize>) -> DenseIds {
        match self {
            DenseIds::Narrow(v) => DenseIds::Narrow(ix.map(|n| v[n]).collect()),
            DenseIds::Wide(v) => DenseIds::Wide(ix.map(|n| v[n]).collect()),
        }
    }
    /// Little-endian bytes at `width` (4 or 8; 4 only for a narrow column).
    pub fn to_le_bytes(&self, width: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.len() * width);
        match (self, width) {
            (DenseIds::Narrow(v), 4) => v.iter().for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
            (_, 8) => self.iter().for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
            _ => panic!("a column of 8-byte dense ids written at 4 bytes"),
        }
        out
    }
}

/// The test knob `SCALEFREE_TEST_MF_DENSE_BASE` (default 0; `docs/config.md`): the dense id
/// of the first user and of the first item. Past 2^32 it makes every dense id that
/// [`Ratings`] and the rating cache store 8 bytes wide and past 2^32, on data of any size, so
/// the 64-bit path is exercised without 2^32 distinct ids; rows of P and Q are `id − base`.
pub fn dense_base() -> u64 {
    std::env::var("SCALEFREE_TEST_MF_DENSE_BASE").ok().and_then(|s| s.trim().parse().ok()).unwrap_or(0)
}

/// Ratings with dense ids starting at `base` (0 but under the test knob [`dense_base`]):
/// `user_ids[u - base]` is the original id of dense user `u`, and `u - base` its row of P.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Ratings {
    pub users: DenseIds,
    pub items: DenseIds,
    pub values: Vec<f32>,
    pub user_ids: Vec<u64>,
    pub item_ids: Vec<u64>,
    pub base: u64,
}

impl Ratings {
    /// Rating `n`'s user row (dense id − base).
    #[inline]
    pub fn user_row(&self, n: usize) -> usize {
        (self.users.get(n) - self.base) as usize
    }
    /// Rating `n`'s item row (dense id − base).
    #[inline]
    pub fn item_row(&self, n: usize) -> usize {
        (self.items.get(n) - self.base) as usize
    }
    /// (user row, item row, rating) of every rating, in order.
    pub fn rows(&self) -> impl Iterator<Item = (usize, usize, f32)> + '_ {
        let b = self.base;
        self.users.iter().zip(self.items.iter()).zip(&self.values).map(move |((u, i), &v)| ((u - b) as usize, (i - b) as usize, v))
    }

    pub fn len(&self) -> usize {
        self.values.len()
    }
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }
    pub fn n_users(&self) -> usize {
        self.user_ids.len()
    }
    pub fn n_items(&self) -> usize {
        self.item_ids.len()
    }
    pub fn mean(&self) -> f64 {
        if self.values.is_empty() {
            return 0.0;
        }
        self.values.iter().map(|&v| v as f64).sum::<f64>() / self.values.len() as f64
    }

    /// Build from original ids (any u64), remapping to dense ids in order of first appearance.
    pub fn from_triples(users: &[u64], items: &[u64], values: &[f32]) -> Result<Ratings> {
        if users.len() != items.len() || users.len() != values.len() {
            return Err(MfError::InvalidArgument(format!(
                "users, items and ratings differ in length ({}, {}, {})",
                users.len(),
                items.len(),
                values.len()
            )));
        }
        let mut b = Builder::default();
        for (n, ((&u, &i), &r)) in users.iter().zip(items).zip(values).enumerate() {
            if !r.is_finite() {
                return Err(MfError::InvalidArgument(format!("rating {n} is not finite ({r})")));
            }
            b.push(u, i, r)?;
        }
        Ok(b.finish())
    }

    /// Seeded random split: `test_fraction` of the ratings go to the second set. Both keep the
    /// full id maps, so dense ids agree between them.
    pub fn split(&self, test_fraction: f64, seed: u64) -> Result<(Ratings, Ratings)> {
        if !(0.0..1.0).contains(&test_fraction) {
            return Err(MfError::InvalidArgument(format!("test fraction must be in [0, 1), got {test_fraction}")));
        }
        // u32 positions while they fit (half the memory), u64 past 2^32 ratings.
        if crate::stream::positions_fit_u32(self.len()) {
            Ok(self.split_as::<u32>(test_fraction, seed))
        } else {
            Ok(self.split_as::<u64>(test_fraction, seed))
        }
    }

    fn split_as<P: crate::stream::Position>(&self, test_fraction: f64, seed: u64) -> (Ratings, Ratings) {
        let mut idx: Vec<P> = (0..self.len()).map(P::of).collect();
        Rng::new(seed).shuffle(&mut idx);
        let n_test = (self.len() as f64 * test_fraction).round() as usize;
        let pick = |ix: &[P]| {
            let mut ix = ix.to_vec();
            ix.sort_unstable();
            Ratings {
                users: self.users.pick(ix.iter().map(|&n| n.at())),
                items: self.items.pick(ix.iter().map(|&n| n.at())),
                values: ix.iter().map(|&n| self.values[n.at()]).collect(),
                user_ids: self.user_ids.clone(),
                item_ids: self.item_ids.clone(),
                base: self.base,
            }
        };
        (pick(&idx[n_test..]), pick(&idx[..n_test]))
    }
}

/// What [`Ratings::align_to`] found: ids of the other set that the base never saw.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Unseen {
    pub users: usize,
    pub items: usize,
    /// Ratings with an unseen user or item (answered with the training mean).
    pub ratings: usize,
}

impl Ratings {
    /// These ratings renumbered into `base`'s id maps (original ids compared, so two files
    /// loaded separately line up): the result's `user_ids` / `item_ids` start with `base`'s,
    /// followed by the ids `base` never saw (dense ids ≥ `base.n_users()` / `n_items()`, which
    /// models answer with the training mean).
    pub fn align_to(&self, base: &Ratings) -> (Ratings, Unseen) {
        // Rows (dense id − base) of `ids` → rows of `base`'s maps; the result's dense ids
        // start at `base.base`.
        fn remap(ids: &[u64], base: &[u64], dense: &DenseIds, from: u64, to: u64) -> (DenseIds, Vec<u64>, usize) {
            let index: HashMap<u64, u64> = base.iter().enumerate().map(|(n, &x)| (x, n as u64)).collect();
            let mut out_ids = base.to_vec();
            let mut extra: HashMap<u64, u64> = HashMap::new();
            let table: Vec<u64> = ids
                .iter()
                .map(|&x| match index.get(&x) {
                    Some(&d) => d,
                    None => *extra.entry(x).or_insert_with(|| {
                        out_ids.push(x);
                        (out_ids.len() - 1) as u64
                    }),
                })
                .collect();
            let n = extra.len();
            let mut out = dense.with_capacity_like(dense.len());
            dense.iter().for_each(|d| out.push(to + table[(d - from) as usize]));
            (out, out_ids, n)
        }
        let (users, user_ids, nu) = remap(&self.user_ids, &base.user_ids, &self.users, self.base, base.base);
        let (items, item_ids, ni) = remap(&self.item_ids, &base.item_ids, &self.items, self.base, base.base);
        let (bm, bn) = (base.base + base.n_users() as u64, base.base + base.n_items() as u64);
        let ratings = users.iter().zip(items.iter()).filter(|&(u, i)| u >= bm || i >= bn).count();
        (Ratings { users, items, values: self.values.clone(), user_ids, item_ids, base: base.base }, Unseen { users: nu, items: ni, ratings })
    }

    /// True when these ratings number users and items as `base` does (their id maps start
    /// with `base`'s), so dense ids mean the same in both.
    pub fn shares_ids_with(&self, user_ids: &[u64], item_ids: &[u64]) -> bool {
        self.user_ids.len() >= user_ids.len() && self.item_ids.len() >= item_ids.len() && self.user_ids[..user_ids.len()] == *user_ids && self.item_ids[..item_ids.len()] == *item_ids
    }
}

struct Builder {
    umap: HashMap<u64, u64>,
    imap: HashMap<u64, u64>,
    r: Ratings,
}

impl Default for Builder {
    fn default() -> Self {
        Builder { umap: HashMap::new(), imap: HashMap::new(), r: Ratings { base: dense_base(), ..Ratings::default() } }
    }
}

/// The dense id of `id` in `map` / `ids` (the next one, `base` + how many there are, when it
/// is new): 64-bit, so the only limit is `base` + the distinct ids below 2^64.
pub(crate) fn dense_id(map: &mut HashMap<u64, u64>, ids: &mut Vec<u64>, id: u64, base: u64, what: &str) -> Result<u64> {
    if let Some(&d) = map.get(&id) {
        return Ok(d);
    }
    let d = base.checked_add(ids.len() as u64).ok_or_else(|| MfError::InvalidArgument(format!("dense {what} ids past 2^64 (base {base})")))?;
    ids.push(id);
    map.insert(id, d);
    Ok(d)
}

impl Builder {
    fn push(&mut self, u: u64, i: u64, v: f32) -> Result<()> {
        let r = &mut self.r;
        let du = dense_id(&mut self.umap, &mut r.user_ids, u, r.base, "user")?;
        let di = dense_id(&mut self.imap, &mut r.item_ids, i, r.base, "item")?;
        r.users.push(du);
        r.items.push(di);
        r.values.push(v);
        Ok(())
    }
    fn finish(self) -> Ratings {
        self.r
    }
}

fn open(path: &Path) -> Result<Box<dyn BufRead>> {
    let mut f = File::open(path).map_err(|e| MfError::io(path, e))?;
    let mut magic = [0u8; 2];
    let n = f.read(&mut magic).map_err(|e| MfError::io(path, e))?;
    drop(f);
    let f = File::open(path).map_err(|e| MfError::io(path, e))?;
    if n == 2 && magic == [0x1f, 0x8b] {
        Ok(Box::new(BufReader::with_capacity(1 << 20, flate2::read::MultiGzDecoder::new(f))))
    } else {
        Ok(Box::new(BufReader::with_capacity(1 << 20, f)))
    }
}

/// Read a rating file in any supported format (see the module doc), or a rating cache
/// written by [`load`] / [`crate::stream::write_cache`] (recognised by its magic bytes).
pub fn read_ratings(path: &Path) -> Result<Ratings> {
    if is_cache(path)? {
        let bytes = std::fs::read(path).map_err(|e| MfError::io(path, e))?;
        return decode(&bytes, path);
    }
    let mut b = Builder::default();
    parse_ratings(path, |u, i, r| b.push(u, i, r))?;
    Ok(b.finish())
}

/// Whether `path` starts with the rating cache's magic bytes.
pub fn is_cache(path: &Path) -> Result<bool> {
    let mut f = File::open(path).map_err(|e| MfError::io(path, e))?;
    let mut magic = [0u8; 8];
    let mut got = 0;
    while got < magic.len() {
        match f.read(&mut magic[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(MfError::io(path, e)),
        }
    }
    Ok(got == magic.len() && (&magic == CACHE_MAGIC || &magic == CACHE_MAGIC_WIDE))
}

/// Parse a rating file in any supported text format (see the module doc), handing every
/// rating to `push` as (user id, item id, rating) in file order; returns how many there were.
/// Errors name the file and line; an empty file and a Matrix Market entry count that does not
/// match are errors too.
pub fn parse_ratings(path: &Path, push: impl FnMut(u64, u64, f32) -> Result<()>) -> Result<usize> {
    parse_lines(path, RatingSyntax::new(u64::MAX), push)
}

/// The (user, item, rating) lines of a file for prediction: every format [`parse_ratings`]
/// reads, and also `user item` lines without a rating (NaN). A file that mixes lines with and
/// without ratings is an error naming the first line that differs.
pub fn read_pairs(path: &Path) -> Result<(Vec<u64>, Vec<u64>, Vec<f32>)> {
    let (mut us, mut is, mut vs) = (Vec::new(), Vec::new(), Vec::new());
    parse_lines(path, RatingSyntax::new(u64::MAX).with_pairs(), |u, i, r| {
        if let Some(&first) = vs.first() {
            let first: f32 = first;
            if first.is_nan() != r.is_nan() {
                return Err(MfError::Format { path: path.into(), msg: format!("rating {} {} a rating where the first line {}", vs.len() + 1, if r.is_nan() { "lacks" } else { "has" }, if r.is_nan() { "has one" } else { "has none" }) });
            }
        }
        us.push(u);
        is.push(i);
        vs.push(r);
        Ok(())
    })?;
    Ok((us, is, vs))
}

fn parse_lines(path: &Path, syntax: RatingSyntax, mut push: impl FnMut(u64, u64, f32) -> Result<()>) -> Result<usize> {
    let mut syntax = syntax;
    let mut rd = open(path)?;
    let mut count = 0usize;
    let mut line = String::new();
    let mut lineno = 0usize;
    // The line syntax is the one of the partitioned reader (`scalefree-io`), so both accept
    // the same files.
    loop {
        line.clear();
        let n = rd.read_line(&mut line).map_err(|e| MfError::io(path, e))?;
        if n == 0 {
            break;
        }
        lineno += 1;
        match syntax.line(&line, lineno == 1).map_err(|msg| MfError::Parse { path: path.into(), line: lineno, msg })? {
            RatingLine::Skip => {}
            RatingLine::Rating { user, item, rating } => {
                push(user, item, rating)?;
                count += 1;
            }
        }
    }
    if count == 0 {
        return Err(MfError::Format { path: path.into(), msg: "no ratings (empty file)".into() });
    }
    if let Some(nnz) = syntax.declared_entries() {
        if nnz != count as u64 {
            return Err(MfError::Format { path: path.into(), msg: format!("Matrix Market header says {nnz} entries, file has {count}") });
        }
    }
    Ok(count)
}

/// The rating cache, version 1: 4-byte dense ids from 0 (what every cache of fewer than
/// 2^32 users and items is). Header: magic, ratings, users, items (u64 each), then the user
/// and item id maps (u64 each), then the user, item and rating columns.
pub const CACHE_MAGIC: &[u8; 8] = b"SFMFRAT1";
/// Version 2, for dense ids that do not fit 4 bytes: the header has a fifth word, the dense
/// base, and the user and item columns are 8-byte dense ids.
pub const CACHE_MAGIC_WIDE: &[u8; 8] = b"SFMFRAT2";

fn put_u64s(out: &mut Vec<u8>, v: impl Iterator<Item = u64>) {
    v.for_each(|x| out.extend_from_slice(&x.to_le_bytes()));
}

/// Serialise ratings to the compact cache format (little-endian, length-prefixed arrays).
/// Version 1 while every dense id fits 4 bytes and the base is 0, else version 2.
pub fn encode(r: &Ratings) -> Vec<u8> {
    let wide = r.base != 0 || r.users.width() == 8 || r.items.width() == 8;
    let w = if wide { 8 } else { 4 };
    let mut out = Vec::with_capacity(40 + r.len() * (2 * w + 4) + (r.n_users() + r.n_items()) * 8);
    out.extend_from_slice(if wide { CACHE_MAGIC_WIDE } else { CACHE_MAGIC });
    put_u64s(&mut out, [r.len() as u64, r.n_users() as u64, r.n_items() as u64].into_iter());
    if wide {
        put_u64s(&mut out, std::iter::once(r.base));
    }
    put_u64s(&mut out, r.user_ids.iter().copied());
    put_u64s(&mut out, r.item_ids.iter().copied());
    out.extend_from_slice(&r.users.to_le_bytes(w));
    out.extend_from_slice(&r.items.to_le_bytes(w));
    r.values.iter().for_each(|x| out.extend_from_slice(&x.to_le_bytes()));
    out
}

/// Inverse of [`encode`]; checks sizes and id bounds so a corrupt cache is an error, not UB.
pub fn decode(bytes: &[u8], path: &Path) -> Result<Ratings> {
    let bad = |msg: &str| MfError::Format { path: path.into(), msg: format!("corrupt rating cache: {msg}") };
    let wide = bytes.len() >= 40 && &bytes[..8] == CACHE_MAGIC_WIDE;
    if !wide && (bytes.len() < 32 || &bytes[..8] != CACHE_MAGIC) {
        return Err(bad("bad header"));
    }
    let rd = |o: usize| u64::from_le_bytes(bytes[o..o + 8].try_into().unwrap());
    let (n, nu, ni) = (rd(8) as usize, rd(16) as usize, rd(24) as usize);
    let (head, w, base) = if wide { (40usize, 8usize, rd(32)) } else { (32, 4, 0) };
    let need = head
        .checked_add(nu.checked_add(ni).and_then(|x| x.checked_mul(8)).ok_or_else(|| bad("size"))?)
        .and_then(|x| x.checked_add(n.checked_mul(2 * w + 4)?));
    if need != Some(bytes.len()) {
        return Err(bad("size mismatch"));
    }
    let mut o = head;
    let mut take = |cnt: usize, w: usize| {
        let s = &bytes[o..o + cnt * w];
        o += cnt * w;
        s
    };
    let user_ids = take(nu, 8).chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap())).collect();
    let item_ids = take(ni, 8).chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap())).collect();
    let mut col = |cnt: usize| -> DenseIds {
        let s = take(cnt, w);
        if w == 4 {
            DenseIds::Narrow(s.chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().unwrap())).collect())
        } else {
            DenseIds::from_u64s(s.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap())).collect())
        }
    };
    let users = col(n);
    let items = col(n);
    let values = take(n, 4).chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
    let out = |d: u64, count: usize| d < base || d - base >= count as u64;
    if users.iter().any(|u| out(u, nu)) || items.iter().any(|i| out(i, ni)) {
        return Err(bad("id out of range"));
    }
    Ok(Ratings { users, items, values, user_ids, item_ids, base })
}

/// Write `bytes` to `path` atomically: a temp file in the same directory, fsync, rename.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(|e| MfError::io(dir, e))?;
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let tmp = dir.join(format!(".{name}.tmp.{}", std::process::id()));
    let res = (|| {
        let mut f = File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if let Err(e) = res {
        let _ = std::fs::remove_file(&tmp);
        return Err(MfError::io(path, e));
    }
    Ok(())
}

/// The cache file for `path` inside `cache_dir`: keyed by canonical path, size and mtime, so
/// an edited data file is read again (and by the dense base of the test knob, if set).
pub fn cache_path(path: &Path, cache_dir: &Path) -> Result<PathBuf> {
    let canon = path.canonicalize().map_err(|e| MfError::io(path, e))?;
    let md = std::fs::metadata(&canon).map_err(|e| MfError::io(path, e))?;
    let mtime = md.modified().ok().and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok()).map(|d| d.as_nanos()).unwrap_or(0);
    // FNV-1a over the key; collisions only cost a re-read because the key is not checked back.
    let mut key = format!("{}\0{}\0{}", canon.display(), md.len(), mtime);
    let base = dense_base();
    if base != 0 {
        key += &format!("\0base {base}"); // the test knob's caches apart from the others
    }
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in key.bytes() {
        h = (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3);
    }
    let stem = canon.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    Ok(cache_dir.join(format!("{stem}.{h:016x}.sfr")))
}

/// Read `path`, using (and filling) a binary cache in `cache_dir` when given.
pub fn load(path: &Path, cache_dir: Option<&Path>) -> Result<Ratings> {
    let Some(dir) = cache_dir else { return read_ratings(path) };
    if is_cache(path)? {
        return read_ratings(path); // already a cache: nothing to cache
    }
    let cp = cache_path(path, dir)?;
    if let Ok(bytes) = std::fs::read(&cp) {
        if let Ok(r) = decode(&bytes, &cp) {
            return Ok(r);
        }
    }
    let r = read_ratings(path)?;
    // A cache that cannot be written (read-only dir) is not an error for the caller.
    let _ = write_atomic(&cp, &encode(&r));
    Ok(r)
}
