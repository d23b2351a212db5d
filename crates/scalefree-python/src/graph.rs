//! `scalefree._native.PageRankCsr` (one rank's local PageRank matrix in compact ids) and
//! the set-up kernels of a partitioned graph load: `owner_partition`, `sort_dedup_pairs`,
//! `degree_counts`, `PageRankCsr.from_edges`; `PageRankCsr.move_to_flash` moves the matrix to a
//! flash runtime's scratch file and `FlashRows` holds HADI's edges there (`flash_rows.rs`). Thin: the kernels are in `scalefree-graph`
//! (`pagerank.rs`, `edges.rs`, `local.rs`, `flash_rows.rs`), the algorithms in `python/scalefree/graph/`.
//! Arrays come in through the buffer protocol (contiguous, no copy) and go out as numpy
//! views of the vectors the kernels filled (no copy); the work runs with the GIL released.

use pyo3::prelude::*;
use scalefree_graph::edges;
use scalefree_graph::hadi::{merge_rows, union_changed};
use scalefree_graph::keys;
use scalefree_graph::local::{local_csr, LocalCsr};
use scalefree_graph::pagerank::{csr_pattern, owned_update, spmv_step, Real};
use scalefree_graph::Id;
use scalefree_graph::flash_rows::FlashRows;
use std::sync::Arc;

use scalefree_flash::{RunStats, Runtime};

use crate::buffer::Buf;
use crate::errors::invalid;
use crate::flash::{flash_err, stats_dict, PyFlashRuntime};
use crate::io::{array, Owned};

/// Vertex ids of an integer buffer: uint32, int64 or uint64 (no copy).
enum Ids<'a> {
    U32(&'a [u32]),
    I64(&'a [i64]),
    U64(&'a [u64]),
}

impl Ids<'_> {
    fn len(&self) -> usize {
        match self {
            Ids::U32(v) => v.len(),
            Ids::I64(v) => v.len(),
            Ids::U64(v) => v.len(),
        }
    }
    fn dtype(&self) -> &'static str {
        match self {
            Ids::U32(_) => "uint32",
            Ids::I64(_) => "int64",
            Ids::U64(_) => "uint64",
        }
    }
}

fn ids<'a>(py: Python<'_>, b: &'a Buf, what: &str) -> PyResult<Ids<'a>> {
    let f = b.format.trim_start_matches(['@', '=', '<']);
    let (p, n) = (b.ptr(), b.count());
    // SAFETY (all three): the buffer is contiguous, aligned to its item size (checked by
    // `Buf::get`) and holds `n` items of the matched type while `b` lives.
    let empty = b.len_bytes() == 0;
    Ok(match (f, b.itemsize()) {
        ("I" | "L", 4) => Ids::U32(if empty { &[] } else { unsafe { std::slice::from_raw_parts(p as *const u32, n) } }),
        ("q" | "l", 8) => Ids::I64(if empty { &[] } else { unsafe { std::slice::from_raw_parts(p as *const i64, n) } }),
        ("Q" | "L", 8) => Ids::U64(if empty { &[] } else { unsafe { std::slice::from_raw_parts(p as *const u64, n) } }),
        _ => return Err(invalid(py, format!("{what} must hold uint32, int64 or uint64 ids, got buffer format {:?}", b.format))),
    })
}

/// A numpy array of shape `(n, 2)` viewing interleaved pairs.
fn pairs_array<'py>(py: Python<'py>, v: Owned) -> PyResult<Bound<'py, PyAny>> {
    array(py, v)?.call_method1("reshape", ((-1i64, 2i64),))
}

/// `(pairs, counts)`: the edges grouped by owner rank (hash of the edge modulo `size`, the
/// same as `scalefree.graph.io.edge_owner`), stably; `pairs` is an `(edges, 2)` array of
/// `dtype` (`"uint32"`, `"int64"` or `"uint64"`; ids that do not fit raise), `counts`
/// int64 edges per owner (`size` entries).
#[pyfunction]
#[pyo3(signature = (src, dst, size, dtype="uint32"))]
pub fn owner_partition<'py>(py: Python<'py>, src: Bound<'py, PyAny>, dst: Bound<'py, PyAny>, size: usize, dtype: &str) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyAny>)> {
    let (sb, db) = (Buf::get(&src, false, "src")?, Buf::get(&dst, false, "dst")?);
    let (s, d) = (ids(py, &sb, "src")?, ids(py, &db, "dst")?);
    if s.len() != d.len() {
        return Err(invalid(py, format!("owner_partition: src holds {} ids but dst {}", s.len(), d.len())));
    }
    fn go<I: scalefree_graph::Id>(s: &[I], d: &[I], size: usize, dtype: &str) -> Result<(Owned, Vec<u64>), String> {
        Ok(match dtype {
            "uint32" => {
                let (p, c) = edges::owner_partition_as::<I, u32>(s, d, size)?;
                (Owned::U32(p), c)
            }
            "int64" => {
                let (p, c) = edges::owner_partition_as::<I, i64>(s, d, size)?;
                (Owned::I64(p), c)
            }
            "uint64" => {
                let (p, c) = edges::owner_partition_as::<I, u64>(s, d, size)?;
                (Owned::U64(p), c)
            }
            _ => return Err(format!("owner_partition: dtype must be uint32, int64 or uint64, got {dtype:?}")),
        })
    }
    let (pairs, counts) = match (s, d) {
        (Ids::U32(s), Ids::U32(d)) => py.detach(|| go(s, d, size, dtype)),
        (Ids::I64(s), Ids::I64(d)) => py.detach(|| go(s, d, size, dtype)),
        (Ids::U64(s), Ids::U64(d)) => py.detach(|| go(s, d, size, dtype)),
        (a, b) if a.len() == 0 && b.len() == 0 => py.detach(|| go::<u32>(&[], &[], size, dtype)),
        (a, b) => return Err(invalid(py, format!("owner_partition: src and dst must have the same dtype, got {} and {}", a.dtype(), b.dtype()))),
    }
    .map_err(|e| invalid(py, e))?;
    drop((sb, db));
    let counts: Vec<i64> = counts.into_iter().map(|c| c as i64).collect();
    Ok((pairs_array(py, pairs)?, array(py, Owned::I64(counts))?))
}

