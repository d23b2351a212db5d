//! Import of a model saved by omikuji (`Model::save`: `settings.json` and one CBOR file per
//! tree, `tree0.cbor`, `tree1.cbor`, ...). The serde types below mirror the shapes omikuji
//! serializes (an externally tagged `TreeNode` enum of `Branch { weights, children }` and
//! `Leaf { weights, labels }`; `WeightMat` is `Sparse(LilMat)` or `Dense(ndarray Array2)`);
//! unknown shapes — another version's trees — fail to deserialize and are reported naming the
//! file. One tree is held in memory while it is converted.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};

use scalefree_flash::{FlashError, Result};
use serde::Deserialize;

use crate::format::{Loss, ModelWriter, NodeKind, NodeSpec, Weights};

#[derive(Deserialize)]
struct Settings {
    n_features: usize,
    classifier_loss_type: String,
}

/// omikuji's `LilMat`: rows (features) with stored values, as `(outer_inds, indptr)` over
/// `(inner_inds, data)`; shape `(outer_dim, inner_dim)` = `(n_features + 1, n_out)`.
#[derive(Deserialize)]
struct LilMat {
    outer_dim: usize,
    inner_dim: usize,
    indptr: Vec<usize>,
    outer_inds: Vec<u32>,
    inner_inds: Vec<u32>,
    data: Vec<f32>,
}

/// ndarray's serde form of an `Array2<f32>` (format version 1, standard layout).
#[derive(Deserialize)]
struct Array2 {
    v: u8,
    dim: (usize, usize),
    data: Vec<f32>,
}

#[derive(Deserialize)]
enum WeightMat {
    Sparse(LilMat),
    Dense(Array2),
}

#[derive(Deserialize)]
enum TreeNode {
    Branch { weights: WeightMat, children: Vec<TreeNode> },
    Leaf { weights: WeightMat, labels: Vec<u32> },
}

fn corrupt(path: &Path, reason: impl Into<String>) -> FlashError {
    FlashError::Corrupt { path: path.to_path_buf(), reason: reason.into() }
}

fn convert_weights(path: &Path, weights: WeightMat, n_features: usize, n_out: usize) -> Result<Weights> {
    let rows = n_features + 1;
    match weights {
        WeightMat::Dense(a) => {
            if a.v != 1 || a.dim != (rows, n_out) || a.data.len() != rows * n_out {
                return Err(corrupt(path, format!("dense weights of shape {:?}, expected ({rows}, {n_out})", a.dim)));
            }
            Ok(Weights::Dense(a.data))
        }
        WeightMat::Sparse(m) => {
            let consistent = m.outer_dim == rows
                && m.inner_dim == n_out
                && m.indptr.len() == m.outer_inds.len() + 1
                && m.inner_inds.len() == m.data.len()
                && m.indptr.first() == Some(&0)
                && m.indptr.last() == Some(&m.data.len())
                && m.data.len() < u32::MAX as usize;
            if !consistent {
                return Err(corrupt(path, format!("sparse weights of shape ({}, {}) are inconsistent, expected ({rows}, {n_out})", m.outer_dim, m.inner_dim)));
            }
            let row_ptr = m.indptr.iter().map(|&p| p as u32).collect();
            Ok(Weights::Sparse { row_ids: m.outer_inds, row_ptr, outputs: m.inner_inds, values: m.data })
        }
    }
}

/// Flattens one tree breadth-first into levels.
fn tree_levels(path: &Path, root: TreeNode, n_features: usize) -> Result<Vec<Vec<NodeSpec>>> {
    let mut levels = Vec::new();
    let mut current = VecDeque::from([root]);
    while !current.is_empty() {
        let mut level = Vec::with_capacity(current.len());
        let mut next = VecDeque::new();
        for node in current.drain(..) {
            match node {
                TreeNode::Branch { weights, children } => {
                    let n_out = children.len();
                    if n_out == 0 {
                        return Err(corrupt(path, "a branch without children"));
                    }
                    let weights = convert_weights(path, weights, n_features, n_out)?;
                    level.push(NodeSpec { n_out: n_out as u32, kind: NodeKind::Branch { first_child: next.len() as u32 }, weights });
                    next.extend(children);
                }
                TreeNode::Leaf { weights, labels } => {
                    let n_out = labels.len();
                    if n_out == 0 {
                        return Err(corrupt(path, "a leaf without labels"));
                    }
                    let weights = convert_weights(path, weights, n_features, n_out)?;
                    level.push(NodeSpec { n_out: n_out as u32, kind: NodeKind::Leaf { labels }, weights });
                }
            }
        }
        levels.push(level);
        current = next;
    }
    Ok(levels)
}

/// The tree files of an omikuji model directory, in tree-number order.
fn tree_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut files: Vec<(u64, PathBuf)> = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|e| FlashError::io(dir, e))? {
        let entry = entry.map_err(|e| FlashError::io(dir, e))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if let Some(number) = name.strip_prefix("tree").and_then(|r| r.strip_suffix(".cbor")) {
            let order = number.parse::<u64>().unwrap_or(u64::MAX);
            files.push((order, entry.path()));
        }
    }
    files.sort();
    if files.is_empty() {
        return Err(corrupt(dir, "no tree*.cbor files: not an omikuji model directory"));
    }
    Ok(files.into_iter().map(|(_, p)| p).collect())
}

/// What an import did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImportSummary {
    pub n_trees: usize,
    pub n_features: usize,
    pub loss: Loss,
}

/// Converts the omikuji model in `dir` into a model file at `out`.
pub fn import_omikuji(dir: &Path, out: &Path) -> Result<ImportSummary> {
    let settings_path = dir.join("settings.json");
    let text = std::fs::read_to_string(&settings_path).map_err(|e| FlashError::io(&settings_path, e))?;
    let settings: Settings = serde_json::from_str(&text).map_err(|e| corrupt(&settings_path, format!("not omikuji settings: {e}")))?;
    let loss = Loss::parse(&settings.classifier_loss_type).ok_or_else(|| corrupt(&settings_path, format!("unknown classifier_loss_type {:?}", settings.classifier_loss_type)))?;
    let files = tree_files(dir)?;
    let mut writer = ModelWriter::create(out, settings.n_features as u64, loss)?;
    for path in &files {
        let file = std::fs::File::open(path).map_err(|e| FlashError::io(path, e))?;
        let reader = std::io::BufReader::with_capacity(1 << 20, file);
        let root: TreeNode = ciborium::de::from_reader(reader).map_err(|e| corrupt(path, format!("not an omikuji tree of this version: {e}")))?;
        let levels = tree_levels(path, root, settings.n_features)?;
        writer.add_tree(&levels).map_err(|e| corrupt(path, e.to_string()))?;
    }
    writer.finish()?;
    Ok(ImportSummary { n_trees: files.len(), n_features: settings.n_features, loss })
}
