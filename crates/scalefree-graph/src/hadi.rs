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

#[cfg(test)]
mod tests {
    use super::register_max;

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
}
