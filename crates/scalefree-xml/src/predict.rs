//! Batched breadth-first beam search on the flash scheduler (BLAS-on-flash §5.5).
//!
//! Points arrive in batches. For each (tree, batch) the search walks the tree level by level:
//! one task per (tree, level, chunk of the level, batch) reads that chunk of the level's
//! segment (declared as its access; the runtime prefetches it under the memory budget and the
//! program cache shares it between batches) and scores the batch's points sitting at its
//! nodes; a merge task per (tree, level, batch), child of those, keeps each point's `beam` best
//! candidates (omikuji's semantics: leaves reached early stay in the beam and compete) and
//! injects the next level's tasks — only for chunks some point reaches. Several batches are in
//! flight, so while one batch's level computes, other batches' levels are being read. When the
//! last tree of a batch is done its predictions (averaged over trees, top k) go to the sink,
//! in input order. Memory: the budget (level chunks) plus the batches in flight.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use scalefree_flash::{Access, AccessSpec, FileOptions, FlashError, FlashFile, Injector, OpenMode, Result, RunStats, Runtime, Task, TaskBuffers, TaskContext, TaskId};

use crate::beam::{by_score_then_key, combine_trees, score_chunk, Points, Work};
use crate::data::Batch;
use crate::format::ModelInfo;

/// Options of a prediction run.
#[derive(Clone, Debug)]
pub struct PredictOptions {
    /// Labels returned per point (default 5).
    pub k: usize,
    /// Beam width per tree (default 10, omikuji's).
    pub beam: usize,
    /// Points per batch (default 8192).
    pub batch_points: usize,
    /// Batches scored at once (default 4).
    pub batches_in_flight: usize,
    /// Largest read per task; levels larger than this are split by nodes (default: an eighth
    /// of the memory budget).
    pub max_chunk_bytes: Option<u64>,
    /// The in-memory twin: read every level into memory first (outside the budget, timed as
    /// `load_seconds`), then score with no IO (default false).
    pub in_memory: bool,
}

impl Default for PredictOptions {
    fn default() -> Self {
        PredictOptions { k: 5, beam: 10, batch_points: 8192, batches_in_flight: 4, max_chunk_bytes: None, in_memory: false }
    }
}

/// Live counters (read from another thread for progress).
#[derive(Debug, Default)]
pub struct PredictProgress {
    pub points_done: AtomicU64,
    pub batches_done: AtomicU64,
}

/// What a run did.
#[derive(Clone, Debug, Default)]
pub struct PredictStats {
    pub points: u64,
    pub batches: u64,
    pub seconds: f64,
    pub run: RunStats,
    /// Largest bytes of batches (points and search state) held at once.
    pub peak_batch_bytes: u64,
    /// Seconds spent reading the model into memory first (`in_memory`; 0 otherwise), part of
    /// `seconds`.
    pub load_seconds: f64,
}

/// A node range of a level, read by one task.
#[derive(Clone)]
struct Chunk {
    end_node: u32,
    /// Offset of its first byte in the level's segment.
    segment_offset: u64,
    len: u64,
    spec: AccessSpec,
}

/// The chunks of every level of every tree.
struct Plan {
    /// `chunks[tree][level]`.
    chunks: Vec<Vec<Vec<Chunk>>>,
}

impl Plan {
    fn new(model: &ModelInfo, file: &Arc<FlashFile>, max_chunk_bytes: u64) -> Result<Plan> {
        let mut chunks = Vec::with_capacity(model.n_trees);
        for levels in &model.trees {
            let mut per_level = Vec::with_capacity(levels.len());
            for level in levels {
                let nodes = model.level_nodes(level);
                let mut list = Vec::new();
                let mut start = 0usize;
                while start < nodes.len() {
                    let mut end = start + 1;
                    while end < nodes.len() && nodes[end].offset + nodes[end].len - nodes[start].offset <= max_chunk_bytes {
                        end += 1;
                    }
                    let segment_offset = nodes[start].offset;
                    let len = nodes[end - 1].offset + nodes[end - 1].len - segment_offset;
                    let spec = AccessSpec::contiguous(file.clone(), level.offset + segment_offset, len.max(1))?;
                    list.push(Chunk { end_node: end as u32, segment_offset, len, spec });
                    start = end;
                }
                per_level.push(list);
            }
            chunks.push(per_level);
        }
        Ok(Plan { chunks })
    }

