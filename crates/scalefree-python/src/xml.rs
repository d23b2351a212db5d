//! `scalefree._native.xml_*`: extreme multi-label models on flash (import, write, inspect) and
//! their batched beam-search scoring (`scalefree.flash.xml`).

use std::io::Write;
use std::path::PathBuf;

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyTuple};
use scalefree_flash::FlashError;
use scalefree_xml::{import_omikuji, predict, push_csr_rows, Batch, CsrBatches, FlashCsrBatches, Loss, ModelInfo, ModelWriter, NodeKind, NodeSpec, PredictOptions, PredictProgress, RankingMetrics, TextReader, Weights};

use crate::buffer::Buf;
use crate::errors::invalid;
use crate::flash::{flash_err, stats_dict, AnyCsr, PyFlashCsr, PyFlashRuntime};

/// Copies a numpy array of 4-byte items into a Vec.
fn vec4<T: bytemuck::Pod>(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Vec<T>> {
    let b = Buf::get(obj, false, what)?;
    if b.itemsize() != 4 {
        return Err(invalid(obj.py(), format!("{what} must hold 4-byte items (uint32/float32)")));
    }
    let bytes = unsafe { std::slice::from_raw_parts(b.ptr() as *const u8, b.len_bytes()) };
    Ok(bytemuck::pod_collect_to_vec(bytes))
}

fn loss_of(py: Python<'_>, name: &str) -> PyResult<Loss> {
    Loss::parse(name).ok_or_else(|| invalid(py, format!("loss must be 'log' or 'hinge', got {name:?}")))
}

fn info_dict<'py>(py: Python<'py>, m: &ModelInfo) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("path", &m.path)?;
    d.set_item("n_features", m.n_features)?;
    d.set_item("n_labels", m.n_labels)?;
    d.set_item("n_trees", m.n_trees)?;
    d.set_item("loss", m.loss.name())?;
    d.set_item("file_bytes", m.file_len)?;
    d.set_item("level_bytes", m.segment_bytes())?;
    d.set_item("n_nodes", m.nodes.len())?;
    d.set_item("depth", m.max_depth())?;
    let largest = m.trees.iter().flatten().map(|l| l.len).max().unwrap_or(0);
    d.set_item("largest_level_bytes", largest)?;
    Ok(d)
}

/// Header and table of a model file, as a dict.
#[pyfunction]
pub fn xml_model_info(py: Python<'_>, path: PathBuf) -> PyResult<Py<PyDict>> {
    let m = py.detach(|| ModelInfo::open(&path)).map_err(|e| flash_err(py, e))?;
    Ok(info_dict(py, &m)?.unbind())
}

/// Converts an omikuji model directory into a model file.
#[pyfunction]
pub fn xml_import_omikuji(py: Python<'_>, dir: PathBuf, out: PathBuf) -> PyResult<Py<PyDict>> {
    py.detach(|| import_omikuji(&dir, &out)).map_err(|e| flash_err(py, e))?;
    let m = py.detach(|| ModelInfo::open(&out)).map_err(|e| flash_err(py, e))?;
    Ok(info_dict(py, &m)?.unbind())
}

/// Writes a model file. `trees`: per tree a list of levels, per level a list of nodes
/// `(first_child or -1 for a leaf, n_out, labels uint32 or None, weights)` with weights
/// `("dense", float32[(n_features + 1) * n_out])` or
/// `("sparse", row_ids uint32, row_ptr uint32, outputs uint32, values float32)`.
#[pyfunction]
pub fn xml_write_model(py: Python<'_>, path: PathBuf, n_features: u64, loss: &str, trees: Bound<'_, PyList>) -> PyResult<()> {
    let loss = loss_of(py, loss)?;
    let mut writer = ModelWriter::create(&path, n_features, loss).map_err(|e| flash_err(py, e))?;
    for tree in trees.iter() {
        let mut levels = Vec::new();
        for level in tree.cast::<PyList>()?.iter() {
            let mut nodes = Vec::new();
            for node in level.cast::<PyList>()?.iter() {
                let node = node.cast::<PyTuple>()?;
                let first_child: i64 = node.get_item(0)?.extract()?;
                let n_out: u32 = node.get_item(1)?.extract()?;
                let kind = if first_child < 0 {
                    NodeKind::Leaf { labels: vec4(&node.get_item(2)?, "labels")? }
                } else {
                    NodeKind::Branch { first_child: first_child as u32 }
                };
                let w = node.get_item(3)?;
                let w = w.cast::<PyTuple>()?;
                let tag: String = w.get_item(0)?.extract()?;
                let weights = match tag.as_str() {
                    "dense" => Weights::Dense(vec4(&w.get_item(1)?, "dense weights")?),
                    "sparse" => Weights::Sparse {
                        row_ids: vec4(&w.get_item(1)?, "row_ids")?,
                        row_ptr: vec4(&w.get_item(2)?, "row_ptr")?,
                        outputs: vec4(&w.get_item(3)?, "outputs")?,
                        values: vec4(&w.get_item(4)?, "values")?,
                    },
                    other => return Err(invalid(py, format!("weights kind must be 'dense' or 'sparse', got {other:?}"))),
                };
                nodes.push(NodeSpec { n_out, kind, weights });
            }
            levels.push(nodes);
        }
        py.detach(|| writer.add_tree(&levels)).map_err(|e| flash_err(py, e))?;
    }
    py.detach(|| writer.finish()).map_err(|e| flash_err(py, e))
}

