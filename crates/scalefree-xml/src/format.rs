//! The model file: label trees laid out level by level, so that one level of one tree is one
//! contiguous range of bytes (one read, or a few when a level is split into chunks to fit the
//! memory budget).
//!
//! ```text
//! [header: 4096 bytes]                magic, version, loss, n_features, n_labels, n_trees,
//!                                     n_levels, n_nodes, table offset, file length
//! [tree 0 level 0 segment]            4096-aligned; the payloads of its nodes, in node order
//! [tree 0 level 1 segment] ...
//! [table]                             level records (48 bytes each), node records (40 bytes)
//! ```
//!
//! Nodes of a level are numbered in breadth-first order; the children of a branch are
//! consecutive in the next level (`first_child .. first_child + n_out`), so a node range is a
//! byte range. A node's payload (4-byte aligned, little-endian): a leaf's labels `u32[n_out]`,
//! then its weights — sparse: `row_ids u32[n_rows]` (ascending feature ids, the bias is
//! `n_features`), `row_ptr u32[n_rows + 1]`, `outputs u32[nnz]`, `values f32[nnz]`; dense:
//! `f32[(n_features + 1) * n_out]`, feature-major. The score of output `o` for a point `x`
//! (normalized, with the bias feature 1 appended) is `Σ_f x_f W[f, o]`.
//!
//! The table is small (40 bytes per node) and is held in memory; the segments stay on flash.
//! A file whose length differs from the header's is refused as truncated.

use std::fs::File;
use std::io::{BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use scalefree_flash::{FlashError, Result};

/// First bytes of a model file.
pub const MAGIC: &[u8; 8] = b"SFXMLmdl";
/// The format version this code reads and writes.
pub const VERSION: u32 = 1;
/// Bytes before the first segment.
pub const HEADER_BYTES: u64 = 4096;
/// Segments start at multiples of this (direct IO reads whole sectors).
pub const SEGMENT_ALIGN: u64 = 4096;
const LEVEL_RECORD_BYTES: usize = 48;
const NODE_RECORD_BYTES: usize = 40;

/// How a node classifier's raw score becomes a log-probability (omikuji's two losses).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Loss {
    /// Logistic: `log σ(s) = −ln(1 + e^{−s})`.
    Log,
    /// Squared hinge: `−max(0, 1 − s)²`.
    Hinge,
}

impl Loss {
    fn code(self) -> u32 {
        match self {
            Loss::Log => 0,
            Loss::Hinge => 1,
        }
    }

    fn from_code(code: u32) -> Option<Loss> {
        match code {
            0 => Some(Loss::Log),
            1 => Some(Loss::Hinge),
            _ => None,
        }
    }

    /// The name used in `settings.json` and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Loss::Log => "log",
            Loss::Hinge => "hinge",
        }
    }

    /// Parses `"log"` or `"hinge"` (any case).
    pub fn parse(text: &str) -> Option<Loss> {
        match text.to_ascii_lowercase().as_str() {
            "log" => Some(Loss::Log),
            "hinge" => Some(Loss::Hinge),
            _ => None,
        }
    }

    /// The log-probability of a raw score, in f32 exactly as omikuji computes it.
    #[inline]
    pub fn log_prob(self, score: f32) -> f32 {
        match self {
            Loss::Log => -(-score).exp().ln_1p(),
            Loss::Hinge => -(1. - score).max(0.).powi(2),
        }
    }
}

/// A node classifier's weights, `(n_features + 1) × n_out`.
#[derive(Clone, Debug, PartialEq)]
pub enum Weights {
    /// The non-zero rows: `row_ids` ascending, row `r` has `outputs[row_ptr[r]..row_ptr[r+1]]`.
    Sparse { row_ids: Vec<u32>, row_ptr: Vec<u32>, outputs: Vec<u32>, values: Vec<f32> },
    /// Feature-major, `(n_features + 1) * n_out` values.
    Dense(Vec<f32>),
}