    fn chunk_of(&self, tree: usize, level: usize, node: u32) -> usize {
        let list = &self.chunks[tree][level];
        list.partition_point(|c| c.end_node <= node)
    }
}

/// A beam candidate: a node (index within its level) and the point's path score there.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Cand {
    node: u32,
    level: u32,
    score: f32,
}

/// An evaluated leaf in a point's beam: its labels are `labels[start..start + len]`.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct LeafRef {
    node: u32,
    level: u32,
    start: u32,
    len: u32,
}

/// The search state of one tree for one batch, in flat arrays (a point's slots are
/// `p * beam .. p * beam + count[p]`), so a batch costs a few allocations whatever its size,
/// and the arrays are reused by the next batch (see [`BatchBuffers`]).
#[derive(Default)]
struct TreeState {
    /// Current candidates of each point (at most `beam`).
    cands: Vec<Cand>,
    n_cands: Vec<u32>,
    /// Evaluated leaves still in each point's beam (at most `beam`).
    leaves: Vec<LeafRef>,
    n_leaves: Vec<u32>,
    /// Labels of evaluated leaves; those of leaves that left the beam are dropped when they
    /// are the larger part ([`TreeState::compact_labels`]).
    labels: Vec<(u32, f32)>,
    /// `(point, child, score)` produced at the level being scored, by its chunk tasks.
    children: Vec<(u32, u32, f32)>,
    /// Per point: it sat at a branch of the level being scored.
    expanded: Vec<bool>,
    /// Points whose search in this tree goes on.
    active: Vec<u32>,
    /// Scratch of the merge: children of each point (counting sort by point).
    child_start: Vec<u32>,
    child_sorted: Vec<(u32, f32)>,
}

impl TreeState {
    /// Resets for a batch of `n` points, all at the root, keeping the capacity.
    fn reset(&mut self, n: usize, beam: usize) {
        self.cands.clear();
        self.cands.resize(n * beam, Cand::default());
        self.n_cands.clear();
        self.n_cands.resize(n, 1);
        self.leaves.clear();
        self.leaves.resize(n * beam, LeafRef::default());
        self.n_leaves.clear();
        self.n_leaves.resize(n, 0);
        self.labels.clear();
        self.children.clear();
        self.expanded.clear();
        self.expanded.resize(n, false);
        self.active.clear();
        self.active.extend(0..n as u32);
    }

    /// Point p's evaluated leaves in its beam.
    fn point_leaves(&self, p: usize, beam: usize) -> &[LeafRef] {
        &self.leaves[p * beam..p * beam + self.n_leaves[p] as usize]
    }

    /// Rewrites `labels` with only the labels of leaves still in a beam.
    fn compact_labels(&mut self, beam: usize) {
        let mut kept = Vec::with_capacity(self.labels.capacity());
        for p in 0..self.n_leaves.len() {
            for leaf in &mut self.leaves[p * beam..p * beam + self.n_leaves[p] as usize] {
                let start = kept.len() as u32;
                kept.extend_from_slice(&self.labels[leaf.start as usize..(leaf.start + leaf.len) as usize]);
                leaf.start = start;
            }
        }
        self.labels = kept;
    }

    /// Bytes held (capacity).
    fn size_bytes(&self) -> u64 {
        (12 * self.cands.capacity() + 4 * self.n_cands.capacity() + 16 * self.leaves.capacity() + 4 * self.n_leaves.capacity() + 8 * self.labels.capacity() + 12 * self.children.capacity() + self.expanded.capacity() + 4 * self.active.capacity() + 4 * self.child_start.capacity() + 8 * self.child_sorted.capacity()) as u64
    }
}

