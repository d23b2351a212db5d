//! kmeans: Lloyd iterations over the rows of a dense matrix on flash. Each iteration is one
//! DAG: row-block tasks read a block of points, compute its distances to the centers with a
//! block multiply (‖x‖² − 2 x·c + ‖c‖², the x·c part by gemm), assign each point to its
//! nearest center, and add the block's per-cluster sums into shared totals. The centers
//! (k x d) and the labels (one u32 per point) stay in memory; the points stream from flash.
//!
//! Initial centers are `k` distinct rows chosen by a seeded shuffle (reproducible). A cluster
//! that loses all its points keeps its previous center.

use std::sync::Mutex;

use crate::dense::{DenseMut, DenseRef, Layout, Transpose};
use crate::element::Real;
use crate::error::{FlashError, Result};
use crate::file::FlashMatrix;
use crate::io::Access;
use crate::runtime::Runtime;
use crate::sched::{FnTask, RunStats};

use super::block_gemm::gemm_in_memory;
use super::tiling::tile_ranges;

/// Options of [`kmeans`].
#[derive(Clone, Copy, Debug)]
pub struct KmeansOptions {
    /// Number of clusters.
    pub k: usize,
    /// Most Lloyd iterations.
    pub max_iterations: usize,
    /// Stop when no center moves more than this (Euclidean distance).
    pub tolerance: f64,
    /// Seed of the initial choice of centers.
    pub seed: u64,
}

/// What [`kmeans`] found.
#[derive(Clone, Debug)]
pub struct KmeansResult<T> {
    /// Centers, k x d, row-major.
    pub centers: Vec<T>,
    /// Cluster of each point (after the last assignment).
    pub labels: Vec<u32>,
    /// Sum of squared distances of the points to their centers (last assignment).
    pub inertia: f64,
    /// Iterations run.
    pub iterations: usize,
    /// Statistics of all iterations added up.
    pub stats: RunStats,
}

/// `k` distinct indices below `n` from a seeded partial Fisher-Yates shuffle.
fn choose(n: usize, k: usize, seed: u64) -> Vec<usize> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut picked: std::collections::HashMap<usize, usize> = std::collections::HashMap::new();
    (0..k)
        .map(|i| {
            let j = i + (next() % (n - i) as u64) as usize;
            let vj = *picked.get(&j).unwrap_or(&j);
            let vi = *picked.get(&i).unwrap_or(&i);
            picked.insert(j, vi);
            vj
        })
        .collect()
}