/// `(src, dst)`: the distinct edges of `pairs` (an `(edges, 2)` or interleaved 1-D array of
/// uint32, int64 or uint64 ids), sorted by (src, dst), in the input's dtype.
#[pyfunction]
pub fn sort_dedup_pairs<'py>(py: Python<'py>, pairs: Bound<'py, PyAny>) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyAny>)> {
    let pb = Buf::get(&pairs, false, "pairs")?;
    let (s, d) = match ids(py, &pb, "pairs")? {
        Ids::U32(p) => py.detach(|| edges::sort_dedup_pairs_as(p).map(|(s, d)| (Owned::U32(s), Owned::U32(d)))),
        Ids::I64(p) => py.detach(|| edges::sort_dedup_pairs_as(p).map(|(s, d)| (Owned::I64(s), Owned::I64(d)))),
        Ids::U64(p) => py.detach(|| edges::sort_dedup_pairs_as(p).map(|(s, d)| (Owned::U64(s), Owned::U64(d)))),
    }
    .map_err(|e| invalid(py, e))?;
    drop(pb);
    Ok((array(py, s)?, array(py, d)?))
}

/// `(src, dst)` of `dtype` (`"uint32"`, `"int64"` or `"uint64"`): the distinct edges if
/// the edges are in non-decreasing (src, dst) order, else None (`scalefree-graph`'s
/// `dedup_sorted_as`).
#[pyfunction]
#[pyo3(signature = (src, dst, dtype="uint32"))]
pub fn dedup_sorted<'py>(py: Python<'py>, src: Bound<'py, PyAny>, dst: Bound<'py, PyAny>, dtype: &str) -> PyResult<Option<(Bound<'py, PyAny>, Bound<'py, PyAny>)>> {
    let (sb, db) = (Buf::get(&src, false, "src")?, Buf::get(&dst, false, "dst")?);
    let (s, d) = (ids(py, &sb, "src")?, ids(py, &db, "dst")?);
    fn go<I: scalefree_graph::Id>(s: &[I], d: &[I], dtype: &str) -> Result<Option<(Owned, Owned)>, String> {
        Ok(match dtype {
            "uint32" => edges::dedup_sorted_as::<I, u32>(s, d)?.map(|(a, b)| (Owned::U32(a), Owned::U32(b))),
            "int64" => edges::dedup_sorted_as::<I, i64>(s, d)?.map(|(a, b)| (Owned::I64(a), Owned::I64(b))),
            "uint64" => edges::dedup_sorted_as::<I, u64>(s, d)?.map(|(a, b)| (Owned::U64(a), Owned::U64(b))),
            _ => return Err(format!("dedup_sorted: dtype must be uint32, int64 or uint64, got {dtype:?}")),
        })
    }
    let got = match (s, d) {
        (Ids::U32(s), Ids::U32(d)) => py.detach(|| go(s, d, dtype)),
        (Ids::I64(s), Ids::I64(d)) => py.detach(|| go(s, d, dtype)),
        (Ids::U64(s), Ids::U64(d)) => py.detach(|| go(s, d, dtype)),
        (a, b) if a.len() == 0 && b.len() == 0 => py.detach(|| go::<u32>(&[], &[], dtype)),
        (a, b) => return Err(invalid(py, format!("dedup_sorted: src and dst must have the same dtype, got {} and {}", a.dtype(), b.dtype()))),
    }
    .map_err(|e| invalid(py, e))?;
    drop((sb, db));
    match got {
        None => Ok(None),
        Some((a, b)) => Ok(Some((array(py, a)?, array(py, b)?))),
    }
}

fn check_u64s(py: Python<'_>, b: &Buf, what: &str) -> PyResult<()> {
    let f = b.format.trim_start_matches(['@', '=', '<']);
    if b.len_bytes() > 0 && (b.itemsize() != 8 || !matches!(f, "Q" | "L")) {
        return Err(invalid(py, format!("{what} must be uint64 keys, got buffer format {:?}", b.format)));
    }
    Ok(())
}

/// A uint64 buffer as a slice (no copy).
fn u64s<'a>(py: Python<'_>, b: &'a Buf, what: &str) -> PyResult<&'a [u64]> {
    check_u64s(py, b, what)?;
    // SAFETY: a contiguous, aligned buffer of `count()` u64 held while `b` lives.
    Ok(if b.len_bytes() == 0 { &[] } else { unsafe { std::slice::from_raw_parts(b.ptr() as *const u64, b.count()) } })
}

/// A writable uint64 buffer (`Buf::get(.., true, ..)`) as a mutable slice (no copy).
#[allow(clippy::mut_from_ref)]
fn u64s_mut<'a>(py: Python<'_>, b: &'a Buf, what: &str) -> PyResult<&'a mut [u64]> {
    check_u64s(py, b, what)?;
    // SAFETY: a contiguous, aligned, writable buffer of `count()` u64 held while `b` lives;
    // the callers take one view per distinct array (and check that two do not overlap).
    Ok(if b.len_bytes() == 0 { &mut [] } else { unsafe { std::slice::from_raw_parts_mut(b.ptr() as *mut u64, b.count()) } })
}