/// What a node is: a branch with children in the next level, or a leaf with labels.
#[derive(Clone, Debug, PartialEq)]
pub enum NodeKind {
    /// Children are nodes `first_child .. first_child + n_out` of the next level.
    Branch { first_child: u32 },
    /// One label per output.
    Leaf { labels: Vec<u32> },
}

/// A node to write.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeSpec {
    /// Outputs: children of a branch, labels of a leaf.
    pub n_out: u32,
    pub kind: NodeKind,
    pub weights: Weights,
}

/// A node as stored: where its payload lies in its level's segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeRecord {
    pub is_leaf: bool,
    pub dense: bool,
    pub n_out: u32,
    /// First child in the next level (branches).
    pub first_child: u32,
    /// Stored rows (sparse) or `n_features + 1` (dense).
    pub n_rows: u32,
    /// Stored weights (sparse) or rows × outputs (dense).
    pub nnz: u64,
    /// Payload offset from the start of the level's segment.
    pub offset: u64,
    pub len: u64,
}

impl NodeRecord {
    fn payload_len(is_leaf: bool, dense: bool, n_out: u64, n_rows: u64, nnz: u64) -> u64 {
        let labels = if is_leaf { 4 * n_out } else { 0 };
        let weights = if dense { 4 * n_rows * n_out } else { 4 * n_rows + 4 * (n_rows + 1) + 8 * nnz };
        labels + weights
    }
}

/// One level of one tree.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LevelRecord {
    pub tree: u32,
    pub level: u32,
    /// Index of its first node in the model's node table.
    pub first_node: u64,
    pub n_nodes: u64,
    /// File offset and length of its segment.
    pub offset: u64,
    pub len: u64,
}

/// A node's payload, borrowed from a level buffer.
pub struct NodeView<'a> {
    pub labels: &'a [u32],
    pub weights: WeightsView<'a>,
}

/// Borrowed weights.
pub enum WeightsView<'a> {
    Sparse { row_ids: &'a [u32], row_ptr: &'a [u32], outputs: &'a [u32], values: &'a [f32] },
    Dense(&'a [f32]),
}

fn corrupt(path: &Path, reason: impl Into<String>) -> FlashError {
    FlashError::Corrupt { path: path.to_path_buf(), reason: reason.into() }
}

fn u32s(bytes: &[u8]) -> &[u32] {
    bytemuck::cast_slice(bytes)
}

fn f32s(bytes: &[u8]) -> &[f32] {
    bytemuck::cast_slice(bytes)
}

impl NodeRecord {
    /// The node's payload within `segment_bytes`, a buffer that starts at segment offset
    /// `buffer_offset` (4-byte aligned). Panics if the buffer does not hold it (misuse).
    pub fn view<'a>(&self, buffer: &'a [u8], buffer_offset: u64) -> NodeView<'a> {
        let start = (self.offset - buffer_offset) as usize;
        let bytes = &buffer[start..start + self.len as usize];
        let n_out = self.n_out as usize;
        let (labels, rest) = if self.is_leaf { bytes.split_at(4 * n_out) } else { bytes.split_at(0) };
        let weights = if self.dense {
            WeightsView::Dense(f32s(rest))
        } else {
            let n_rows = self.n_rows as usize;
            let nnz = self.nnz as usize;
            let (row_ids, rest) = rest.split_at(4 * n_rows);
            let (row_ptr, rest) = rest.split_at(4 * (n_rows + 1));
            let (outputs, values) = rest.split_at(4 * nnz);
            WeightsView::Sparse { row_ids: u32s(row_ids), row_ptr: u32s(row_ptr), outputs: u32s(outputs), values: f32s(values) }
        };
        NodeView { labels: u32s(labels), weights }
    }
}

/// Writes a model file tree by tree; it appears at its path only after [`ModelWriter::finish`]
/// (written to a temporary beside it, synced and renamed).
pub struct ModelWriter {
    path: PathBuf,
    temp: PathBuf,
    out: BufWriter<File>,
    position: u64,
    n_features: u64,
    loss: Loss,
    n_labels: u64,
    n_trees: u32,
    levels: Vec<LevelRecord>,
    nodes: Vec<NodeRecord>,
}

