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

use crate::beam::{combine_trees, score_chunk, Points, Work};
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
}

impl Default for PredictOptions {
    fn default() -> Self {
        PredictOptions { k: 5, beam: 10, batch_points: 8192, batches_in_flight: 4, max_chunk_bytes: None }
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
}

/// A node range of a level, read by one task.
#[derive(Clone)]
struct Chunk {
    end_node: u32,
    /// Offset of its first byte in the level's segment.
    segment_offset: u64,
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
                    list.push(Chunk { end_node: end as u32, segment_offset, spec });
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

/// The search state of one tree for one batch.
struct TreeState {
    /// Per point: current candidates `(node index within its level, level, score)`.
    cands: Vec<Vec<(u32, u32, f32)>>,
    /// Per point: children produced at the level being scored.
    next: Vec<Vec<(u32, f32)>>,
    expanded: Vec<bool>,
    /// Per point: evaluated leaves `((level, node), labels)` still in the beam.
    leaves: Vec<Vec<((u32, u32), Vec<(u32, f32)>)>>,
    active: Vec<u32>,
    /// Per point: the tree's label scores once its search is over.
    done: Vec<Vec<(u32, f32)>>,
}

struct BatchJob {
    index: u64,
    /// Taken by [`finish_batch`] to hand to the sink.
    batch: Mutex<Option<Batch>>,
    /// Bytes of the batch and its search state (for the peak).
    bytes: u64,
    points: Points,
    trees: Vec<Mutex<TreeState>>,
    trees_left: AtomicUsize,
    results: mpsc::Sender<Finished>,
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
    job: Arc<BatchJob>,
    tree: usize,
    level: usize,
    chunk: usize,
    work: Vec<Work>,
}

impl<'a> Task<'a> for ChunkTask<'a> {
    fn accesses(&self) -> Vec<Access> {
        vec![Access::read(self.shared.plan.chunks[self.tree][self.level][self.chunk].spec.clone())]
    }

    fn execute(&mut self, buffers: &mut TaskBuffers<'_>, _context: &TaskContext<'a>) -> Result<()> {
        let shared = self.shared;
        let model = shared.model;
        let chunk = &shared.plan.chunks[self.tree][self.level][self.chunk];
        let level = &model.trees[self.tree][self.level];
        let bytes: &[u8] = buffers.read::<u8>(0);
        let out = score_chunk(model.level_nodes(level), bytes, chunk.segment_offset, &mut self.work, &self.job.points, model.loss, shared.options.beam, model.n_features);
        let mut state = self.job.trees[self.tree].lock().expect("tree state poisoned");
        for (point, child, score) in out.children {
            state.next[point as usize].push((child, score));
        }
        for point in out.expanded {
            state.expanded[point as usize] = true;
        }
        for (point, node, labels) in out.leaves {
            state.leaves[point as usize].push(((self.level as u32, node), labels));
        }
        Ok(())
    }