/// `(counts, owners)`: the keys per owner rank (int64, `size` entries) of packed edge keys
/// (uint64, `src << 32 | dst`; the owner as `owner_partition`'s), and each key's owner
/// (uint8; empty for more than 256 owners).
#[pyfunction]
pub fn key_owners<'py>(py: Python<'py>, keys: Bound<'py, PyAny>, size: usize) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyAny>)> {
    let kb = Buf::get(&keys, false, "keys")?;
    let k = u64s(py, &kb, "keys")?;
    let (counts, owners) = py.detach(|| keys::key_owners(k, size)).map_err(|e| invalid(py, e))?;
    drop(kb);
    Ok((array(py, Owned::I64(counts.into_iter().map(|c| c as i64).collect()))?, array(py, Owned::U8(owners))?))
}

/// Writes every key into `pieces[owner]` (writable uint64 arrays, one per owner, each as
/// long as its owner's count from `key_owners`, not overlapping), in key order.
#[pyfunction]
pub fn scatter_keys(py: Python<'_>, keys: Bound<'_, PyAny>, owners: Bound<'_, PyAny>, pieces: Vec<Bound<'_, PyAny>>) -> PyResult<()> {
    let (kb, ob) = (Buf::get(&keys, false, "keys")?, Buf::get(&owners, false, "owners")?);
    let k = u64s(py, &kb, "keys")?;
    if ob.len_bytes() > 0 && ob.itemsize() != 1 {
        return Err(invalid(py, format!("owners must be uint8, got buffer format {:?}", ob.format)));
    }
    // SAFETY: a contiguous byte buffer held while `ob` lives.
    let o: &[u8] = if ob.len_bytes() == 0 { &[] } else { unsafe { std::slice::from_raw_parts(ob.ptr(), ob.len_bytes()) } };
    let bufs = pieces.iter().enumerate().map(|(i, p)| Buf::get(p, true, &format!("pieces[{i}]"))).collect::<PyResult<Vec<_>>>()?;
    let mut spans: Vec<(usize, usize)> = bufs.iter().filter(|b| b.len_bytes() > 0).map(|b| (b.ptr() as usize, b.ptr() as usize + b.len_bytes())).collect();
    spans.sort_unstable();
    if spans.windows(2).any(|w| w[1].0 < w[0].1) {
        return Err(invalid(py, "scatter_keys: pieces overlap"));
    }
    let mut slices = bufs.iter().enumerate().map(|(i, b)| u64s_mut(py, b, &format!("pieces[{i}]"))).collect::<PyResult<Vec<_>>>()?;
    py.detach(|| keys::scatter_keys(k, o, &mut slices)).map_err(|e| invalid(py, e))?;
    drop(slices);
    drop((kb, ob, bufs));
    Ok(())
}

/// The number `m` of distinct keys: `keys` (uint64) sorted and deduplicated in place, the
/// distinct edges written back into its memory as uint32 columns (`keys.view(np.uint32)`:
/// sources `[:m]`, targets `[n:n + m]`); `scratch` (uint64, at least as long, another
/// array) is overwritten.
#[pyfunction]
pub fn sort_dedup_keys(py: Python<'_>, keys: Bound<'_, PyAny>, scratch: Bound<'_, PyAny>) -> PyResult<usize> {
    let (kb, sb) = (Buf::get(&keys, true, "keys")?, Buf::get(&scratch, true, "scratch")?);
    let (k, s) = (u64s_mut(py, &kb, "keys")?, u64s_mut(py, &sb, "scratch")?);
    if s.len() < k.len() {
        return Err(invalid(py, format!("sort_dedup_keys: scratch holds {} keys, keys {}", s.len(), k.len())));
    }
    let (kr, sr) = (k.as_ptr_range(), s.as_ptr_range());
    if !k.is_empty() && kr.start < sr.end && sr.start < kr.end {
        return Err(invalid(py, "sort_dedup_keys: keys and scratch overlap"));
    }
    let m = py.detach(|| keys::sort_dedup_keys(k, s));
    drop((kb, sb));
    Ok(m)
}

/// `(src, dst)` uint32: the distinct edges of packed keys (uint64) in non-decreasing order,
/// or None when they are not in order.
#[pyfunction]
pub fn dedup_sorted_keys<'py>(py: Python<'py>, keys: Bound<'py, PyAny>) -> PyResult<Option<(Bound<'py, PyAny>, Bound<'py, PyAny>)>> {
    let kb = Buf::get(&keys, false, "keys")?;
    let k = u64s(py, &kb, "keys")?;
    let got = py.detach(|| keys::dedup_sorted_keys(k));
    drop(kb);
    match got {
        None => Ok(None),
        Some((s, d)) => Ok(Some((array(py, Owned::U32(s))?, array(py, Owned::U32(d))?))),
    }
}

/// One more than the largest id of packed keys (uint64; 0 for none).
#[pyfunction]
pub fn keys_id_bound(py: Python<'_>, keys: Bound<'_, PyAny>) -> PyResult<u64> {
    let kb = Buf::get(&keys, false, "keys")?;
    let k = u64s(py, &kb, "keys")?;
    let n = py.detach(|| keys::id_bound(k));
    drop(kb);
    Ok(n)
}

/// uint64 packed keys (`src << 32 | dst`) of the edges, or None when an id is 2^32 or larger.
#[pyfunction]
pub fn pack_edge_keys<'py>(py: Python<'py>, src: Bound<'py, PyAny>, dst: Bound<'py, PyAny>) -> PyResult<Option<Bound<'py, PyAny>>> {
    let (sb, db) = (Buf::get(&src, false, "src")?, Buf::get(&dst, false, "dst")?);
    let (s, d) = (ids(py, &sb, "src")?, ids(py, &db, "dst")?);
    let got = match (s, d) {
        (Ids::U32(s), Ids::U32(d)) => py.detach(|| keys::pack_keys(s, d)),
        (Ids::I64(s), Ids::I64(d)) => py.detach(|| keys::pack_keys(s, d)),
        (Ids::U64(s), Ids::U64(d)) => py.detach(|| keys::pack_keys(s, d)),
        (a, b) if a.len() == 0 && b.len() == 0 => Ok(Some(Vec::new())),
        (a, b) => return Err(invalid(py, format!("pack_edge_keys: src and dst must have the same dtype, got {} and {}", a.dtype(), b.dtype()))),
    }
    .map_err(|e| invalid(py, e))?;
    drop((sb, db));
    got.map(|k| array(py, Owned::U64(k))).transpose()
}

