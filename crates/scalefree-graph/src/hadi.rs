//! HADI's per-hop kernels on rows of HyperLogLog registers and a sampled-target bitset
//! (`python/scalefree/graph/hadi.py`): a row is `width` bytes, the first `width_max`
//! registers (the union of two sets is the byte-wise max), the rest a bitset (the union is
//! the OR). [`union_changed`] builds, for every edge source, the union of its targets'
//! rows in one pass over the edges grouped by source (no temporary per edge), and
//! [`merge_rows`] merges the partial rows the owners receive. The same row loop serves
//! the edges in memory and the edges streamed from flash
//! ([`crate::flash_rows::FlashRows::union_changed`]), so both give the same bits.
//!
//! Cost: `edges x width` byte maxima and ORs (vectorised by the compiler), memory traffic
//! one row per edge read (random) and one per source written (sequential).

/// Bytes before a row of [`union_changed`]'s output: the row's vertex id (little-endian
/// i64), so the output is the message itself.
pub const ID_BYTES: usize = 8;

/// The partitioned hop's kernel: `out` holds rows of `ID_BYTES + width` bytes. For row
/// `r` (edges `indptr[r]..indptr[r+1]`), the union of `rows[targets[e]]` over its edges
/// whose target changed in the last hop (`changed[t] != 0`; a target that did not change
/// adds nothing the previous hop did not already add), preceded by `ids[r]`; rows without
/// such an edge are left out (`hit[r] = 0`, else 1), the others packed at the front of
/// `out` in row order. Returns the number of rows written. Errors name an index out of
/// range or lengths that disagree.
#[allow(clippy::too_many_arguments)]
pub fn union_changed(rows: &[u8], width: usize, width_max: usize, changed: &[u8], targets: &[u32], indptr: &[i64], ids: &[i64], out: &mut [u8], hit: &mut [u8]) -> Result<usize, String> {
    let n_out = indptr.len().saturating_sub(1);
    check_union(rows, width, width_max, changed, n_out, ids, out, hit)?;
    if let Some(&t) = targets.iter().find(|&&t| t as usize >= rows.len() / width) {
        return Err(format!("union_changed: target {t} past the {} rows", rows.len() / width));
    }
    let mut k = 0;
    for r in 0..n_out {
        let (lo, hi) = (indptr[r], indptr[r + 1]);
        if lo < 0 || hi < lo || hi as usize > targets.len() {
            return Err(format!("union_changed: indptr[{r}..{}] = {lo}..{hi} is not a range of the {} edges", r + 1, targets.len()));
        }
        let row = &mut out[k * (ID_BYTES + width)..(k + 1) * (ID_BYTES + width)];
        hit[r] = union_row(rows, width, width_max, changed, &targets[lo as usize..hi as usize], ids[r], row) as u8;
        k += hit[r] as usize;
    }
    Ok(k)
}

/// The shapes [`union_changed`] needs (`width > 0`, `n_out` rows out).
#[allow(clippy::too_many_arguments)]
pub(crate) fn check_union(rows: &[u8], width: usize, width_max: usize, changed: &[u8], n_out: usize, ids: &[i64], out: &[u8], hit: &[u8]) -> Result<(), String> {
    if width == 0 || width_max > width || out.len() != n_out * (ID_BYTES + width) || hit.len() != n_out || ids.len() != n_out {
        return Err(format!("union_changed: out holds {} bytes, hit {} and ids {}, expected {n_out} rows of {ID_BYTES} + {width} > 0 (max part {width_max})", out.len(), hit.len(), ids.len()));
    }
    if !rows.len().is_multiple_of(width) || changed.len() != rows.len() / width {
        return Err(format!("union_changed: {} row bytes and {} changed flags do not make rows of {width}", rows.len(), changed.len()));
    }
    Ok(())
}

/// One output row (`ID_BYTES + width` bytes): `id`, then the union of `rows[t]` over the
/// changed `targets` (which must be rows: checked by the callers). Returns whether there
/// was a changed target (else the row's content is undefined).
#[inline]
fn union_row(rows: &[u8], width: usize, width_max: usize, changed: &[u8], targets: &[u32], id: i64, out: &mut [u8]) -> bool {
    let (head, row) = out.split_at_mut(ID_BYTES);
    head.copy_from_slice(&id.to_le_bytes());
    row.fill(0);
    let mut any = false;
    for (e, &t) in targets.iter().enumerate() {
        if changed[t as usize] == 0 {
            continue;
        }
        if let Some(&ahead) = targets.get(e + 4) {
            crate::prefetch(rows.as_ptr().wrapping_add(ahead as usize * width));
        }
        any = true;
        let src = &rows[t as usize * width..(t as usize + 1) * width];
        let (rm, rb) = row.split_at_mut(width_max);
        let (sm, sb) = src.split_at(width_max);
        for (a, &b) in rm.iter_mut().zip(sm) {
            *a = (*a).max(b);
        }
        for (a, &b) in rb.iter_mut().zip(sb) {
            *a |= b;
        }
    }
    any
}

