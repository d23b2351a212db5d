//! The arithmetic of one step of the breadth-first beam search: the points of a batch that sit
//! at nodes of one chunk of one level are scored against those nodes' classifiers.
//!
//! Scores follow omikuji's `TreeNode::predict` exactly: a point is L2-normalized and gets the
//! bias feature (`n_features`, value 1); a node's raw scores are `xᵀW` (accumulated over the
//! point's features in ascending order, in f32, as omikuji does); a child's score is its
//! parent's plus the loss's log-probability of the raw score; a leaf's label scores are
//! `exp(leaf score + log-probability)`, of which the `beam` best are kept. Points at the same
//! node are scored together, so a sparse node's rows are looked up through a table built once
//! per node and batch (cost: its stored rows) instead of a binary search per point and feature
//! (what a per-point scorer pays) — whichever is cheaper for the group at hand.

use rayon::prelude::*;

use crate::format::{Loss, NodeRecord, WeightsView};

/// A batch's points, normalized, each ending with the bias feature.
#[derive(Clone, Debug, Default)]
pub struct Points {
    pub indptr: Vec<usize>,
    pub indices: Vec<u32>,
    pub values: Vec<f32>,
}

impl Points {
    /// Normalizes the rows of a CSR batch (f32, in feature order, as omikuji) and appends the
    /// bias feature. A row with norm 0 keeps its values (omikuji would divide 0 by 0).
    pub fn prepare(indptr: &[u64], indices: &[u32], values: &[f32], n_features: u64) -> Points {
        let n = indptr.len() - 1;
        let mut out = Points { indptr: Vec::with_capacity(n + 1), indices: Vec::with_capacity(indices.len() + n), values: Vec::with_capacity(indices.len() + n) };
        out.indptr.push(0);
        for i in 0..n {
            let (a, b) = (indptr[i] as usize, indptr[i + 1] as usize);
            let norm = values[a..b].iter().map(|v| v.powi(2)).sum::<f32>().sqrt();
            let scale = if norm > 0. { norm } else { 1. };
            for k in a..b {
                out.indices.push(indices[k]);
                out.values.push(values[k] / scale);
            }
            out.indices.push(n_features as u32);
            out.values.push(1.);
            out.indptr.push(out.indices.len());
        }
        out
    }

    /// Point i's (features, values).
    pub fn row(&self, i: usize) -> (&[u32], &[f32]) {
        let (a, b) = (self.indptr[i], self.indptr[i + 1]);
        (&self.indices[a..b], &self.values[a..b])
    }

    /// Bytes held.
    pub fn size_bytes(&self) -> u64 {
        (8 * self.indptr.len() + 8 * self.indices.len()) as u64
    }
}

/// A point waiting at a node of the level being scored.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Work {
    pub point: u32,
    /// Node index within the level.
    pub node: u32,
    /// The point's path score (sum of log-probabilities) at this node.
    pub score: f32,
}

/// What scoring a chunk produced.
#[derive(Debug, Default)]
pub struct ChunkOutput {
    /// `(point, child index in the next level, child score)` for every branch's children.
    pub children: Vec<(u32, u32, f32)>,
    /// `(point, leaf index in the level, its best labels and scores)`.
    pub leaves: Vec<(u32, u32, Vec<(u32, f32)>)>,
    /// Points that sat at a branch.
    pub expanded: Vec<u32>,
}

impl ChunkOutput {
    fn append(mut self, mut other: ChunkOutput) -> ChunkOutput {
        self.children.append(&mut other.children);
        self.leaves.append(&mut other.leaves);
        self.expanded.append(&mut other.expanded);
        self
    }
}