/// int64 array: every id by falling `total` (float64, one per id), ties by id; the order
/// of `np.argsort(-total, kind="stable")`.
#[pyfunction]
pub fn degree_order<'py>(py: Python<'py>, total: Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    let tb = Buf::get(&total, false, "total")?;
    let f = tb.format.trim_start_matches(['@', '=', '<']);
    if tb.len_bytes() > 0 && (f != "d" || tb.itemsize() != 8) {
        return Err(invalid(py, format!("degree_order: total must be float64, got buffer format {:?}", tb.format)));
    }
    // SAFETY: contiguous, aligned float64 buffer of `count()` items, held while `tb` lives.
    let t: &[f64] = if tb.len_bytes() == 0 { &[] } else { unsafe { std::slice::from_raw_parts(tb.ptr() as *const f64, tb.count()) } };
    let order = py.detach(|| edges::degree_order(t));
    drop(tb);
    array(py, Owned::I64(order))
}

/// float64 array of `2 n`: the out-degree (count in `src`) of every id below `n`, then its
/// in-degree (count in `dst`); what `vertex_keys` allreduces.
#[pyfunction]
pub fn degree_counts<'py>(py: Python<'py>, src: Bound<'py, PyAny>, dst: Bound<'py, PyAny>, n: usize) -> PyResult<Bound<'py, PyAny>> {
    let (sb, db) = (Buf::get(&src, false, "src")?, Buf::get(&dst, false, "dst")?);
    let (s, d) = (ids(py, &sb, "src")?, ids(py, &db, "dst")?);
    let deg = match (s, d) {
        (Ids::U32(s), Ids::U32(d)) => py.detach(|| edges::degree_counts(s, d, n)),
        (Ids::I64(s), Ids::I64(d)) => py.detach(|| edges::degree_counts(s, d, n)),
        (Ids::U64(s), Ids::U64(d)) => py.detach(|| edges::degree_counts(s, d, n)),
        (a, b) if a.len() == 0 && b.len() == 0 => Ok(vec![0.0; 2 * n]),
        (a, b) => return Err(invalid(py, format!("degree_counts: src and dst must have the same dtype and length, got {} {} and {} {}", a.len(), a.dtype(), b.len(), b.dtype()))),
    }
    .map_err(|e| invalid(py, e))?;
    drop((sb, db));
    array(py, Owned::F64(deg))
}

/// `(ids, src, dst)`: the distinct ids of the edges (int64, sorted) and the edges as uint32
/// indices into them, by a marker over `[0, n)` (for id spaces no larger than the edges'
/// endpoints; `scalefree.graph.io.local_ids` sorts otherwise).
#[pyfunction]
pub fn local_ids<'py>(py: Python<'py>, src: Bound<'py, PyAny>, dst: Bound<'py, PyAny>, n: usize) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyAny>, Bound<'py, PyAny>)> {
    let (sb, db) = (Buf::get(&src, false, "src")?, Buf::get(&dst, false, "dst")?);
    let (s, d) = (ids(py, &sb, "src")?, ids(py, &db, "dst")?);
    let got = match (s, d) {
        (Ids::U32(s), Ids::U32(d)) => py.detach(|| edges::local_ids(s, d, n)),
        (Ids::I64(s), Ids::I64(d)) => py.detach(|| edges::local_ids(s, d, n)),
        (Ids::U64(s), Ids::U64(d)) => py.detach(|| edges::local_ids(s, d, n)),
        (a, b) if a.len() == 0 && b.len() == 0 => Ok((Vec::new(), Vec::new(), Vec::new())),
        (a, b) => return Err(invalid(py, format!("local_ids: src and dst must have the same dtype and length, got {} {} and {} {}", a.len(), a.dtype(), b.len(), b.dtype()))),
    }
    .map_err(|e| invalid(py, e))?;
    drop((sb, db));
    let (i, s, d) = got;
    let i: Vec<i64> = i.into_iter().map(|v| v as i64).collect();
    Ok((array(py, Owned::I64(i))?, array(py, Owned::U32(s))?, array(py, Owned::U32(d))?))
}

fn u32s<'a>(py: Python<'_>, b: &'a Buf, what: &str) -> PyResult<&'a [u32]> {
    let f = b.format.trim_start_matches(['@', '=', '<']);
    if b.len_bytes() > 0 && (b.itemsize() != 4 || !matches!(f, "I" | "L")) {
        return Err(invalid(py, format!("{what} must be uint32, got buffer format {:?}", b.format)));
    }
    Ok(if b.len_bytes() == 0 { &[] } else { unsafe { std::slice::from_raw_parts(b.ptr() as *const u32, b.count()) } })
}

/// Float view of a buffer: 4 → f32, 8 → f64 (checked by format). Mutable through a shared
/// `Buf`: the buffer protocol hands out the memory, not Rust ownership; `y` and `scores`
/// are requested writable, and no two views of one call alias (distinct arrays).
#[allow(clippy::mut_from_ref)]
fn floats<'a, T: Real>(py: Python<'_>, b: &'a Buf, what: &str, n: usize) -> PyResult<&'a mut [T]> {
    let f = b.format.trim_start_matches(['@', '=', '<']);
    let want = if std::mem::size_of::<T>() == 4 { "f" } else { "d" };
    if f != want || b.itemsize() != std::mem::size_of::<T>() {
        return Err(invalid(py, format!("{what} must be {} like the matrix, got buffer format {:?}", if want == "f" { "float32" } else { "float64" }, b.format)));
    }
    if b.count() != n {
        return Err(invalid(py, format!("{what} holds {} values, expected {n}", b.count())));
    }
    Ok(if n == 0 { &mut [] } else { unsafe { std::slice::from_raw_parts_mut(b.ptr() as *mut T, n) } })
}