impl ModelWriter {
    /// Starts a model of `n_features` input features.
    pub fn create(path: &Path, n_features: u64, loss: Loss) -> Result<ModelWriter> {
        if n_features >= u32::MAX as u64 {
            return Err(FlashError::invalid(format!("{n_features} features: at most 2^32 - 2 are supported")));
        }
        let name = path.file_name().ok_or_else(|| FlashError::invalid(format!("{} names no file", path.display())))?;
        let temp = path.with_file_name(format!(".{}.tmp-{}", name.to_string_lossy(), std::process::id()));
        let file = File::create(&temp).map_err(|e| FlashError::io(&temp, e))?;
        let mut out = BufWriter::with_capacity(1 << 20, file);
        out.write_all(&[0u8; HEADER_BYTES as usize]).map_err(|e| FlashError::io(&temp, e))?;
        Ok(ModelWriter { path: path.to_path_buf(), temp, out, position: HEADER_BYTES, n_features, loss, n_labels: 0, n_trees: 0, levels: Vec::new(), nodes: Vec::new() })
    }

    fn put(&mut self, bytes: &[u8]) -> Result<()> {
        self.out.write_all(bytes).map_err(|e| FlashError::io(&self.temp, e))?;
        self.position += bytes.len() as u64;
        Ok(())
    }

    fn pad_to(&mut self, align: u64) -> Result<()> {
        let pad = (align - self.position % align) % align;
        self.put(&vec![0u8; pad as usize])
    }

    /// Checks a tree's structure: every level non-empty, the children of the branches of a
    /// level are exactly the next level in order, shapes match.
    fn check_tree(&self, levels: &[Vec<NodeSpec>]) -> Result<()> {
        let tree = self.n_trees;
        if levels.is_empty() || levels[0].len() != 1 {
            return Err(FlashError::invalid(format!("tree {tree}: level 0 must hold exactly the root")));
        }
        let rows = self.n_features + 1;
        for (l, level) in levels.iter().enumerate() {
            let mut expected_child = 0u64;
            for (i, node) in level.iter().enumerate() {
                let at = || format!("tree {tree} level {l} node {i}");
                let n_out = node.n_out as u64;
                if n_out == 0 {
                    return Err(FlashError::invalid(format!("{}: a node needs at least one output", at())));
                }
                match &node.kind {
                    NodeKind::Branch { first_child } => {
                        if *first_child as u64 != expected_child {
                            return Err(FlashError::invalid(format!("{}: children start at {first_child}, expected {expected_child} (children of a level's branches are the next level, in order)", at())));
                        }
                        expected_child += n_out;
                    }
                    NodeKind::Leaf { labels } => {
                        if labels.len() as u64 != n_out {
                            return Err(FlashError::invalid(format!("{}: {} labels for {n_out} outputs", at(), labels.len())));
                        }
                    }
                }
                match &node.weights {
                    Weights::Dense(values) => {
                        if values.len() as u64 != rows * n_out {
                            return Err(FlashError::shape(format!("{}: dense weights hold {} values, expected {rows} x {n_out}", at(), values.len())));
                        }
                    }
                    Weights::Sparse { row_ids, row_ptr, outputs, values } => {
                        if row_ptr.len() != row_ids.len() + 1 || row_ptr[0] != 0 || *row_ptr.last().unwrap() as usize != outputs.len() || outputs.len() != values.len() {
                            return Err(FlashError::shape(format!("{}: inconsistent sparse weight arrays", at())));
                        }
                        if row_ptr.windows(2).any(|w| w[0] > w[1]) || row_ids.windows(2).any(|w| w[0] >= w[1]) || row_ids.last().is_some_and(|&r| r as u64 >= rows) {
                            return Err(FlashError::shape(format!("{}: sparse weight rows must ascend and lie below {rows}", at())));
                        }
                        if outputs.iter().any(|&o| o as u64 >= n_out) {
                            return Err(FlashError::shape(format!("{}: a weight names an output past {n_out}", at())));
                        }
                    }
                }
            }
            let next_len = levels.get(l + 1).map_or(0, |n| n.len() as u64);
            if expected_child != next_len {
                return Err(FlashError::invalid(format!("tree {tree} level {l}: its branches have {expected_child} children but level {} holds {next_len} nodes", l + 1)));
            }
        }
        Ok(())
    }