/// [`union_changed`] over a run of rows as [`crate::flash_rows::FlashRows`] streams them,
/// without packing: `starts[r]` is row `r`'s first edge and `end` the run's last edge + 1
/// (counted from the matrix's first edge), `targets` the run's targets only (rows of
/// `rows`: checked when the matrix was written), `ids`, `out` (`starts.len()` rows of
/// `ID_BYTES + width`) and `hit` the run's.
#[allow(clippy::too_many_arguments)]
pub(crate) fn union_changed_rows(rows: &[u8], width: usize, width_max: usize, changed: &[u8], starts: &[u64], end: u64, targets: &[u32], ids: &[i64], out: &mut [u8], hit: &mut [u8]) {
    let first = starts.first().copied().unwrap_or(end);
    for (r, row) in out.chunks_exact_mut(ID_BYTES + width).enumerate() {
        let a = (starts[r] - first) as usize;
        let e = (if r + 1 < starts.len() { starts[r + 1] } else { end } - first) as usize;
        hit[r] = union_row(rows, width, width_max, changed, &targets[a..e], ids[r], row) as u8;
    }
}

/// Packs the rows of `out` (`row_bytes` each) whose `hit` is set at its front, in order;
/// returns how many there are.
pub fn pack_rows(out: &mut [u8], row_bytes: usize, hit: &[u8]) -> usize {
    let mut k = 0;
    for (r, &h) in hit.iter().enumerate() {
        if h != 0 {
            if k != r {
                out.copy_within(r * row_bytes..(r + 1) * row_bytes, k * row_bytes);
            }
            k += 1;
        }
    }
    k
}

