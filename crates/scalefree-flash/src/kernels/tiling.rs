//! Tile sizes from the memory budget: a task's blocks take about a third of the budget, so
//! one task computes while the next is prefetched and the previous one is written back.

/// Splits `len` into `ceil(len / max_tile)` near-equal tiles; returns the tile length
/// (`len` itself when it fits, at least 1).
pub fn balanced_tile(len: usize, max_tile: usize) -> usize {
    let max_tile = max_tile.max(1);
    if len <= max_tile {
        return len.max(1);
    }
    let tiles = len.div_ceil(max_tile);
    len.div_ceil(tiles)
}

/// Tile ranges `[start, end)` covering `0..len`.
pub fn tile_ranges(len: usize, tile: usize) -> Vec<(usize, usize)> {
    (0..len).step_by(tile.max(1)).map(|start| (start, (start + tile).min(len))).collect()
}

/// How a flash gemm cuts its work. With [`GemmStream::ARows`], each C tile (`tm x tn`) is an
/// accumulate chain over reduction tiles `p` that keeps the whole strip of op(A) it needs
/// (`tm x k`, contiguous on flash) resident and streams blocks of op(B) (`tk x tn`); with
/// [`GemmStream::BColumns`], the roles of A and B swap. Each chain reads its strip once with a
/// few large IOs, instead of one short strided run per row and reduction tile.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GemmStream {
    /// Whole-k strips of op(A) stay along a chain; op(B) blocks stream. Chosen when op(A)'s
    /// rows are contiguous on flash (row-major A, or column-major A transposed).
    ARows,
    /// Whole-k strips of op(B) stay along a chain; op(A) blocks stream. Chosen when op(B)'s
    /// columns are contiguous on flash.
    BColumns,
    /// Square-ish blocks of everything (no operand has contiguous strips).
    Square,
}

/// A strip is at least this many rows (columns) or the square tiling is used instead.
const MIN_STRIP: usize = 16;

/// Tiles `(tile_m, tile_n, tile_k)` of a flash gemm under `budget_bytes` for `stream`.
///
/// Strips: a streamed block takes at most a twelfth of the budget (the next one is prefetched
/// while one computes). The C tile is as wide as possible (whole rows of a row-major C are
/// contiguous), and the strip as tall as lets the next chain's strip be prefetched while the
/// current chain runs (`2 strips + C + 2 blocks`) and the next chain's C tile be allocated
/// while the current one is written back (`strip + 2 C + 1 block`). Falls back to
/// [`square_gemm_tiles`] when a strip of [`MIN_STRIP`] does not fit.
pub fn gemm_tiles(m: usize, n: usize, k: usize, element_bytes: usize, budget_bytes: u64, stream: GemmStream) -> (usize, usize, usize) {
    let elements = (budget_bytes / element_bytes.max(1) as u64) as usize;
    let block_budget = elements / 12;
    // (strip dimension, other C dimension) -> (strip tile, other tile, k tile).
    let strips = |along: usize, across: usize| -> Option<(usize, usize, usize)> {
        let min_strip = MIN_STRIP.min(along.max(1));
        let mut across_tile = across.max(1);
        loop {
            let k_tile = balanced_tile(k, (block_budget / across_tile).max(1));
            let block = k_tile * across_tile;
            let room = |fixed: usize, per_row: usize| elements.checked_sub(fixed).map_or(0, |free| free / per_row.max(1));
            let strip_max = room(2 * block, 2 * k + across_tile).min(room(block, k + 2 * across_tile));
            if strip_max >= min_strip {
                return Some((balanced_tile(along, strip_max), across_tile, k_tile));
            }
            if across_tile == 1 {
                return None;
            }
            across_tile = balanced_tile(across, across_tile / 2);
        }
    };
    match stream {
        GemmStream::ARows => strips(m, n),
        GemmStream::BColumns => strips(n, m).map(|(tn, tm, tk)| (tm, tn, tk)),
        GemmStream::Square => None,
    }
    .unwrap_or_else(|| square_gemm_tiles(m, n, k, element_bytes, budget_bytes))
}