    /// Appends a tree given level by level (level 0 is the root).
    pub fn add_tree(&mut self, levels: &[Vec<NodeSpec>]) -> Result<()> {
        self.check_tree(levels)?;
        let tree = self.n_trees;
        for (l, level) in levels.iter().enumerate() {
            self.pad_to(SEGMENT_ALIGN)?;
            let segment_start = self.position;
            let first_node = self.nodes.len() as u64;
            for node in level {
                let offset = self.position - segment_start;
                let (is_leaf, first_child) = match &node.kind {
                    NodeKind::Branch { first_child } => (false, *first_child),
                    NodeKind::Leaf { labels } => {
                        self.n_labels = self.n_labels.max(labels.iter().map(|&x| x as u64 + 1).max().unwrap_or(0));
                        self.put(bytemuck::cast_slice(labels))?;
                        (true, 0)
                    }
                };
                let (dense, n_rows, nnz) = match &node.weights {
                    Weights::Dense(values) => {
                        self.put(bytemuck::cast_slice(values))?;
                        (true, (self.n_features + 1) as u32, values.len() as u64)
                    }
                    Weights::Sparse { row_ids, row_ptr, outputs, values } => {
                        self.put(bytemuck::cast_slice(row_ids))?;
                        self.put(bytemuck::cast_slice(row_ptr))?;
                        self.put(bytemuck::cast_slice(outputs))?;
                        self.put(bytemuck::cast_slice(values))?;
                        (false, row_ids.len() as u32, values.len() as u64)
                    }
                };
                let len = self.position - segment_start - offset;
                self.nodes.push(NodeRecord { is_leaf, dense, n_out: node.n_out, first_child, n_rows, nnz, offset, len });
            }
            let len = self.position - segment_start;
            self.levels.push(LevelRecord { tree, level: l as u32, first_node, n_nodes: level.len() as u64, offset: segment_start, len });
        }
        self.n_trees += 1;
        Ok(())
    }

    /// Appends every tree of the model `source` (same features and loss), copying its level
    /// segments as they are: ensembles trained apart become one model.
    pub fn copy_trees(&mut self, source: &ModelInfo) -> Result<()> {
        if source.n_features != self.n_features || source.loss != self.loss {
            return Err(FlashError::invalid(format!("{} has {} features and {} loss, the model being written {} and {}", source.path.display(), source.n_features, source.loss.name(), self.n_features, self.loss.name())));
        }
        let mut file = File::open(&source.path).map_err(|e| FlashError::io(&source.path, e))?;
        for levels in &source.trees {
            let tree = self.n_trees;
            for level in levels {
                self.pad_to(SEGMENT_ALIGN)?;
                let offset = self.position;
                let mut bytes = vec![0u8; level.len as usize];
                file.seek(SeekFrom::Start(level.offset)).map_err(|e| FlashError::io(&source.path, e))?;
                file.read_exact(&mut bytes).map_err(|e| FlashError::io(&source.path, e))?;
                self.put(&bytes)?;
                let first_node = self.nodes.len() as u64;
                self.nodes.extend_from_slice(source.level_nodes(level));
                self.levels.push(LevelRecord { tree, level: level.level, first_node, n_nodes: level.n_nodes, offset, len: level.len });
            }
            self.n_trees += 1;
        }
        self.n_labels = self.n_labels.max(source.n_labels);
        Ok(())
    }

