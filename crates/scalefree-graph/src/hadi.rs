//! HADI's per-hop kernel on HyperLogLog registers: every edge source takes the
//! register-wise maximum of the register rows of its edge targets (the union of the sets
//! the rows stand for). One pass over the edges grouped by source, no temporary per edge:
//! the numpy version (`maximum.reduceat` over `regs[targets]`) materialises a row per
//! edge, `edges x width` bytes, which at 16M edges a rank and 64 registers is 1 GiB.
//!
//! Cost: `edges x width` byte maxima (vectorised by the compiler), memory traffic one
//! register row per edge read (random) and one per source written (sequential).
//! The algorithm around it is in `python/scalefree/graph/hadi.py`.

/// `out[r] = max over e in indptr[r]..indptr[r+1] of regs[targets[e]]`, rows of `width`
/// bytes; a source with no edge gets zeros (the empty set). Returns an error message when
/// an index is out of range or the lengths disagree.
pub fn register_max(regs: &[u8], width: usize, targets: &[i64], indptr: &[i64], out: &mut [u8]) -> Result<(), String> {
    let rows = indptr.len().saturating_sub(1);
    if out.len() != rows * width {
        return Err(format!("register_max: out holds {} bytes, expected {rows} rows of {width}", out.len()));
    }
    if width == 0 {
        return Ok(());
    }
    let n_regs = regs.len() / width;
    if regs.len() != n_regs * width {
        return Err(format!("register_max: {} register bytes is not a whole number of rows of {width}", regs.len()));
    }
    if let Some(&t) = targets.iter().find(|&&t| t < 0 || t as usize >= n_regs) {
        return Err(format!("register_max: target {t} past the {n_regs} register rows"));
    }
    for r in 0..rows {
        let (lo, hi) = (indptr[r], indptr[r + 1]);
        if lo < 0 || hi < lo || hi as usize > targets.len() {
            return Err(format!("register_max: indptr[{r}..{}] = {lo}..{hi} is not a range of the {} edges", r + 1, targets.len()));
        }
        max_row(regs, width, &targets[lo as usize..hi as usize], &mut out[r * width..(r + 1) * width]);
    }
    Ok(())
}

/// `row` = the register-wise max of `regs[t]` over `targets` (zeros when empty); targets
/// must be register rows (checked by the callers).
#[inline]
fn max_row<T: Copy + RegisterRow>(regs: &[u8], width: usize, targets: &[T], row: &mut [u8]) {
    row.fill(0);
    for (e, &t) in targets.iter().enumerate() {
        if let Some(&ahead) = targets.get(e + 4) {
            crate::prefetch(regs.as_ptr().wrapping_add(ahead.row() * width));
        }
        let t = t.row();
        let src = &regs[t * width..(t + 1) * width];
        for (a, &b) in row.iter_mut().zip(src) {
            *a = (*a).max(b);
        }
    }
}

/// A target's register row (i64 targets are checked non-negative first).
trait RegisterRow {
    fn row(self) -> usize;
}

impl RegisterRow for i64 {
    #[inline(always)]
    fn row(self) -> usize {
        self as usize
    }
}

impl RegisterRow for u32 {
    #[inline(always)]
    fn row(self) -> usize {
        self as usize
    }
}

/// [`register_max`] over a run of rows as [`crate::flash_rows::FlashRows`] streams them:
/// `starts[r]` is row `r`'s first edge and `end` the run's last edge + 1 (counted from the
/// matrix's first edge), `targets` the run's u32 targets only (below `regs.len() / width`,
/// checked when the rows were written), `out` `starts.len()` rows of `width` bytes.
pub fn register_max_rows(regs: &[u8], width: usize, starts: &[u64], end: u64, targets: &[u32], out: &mut [u8]) {
    let first = starts.first().copied().unwrap_or(end);
    for (r, row) in out.chunks_exact_mut(width).enumerate() {
        let a = (starts[r] - first) as usize;
        let e = (if r + 1 < starts.len() { starts[r + 1] } else { end } - first) as usize;
        max_row(regs, width, &targets[a..e], row);
    }
}

