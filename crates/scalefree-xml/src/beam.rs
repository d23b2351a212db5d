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
        let mut out = Points::default();
        out.prepare_into(indptr, indices, values, n_features);
        out
    }

    /// [`Points::prepare`] into buffers already held (their capacity is kept: a stream of
    /// batches reuses the same memory).
    pub fn prepare_into(&mut self, indptr: &[u64], indices: &[u32], values: &[f32], n_features: u64) {
        let n = indptr.len() - 1;
        self.indptr.clear();
        self.indices.clear();
        self.values.clear();
        self.indptr.reserve(n + 1);
        self.indices.reserve(indices.len() + n);
        self.values.reserve(indices.len() + n);
        self.indptr.push(0);
        for i in 0..n {
            let (a, b) = (indptr[i] as usize, indptr[i + 1] as usize);
            let norm = values[a..b].iter().map(|v| v.powi(2)).sum::<f32>().sqrt();
            let scale = if norm > 0. { norm } else { 1. };
            for k in a..b {
                self.indices.push(indices[k]);
                self.values.push(values[k] / scale);
            }
            self.indices.push(n_features as u32);
            self.values.push(1.);
            self.indptr.push(self.indices.len());
        }
    }

    /// Point i's (features, values).
    pub fn row(&self, i: usize) -> (&[u32], &[f32]) {
        let (a, b) = (self.indptr[i], self.indptr[i + 1]);
        (&self.indices[a..b], &self.values[a..b])
    }

    /// Bytes held (capacity).
    pub fn size_bytes(&self) -> u64 {
        (8 * self.indptr.capacity() + 4 * self.indices.capacity() + 4 * self.values.capacity()) as u64
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

/// A leaf a point reached: its best labels are `labels[start..start + len]` of the output.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LeafHit {
    pub point: u32,
    /// Leaf index within the level.
    pub node: u32,
    pub start: u32,
    pub len: u32,
}

/// What scoring a chunk produced (flat: no allocation per point or leaf).
#[derive(Debug, Default)]
pub struct ChunkOutput {
    /// `(point, child index in the next level, child score)` for every branch's children.
    pub children: Vec<(u32, u32, f32)>,
    /// Leaves reached, their labels in `labels`.
    pub leaves: Vec<LeafHit>,
    /// `(label, score)` of the leaves reached, the `beam` best of each leaf.
    pub labels: Vec<(u32, f32)>,
    /// Points that sat at a branch.
    pub expanded: Vec<u32>,
}

impl ChunkOutput {
    fn append(mut self, mut other: ChunkOutput) -> ChunkOutput {
        if self.children.is_empty() && self.leaves.is_empty() && self.expanded.is_empty() {
            return other;
        }
        let base = self.labels.len() as u32;
        self.children.append(&mut other.children);
        self.leaves.extend(other.leaves.iter().map(|h| LeafHit { start: h.start + base, ..*h }));
        self.labels.append(&mut other.labels);
        self.expanded.append(&mut other.expanded);
        self
    }
}

/// The order of candidates: higher score first, then the smaller key (a total order, so the
/// selection does not depend on the order the candidates arrived in).
#[inline]
pub fn by_score_then_key<K: Ord>(a: &(K, f32), b: &(K, f32)) -> std::cmp::Ordering {
    b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0))
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
                        let start = out.labels.len();
                        out.labels.extend(view.labels.iter().zip(acc.iter()).map(|(&l, &s)| (l, (loss.log_prob(s) + w.score).exp())));
                        let labels = &mut out.labels[start..];
                        if labels.len() > beam {
                            labels.select_nth_unstable_by(beam, by_score_then_key);
                        }
                        let len = labels.len().min(beam);
                        out.labels.truncate(start + len);
                        out.leaves.push(LeafHit { point: w.point, node: w.node, start: start as u32, len: len as u32 });
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

/// Averages per-tree `(label, score)` lists of one point (given tree after tree) over `n_trees` (a label missing from
/// a tree counts 0 there) and leaves the best `k` in `pairs`, highest first (ties: smaller
/// label first).
pub fn combine_trees(pairs: &mut Vec<(u32, f32)>, n_trees: usize, k: usize) {
    // Stable: a label's scores are summed in tree order whatever the sort does.
    pairs.sort_by_key(|p| p.0);
    let mut w = 0usize;
    for r in 0..pairs.len() {
        if w > 0 && pairs[w - 1].0 == pairs[r].0 {
            pairs[w - 1].1 += pairs[r].1;
        } else {
            pairs[w] = pairs[r];
            w += 1;
        }
    }
    pairs.truncate(w);
    for p in pairs.iter_mut() {
        p.1 /= n_trees as f32;
    }
    let by_score = by_score_then_key::<u32>;
    if pairs.len() > k && k > 0 {
        pairs.select_nth_unstable_by(k - 1, by_score);
    }
    pairs.truncate(k);
    pairs.sort_unstable_by(by_score);
}