/// The memory of a batch in flight other than its input: reused by later batches, so a
/// stream of any length holds at most `batches_in_flight` of them.
#[derive(Default)]
struct BatchBuffers {
    points: Points,
    trees: Vec<Mutex<TreeState>>,
}

impl BatchBuffers {
    fn size_bytes(&mut self) -> u64 {
        self.points.size_bytes() + self.trees.iter_mut().map(|t| t.get_mut().expect("tree state poisoned").size_bytes()).sum::<u64>()
    }
}

struct BatchJob<'a> {
    index: u64,
    shared: &'a Shared<'a>,
    /// Taken by [`finish_batch`] to hand to the sink.
    batch: Mutex<Option<Batch>>,
    /// Bytes of the batch and its search state (for the peak).
    bytes: AtomicU64,
    /// Returned to the pool when the last task holding the job drops it.
    buffers: BatchBuffers,
    trees_left: AtomicUsize,
    results: mpsc::Sender<Finished>,
}

impl Drop for BatchJob<'_> {
    fn drop(&mut self) {
        let buffers = std::mem::take(&mut self.buffers);
        if let Ok(mut pool) = self.shared.pool.lock() {
            pool.push(buffers);
        }
    }
}

struct Finished {
    index: u64,
    batch: Batch,
    bytes: u64,
    /// `k` per point, `u32::MAX` / NaN padded.
    labels: Vec<u32>,
    scores: Vec<f32>,
}

struct Shared<'m> {
    model: &'m ModelInfo,
    plan: Plan,
    options: PredictOptions,
    abort: AtomicBool,
    /// Batches handed out and not yet through the sink.
    in_flight: (Mutex<usize>, Condvar),
    batch_bytes: AtomicU64,
    peak_batch_bytes: AtomicU64,
    /// Buffers of finished batches, for the next ones.
    pool: Mutex<Vec<BatchBuffers>>,
    /// `in_memory`: the file's bytes from offset `.0` on, covering every level.
    resident: Option<(u64, Vec<u8>)>,
}

/// Adds tasks either from the feeder (an [`Injector`]) or from a running task.
enum Adder<'c, 'a> {
    Injector(&'c Injector<'a>),
    Context(&'c TaskContext<'a>),
}

impl<'a> Adder<'_, 'a> {
    fn add(&self, task: impl Task<'a> + 'a, parents: &[TaskId]) -> Result<TaskId> {
        match self {
            Adder::Injector(i) => i.inject(task, parents),
            Adder::Context(c) => c.inject(task, parents),
        }
    }
}

struct ChunkTask<'a> {
    shared: &'a Shared<'a>,
    job: Arc<BatchJob<'a>>,
    tree: usize,
    level: usize,
    chunk: usize,
    work: Vec<Work>,
}

impl<'a> Task<'a> for ChunkTask<'a> {
    fn accesses(&self) -> Vec<Access> {
        if self.shared.resident.is_some() {
            return Vec::new();
        }
        vec![Access::read(self.shared.plan.chunks[self.tree][self.level][self.chunk].spec.clone())]
    }

    fn execute(&mut self, buffers: &mut TaskBuffers<'_>, _context: &TaskContext<'a>) -> Result<()> {
        let shared = self.shared;
        let model = shared.model;
        let chunk = &shared.plan.chunks[self.tree][self.level][self.chunk];
        let level = &model.trees[self.tree][self.level];
        let bytes: &[u8] = match &shared.resident {
            Some((base, all)) => {
                let start = (level.offset + chunk.segment_offset - base) as usize;
                &all[start..start + chunk.len as usize]
            }
            None => buffers.read::<u8>(0),
        };
        let out = score_chunk(model.level_nodes(level), bytes, chunk.segment_offset, &mut self.work, &self.job.buffers.points, model.loss, shared.options.beam, model.n_features);
        let beam = shared.options.beam;
        let mut guard = self.job.buffers.trees[self.tree].lock().expect("tree state poisoned");
        let state = &mut *guard;
        state.children.extend_from_slice(&out.children);
        for point in out.expanded {
            state.expanded[point as usize] = true;
        }
        let base = state.labels.len() as u32;
        state.labels.extend_from_slice(&out.labels);
        for hit in out.leaves {
            let p = hit.point as usize;
            let slot = p * beam + state.n_leaves[p] as usize;
            state.leaves[slot] = LeafRef { node: hit.node, level: self.level as u32, start: base + hit.start, len: hit.len };
            state.n_leaves[p] += 1;
        }
        Ok(())
    }

    fn name(&self) -> String {
        format!("xml tree {} level {} chunk {} batch {}", self.tree, self.level, self.chunk, self.job.index)
    }
}