    fn name(&self) -> String {
        format!("xml tree {} level {} chunk {} batch {}", self.tree, self.level, self.chunk, self.job.index)
    }
}

struct MergeTask<'a> {
    shared: &'a Shared<'a>,
    job: Arc<BatchJob>,
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
        let next_level = self.level + 1;
        let n_chunks_next = shared.plan.chunks[self.tree].get(next_level).map_or(0, |c| c.len());
        let mut work: Vec<Vec<Work>> = vec![Vec::new(); n_chunks_next];
        let tree_done = {
            let mut guard = self.job.trees[self.tree].lock().expect("tree state poisoned");
            let state = &mut *guard;
            let active = std::mem::take(&mut state.active);
            let mut still = Vec::with_capacity(active.len());
            let mut merged: Vec<(u32, f32)> = Vec::new();
            let mut levels_of: Vec<u32> = Vec::new();
            for p in active {
                let pi = p as usize;
                if !state.expanded[pi] {
                    // Only leaves remain: the search of this point is over.
                    let mut labels = Vec::new();
                    for (_, list) in state.leaves[pi].drain(..) {
                        labels.extend(list);
                    }
                    state.done[pi] = labels;
                    state.cands[pi] = Vec::new();
                    continue;
                }
                state.expanded[pi] = false;
                // Children of this level's branches plus leaves carried along, then the beam.
                merged.clear();
                levels_of.clear();
                let children = std::mem::take(&mut state.next[pi]);
                for (node, score) in children {
                    merged.push((node, score));
                    levels_of.push(next_level as u32);
                }
                for &(node, level, score) in &state.cands[pi] {
                    let is_leaf = shared.model.level_nodes(&shared.model.trees[self.tree][level as usize])[node as usize].is_leaf;
                    if is_leaf {
                        merged.push((node, score));
                        levels_of.push(level);
                    }
                }
                // Encode the level in the candidate so the selection keeps it with its node.
                let mut tagged: Vec<(u64, f32)> = merged.iter().zip(&levels_of).map(|(&(n, s), &l)| (((l as u64) << 32) | n as u64, s)).collect();
                if tagged.len() > beam {
                    tagged.select_nth_unstable_by(beam, |a, b| b.1.total_cmp(&a.1));
                    tagged.truncate(beam);
                }
                let cands: Vec<(u32, u32, f32)> = tagged.iter().map(|&(key, s)| (key as u32, (key >> 32) as u32, s)).collect();
                state.leaves[pi].retain(|((l, n), _)| cands.iter().any(|&(cn, cl, _)| cn == *n && cl == *l));
                for &(node, level, score) in &cands {
                    if level as usize == next_level {
                        let c = shared.plan.chunk_of(self.tree, next_level, node);
                        work[c].push(Work { point: p, node, score });
                    }
                }
                state.cands[pi] = cands;
                still.push(p);
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
fn launch_level<'a>(adder: &Adder<'_, 'a>, shared: &'a Shared<'a>, job: &Arc<BatchJob>, tree: usize, level: usize, work: Vec<Vec<Work>>) -> Result<()> {
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
fn finish_batch(shared: &Shared<'_>, job: &Arc<BatchJob>) {
    let k = shared.options.k;
    let batch = job.batch.lock().expect("batch lock poisoned").take().unwrap_or_default();
    let n = batch.len();
    let n_trees = shared.model.n_trees;
    let mut per_tree: Vec<_> = job.trees.iter().map(|t| std::mem::take(&mut t.lock().expect("tree state poisoned").done)).collect();
    let mut labels = vec![u32::MAX; n * k];
    let mut scores = vec![f32::NAN; n * k];
    for p in 0..n {
        let mut pairs = Vec::new();
        for t in per_tree.iter_mut() {
            pairs.append(&mut t[p]);
        }
        for (j, (l, s)) in combine_trees(pairs, n_trees, k).into_iter().enumerate() {
            labels[p * k + j] = l;
            scores[p * k + j] = s;
        }
    }
    let _ = job.results.send(Finished { index: job.index, batch, bytes: job.bytes, labels, scores });
}

fn start_batch<'a>(injector: &Injector<'a>, shared: &'a Shared<'a>, index: u64, batch: Batch, results: &mpsc::Sender<Finished>) -> Result<()> {
    let model = shared.model;
    let n = batch.len();
    let points = Points::prepare(&batch.indptr, &batch.indices, &batch.values, model.n_features);
    let trees = (0..model.n_trees)
        .map(|_| {
            Mutex::new(TreeState {
                cands: vec![vec![(0, 0, 0.)]; n],
                next: vec![Vec::new(); n],
                expanded: vec![false; n],
                leaves: vec![Vec::new(); n],
                active: (0..n as u32).collect(),
                done: vec![Vec::new(); n],
            })
        })
        .collect();
    let bytes = batch.size_bytes() + points.size_bytes() + (n * model.n_trees * (64 + 24 * shared.options.beam * (shared.options.beam + 2))) as u64;
    let now = shared.batch_bytes.fetch_add(bytes, Ordering::AcqRel) + bytes;
    shared.peak_batch_bytes.fetch_max(now, Ordering::AcqRel);
    let job = Arc::new(BatchJob { index, batch: Mutex::new(Some(batch)), bytes, points, trees, trees_left: AtomicUsize::new(model.n_trees), results: results.clone() });
    for tree in 0..model.n_trees {
        let work = vec![(0..n as u32).map(|p| Work { point: p, node: 0, score: 0. }).collect()];
        launch_level(&Adder::Injector(injector), shared, &job, tree, 0, work)?;
    }
    Ok(())
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
    let shared = Shared {
        model,
        plan: Plan::new(model, &file, max_chunk_bytes)?,
        options: options.clone(),
        abort: AtomicBool::new(false),
        in_flight: (Mutex::new(0), Condvar::new()),
        batch_bytes: AtomicU64::new(0),
        peak_batch_bytes: AtomicU64::new(0),
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
        Ok(PredictStats { points, batches, seconds: started.elapsed().as_secs_f64(), run, peak_batch_bytes: shared.peak_batch_bytes.load(Ordering::Acquire) })
    })
}