/// Writes a model made of the trees of `sources`, in order (segments copied as they are).
#[pyfunction]
pub fn xml_concat_models(py: Python<'_>, out: PathBuf, sources: Vec<PathBuf>) -> PyResult<Py<PyDict>> {
    let infos = py.detach(|| sources.iter().map(|p| ModelInfo::open(p)).collect::<scalefree_flash::Result<Vec<_>>>()).map_err(|e| flash_err(py, e))?;
    let first = infos.first().ok_or_else(|| invalid(py, "no source models"))?;
    let mut writer = ModelWriter::create(&out, first.n_features, first.loss).map_err(|e| flash_err(py, e))?;
    py.detach(|| {
        for info in &infos {
            writer.copy_trees(info)?;
        }
        writer.finish()
    })
    .map_err(|e| flash_err(py, e))?;
    let m = py.detach(|| ModelInfo::open(&out)).map_err(|e| flash_err(py, e))?;
    Ok(info_dict(py, &m)?.unbind())
}

/// Live counters of a prediction, readable while it runs in another thread.
#[pyclass(name = "XmlProgress", module = "scalefree._native")]
pub struct PyXmlProgress {
    inner: std::sync::Arc<PredictProgress>,
}

#[pymethods]
impl PyXmlProgress {
    #[new]
    fn new() -> Self {
        PyXmlProgress { inner: Default::default() }
    }