struct MergeTask<'a> {
    shared: &'a Shared<'a>,
    job: Arc<BatchJob<'a>>,
    tree: usize,
    level: usize,
}

impl<'a> Task<'a> for MergeTask<'a> {
    fn accesses(&self) -> Vec<Access> {
        Vec::new()
    }

    fn execute(&mut self, _buffers: &mut TaskBuffers<'_>, context: &TaskContext<'a>) -> Result<()> {
        let shared = self.shared;
        let beam = shared.options.beam;
        let model = shared.model;
        let next_level = self.level + 1;
        let n_chunks_next = shared.plan.chunks[self.tree].get(next_level).map_or(0, |c| c.len());
        let mut work: Vec<Vec<Work>> = vec![Vec::new(); n_chunks_next];
        let tree_done = {
            let mut guard = self.job.buffers.trees[self.tree].lock().expect("tree state poisoned");
            let state = &mut *guard;
            let n = state.n_cands.len();
            // The children of the level, grouped by point (a counting sort, in place order).
            state.child_start.clear();
            state.child_start.resize(n + 1, 0);
            for &(p, _, _) in &state.children {
                state.child_start[p as usize + 1] += 1;
            }
            for i in 0..n {
                state.child_start[i + 1] += state.child_start[i];
            }
            state.child_sorted.clear();
            state.child_sorted.resize(state.children.len(), (0, 0.));
            {
                let mut fill: Vec<u32> = state.child_start[..n].to_vec();
                for &(p, child, score) in &state.children {
                    let at = &mut fill[p as usize];
                    state.child_sorted[*at as usize] = (child, score);
                    *at += 1;
                }
            }
            state.children.clear();
            let active = std::mem::take(&mut state.active);
            let mut still = Vec::with_capacity(active.len());
            // Candidates tagged (level << 32 | node) so the selection keeps a node with its level.
            let mut tagged: Vec<(u64, f32)> = Vec::with_capacity(4 * beam);
            for &p in &active {
                let pi = p as usize;
                if !state.expanded[pi] {
                    // Only leaves remain: the search of this point is over; its leaves stay
                    // in `leaves` for finish_batch.
                    continue;
                }
                state.expanded[pi] = false;
                // Children of this level's branches plus leaves carried along, then the beam.
                tagged.clear();
                let (c0, c1) = (state.child_start[pi] as usize, state.child_start[pi + 1] as usize);
                tagged.extend(state.child_sorted[c0..c1].iter().map(|&(node, score)| (((next_level as u64) << 32) | node as u64, score)));
                for c in &state.cands[pi * beam..pi * beam + state.n_cands[pi] as usize] {
                    let is_leaf = model.level_nodes(&model.trees[self.tree][c.level as usize])[c.node as usize].is_leaf;
                    if is_leaf {
                        tagged.push((((c.level as u64) << 32) | c.node as u64, c.score));
                    }
                }
                if tagged.len() > beam {
                    tagged.select_nth_unstable_by(beam, by_score_then_key);
                    tagged.truncate(beam);
                }
                for (slot, &(key, score)) in state.cands[pi * beam..].iter_mut().zip(&tagged) {
                    *slot = Cand { node: key as u32, level: (key >> 32) as u32, score };
                }
                state.n_cands[pi] = tagged.len() as u32;
                // Keep the evaluated leaves still in the beam.
                let mut kept = 0;
                for j in 0..state.n_leaves[pi] as usize {
                    let leaf = state.leaves[pi * beam + j];
                    if tagged.iter().any(|&(key, _)| key == (((leaf.level as u64) << 32) | leaf.node as u64)) {
                        state.leaves[pi * beam + kept] = leaf;
                        kept += 1;
                    }
                }
                state.n_leaves[pi] = kept as u32;
                for &(key, score) in &tagged {
                    if (key >> 32) as usize == next_level {
                        let node = key as u32;
                        let c = shared.plan.chunk_of(self.tree, next_level, node);
                        work[c].push(Work { point: p, node, score });
                    }
                }
                still.push(p);
            }
            // Labels of leaves that left every beam are dropped once they are the larger part.
            if state.labels.len() > 1 << 16 {
                let live: usize = (0..n).map(|p| state.point_leaves(p, beam).iter().map(|l| l.len as usize).sum::<usize>()).sum();
                if state.labels.len() > 2 * live {
                    state.compact_labels(beam);
                }
            }
            state.active = still;
            state.active.is_empty()
        };
        if tree_done {
            if self.job.trees_left.fetch_sub(1, Ordering::AcqRel) == 1 {
                finish_batch(shared, &self.job);
            }
            return Ok(());
        }
        launch_level(&Adder::Context(context), shared, &self.job, self.tree, next_level, work)
    }

    fn name(&self) -> String {
        format!("xml merge tree {} level {} batch {}", self.tree, self.level, self.job.index)
    }
}

