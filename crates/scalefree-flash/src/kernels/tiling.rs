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

/// Square-ish gemm tiles `(tile_m, tile_n, tile_k)` so that the three blocks of one task
/// (`tm*tk + tk*tn + tm*tn` elements of `element_bytes`) fit in `budget_bytes / 3`.
pub fn gemm_tiles(m: usize, n: usize, k: usize, element_bytes: usize, budget_bytes: u64) -> (usize, usize, usize) {
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
            let (tm, tn, tk) = gemm_tiles(m, n, k, 4, budget);
            assert!(((tm * tk + tk * tn + tm * tn) * 4) as u64 <= budget / 3 + 1, "{m} {n} {k}: {tm} {tn} {tk}");
            assert!(tm >= 1 && tn >= 1 && tk >= 1);
        }
        assert_eq!(gemm_tiles(16384, 16384, 16384, 4, 1 << 30), (4096, 4096, 4096));
        assert_eq!(gemm_tiles(5, 5, 5, 4, 1 << 30), (5, 5, 5));
    }
}