/// Merges received partial rows into the owner's rows: `incoming` holds the messages of
/// [`union_changed`] (`ID_BYTES + width` bytes each, the id first, which the caller has
/// turned into `pos`), and `rows[pos[i]] |= ` message `i`'s row (byte max on the first
/// `width_max` bytes, OR on the rest; rows as in [`union_changed`]).
/// `changed[pos[i]]` is set to 1 when the row grew, and every bit that the bitset part
/// gains adds one to `columns[bit]` (bit `k` of byte `j` is column `8 j + k`): the column
/// counts of the owner's rows stay current without a pass over them. Returns an error
/// message when an index is out of range or the lengths disagree.
pub fn merge_rows(rows: &mut [u8], width: usize, width_max: usize, pos: &[i64], incoming: &[u8], changed: &mut [u8], columns: &mut [i64]) -> Result<(), String> {
    if width == 0 || width_max > width {
        return Err(format!("merge_rows: width {width}, max part {width_max}"));
    }
    let n_rows = rows.len() / width;
    if rows.len() != n_rows * width || changed.len() != n_rows || incoming.len() != pos.len() * (ID_BYTES + width) || columns.len() != (width - width_max) * 8 {
        return Err(format!("merge_rows: {} row bytes, {} flags, {} incoming bytes for {} positions and {} columns do not fit rows of {ID_BYTES} + {width} (max part {width_max})",
                           rows.len(), changed.len(), incoming.len(), pos.len(), columns.len()));
    }
    if let Some(&p) = pos.iter().find(|&&p| p < 0 || p as usize >= n_rows) {
        return Err(format!("merge_rows: position {p} past the {n_rows} rows"));
    }
    for (i, &p) in pos.iter().enumerate() {
        let p = p as usize;
        let (dm, db) = rows[p * width..(p + 1) * width].split_at_mut(width_max);
        let (sm, sb) = incoming[i * (ID_BYTES + width) + ID_BYTES..(i + 1) * (ID_BYTES + width)].split_at(width_max);
        let mut grew = false;
        for (a, &b) in dm.iter_mut().zip(sm) {
            grew |= b > *a;
            *a = (*a).max(b);
        }
        // The bitset a word at a time: most words gain nothing. Little-endian, so bit k of
        // word w is bit k % 8 of byte 8 w + k / 8, column 64 w + k.
        let words = db.len() / 8;
        for (w, (a8, b8)) in db.chunks_exact_mut(8).zip(sb.chunks_exact(8)).enumerate() {
            let a = u64::from_le_bytes(a8.try_into().unwrap());
            let b = u64::from_le_bytes(b8.try_into().unwrap());
            let mut gained = b & !a;
            if gained != 0 {
                grew = true;
                a8.copy_from_slice(&(a | b).to_le_bytes());
                while gained != 0 {
                    columns[w * 64 + gained.trailing_zeros() as usize] += 1;
                    gained &= gained - 1;
                }
            }
        }
        for (j, (a, &b)) in db[words * 8..].iter_mut().zip(&sb[words * 8..]).enumerate() {
            let mut gained = b & !*a;
            if gained != 0 {
                grew = true;
                *a |= b;
                while gained != 0 {
                    columns[(words * 8 + j) * 8 + gained.trailing_zeros() as usize] += 1;
                    gained &= gained - 1;
                }
            }
        }
        if grew {
            changed[p] = 1;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{merge_rows, pack_rows, union_changed, ID_BYTES};

    #[test]
    fn union_and_merge_match_a_simple_reference() {
        // rows of 2 max bytes + 2 bitset bytes, and + 19 (two words and a tail)
        for (width, wm) in [(4usize, 2usize), (21, 2)] {
            let rows: Vec<u8> = (0..5 * width).map(|i| ((i * 37 + 11) % 251) as u8).collect();
            let changed = [1u8, 0, 1, 1, 1];
            let targets = [0u32, 1, 2, 1, 3, 4, 1];
            let indptr = [0i64, 2, 3, 3, 4, 7];
            let ids = [10i64, -3, 12, 1 << 40, 14];
            let rb = ID_BYTES + width;
            let mut out = vec![7u8; 5 * rb];
            let mut hit = vec![9u8; 5];
            let k = union_changed(&rows, width, wm, &changed, &targets, &indptr, &ids, &mut out, &mut hit).unwrap();
            let mut at = 0;
            for r in 0..5 {
                let ts: Vec<usize> = targets[indptr[r] as usize..indptr[r + 1] as usize].iter().map(|&t| t as usize).filter(|&t| changed[t] == 1).collect();
                assert_eq!(hit[r], !ts.is_empty() as u8);
                if ts.is_empty() {
                    continue;
                }
                assert_eq!(out[at * rb..at * rb + ID_BYTES], ids[r].to_le_bytes());
                for c in 0..width {
                    let want = ts.iter().fold(0u8, |acc, &t| if c < wm { acc.max(rows[t * width + c]) } else { acc | rows[t * width + c] });
                    assert_eq!(out[at * rb + ID_BYTES + c], want, "row {r} byte {c}");
                }
                at += 1;
            }
            assert_eq!(k, at);
            assert!(union_changed(&rows, width, wm, &changed, &[5], &[0, 1], &ids[..1], &mut out[..rb], &mut hit[..1]).is_err());
            assert!(union_changed(&rows, width, wm, &changed, &targets, &indptr, &ids[..4], &mut out, &mut hit).is_err());

            let mut dst = rows.clone();
            let mut flags = vec![0u8; 5];
            let mut cols = vec![0i64; (width - wm) * 8];
            let pos = [3i64, 0, 3];
            let inc: Vec<u8> = (0..3 * rb).map(|i| ((i * 53 + 5) % 256) as u8).collect();
            merge_rows(&mut dst, width, wm, &pos, &inc, &mut flags, &mut cols).unwrap();
            let mut want = rows.clone();
            let mut want_cols = vec![0i64; (width - wm) * 8];
            let mut want_flags = vec![0u8; 5];
            for (i, &p) in pos.iter().enumerate() {
                let p = p as usize;
                for c in 0..width {
                    let (a, b) = (want[p * width + c], inc[i * rb + ID_BYTES + c]);
                    let v = if c < wm { a.max(b) } else { a | b };
                    if v != a {
                        want_flags[p] = 1;
                    }
                    if c >= wm {
                        for k in 0..8 {
                            if (b & !a) >> k & 1 == 1 {
                                want_cols[(c - wm) * 8 + k] += 1;
                            }
                        }
                    }
                    want[p * width + c] = v;
                }
            }
            assert_eq!(dst, want);
            assert_eq!(flags, want_flags);
            assert_eq!(cols, want_cols);
            assert!(merge_rows(&mut dst, width, wm, &[5], &inc[..rb], &mut flags, &mut cols).is_err());
            assert!(merge_rows(&mut dst, width, wm, &[0], &inc[..width], &mut flags, &mut cols).is_err());
        }
    }

    #[test]
    fn pack_rows_keeps_the_hits_in_order() {
        let mut out: Vec<u8> = (0..12).collect();
        assert_eq!(pack_rows(&mut out, 3, &[0, 1, 0, 1]), 2);
        assert_eq!(out[..6], [3, 4, 5, 9, 10, 11]);
        assert_eq!(pack_rows(&mut out, 3, &[]), 0);
    }
}