    /// Points scored so far.
    #[getter]
    fn points_done(&self) -> u64 {
        self.inner.points_done.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// Batches from a Python iterator of CSR blocks `(indptr int64, indices int32, values float32)`
/// (each its own rows; `indptr` relative to its arrays): a source read piece by piece in
/// Python (a `.npz` streamed from its zip), called from the feeder thread with the GIL.
struct PyBatches {
    iter: Py<PyAny>,
    n_features: u64,
    next_row: u64,
    done: bool,
    row: Vec<(u32, f32)>,
}

impl PyBatches {
    fn block(&mut self, py: Python<'_>, item: &Bound<'_, PyAny>) -> PyResult<scalefree_flash::Result<Batch>> {
        let t = item.cast::<PyTuple>()?;
        let ip = Buf::get(&t.get_item(0)?, false, "indptr")?;
        let ix = Buf::get(&t.get_item(1)?, false, "indices")?;
        let v = Buf::get(&t.get_item(2)?, false, "values")?;
        if ip.itemsize() != 8 || ix.itemsize() != 4 || v.itemsize() != 4 || ip.count() == 0 {
            return Err(invalid(py, "a CSR block must be (indptr int64, indices int32, values float32)"));
        }
        let indptr = unsafe { std::slice::from_raw_parts(ip.ptr() as *const i64, ip.count()) };
        let indices: Vec<i64> = unsafe { std::slice::from_raw_parts(ix.ptr() as *const i32, ix.count()) }.iter().map(|&f| f as i64).collect();
        let values = unsafe { std::slice::from_raw_parts(v.ptr() as *const f32, v.count()) };
        let (first, last) = (indptr[0], indptr[indptr.len() - 1]);
        if indptr.windows(2).any(|w| w[0] > w[1]) || first < 0 || (last - first) as usize != indices.len() || indices.len() != values.len() {
            return Err(invalid(py, "a CSR block's indptr must not decrease and must span its indices and values"));
        }
        let mut batch = Batch::new(self.next_row);
        let result = push_csr_rows(&mut batch, self.next_row, indptr, &indices, values, self.n_features, &mut self.row);
        self.next_row += (indptr.len() - 1) as u64;
        Ok(result.map(|()| batch))
    }
}

impl Iterator for PyBatches {
    type Item = scalefree_flash::Result<Batch>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let out = Python::attach(|py| -> Option<Self::Item> {
            let iter = self.iter.clone_ref(py);
            let message = |e: PyErr| FlashError::invalid(e.value(py).str().map(|s| s.to_string()).unwrap_or_else(|_| e.to_string()));
            match iter.bind(py).call_method0("__next__") {
                Ok(item) => Some(self.block(py, &item).unwrap_or_else(|e| Err(message(e)))),
                Err(e) if e.is_instance_of::<pyo3::exceptions::PyStopIteration>(py) => None,
                Err(e) => Some(Err(message(e))),
            }
        });
        match &out {
            None | Some(Err(_)) => self.done = true,
            Some(Ok(_)) => {}
        }
        out
    }
}

/// Scores `source` — a text file path (XC repository format or multi-label svmlight), a CSR
/// triple `(indptr int64, indices int32, values float32)`, a `FlashCsr` (read a batch of rows at
/// a time) or an iterator of CSR blocks (see `PyBatches`) — with the model at
/// `model_path`. Writes `label:score` lines to `out_path` (atomically) when given, returns the
/// top-k arrays as bytes when `collect`, and the ranking metrics when the input has labels.
#[pyfunction]
#[pyo3(signature = (runtime, model_path, source, k, beam, batch_points, batches_in_flight, max_chunk_bytes=None, out_path=None, collect=true, progress=None, in_memory=false))]
#[allow(clippy::too_many_arguments)]
pub fn xml_predict(
    py: Python<'_>,
    runtime: &PyFlashRuntime,
    model_path: PathBuf,
    source: Bound<'_, PyAny>,
    k: usize,
    beam: usize,
    batch_points: usize,
    batches_in_flight: usize,
    max_chunk_bytes: Option<u64>,
    out_path: Option<PathBuf>,
    collect: bool,
    progress: Option<PyRef<'_, PyXmlProgress>>,
    in_memory: bool,
) -> PyResult<Py<PyDict>> {
    let model = py.detach(|| ModelInfo::open(&model_path)).map_err(|e| flash_err(py, e))?;
    let options = PredictOptions { k, beam, batch_points, batches_in_flight, max_chunk_bytes, in_memory };
    let progress = progress.map(|p| p.inner.clone()).unwrap_or_default();
    let max_k = k.max(5);
    let mut metrics = RankingMetrics::new(max_k);
    let mut has_labels = false;
    let mut labels_out: Vec<u32> = Vec::new();
    let mut scores_out: Vec<f32> = Vec::new();
    let mut writer: Option<(PathBuf, std::io::BufWriter<std::fs::File>)> = None;
    if let Some(path) = &out_path {
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let temp = path.with_file_name(format!(".{name}.tmp-{}", std::process::id()));
        let file = std::fs::File::create(&temp).map_err(|e| flash_err(py, FlashError::io(&temp, e)))?;
        writer = Some((temp, std::io::BufWriter::with_capacity(1 << 20, file)));
    }
    let sink = |batch: &Batch, labels: &[u32], scores: &[f32]| -> scalefree_flash::Result<()> {
        let n = batch.len();
        let batch_has_labels = !batch.labels.is_empty();
        has_labels |= batch_has_labels;
        for i in 0..n {
            let row = &labels[i * k..(i + 1) * k];
            let mut padded = row.to_vec();
            padded.resize(max_k, u32::MAX);
            metrics.add(&padded, batch.point_labels(i));
            if let Some((temp, w)) = writer.as_mut() {
                let mut line = String::with_capacity(16 * k);
                for (j, (&l, &s)) in row.iter().zip(&scores[i * k..(i + 1) * k]).enumerate() {
                    if l == u32::MAX {
                        break;
                    }
                    if j > 0 {
                        line.push(' ');
                    }
                    line.push_str(&format!("{l}:{s:.6}"));
                }
                line.push('\n');
                w.write_all(line.as_bytes()).map_err(|e| FlashError::io(temp, e))?;
            }
        }
        if collect {
            labels_out.extend_from_slice(labels);
            scores_out.extend_from_slice(scores);
        }
        Ok(())
    };
    let rt = runtime.rt.clone();
    let stats = if let Ok(csr) = source.cast::<PyFlashCsr>() {
        let csr = csr.borrow();
        let n_features = model.n_features;
        match &csr.m {
            AnyCsr::F32(m) => {
                let batches = FlashCsrBatches::new(m, n_features, batch_points).map_err(|e| flash_err(py, e))?;
                py.detach(|| predict(&rt, &model, batches, &options, &progress, sink))
            }
            AnyCsr::F64(m) => {
                let batches = FlashCsrBatches::new(m, n_features, batch_points).map_err(|e| flash_err(py, e))?;
                py.detach(|| predict(&rt, &model, batches, &options, &progress, sink))
            }
        }
    } else if source.hasattr("__next__")? {
        let batches = PyBatches { iter: source.clone().unbind(), n_features: model.n_features, next_row: 0, done: false, row: Vec::new() };
        py.detach(|| predict(&rt, &model, batches, &options, &progress, sink))
    } else if let Ok(path) = source.extract::<PathBuf>() {
        let reader = py.detach(|| TextReader::open(&path, model.n_features, batch_points)).map_err(|e| flash_err(py, e))?;
        py.detach(|| predict(&rt, &model, reader, &options, &progress, sink))
    } else {
        let t = source.cast::<PyTuple>()?;
        let ip = Buf::get(&t.get_item(0)?, false, "indptr")?;
        let ix = Buf::get(&t.get_item(1)?, false, "indices")?;
        let v = Buf::get(&t.get_item(2)?, false, "values")?;
        if ip.itemsize() != 8 || ix.itemsize() != 4 || v.itemsize() != 4 || ix.count() != v.count() || ip.count() == 0 {
            return Err(invalid(py, "CSR source must be (indptr int64, indices int32, values float32) of matching lengths"));
        }
        let indptr = unsafe { std::slice::from_raw_parts(ip.ptr() as *const i64, ip.count()) };
        let indices = unsafe { std::slice::from_raw_parts(ix.ptr() as *const i32, ix.count()) };
        let values = unsafe { std::slice::from_raw_parts(v.ptr() as *const f32, v.count()) };
        if indptr[0] != 0 || indptr.windows(2).any(|w| w[0] > w[1]) || *indptr.last().unwrap_or(&0) as usize != indices.len() {
            return Err(invalid(py, "indptr must start at 0, not decrease and end at the number of entries"));
        }
        if indptr.len() == 1 {
            return Err(invalid(py, "no data points (the matrix has no rows)"));
        }
        let batches = CsrBatches { indptr, indices, values, n_features: model.n_features, batch_points, next_row: 0 };
        py.detach(|| predict(&rt, &model, batches, &options, &progress, sink))
    };
    let stats = match stats {
        Ok(s) => s,
        Err(e) => {
            if let Some((temp, _)) = &writer {
                let _ = std::fs::remove_file(temp);
            }
            return Err(flash_err(py, e));
        }
    };
    if let Some((temp, w)) = writer {
        let file = w.into_inner().map_err(|e| flash_err(py, FlashError::io(&temp, e.into_error())))?;
        file.sync_all().map_err(|e| flash_err(py, FlashError::io(&temp, e)))?;
        let path = out_path.as_ref().expect("writer implies a path");
        std::fs::rename(&temp, path).map_err(|e| flash_err(py, FlashError::io(path, e)))?;
    }
    let d = PyDict::new(py);
    d.set_item("points", stats.points)?;
    d.set_item("batches", stats.batches)?;
    d.set_item("seconds", stats.seconds)?;
    d.set_item("load_seconds", stats.load_seconds)?;
    d.set_item("peak_batch_bytes", stats.peak_batch_bytes)?;
    d.set_item("run", stats_dict(py, &stats.run)?)?;
    d.set_item("model", info_dict(py, &model)?)?;
    if has_labels {
        let m = PyDict::new(py);
        for kk in 1..=max_k {
            m.set_item(format!("precision@{kk}"), metrics.precision(kk))?;
            m.set_item(format!("ndcg@{kk}"), metrics.ndcg(kk))?;
        }
        d.set_item("metrics", m)?;
    }
    if collect {
        d.set_item("labels", PyBytes::new(py, bytemuck::cast_slice(&labels_out)))?;
        d.set_item("scores", PyBytes::new(py, bytemuck::cast_slice(&scores_out)))?;
    }
    Ok(d.unbind())
}