/// A matrix's column slots: u32, or u64 for a rank whose in vector has more than 2^32 slots.
enum Cols {
    U32(Vec<u32>),
    U64(Vec<u64>),
}

/// The matrix on flash, columns as in memory.
enum Rows {
    U32(FlashRows<u32>),
    U64(FlashRows<u64>),
}

/// Where the matrix lives: in memory, or on flash with the runtime that streams it.
enum Storage {
    Memory { indptr: Vec<u64>, cols: Cols },
    Flash { csr: Rows, rt: Arc<Runtime>, last: Option<RunStats> },
}

/// The local matrix (rows = out slots, columns = in slots, no values) and its scratch
/// vector; `step` and `owned` allocate nothing (in memory; on flash the runtime's buffers).
#[pyclass(name = "PageRankCsr", module = "scalefree._native")]
pub struct PyPageRankCsr {
    storage: Storage,
    ncols: usize,
    f32: bool,
    x32: Vec<f32>,
    x64: Vec<f64>,
}

impl PyPageRankCsr {
    fn of_parts(indptr: Vec<u64>, cols: Cols, ncols: usize, f32: bool) -> Self {
        PyPageRankCsr {
            storage: Storage::Memory { indptr, cols },
            ncols,
            f32,
            x32: if f32 { vec![0.0; ncols] } else { Vec::new() },
            x64: if f32 { Vec::new() } else { vec![0.0; ncols] },
        }
    }

    fn nrows(&self) -> usize {
        match &self.storage {
            Storage::Memory { indptr, .. } => indptr.len() - 1,
            Storage::Flash { csr: Rows::U32(c), .. } => c.nrows(),
            Storage::Flash { csr: Rows::U64(c), .. } => c.nrows(),
        }
    }

    /// One step in `T` (see `step`).
    #[allow(clippy::too_many_arguments)]
    fn step_in<T: Real>(&mut self, py: Python<'_>, g: &[T], w: &[T], base: f64, damping: f64, yv: &mut [T], x: fn(&mut Self) -> &mut Vec<T>) -> PyResult<f64> {
        let xs = std::mem::take(x(self));
        let mut xs = xs;
        let out = match &mut self.storage {
            Storage::Memory { indptr, cols: Cols::U32(cols) } => Ok(py.detach(|| spmv_step(indptr, cols, g, w, base, damping, &mut xs, yv))),
            Storage::Memory { indptr, cols: Cols::U64(cols) } => Ok(py.detach(|| spmv_step(indptr, cols, g, w, base, damping, &mut xs, yv))),
            Storage::Flash { csr, rt, last } => match py.detach(|| match csr {
                Rows::U32(c) => c.pagerank_step(rt, g, w, base, damping, &mut xs, yv),
                Rows::U64(c) => c.pagerank_step(rt, g, w, base, damping, &mut xs, yv),
            }) {
                Ok((total, stats)) => {
                    *last = Some(stats);
                    Ok(total)
                }
                Err(e) => Err(flash_err(py, e)),
            },
        };
        *x(self) = xs;
        out
    }
}

#[pymethods]
impl PyPageRankCsr {
    /// `rows`, `cols`: slots of every edge (target row, source column), both uint32 or both
    /// uint64 (the matrix keeps that width: uint64 where a rank has 2^32 slots or more).
    #[new]
    fn new(py: Python<'_>, rows: Bound<'_, PyAny>, cols: Bound<'_, PyAny>, nrows: usize, ncols: usize, dtype: &str) -> PyResult<Self> {
        let f32 = match dtype {
            "float32" => true,
            "float64" => false,
            _ => return Err(invalid(py, format!("PageRankCsr: dtype must be float32 or float64, got {dtype:?}"))),
        };
        let rb = Buf::get(&rows, false, "rows")?;
        let cb = Buf::get(&cols, false, "cols")?;
        fn build<S: Id>(py: Python<'_>, r: &[S], c: &[S], nrows: usize, ncols: usize) -> PyResult<(Vec<u64>, Vec<S>)> {
            if nrows.max(ncols) as u128 > S::MAX_U64 as u128 + 1 {
                return Err(invalid(py, format!("PageRankCsr: {nrows} x {ncols} slots do not fit {}-bit slots", std::mem::size_of::<S>() * 8)));
            }
            py.detach(|| csr_pattern(r, c, nrows, ncols)).map_err(|e| invalid(py, e))
        }
        let cols = match (ids(py, &rb, "rows")?, ids(py, &cb, "cols")?) {
            (Ids::U32(r), Ids::U32(c)) => {
                let (indptr, cols) = build(py, r, c, nrows, ncols)?;
                return Ok(Self::of_parts(indptr, Cols::U32(cols), ncols, f32));
            }
            (Ids::U64(r), Ids::U64(c)) => build(py, r, c, nrows, ncols)?,
            (a, b) if a.len() == 0 && b.len() == 0 => build::<u64>(py, &[], &[], nrows, ncols)?,
            (a, b) => return Err(invalid(py, format!("PageRankCsr: rows and cols must be both uint32 or both uint64 slots, got {} and {}", a.dtype(), b.dtype()))),
        };
        Ok(Self::of_parts(cols.0, Cols::U64(cols.1), ncols, f32))
    }