/// Injects the chunk tasks of `level` that have work, and the merge task after them.
fn launch_level<'a>(adder: &Adder<'_, 'a>, shared: &'a Shared<'a>, job: &Arc<BatchJob<'a>>, tree: usize, level: usize, work: Vec<Vec<Work>>) -> Result<()> {
    let mut parents = Vec::new();
    for (chunk, w) in work.into_iter().enumerate() {
        if w.is_empty() {
            continue;
        }
        parents.push(adder.add(ChunkTask { shared, job: job.clone(), tree, level, chunk, work: w }, &[])?);
    }
    adder.add(MergeTask { shared, job: job.clone(), tree, level }, &parents)?;
    Ok(())
}

/// Averages the trees' predictions of every point and sends the batch to the sink.
fn finish_batch<'a>(shared: &Shared<'a>, job: &Arc<BatchJob<'a>>) {
    let k = shared.options.k;
    let beam = shared.options.beam;
    let batch = job.batch.lock().expect("batch lock poisoned").take().unwrap_or_default();
    let n = batch.len();
    let n_trees = shared.model.n_trees;
    let trees: Vec<_> = job.buffers.trees.iter().map(|t| t.lock().expect("tree state poisoned")).collect();
    let mut labels = vec![u32::MAX; n * k];
    let mut scores = vec![f32::NAN; n * k];
    let mut pairs: Vec<(u32, f32)> = Vec::new();
    for p in 0..n {
        pairs.clear();
        for t in &trees {
            for leaf in t.point_leaves(p, beam) {
                pairs.extend_from_slice(&t.labels[leaf.start as usize..(leaf.start + leaf.len) as usize]);
            }
        }
        combine_trees(&mut pairs, n_trees, k);
        for (j, &(l, s)) in pairs.iter().enumerate() {
            labels[p * k + j] = l;
            scores[p * k + j] = s;
        }
    }
    // The batch's real bytes (the estimate made at its start, corrected).
    let actual = batch.size_bytes() + job.buffers.points.size_bytes() + trees.iter().map(|t| t.size_bytes()).sum::<u64>();
    drop(trees);
    let estimate = job.bytes.swap(actual, Ordering::AcqRel);
    if actual > estimate {
        let now = shared.batch_bytes.fetch_add(actual - estimate, Ordering::AcqRel) + (actual - estimate);
        shared.peak_batch_bytes.fetch_max(now, Ordering::AcqRel);
    } else {
        shared.batch_bytes.fetch_sub(estimate - actual, Ordering::AcqRel);
    }
    let _ = job.results.send(Finished { index: job.index, batch, bytes: actual, labels, scores });
}