    /// Writes the table and header, syncs, and renames the file into place.
    pub fn finish(mut self) -> Result<()> {
        if self.n_trees == 0 {
            return Err(FlashError::invalid("a model needs at least one tree"));
        }
        self.pad_to(8)?;
        let table_offset = self.position;
        let mut table = Vec::with_capacity(self.levels.len() * LEVEL_RECORD_BYTES + self.nodes.len() * NODE_RECORD_BYTES);
        for l in &self.levels {
            table.extend_from_slice(&l.tree.to_le_bytes());
            table.extend_from_slice(&l.level.to_le_bytes());
            for v in [l.first_node, l.n_nodes, l.offset, l.len, 0] {
                table.extend_from_slice(&v.to_le_bytes());
            }
        }
        for n in &self.nodes {
            table.push(n.is_leaf as u8);
            table.push(n.dense as u8);
            table.extend_from_slice(&[0, 0]);
            for v in [n.n_out, n.first_child, n.n_rows] {
                table.extend_from_slice(&v.to_le_bytes());
            }
            for v in [n.nnz, n.offset, n.len] {
                table.extend_from_slice(&v.to_le_bytes());
            }
        }
        self.put(&table)?;
        let file_len = self.position;
        let mut header = Vec::with_capacity(HEADER_BYTES as usize);
        header.extend_from_slice(MAGIC);
        header.extend_from_slice(&VERSION.to_le_bytes());
        header.extend_from_slice(&self.loss.code().to_le_bytes());
        for v in [self.n_features, self.n_labels, self.n_trees as u64, self.levels.len() as u64, self.nodes.len() as u64, table_offset, file_len] {
            header.extend_from_slice(&v.to_le_bytes());
        }
        let temp = self.temp.clone();
        let io = |e| FlashError::io(&temp, e);
        self.out.flush().map_err(io)?;
        let mut file = self.out.get_ref().try_clone().map_err(io)?;
        file.seek(SeekFrom::Start(0)).map_err(io)?;
        file.write_all(&header).map_err(io)?;
        file.sync_all().map_err(io)?;
        std::fs::rename(&temp, &self.path).map_err(|e| FlashError::io(&self.path, e))?;
        self.temp = PathBuf::new();
        Ok(())
    }
}

impl Drop for ModelWriter {
    fn drop(&mut self) {
        if !self.temp.as_os_str().is_empty() {
            let _ = std::fs::remove_file(&self.temp);
        }
    }
}

/// A model file's header and table (in memory); the segments stay on flash.
#[derive(Clone, Debug)]
pub struct ModelInfo {
    pub path: PathBuf,
    pub n_features: u64,
    pub n_labels: u64,
    pub n_trees: usize,
    pub loss: Loss,
    pub file_len: u64,
    /// Per tree, its levels in order.
    pub trees: Vec<Vec<LevelRecord>>,
    pub nodes: Vec<NodeRecord>,
}

fn le_u32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn le_u64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