    /// `(csr, out_keys, in_keys)` straight from this rank's distinct edges (global ids
    /// `src`, `dst`: uint32, int64 or uint64, the same dtype), the uint32 `key` of every id,
    /// the flow key (above every vertex key) and the owned key range `[own_lo_key,
    /// own_lo_key + n_own)`: `out_keys` (int64) = sorted distinct keys of `dst` plus
    /// `flow_key`, `in_keys` (int64) = sorted distinct keys of `src`, the owned range and
    /// `flow_key`; the matrix has rows = slot of `key[dst]` in `out_keys` (`len(out_keys) -
    /// 1` rows), columns = slot of `key[src]` in `in_keys`. The same matrix as
    /// `PageRankCsr(rows, cols, len(out_keys) - 1, len(in_keys), dtype)` over those slots.
    /// The slot of `own_lo_key` is `np.searchsorted(in_keys, own_lo_key)`.
    #[staticmethod]
    #[allow(clippy::too_many_arguments)]
    fn from_edges<'py>(py: Python<'py>, src: Bound<'py, PyAny>, dst: Bound<'py, PyAny>, key: Bound<'py, PyAny>, flow_key: u32, own_lo_key: u32, n_own: usize, dtype: &str) -> PyResult<(Self, Bound<'py, PyAny>, Bound<'py, PyAny>)> {
        let f32 = match dtype {
            "float32" => true,
            "float64" => false,
            _ => return Err(invalid(py, format!("PageRankCsr.from_edges: dtype must be float32 or float64, got {dtype:?}"))),
        };
        let (sb, db, kb) = (Buf::get(&src, false, "src")?, Buf::get(&dst, false, "dst")?, Buf::get(&key, false, "key")?);
        let (s, d, k) = (ids(py, &sb, "src")?, ids(py, &db, "dst")?, u32s(py, &kb, "key")?);
        let built: Result<LocalCsr, String> = match (s, d) {
            (Ids::U32(s), Ids::U32(d)) => py.detach(|| local_csr(s, d, k, flow_key, own_lo_key, n_own)),
            (Ids::I64(s), Ids::I64(d)) => py.detach(|| local_csr(s, d, k, flow_key, own_lo_key, n_own)),
            (Ids::U64(s), Ids::U64(d)) => py.detach(|| local_csr(s, d, k, flow_key, own_lo_key, n_own)),
            (a, b) if a.len() == 0 && b.len() == 0 => py.detach(|| local_csr::<u32>(&[], &[], k, flow_key, own_lo_key, n_own)),
            (a, b) => return Err(invalid(py, format!("PageRankCsr.from_edges: src and dst must have the same dtype and length, got {} {} and {} {}", a.len(), a.dtype(), b.len(), b.dtype()))),
        };
        let l = built.map_err(|e| invalid(py, e))?;
        drop((sb, db, kb));
        if l.in_keys.len() > u32::MAX as usize {
            return Err(invalid(py, "PageRankCsr.from_edges: a rank touches 2**32 or more vertices (slots are uint32)"));
        }
        let ncols = l.in_keys.len();
        let csr = Self::of_parts(l.indptr, Cols::U32(l.cols), ncols, f32);
        Ok((csr, array(py, Owned::I64(l.out_keys))?, array(py, Owned::I64(l.in_keys))?))
    }

    #[getter]
    fn nnz(&self) -> usize {
        match &self.storage {
            Storage::Memory { cols: Cols::U32(c), .. } => c.len(),
            Storage::Memory { cols: Cols::U64(c), .. } => c.len(),
            Storage::Flash { csr: Rows::U32(c), .. } => c.nnz() as usize,
            Storage::Flash { csr: Rows::U64(c), .. } => c.nnz() as usize,
        }
    }

    /// Before the reduce: scaled sources into the scratch vector, then `y = A x` and
    /// `y[nrows] = Σ y` (returned). `got`, `inv_deg`: ncols values; `y`: nrows + 1.
    fn step(&mut self, py: Python<'_>, got: Bound<'_, PyAny>, inv_deg: Bound<'_, PyAny>, base: f64, damping: f64, y: Bound<'_, PyAny>) -> PyResult<f64> {
        let (gb, ib, yb) = (Buf::get(&got, false, "got")?, Buf::get(&inv_deg, false, "inv_deg")?, Buf::get(&y, true, "y")?);
        let (n, m) = (self.ncols, self.nrows() + 1);
        if self.f32 {
            let (g, w, yv) = (floats::<f32>(py, &gb, "got", n)?, floats::<f32>(py, &ib, "inv_deg", n)?, floats::<f32>(py, &yb, "y", m)?);
            self.step_in(py, g, w, base, damping, yv, |s| &mut s.x32)
        } else {
            let (g, w, yv) = (floats::<f64>(py, &gb, "got", n)?, floats::<f64>(py, &ib, "inv_deg", n)?, floats::<f64>(py, &yb, "y", m)?);
            self.step_in(py, g, w, base, damping, yv, |s| &mut s.x64)
        }
    }

    /// Moves the matrix to a scratch file of the flash runtime `runtime` (unnamed: nothing
    /// is left behind, even after a crash) and frees it in memory; from then on every
    /// `step` streams it from flash in row blocks under the runtime's budget (the same
    /// result, bit for bit). Fails with `OutOfBudgetError` when one row's edges alone
    /// exceed the budget.
    fn move_to_flash(&mut self, py: Python<'_>, runtime: PyRef<'_, PyFlashRuntime>) -> PyResult<()> {
        let rt = runtime.rt.clone();
        let ncols = self.ncols;
        if let Storage::Memory { indptr, cols } = &self.storage {
            let csr = py.detach(|| match cols {
                Cols::U32(c) => FlashRows::write(&rt, indptr, c, ncols).map(Rows::U32),
                Cols::U64(c) => FlashRows::write(&rt, indptr, c, ncols).map(Rows::U64),
            });
            self.storage = Storage::Flash { csr: csr.map_err(|e| flash_err(py, e))?, rt, last: None };
        }
        Ok(())
    }

    /// Whether the matrix is on flash.
    #[getter]
    fn on_flash(&self) -> bool {
        matches!(self.storage, Storage::Flash { .. })
    }

    /// Bytes of the matrix (row starts and columns; on flash: what one step reads).
    #[getter]
    fn size_bytes(&self) -> u64 {
        match &self.storage {
            Storage::Memory { indptr, cols: Cols::U32(c) } => (indptr.len() as u64 - 1) * 8 + c.len() as u64 * 4,
            Storage::Memory { indptr, cols: Cols::U64(c) } => (indptr.len() as u64 - 1) * 8 + c.len() as u64 * 8,
            Storage::Flash { csr: Rows::U32(c), .. } => c.size_bytes(),
            Storage::Flash { csr: Rows::U64(c), .. } => c.size_bytes(),
        }
    }

    /// The flash runtime's statistics of the last `step` (None in memory or before a step):
    /// tasks (row blocks), seconds, bytes read, peak resident bytes, compute idle seconds...
    #[getter]
    fn last_stats<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, pyo3::types::PyDict>>> {
        match &self.storage {
            Storage::Flash { last: Some(s), csr, .. } => {
                let d = stats_dict(py, s)?;
                d.set_item("direct_io", match csr {
                    Rows::U32(c) => c.is_direct(),
                    Rows::U64(c) => c.is_direct(),
                })?;
                Ok(Some(d))
            }
            _ => Ok(None),
        }
    }

    /// After the reduce: `scores = base + damping * got[lo : lo + len(scores)]`; returns
    /// the L1 change.
    fn owned(&self, py: Python<'_>, got: Bound<'_, PyAny>, lo: usize, base: f64, damping: f64, scores: Bound<'_, PyAny>) -> PyResult<f64> {
        let (gb, sb) = (Buf::get(&got, false, "got")?, Buf::get(&scores, true, "scores")?);
        let ns = sb.count();
        if lo + ns > self.ncols {
            return Err(invalid(py, format!("owned: slots {lo}..{} past the {} in slots", lo + ns, self.ncols)));
        }
        if self.f32 {
            let (g, s) = (floats::<f32>(py, &gb, "got", self.ncols)?, floats::<f32>(py, &sb, "scores", ns)?);
            Ok(owned_update(g, lo, base, damping, s))
        } else {
            let (g, s) = (floats::<f64>(py, &gb, "got", self.ncols)?, floats::<f64>(py, &sb, "scores", ns)?);
            Ok(owned_update(g, lo, base, damping, s))
        }
    }
}