fn start_batch<'a>(injector: &Injector<'a>, shared: &'a Shared<'a>, index: u64, batch: Batch, results: &mpsc::Sender<Finished>) -> Result<()> {
    let model = shared.model;
    let beam = shared.options.beam;
    let n = batch.len();
    let mut buffers = shared.pool.lock().expect("batch pool poisoned").pop().unwrap_or_default();
    buffers.points.prepare_into(&batch.indptr, &batch.indices, &batch.values, model.n_features);
    buffers.trees.resize_with(model.n_trees, Default::default);
    for t in &mut buffers.trees {
        t.get_mut().expect("tree state poisoned").reset(n, beam);
    }
    // Until the batch ends and its real size is known: what it holds now, or for fresh
    // buffers, its beams and leaves with `beam` labels each.
    let fresh = (n * model.n_trees * (beam * (12 + 16 + 8 * beam + 12 * 2) + 32)) as u64;
    let bytes = batch.size_bytes() + buffers.size_bytes().max(fresh);
    let now = shared.batch_bytes.fetch_add(bytes, Ordering::AcqRel) + bytes;
    shared.peak_batch_bytes.fetch_max(now, Ordering::AcqRel);
    let job = Arc::new(BatchJob { index, shared, batch: Mutex::new(Some(batch)), bytes: AtomicU64::new(bytes), buffers, trees_left: AtomicUsize::new(model.n_trees), results: results.clone() });
    for tree in 0..model.n_trees {
        let work = vec![(0..n as u32).map(|p| Work { point: p, node: 0, score: 0. }).collect()];
        launch_level(&Adder::Injector(injector), shared, &job, tree, 0, work)?;
    }
    Ok(())
}

/// Every level of the model, read into memory: the file's bytes from the first level's offset to
/// the end of the last one.
fn read_levels(model: &ModelInfo) -> Result<(u64, Vec<u8>)> {
    use std::io::{Read, Seek, SeekFrom};
    let first = model.trees.iter().flatten().map(|l| l.offset).min().unwrap_or(0);
    let end = model.trees.iter().flatten().map(|l| l.offset + l.len).max().unwrap_or(first);
    let len = usize::try_from(end - first).map_err(|_| FlashError::invalid("model too large for memory"))?;
    let mut bytes = vec![0u8; len];
    let mut file = std::fs::File::open(&model.path).map_err(|e| FlashError::io(&model.path, e))?;
    file.seek(SeekFrom::Start(first)).map_err(|e| FlashError::io(&model.path, e))?;
    file.read_exact(&mut bytes).map_err(|e| FlashError::io(&model.path, e))?;
    Ok((first, bytes))
}