thread_local! {
    /// Feature id → stored row of the node being scored (`u32::MAX`: none), one per compute
    /// thread, kept between tasks (reset after each node) so it is allocated once.
    static LOOKUP: std::cell::RefCell<Vec<u32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Raw scores `xᵀW` of one point into `acc` (length n_out, zeroed by the caller).
fn dense_scores(x: (&[u32], &[f32]), w: &[f32], n_out: usize, acc: &mut [f32]) {
    for (&f, &v) in x.0.iter().zip(x.1) {
        let row = &w[f as usize * n_out..(f as usize + 1) * n_out];
        for (a, &wv) in acc.iter_mut().zip(row) {
            *a += v * wv;
        }
    }
}

/// Scores every point of `work` (all at one level; sorted by node here) against its node.
/// `buffer` holds the chunk's bytes, starting at segment offset `buffer_offset`.
#[allow(clippy::too_many_arguments)]
pub fn score_chunk(level_nodes: &[NodeRecord], buffer: &[u8], buffer_offset: u64, work: &mut [Work], points: &Points, loss: Loss, beam: usize, n_features: u64) -> ChunkOutput {
    work.sort_unstable_by_key(|w| (w.node, w.point));
    let table_len = n_features as usize + 1;
    work.par_chunk_by(|a, b| a.node == b.node)
        .map_init(
            Vec::<f32>::new,
            |acc_buf, group| LOOKUP.with_borrow_mut(|lookup| {
                let record = &level_nodes[group[0].node as usize];
                let view = record.view(buffer, buffer_offset);
                let n_out = record.n_out as usize;
                let mut out = ChunkOutput::default();
                let use_lookup = match &view.weights {
                    WeightsView::Sparse { row_ids, .. } => {
                        let nnz_x: usize = group.iter().map(|w| points.indptr[w.point as usize + 1] - points.indptr[w.point as usize]).sum();
                        let log_rows = (usize::BITS - row_ids.len().leading_zeros()) as usize;
                        2 * row_ids.len() + nnz_x < nnz_x * log_rows.max(1)
                    }
                    WeightsView::Dense(_) => false,
                };
                if use_lookup {
                    if lookup.len() != table_len {
                        *lookup = vec![u32::MAX; table_len];
                    }
                    if let WeightsView::Sparse { row_ids, .. } = &view.weights {
                        for (r, &f) in row_ids.iter().enumerate() {
                            lookup[f as usize] = r as u32;
                        }
                    }
                }
                for w in group.iter() {
                    let x = points.row(w.point as usize);
                    acc_buf.clear();
                    acc_buf.resize(n_out, 0.);
                    let acc = &mut *acc_buf;
                    match &view.weights {
                        WeightsView::Dense(values) => dense_scores(x, values, n_out, acc),
                        WeightsView::Sparse { row_ids, row_ptr, outputs, values } => {
                            if use_lookup {
                                for (&f, &v) in x.0.iter().zip(x.1) {
                                    let r = lookup[f as usize];
                                    if r != u32::MAX {
                                        let (a, b) = (row_ptr[r as usize] as usize, row_ptr[r as usize + 1] as usize);
                                        for k in a..b {
                                            acc[outputs[k] as usize] += v * values[k];
                                        }
                                    }
                                }
                            } else {
                                let mut from = 0usize;
                                for (&f, &v) in x.0.iter().zip(x.1) {
                                    match row_ids[from..].binary_search(&f) {
                                        Ok(d) => {
                                            from += d;
                                            let (a, b) = (row_ptr[from] as usize, row_ptr[from + 1] as usize);
                                            for k in a..b {
                                                acc[outputs[k] as usize] += v * values[k];
                                            }
                                        }
                                        Err(d) => from += d,
                                    }
                                }
                            }
                        }
                    }
                    if record.is_leaf {
                        let mut labels: Vec<(u32, f32)> = view.labels.iter().zip(acc.iter()).map(|(&l, &s)| (l, (loss.log_prob(s) + w.score).exp())).collect();
                        if labels.len() > beam {
                            labels.select_nth_unstable_by(beam, |a, b| b.1.total_cmp(&a.1));
                            labels.truncate(beam);
                        }
                        out.leaves.push((w.point, w.node, labels));
                    } else {
                        out.expanded.push(w.point);
                        for (j, &s) in acc.iter().enumerate() {
                            out.children.push((w.point, record.first_child + j as u32, loss.log_prob(s) + w.score));
                        }
                    }
                }
                if use_lookup {
                    if let WeightsView::Sparse { row_ids, .. } = &view.weights {
                        for &f in row_ids.iter() {
                            lookup[f as usize] = u32::MAX;
                        }
                    }
                }
                out
            }),
        )
        .reduce(ChunkOutput::default, ChunkOutput::append)
}

/// Averages per-tree `(label, score)` lists of one point over `n_trees` (a label missing from
/// a tree counts 0 there) and returns the best `k`, highest first (ties: smaller label first).
pub fn combine_trees(mut pairs: Vec<(u32, f32)>, n_trees: usize, k: usize) -> Vec<(u32, f32)> {
    pairs.sort_unstable_by_key(|p| p.0);
    let mut summed: Vec<(u32, f32)> = Vec::with_capacity(pairs.len());
    for (label, score) in pairs {
        match summed.last_mut() {
            Some(last) if last.0 == label => last.1 += score,
            _ => summed.push((label, score)),
        }
    }
    for p in &mut summed {
        p.1 /= n_trees as f32;
    }
    let by_score = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
    if summed.len() > k && k > 0 {
        summed.select_nth_unstable_by(k - 1, by_score);
        summed.truncate(k);
    }
    summed.sort_unstable_by(by_score);
    summed.truncate(k);
    summed
}