fn i64s<'a>(py: Python<'_>, b: &'a Buf, what: &str) -> PyResult<&'a [i64]> {
    let f = b.format.trim_start_matches(['@', '=', '<']);
    if b.len_bytes() > 0 && (b.itemsize() != 8 || !matches!(f, "q" | "l")) {
        return Err(invalid(py, format!("{what} must be int64, got buffer format {:?}", b.format)));
    }
    Ok(if b.len_bytes() == 0 { &[] } else { unsafe { std::slice::from_raw_parts(b.ptr() as *const i64, b.count()) } })
}

/// A contiguous uint8 buffer as a slice (`what` names it in the error).
fn u8s<'a>(py: Python<'_>, b: &'a Buf, what: &str) -> PyResult<&'a [u8]> {
    if b.itemsize() != 1 {
        return Err(invalid(py, format!("{what} must be uint8, got buffer format {:?}", b.format)));
    }
    Ok(if b.len_bytes() == 0 { &[] } else { unsafe { std::slice::from_raw_parts(b.ptr() as *const u8, b.len_bytes()) } })
}

/// A writable contiguous uint8 buffer as a slice.
fn u8s_mut<'a>(py: Python<'_>, b: &'a Buf, what: &str) -> PyResult<&'a mut [u8]> {
    if b.itemsize() != 1 {
        return Err(invalid(py, format!("{what} must be uint8, got buffer format {:?}", b.format)));
    }
    Ok(if b.len_bytes() == 0 { &mut [] } else { unsafe { std::slice::from_raw_parts_mut(b.ptr(), b.len_bytes()) } })
}

/// HADI's hop: for each row `r` (edges `indptr[r]..indptr[r+1]`), the union (max on the
/// first `width_max` bytes, OR on the rest) of `rows[targets[e]]` over its edges whose
/// target changed, preceded by `ids[r]` (8 bytes): rows of `8 + width` bytes, those with
/// such an edge (`hit[r] = 1`) packed at the front of `out`; returns how many
/// (`scalefree_graph::hadi::union_changed`; targets uint32, indptr and ids int64).
#[pyfunction]
#[allow(clippy::too_many_arguments)]
pub fn hadi_union_changed(py: Python<'_>, rows: Bound<'_, PyAny>, width: usize, width_max: usize, changed: Bound<'_, PyAny>, targets: Bound<'_, PyAny>, indptr: Bound<'_, PyAny>, ids: Bound<'_, PyAny>, out: Bound<'_, PyAny>, hit: Bound<'_, PyAny>) -> PyResult<usize> {
    let (rb, cb, tb, ib, db) = (Buf::get(&rows, false, "rows")?, Buf::get(&changed, false, "changed")?, Buf::get(&targets, false, "targets")?, Buf::get(&indptr, false, "indptr")?, Buf::get(&ids, false, "ids")?);
    let (ob, hb) = (Buf::get(&out, true, "out")?, Buf::get(&hit, true, "hit")?);
    let (r, c, t, i, d) = (u8s(py, &rb, "rows")?, u8s(py, &cb, "changed")?, u32s(py, &tb, "targets")?, i64s(py, &ib, "indptr")?, i64s(py, &db, "ids")?);
    let (o, h) = (u8s_mut(py, &ob, "out")?, u8s_mut(py, &hb, "hit")?);
    py.detach(|| union_changed(r, width, width_max, c, t, i, d, o, h)).map_err(|e| invalid(py, e))
}