impl ModelInfo {
    /// Reads and checks a model file's header and table.
    pub fn open(path: &Path) -> Result<ModelInfo> {
        let mut file = File::open(path).map_err(|e| FlashError::io(path, e))?;
        let actual_len = file.metadata().map_err(|e| FlashError::io(path, e))?.len();
        let mut header = [0u8; 80];
        if actual_len < HEADER_BYTES {
            return Err(corrupt(path, format!("{actual_len} bytes is too short for a scalefree XML model (truncated?)")));
        }
        file.read_exact(&mut header).map_err(|e| FlashError::io(path, e))?;
        if &header[..8] != MAGIC {
            return Err(corrupt(path, "not a scalefree XML model (bad magic; an omikuji model directory is converted with `scalefree flash xml import`)"));
        }
        let version = le_u32(&header, 8);
        if version != VERSION {
            return Err(corrupt(path, format!("model format version {version}, this build reads version {VERSION}")));
        }
        let loss = Loss::from_code(le_u32(&header, 12)).ok_or_else(|| corrupt(path, "unknown loss code"))?;
        let [n_features, n_labels, n_trees, n_levels, n_nodes, table_offset, file_len] = std::array::from_fn(|i| le_u64(&header, 16 + 8 * i));
        if file_len != actual_len {
            return Err(corrupt(path, format!("the file holds {actual_len} bytes but its header says {file_len} (truncated or damaged)")));
        }
        let table_len = n_levels.checked_mul(LEVEL_RECORD_BYTES as u64).and_then(|a| n_nodes.checked_mul(NODE_RECORD_BYTES as u64).and_then(|b| a.checked_add(b)));
        if table_len.is_none_or(|t| table_offset.checked_add(t) != Some(file_len)) || n_trees == 0 {
            return Err(corrupt(path, "inconsistent table size in the header"));
        }
        let mut table = vec![0u8; table_len.unwrap_or(0) as usize];
        file.seek(SeekFrom::Start(table_offset)).map_err(|e| FlashError::io(path, e))?;
        file.read_exact(&mut table).map_err(|e| FlashError::io(path, e))?;
        let mut trees: Vec<Vec<LevelRecord>> = vec![Vec::new(); n_trees as usize];
        for i in 0..n_levels as usize {
            let b = &table[i * LEVEL_RECORD_BYTES..];
            let rec = LevelRecord { tree: le_u32(b, 0), level: le_u32(b, 4), first_node: le_u64(b, 8), n_nodes: le_u64(b, 16), offset: le_u64(b, 24), len: le_u64(b, 32) };
            let tree = trees.get_mut(rec.tree as usize).ok_or_else(|| corrupt(path, format!("level record {i} names tree {} of {n_trees}", rec.tree)))?;
            if rec.level as usize != tree.len() || rec.n_nodes == 0 || rec.first_node.checked_add(rec.n_nodes).is_none_or(|e| e > n_nodes) || rec.offset.checked_add(rec.len).is_none_or(|e| e > table_offset) || rec.offset % SEGMENT_ALIGN != 0 {
                return Err(corrupt(path, format!("level record {i} is inconsistent")));
            }
            tree.push(rec);
        }
        let node_base = n_levels as usize * LEVEL_RECORD_BYTES;
        let mut nodes = Vec::with_capacity(n_nodes as usize);
        for i in 0..n_nodes as usize {
            let b = &table[node_base + i * NODE_RECORD_BYTES..];
            nodes.push(NodeRecord { is_leaf: b[0] != 0, dense: b[1] != 0, n_out: le_u32(b, 4), first_child: le_u32(b, 8), n_rows: le_u32(b, 12), nnz: le_u64(b, 16), offset: le_u64(b, 24), len: le_u64(b, 32) });
        }
        let info = ModelInfo { path: path.to_path_buf(), n_features, n_labels, n_trees: n_trees as usize, loss, file_len, trees, nodes };
        info.check_nodes()?;
        Ok(info)
    }

    fn check_nodes(&self) -> Result<()> {
        let path = &self.path;
        for (t, levels) in self.trees.iter().enumerate() {
            if levels.is_empty() || levels[0].n_nodes != 1 {
                return Err(corrupt(path, format!("tree {t} has no root level")));
            }
            for (l, level) in levels.iter().enumerate() {
                let next = levels.get(l + 1).map_or(0, |n| n.n_nodes);
                let mut children = 0u64;
                for (i, node) in self.level_nodes(level).iter().enumerate() {
                    let bad = |why: &str| corrupt(path, format!("tree {t} level {l} node {i}: {why}"));
                    if node.n_out == 0 || node.offset % 4 != 0 || node.offset.checked_add(node.len).is_none_or(|e| e > level.len) {
                        return Err(bad("payload out of its level"));
                    }
                    let rows_ok = if node.dense { node.n_rows as u64 == self.n_features + 1 && node.nnz == node.n_rows as u64 * node.n_out as u64 } else { node.n_rows as u64 <= self.n_features + 1 };
                    if !rows_ok || NodeRecord::payload_len(node.is_leaf, node.dense, node.n_out as u64, node.n_rows as u64, node.nnz) != node.len {
                        return Err(bad("payload size does not match its shape"));
                    }
                    if !node.is_leaf {
                        if node.first_child as u64 != children {
                            return Err(bad("children out of order"));
                        }
                        children += node.n_out as u64;
                    }
                }
                if children != next {
                    return Err(corrupt(path, format!("tree {t} level {l}: {children} children but the next level holds {next} nodes")));
                }
            }
        }
        Ok(())
    }