/// Lloyd's k-means on the rows of `x` (n points of dimension d).
pub fn kmeans<T: Real>(runtime: &Runtime, x: &FlashMatrix<T>, options: KmeansOptions) -> Result<KmeansResult<T>> {
    let (n, d, k) = (x.rows(), x.cols(), options.k);
    if k == 0 || k > n {
        return Err(FlashError::invalid(format!("kmeans: k = {k} must be between 1 and the number of points {n}")));
    }
    let mut centers = Vec::with_capacity(k * d);
    for r in choose(n, k, options.seed) {
        centers.extend(x.read_block(r, 0, 1, d)?);
    }
    let size = std::mem::size_of::<T>();
    let o = runtime.options();
    let task_bytes = (o.memory_budget_bytes / o.max_tasks_in_flight.max(1) as u64).max(1) as usize;
    let block_rows = (task_bytes / ((d + k).max(1) * size)).max(1);
    let blocks = tile_ranges(n, block_rows);
    let layout = x.layout();
    let mut labels = vec![0u32; n];
    let mut stats = RunStats::default();
    let mut inertia = 0.0;
    let mut iterations = 0;
    while iterations < options.max_iterations {
        iterations += 1;
        let c_norms: Vec<T> = centers.chunks(d.max(1)).map(|c| c.iter().fold(T::ZERO, |s, &v| s + v * v)).take(k).collect();
        // (sums k x d in f64, counts, inertia)
        let totals = Mutex::new((vec![0f64; k * d], vec![0u64; k], 0f64));
        {
            let dag = runtime.dag();
            let mut rest: &mut [u32] = &mut labels;
            for &(r0, r1) in &blocks {
                let (mine, tail) = std::mem::take(&mut rest).split_at_mut(r1 - r0);
                rest = tail;
                let (centers, c_norms, totals) = (&centers, &c_norms, &totals);
                dag.add(
                    FnTask::new("kmeans", vec![Access::read(x.block_access(r0, 0, r1 - r0, d)?)], move |buffers, _| {
                        let b = r1 - r0;
                        let pts = DenseRef::packed(buffers.read::<T>(0), b, d, layout)?;
                        let cv = DenseRef::packed(centers, k, d, Layout::RowMajor)?;
                        let mut dots = vec![T::ZERO; b * k];
                        gemm_in_memory(Transpose::No, Transpose::Yes, T::ONE, pts, cv, T::ZERO, DenseMut::packed(&mut dots, b, k, Layout::RowMajor)?, 1)?;
                        let mut sums = vec![0f64; k * d];
                        let mut counts = vec![0u64; k];
                        let mut block_inertia = 0f64;
                        for i in 0..b {
                            let norm: f64 = (0..d).map(|j| pts.get(i, j).to_f64().powi(2)).sum();
                            let (best, dist) = (0..k)
                                .map(|c| (c, c_norms[c].to_f64() - 2.0 * dots[i * k + c].to_f64()))
                                .fold((0, f64::INFINITY), |a, (c, v)| if v < a.1 { (c, v) } else { a });
                            mine[i] = best as u32;
                            block_inertia += (norm + dist).max(0.0);
                            counts[best] += 1;
                            for j in 0..d {
                                sums[best * d + j] += pts.get(i, j).to_f64();
                            }
                        }
                        let mut t = totals.lock().expect("kmeans totals lock poisoned");
                        t.0.iter_mut().zip(&sums).for_each(|(a, s)| *a += s);
                        t.1.iter_mut().zip(&counts).for_each(|(a, c)| *a += c);
                        t.2 += block_inertia;
                        Ok(())
                    }),
                    &[],
                )?;
            }
            stats = stats.add(&dag.run()?);
        }
        let (sums, counts, total_inertia) = totals.into_inner().expect("kmeans totals lock poisoned");
        inertia = total_inertia;
        let mut shift = 0f64;
        for c in 0..k {
            if counts[c] == 0 {
                continue;
            }
            let mut moved = 0f64;
            for j in 0..d {
                let new = sums[c * d + j] / counts[c] as f64;
                moved += (new - centers[c * d + j].to_f64()).powi(2);
                centers[c * d + j] = T::from_f64(new);
            }
            shift = shift.max(moved.sqrt());
        }
        if shift <= options.tolerance {
            break;
        }
    }
    Ok(KmeansResult { centers, labels, inertia, iterations, stats })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::test_support::random_vec;
    use crate::runtime::RuntimeOptions;

    /// Plain Lloyd in memory from the same start: must give the same labels and centers.
    fn reference(data: &[f64], n: usize, d: usize, k: usize, iters: usize, seed: u64) -> (Vec<f64>, Vec<u32>) {
        let mut centers: Vec<f64> = choose(n, k, seed).into_iter().flat_map(|r| data[r * d..(r + 1) * d].to_vec()).collect();
        let mut labels = vec![0u32; n];
        for _ in 0..iters {
            for i in 0..n {
                let dist = |c: usize| (0..d).map(|j| (data[i * d + j] - centers[c * d + j]).powi(2)).sum::<f64>();
                labels[i] = (0..k).min_by(|&a, &b| dist(a).total_cmp(&dist(b))).unwrap() as u32;
            }
            let mut sums = vec![0.0; k * d];
            let mut counts = vec![0usize; k];
            for i in 0..n {
                counts[labels[i] as usize] += 1;
                for j in 0..d {
                    sums[labels[i] as usize * d + j] += data[i * d + j];
                }
            }
            for c in 0..k {
                if counts[c] > 0 {
                    for j in 0..d {
                        centers[c * d + j] = sums[c * d + j] / counts[c] as f64;
                    }
                }
            }
        }
        (centers, labels)
    }

    #[test]
    fn flash_kmeans_matches_plain_lloyd_within_budget() {
        let budget = 8 << 10;
        let rt = Runtime::new(RuntimeOptions { memory_budget_bytes: budget, compute_threads: 2, io_threads: 2, max_tasks_in_flight: 3, ..RuntimeOptions::default() }).unwrap();
        for &(n, d, k) in &[(1usize, 1usize, 1usize), (10, 3, 10), (500, 7, 4), (1200, 16, 5)] {
            // Well-separated blobs so that the assignment has no near ties.
            let noise = random_vec::<f64>(n as u64, n * d);
            let data: Vec<f64> = (0..n * d).map(|e| ((e / d) % k) as f64 * 10.0 + noise[e]).collect();
            for layout in [Layout::RowMajor, Layout::ColMajor] {
                let stored: Vec<f64> = match layout {
                    Layout::RowMajor => data.clone(),
                    Layout::ColMajor => (0..n * d).map(|e| data[(e % n) * d + e / n]).collect(),
                };
                let x = FlashMatrix::from_slice(rt.dir(), &stored, n, d, layout, &rt.file_options()).unwrap();
                let got = kmeans(&rt, &x, KmeansOptions { k, max_iterations: 5, tolerance: -1.0, seed: 3 }).unwrap();
                let (centers, labels) = reference(&data, n, d, k, 5, 3);
                assert_eq!(got.iterations, 5);
                assert_eq!(got.labels, labels, "{n}x{d} k={k}");
                for (a, b) in got.centers.iter().zip(&centers) {
                    assert!((a - b).abs() < 1e-9, "{a} vs {b}");
                }
                assert!(got.stats.cache.peak_resident_bytes <= budget);
            }
        }
        let x = FlashMatrix::from_slice(rt.dir(), &[1.0f64, 2.0], 2, 1, Layout::RowMajor, &rt.file_options()).unwrap();
        assert!(kmeans(&rt, &x, KmeansOptions { k: 3, max_iterations: 1, tolerance: 0.0, seed: 0 }).is_err());
    }
}