/// Merges received partial rows into the owner's: `incoming` holds `hadi_union_changed`'s
/// rows (`8 + width` bytes, the id first), `rows[pos[i]]` takes the union with row `i`,
/// `changed[pos[i]] = 1` when it grew, `columns` (int64, 8 per bitset byte)
/// counts the bits gained (`scalefree_graph::hadi::merge_rows`).
#[pyfunction]
#[allow(clippy::too_many_arguments)]
pub fn hadi_merge_rows(py: Python<'_>, rows: Bound<'_, PyAny>, width: usize, width_max: usize, pos: Bound<'_, PyAny>, incoming: Bound<'_, PyAny>, changed: Bound<'_, PyAny>, columns: Bound<'_, PyAny>) -> PyResult<()> {
    let (rb, pb, ib) = (Buf::get(&rows, true, "rows")?, Buf::get(&pos, false, "pos")?, Buf::get(&incoming, false, "incoming")?);
    let (cb, colb) = (Buf::get(&changed, true, "changed")?, Buf::get(&columns, true, "columns")?);
    let (r, p, inc, c) = (u8s_mut(py, &rb, "rows")?, i64s(py, &pb, "pos")?, u8s(py, &ib, "incoming")?, u8s_mut(py, &cb, "changed")?);
    if colb.len_bytes() > 0 && colb.itemsize() != 8 {
        return Err(invalid(py, format!("columns must be int64, got buffer format {:?}", colb.format)));
    }
    let cols: &mut [i64] = if colb.len_bytes() == 0 { &mut [] } else { unsafe { std::slice::from_raw_parts_mut(colb.ptr() as *mut i64, colb.count()) } };
    py.detach(|| merge_rows(r, width, width_max, p, inc, c, cols)).map_err(|e| invalid(py, e))
}

/// HADI's edges grouped by source on flash (`scalefree_graph::flash_rows`): built from the
/// int64 `indptr` (rows + 1) and the uint32 or int64 `targets` of the in-memory hop, a
/// range of rows streamed once per round of a hop.
#[pyclass(name = "FlashRows", module = "scalefree._native")]
pub struct PyFlashRows {
    rows: FlashRows,
    rt: Arc<Runtime>,
    last: Option<RunStats>,
}

#[pymethods]
impl PyFlashRows {
    /// Writes the rows to a scratch file of `runtime` (unnamed: nothing is left behind);
    /// targets (uint32 or int64) must lie in `[0, ncols)`, `ncols < 2**32`.
    #[new]
    fn new(py: Python<'_>, runtime: PyRef<'_, PyFlashRuntime>, indptr: Bound<'_, PyAny>, targets: Bound<'_, PyAny>, ncols: usize) -> PyResult<Self> {
        let (ib, tb) = (Buf::get(&indptr, false, "indptr")?, Buf::get(&targets, false, "targets")?);
        let ip = i64s(py, &ib, "indptr")?;
        if ncols > u32::MAX as usize {
            return Err(invalid(py, format!("FlashRows: {ncols} columns do not fit 32-bit column ids")));
        }
        let wide = tb.itemsize() == 8;
        let t64 = if wide { i64s(py, &tb, "targets")? } else { &[] };
        let t32 = if wide { &[] } else { u32s(py, &tb, "targets")? };
        if let Some(&bad) = ip.iter().find(|&&v| v < 0).or_else(|| t64.iter().find(|&&v| v < 0 || v as usize >= ncols)) {
            return Err(invalid(py, format!("FlashRows: {bad} is not a valid row start or a target below {ncols}")));
        }
        let rt = runtime.rt.clone();
        let rows = py
            .detach(|| {
                let ip: Vec<u64> = ip.iter().map(|&v| v as u64).collect();
                if wide {
                    let t: Vec<u32> = t64.iter().map(|&v| v as u32).collect();
                    FlashRows::write(&rt, &ip, &t, ncols)
                } else {
                    FlashRows::write(&rt, &ip, t32, ncols)
                }
            })
            .map_err(|e| flash_err(py, e))?;
        Ok(PyFlashRows { rows, rt, last: None })
    }

    /// HADI's hop over rows `lo..hi` with the edges read from flash: as
    /// `hadi_union_changed` on those rows (`ids`, `out`, `hit` are the range's); returns
    /// the rows packed at the front of `out`.
    #[allow(clippy::too_many_arguments)]
    fn union_changed(&mut self, py: Python<'_>, rows: Bound<'_, PyAny>, width: usize, width_max: usize, changed: Bound<'_, PyAny>, lo: usize, hi: usize, ids: Bound<'_, PyAny>, out: Bound<'_, PyAny>, hit: Bound<'_, PyAny>) -> PyResult<usize> {
        let (rb, cb, db) = (Buf::get(&rows, false, "rows")?, Buf::get(&changed, false, "changed")?, Buf::get(&ids, false, "ids")?);
        let (ob, hb) = (Buf::get(&out, true, "out")?, Buf::get(&hit, true, "hit")?);
        let (r, c, d) = (u8s(py, &rb, "rows")?, u8s(py, &cb, "changed")?, i64s(py, &db, "ids")?);
        let (o, h) = (u8s_mut(py, &ob, "out")?, u8s_mut(py, &hb, "hit")?);
        let (fr, rt) = (&self.rows, &self.rt);
        let (k, stats) = py.detach(|| fr.union_changed(rt, r, width, width_max, c, lo, hi, d, o, h)).map_err(|e| flash_err(py, e))?;
        self.last = Some(stats);
        Ok(k)
    }

    /// Bytes on flash (row starts and targets): what a hop reads.
    #[getter]
    fn size_bytes(&self) -> u64 {
        self.rows.size_bytes()
    }

    /// The runtime's statistics of the last pass, one round of a hop (None before one).
    #[getter]
    fn last_stats<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, pyo3::types::PyDict>>> {
        match &self.last {
            Some(s) => {
                let d = stats_dict(py, s)?;
                d.set_item("direct_io", self.rows.is_direct())?;
                Ok(Some(d))
            }
            None => Ok(None),
        }
    }
}