/// The partitioned hop's kernel (`python/scalefree/graph/hadi.py`, HyperLogLog with a
/// target sample): a row is `width` bytes, the first `width_max` HyperLogLog registers
/// (union = byte max), the rest a bitset (union = OR). `out[r]` = the union of
/// `rows[targets[e]]` over row `r`'s edges `indptr[r]..indptr[r+1]` whose target changed
/// in the last hop (`changed[t] != 0`; a target that did not change adds nothing the
/// previous hop did not already add), and `hit[r] = 1` when there was such an edge (else
/// the row is zeros and `hit[r] = 0`: nothing to send). Returns an error message when an
/// index is out of range or the lengths disagree.
#[allow(clippy::too_many_arguments)]
pub fn union_changed(rows: &[u8], width: usize, width_max: usize, changed: &[u8], targets: &[u32], indptr: &[i64], out: &mut [u8], hit: &mut [u8]) -> Result<(), String> {
    let n_out = indptr.len().saturating_sub(1);
    if width_max > width || out.len() != n_out * width || hit.len() != n_out {
        return Err(format!("union_changed: out holds {} bytes and hit {}, expected {n_out} rows of {width} (max part {width_max})", out.len(), hit.len()));
    }
    if width == 0 {
        hit.fill(0);
        return Ok(());
    }
    let n_rows = rows.len() / width;
    if rows.len() != n_rows * width || changed.len() != n_rows {
        return Err(format!("union_changed: {} row bytes and {} changed flags do not make rows of {width}", rows.len(), changed.len()));
    }
    if let Some(&t) = targets.iter().find(|&&t| t as usize >= n_rows) {
        return Err(format!("union_changed: target {t} past the {n_rows} rows"));
    }
    for r in 0..n_out {
        let (lo, hi) = (indptr[r], indptr[r + 1]);
        if lo < 0 || hi < lo || hi as usize > targets.len() {
            return Err(format!("union_changed: indptr[{r}..{}] = {lo}..{hi} is not a range of the {} edges", r + 1, targets.len()));
        }
        let row = &mut out[r * width..(r + 1) * width];
        row.fill(0);
        let mut any = false;
        let ts = &targets[lo as usize..hi as usize];
        for (e, &t) in ts.iter().enumerate() {
            if changed[t as usize] == 0 {
                continue;
            }
            if let Some(&ahead) = ts.get(e + 4) {
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
        hit[r] = any as u8;
    }
    Ok(())
}

/// Merges received partial rows into the owner's rows: `rows[pos[i]] |= incoming[i]` (byte
/// max on the first `width_max` bytes, OR on the rest; rows as in [`union_changed`]).
/// `changed[pos[i]]` is set to 1 when the row grew, and every bit that the bitset part
/// gains adds one to `columns[bit]` (bit `k` of byte `j` is column `8 j + k`): the column
/// counts of the owner's rows stay current without a pass over them. Returns an error
/// message when an index is out of range or the lengths disagree.
pub fn merge_rows(rows: &mut [u8], width: usize, width_max: usize, pos: &[i64], incoming: &[u8], changed: &mut [u8], columns: &mut [i64]) -> Result<(), String> {
    if width == 0 || width_max > width {
        return Err(format!("merge_rows: width {width}, max part {width_max}"));
    }
    let n_rows = rows.len() / width;
    if rows.len() != n_rows * width || changed.len() != n_rows || incoming.len() != pos.len() * width || columns.len() != (width - width_max) * 8 {
        return Err(format!("merge_rows: {} row bytes, {} flags, {} incoming bytes for {} positions and {} columns do not fit rows of {width} (max part {width_max})",
                           rows.len(), changed.len(), incoming.len(), pos.len(), columns.len()));
    }
    if let Some(&p) = pos.iter().find(|&&p| p < 0 || p as usize >= n_rows) {
        return Err(format!("merge_rows: position {p} past the {n_rows} rows"));
    }
    for (i, &p) in pos.iter().enumerate() {
        let p = p as usize;
        let (dm, db) = rows[p * width..(p + 1) * width].split_at_mut(width_max);
        let (sm, sb) = incoming[i * width..(i + 1) * width].split_at(width_max);
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
    use super::{merge_rows, register_max, union_changed};

    #[test]
    fn matches_a_simple_reference() {
        let width = 3;
        let regs: Vec<u8> = (0..5 * width).map(|i| ((i * 7) % 11) as u8).collect();
        let targets = [0i64, 4, 2, 1, 3, 3];
        let indptr = [0i64, 2, 2, 6];
        let mut out = vec![9u8; 3 * width];
        register_max(&regs, width, &targets, &indptr, &mut out).unwrap();
        for r in 0..3 {
            for c in 0..width {
                let want = targets[indptr[r] as usize..indptr[r + 1] as usize].iter().map(|&t| regs[t as usize * width + c]).max().unwrap_or(0);
                assert_eq!(out[r * width + c], want);
            }
        }
        assert!(register_max(&regs, width, &[5], &[0, 1], &mut out[..width]).is_err());
        assert!(register_max(&regs, width, &targets, &[0, 7], &mut out[..width]).is_err());
    }

    #[test]
    fn union_and_merge_match_a_simple_reference() {
        // rows of 2 max bytes + 2 bitset bytes, and + 19 (two words and a tail)
        for (width, wm) in [(4usize, 2usize), (21, 2)] {
            let rows: Vec<u8> = (0..5 * width).map(|i| ((i * 37 + 11) % 251) as u8).collect();
            let changed = [1u8, 0, 1, 1, 1];
            let targets = [0u32, 1, 2, 1, 3, 4, 1];
            let indptr = [0i64, 2, 3, 3, 4, 7];
            let mut out = vec![7u8; 5 * width];
            let mut hit = vec![9u8; 5];
            union_changed(&rows, width, wm, &changed, &targets, &indptr, &mut out, &mut hit).unwrap();
            for r in 0..5 {
                let ts: Vec<usize> = targets[indptr[r] as usize..indptr[r + 1] as usize].iter().map(|&t| t as usize).filter(|&t| changed[t] == 1).collect();
                assert_eq!(hit[r], !ts.is_empty() as u8);
                for c in 0..width {
                    let want = ts.iter().fold(0u8, |acc, &t| if c < wm { acc.max(rows[t * width + c]) } else { acc | rows[t * width + c] });
                    assert_eq!(out[r * width + c], want, "row {r} byte {c}");
                }
            }
            assert!(union_changed(&rows, width, wm, &changed, &[5], &[0, 1], &mut out[..width], &mut hit[..1]).is_err());

            let mut dst = rows.clone();
            let mut flags = vec![0u8; 5];
            let mut cols = vec![0i64; (width - wm) * 8];
            let pos = [3i64, 0, 3];
            let inc: Vec<u8> = (0..3 * width).map(|i| ((i * 53 + 5) % 256) as u8).collect();
            merge_rows(&mut dst, width, wm, &pos, &inc, &mut flags, &mut cols).unwrap();
            let mut want = rows.clone();
            let mut want_cols = vec![0i64; (width - wm) * 8];
            let mut want_flags = vec![0u8; 5];
            for (i, &p) in pos.iter().enumerate() {
                let p = p as usize;
                for c in 0..width {
                    let (a, b) = (want[p * width + c], inc[i * width + c]);
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
            assert!(merge_rows(&mut dst, width, wm, &[5], &inc[..width], &mut flags, &mut cols).is_err());
        }
    }
}