    /// The node records of a level.
    pub fn level_nodes(&self, level: &LevelRecord) -> &[NodeRecord] {
        &self.nodes[level.first_node as usize..(level.first_node + level.n_nodes) as usize]
    }

    /// Bytes of the levels (the part of the file a full pass reads).
    pub fn segment_bytes(&self) -> u64 {
        self.trees.iter().flatten().map(|l| l.len).sum()
    }

    /// Depth of the deepest tree.
    pub fn max_depth(&self) -> usize {
        self.trees.iter().map(|t| t.len()).max().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leaf(labels: Vec<u32>, n_features: usize) -> NodeSpec {
        let n_out = labels.len();
        NodeSpec { n_out: n_out as u32, kind: NodeKind::Leaf { labels }, weights: Weights::Dense(vec![0.5; (n_features + 1) * n_out]) }
    }

    fn tree(n_features: usize) -> Vec<Vec<NodeSpec>> {
        let root = NodeSpec {
            n_out: 2,
            kind: NodeKind::Branch { first_child: 0 },
            weights: Weights::Sparse { row_ids: vec![1, 3], row_ptr: vec![0, 1, 3], outputs: vec![1, 0, 1], values: vec![1., -2., 3.] },
        };
        vec![vec![root], vec![leaf(vec![4, 2], n_features), leaf(vec![9], n_features)]]
    }

    #[test]
    fn round_trip_and_truncation() {
        let dir = std::env::temp_dir().join(format!("sfxml-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("m.sfxml");
        let mut w = ModelWriter::create(&path, 4, Loss::Log).unwrap();
        w.add_tree(&tree(4)).unwrap();
        w.add_tree(&tree(4)).unwrap();
        w.finish().unwrap();
        let m = ModelInfo::open(&path).unwrap();
        assert_eq!((m.n_features, m.n_labels, m.n_trees, m.loss), (4, 10, 2, Loss::Log));
        assert_eq!(m.trees[1].len(), 2);
        let root = m.level_nodes(&m.trees[0][0])[0];
        let mut bytes = vec![0u8; m.trees[0][0].len as usize];
        let mut f = File::open(&path).unwrap();
        f.seek(SeekFrom::Start(m.trees[0][0].offset)).unwrap();
        f.read_exact(&mut bytes).unwrap();
        let WeightsView::Sparse { row_ids, outputs, values, .. } = root.view(&bytes, 0).weights else { panic!("sparse root") };
        assert_eq!((row_ids, outputs, values), (&[1u32, 3][..], &[1u32, 0, 1][..], &[1f32, -2., 3.][..]));
        // a truncated copy is refused, naming the file
        let data = std::fs::read(&path).unwrap();
        let cut = dir.join("cut.sfxml");
        std::fs::write(&cut, &data[..data.len() - 7]).unwrap();
        let err = ModelInfo::open(&cut).unwrap_err().to_string();
        assert!(err.contains("cut.sfxml") && err.contains("truncated"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn malformed_trees_are_refused() {
        let dir = std::env::temp_dir().join(format!("sfxml-bad-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut w = ModelWriter::create(&dir.join("b.sfxml"), 4, Loss::Hinge).unwrap();
        let mut t = tree(4);
        t[1].pop();
        assert!(w.add_tree(&t).is_err());
        let mut t = tree(4);
        t[1][0].weights = Weights::Dense(vec![0.; 3]);
        assert!(w.add_tree(&t).is_err());
        drop(w);
        assert!(!dir.join("b.sfxml").exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