/// Square-ish gemm tiles `(tile_m, tile_n, tile_k)` so that the three blocks of one task
/// (`tm*tk + tk*tn + tm*tn` elements of `element_bytes`) fit in `budget_bytes / 3`.
pub fn square_gemm_tiles(m: usize, n: usize, k: usize, element_bytes: usize, budget_bytes: u64) -> (usize, usize, usize) {
    let per_task = (budget_bytes / 3) as f64 / element_bytes as f64;
    let mut side = (per_task / 3.0).sqrt().floor().max(1.0) as usize;
    // Grow the side while dimensions smaller than it leave room.
    loop {
        let (tm, tn, tk) = (m.min(side).max(1), n.min(side).max(1), k.min(side).max(1));
        let next = side + side / 8 + 1;
        let (nm, nn, nk) = (m.min(next).max(1), n.min(next).max(1), k.min(next).max(1));
        let grows = (nm, nn, nk) != (tm, tn, tk);
        if !grows || ((nm * nk + nk * nn + nm * nn) as f64) > per_task {
            return (balanced_tile(m, tm), balanced_tile(n, tn), balanced_tile(k, tk));
        }
        side = next;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiles_fit_the_budget_and_balance() {
        assert_eq!(balanced_tile(16384, 5461), 4096);
        assert_eq!(balanced_tile(10, 100), 10);
        assert_eq!(balanced_tile(0, 100), 1);
        assert_eq!(tile_ranges(10, 4), vec![(0, 4), (4, 8), (8, 10)]);
        assert!(tile_ranges(0, 4).is_empty());
        for &(m, n, k, budget) in &[(16384usize, 16384usize, 16384usize, 1u64 << 30), (1000, 10, 1000, 1 << 20), (5, 5, 5, 1 << 30), (100_000, 64, 64, 1 << 24)] {
            let (tm, tn, tk) = square_gemm_tiles(m, n, k, 4, budget);
            assert!(((tm * tk + tk * tn + tm * tn) * 4) as u64 <= budget / 3 + 1, "{m} {n} {k}: {tm} {tn} {tk}");
            assert!(tm >= 1 && tn >= 1 && tk >= 1);
            for stream in [GemmStream::ARows, GemmStream::BColumns] {
                let (tm, tn, tk) = gemm_tiles(m, n, k, 4, budget, stream);
                let (strip, across) = if stream == GemmStream::ARows { (tm, tn) } else { (tn, tm) };
                let (strip_bytes, c_bytes, block_bytes) = ((strip * k * 4) as u64, (strip * across * 4) as u64, (tk * across * 4) as u64);
                if 2 * strip_bytes + c_bytes + 2 * block_bytes > budget || strip_bytes + 2 * c_bytes + block_bytes > budget && (tm, tn, tk) != square_gemm_tiles(m, n, k, 4, budget) {
                    panic!("{stream:?} {m} {n} {k}: {tm} {tn} {tk} do not fit {budget}");
                }
            }
        }
        assert_eq!(square_gemm_tiles(16384, 16384, 16384, 4, 1 << 30), (4096, 4096, 4096));
        assert_eq!(square_gemm_tiles(5, 5, 5, 4, 1 << 30), (5, 5, 5));
        // The benchmark's shape: 48 MiB for three 64 MiB matrices. Strips of 820 whole rows
        // (A and C 12.8 MiB each), B blocks of 256 rows (4 MiB).
        assert_eq!(gemm_tiles(4096, 4096, 4096, 4, 48 << 20, GemmStream::ARows), (820, 4096, 256));
        assert_eq!(gemm_tiles(4096, 4096, 4096, 4, 48 << 20, GemmStream::BColumns), (4096, 820, 256));
        // k too long for a strip: square tiles.
        assert_eq!(gemm_tiles(64, 64, 1 << 20, 4, 1 << 20, GemmStream::ARows), square_gemm_tiles(64, 64, 1 << 20, 4, 1 << 20));
    }
}