/// Scores the points of `batches` with the model at `model.path`, handing each batch and its
/// top-k `(labels, scores)` (row-major, `k` per point, `u32::MAX` / NaN where a point has fewer
/// than k labels) to `sink`, in input order.
pub fn predict<I, S>(runtime: &Runtime, model: &ModelInfo, batches: I, options: &PredictOptions, progress: &PredictProgress, mut sink: S) -> Result<PredictStats>
where
    I: Iterator<Item = Result<Batch>> + Send,
    S: FnMut(&Batch, &[u32], &[f32]) -> Result<()> + Send,
{
    if options.k == 0 || options.beam == 0 || options.batch_points == 0 || options.batches_in_flight == 0 {
        return Err(FlashError::invalid("k, beam, batch_points and batches_in_flight must be positive"));
    }
    let started = Instant::now();
    let file = FlashFile::open(&model.path, OpenMode::ReadOnly, &FileOptions { direct_io: runtime.options().direct_io })?;
    if file.len_bytes() != model.file_len {
        return Err(FlashError::Corrupt { path: model.path.clone(), reason: "the file changed since it was opened".into() });
    }
    let budget = runtime.options().memory_budget_bytes;
    let max_chunk_bytes = options.max_chunk_bytes.unwrap_or(budget / 8).max(4096);
    let (resident, load_seconds) = if options.in_memory { (Some(read_levels(model)?), started.elapsed().as_secs_f64()) } else { (None, 0.) };
    let shared = Shared {
        model,
        plan: Plan::new(model, &file, max_chunk_bytes)?,
        options: options.clone(),
        abort: AtomicBool::new(false),
        in_flight: (Mutex::new(0), Condvar::new()),
        batch_bytes: AtomicU64::new(0),
        peak_batch_bytes: AtomicU64::new(0),
        pool: Mutex::new(Vec::new()),
        resident,
    };
    let shared = &shared;
    let (results_tx, results_rx) = mpsc::channel::<Finished>();
    let dag = runtime.dag();
    let injector = dag.injector();
    std::thread::scope(|scope| {
        let feeder = scope.spawn(move || -> Result<u64> {
            let injector = injector;
            let results_tx = results_tx;
            let mut index = 0u64;
            for batch in batches {
                {
                    let (lock, cv) = &shared.in_flight;
                    let mut n = lock.lock().expect("in-flight lock poisoned");
                    while *n >= shared.options.batches_in_flight && !shared.abort.load(Ordering::Acquire) {
                        n = cv.wait_timeout(n, Duration::from_millis(100)).expect("in-flight lock poisoned").0;
                    }
                    if shared.abort.load(Ordering::Acquire) {
                        break;
                    }
                    *n += 1;
                }
                let batch = batch?;
                start_batch(&injector, shared, index, batch, &results_tx)?;
                index += 1;
            }
            Ok(index)
        });
        let consumer = scope.spawn(move || -> Result<(u64, u64)> {
            let mut next = 0u64;
            let mut waiting: BTreeMap<u64, Finished> = BTreeMap::new();
            let mut points = 0u64;
            let mut failed: Option<FlashError> = None;
            for finished in results_rx {
                waiting.insert(finished.index, finished);
                while let Some(f) = waiting.remove(&next) {
                    if failed.is_none() {
                        if let Err(e) = sink(&f.batch, &f.labels, &f.scores) {
                            shared.abort.store(true, Ordering::Release);
                            failed = Some(e);
                        }
                    }
                    points += f.batch.len() as u64;
                    progress.points_done.fetch_add(f.batch.len() as u64, Ordering::Relaxed);
                    progress.batches_done.fetch_add(1, Ordering::Relaxed);
                    shared.batch_bytes.fetch_sub(f.bytes, Ordering::AcqRel);
                    let (lock, cv) = &shared.in_flight;
                    *lock.lock().expect("in-flight lock poisoned") -= 1;
                    cv.notify_all();
                    next += 1;
                }
            }
            match failed {
                Some(e) => Err(e),
                None => Ok((points, next)),
            }
        });
        let run = dag.run();
        if run.is_err() {
            shared.abort.store(true, Ordering::Release);
            shared.in_flight.1.notify_all();
        }
        let fed = feeder.join().expect("feeder thread panicked");
        let consumed = consumer.join().expect("consumer thread panicked");
        let run = run?;
        fed?;
        let (points, batches) = consumed?;
        Ok(PredictStats { points, batches, seconds: started.elapsed().as_secs_f64(), run, peak_batch_bytes: shared.peak_batch_bytes.load(Ordering::Acquire), load_seconds })
    })
}
