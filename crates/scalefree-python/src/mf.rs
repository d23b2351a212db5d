//! `scalefree._native.MfRatings`, `MfTrainer`, `MfModel`: thin wrappers over `scalefree-mf`.
//! Arrays cross as little-endian bytes (numpy's `tobytes` / `frombuffer`); long calls
//! release the GIL.

use std::path::PathBuf;

use pyo3::prelude::*;
use pyo3::types::PyBytes;
use scalefree_collectives::DType;
use scalefree_mf::kernel::{sgd_block, Entry, Factors, SgdParams};
use scalefree_mf::data::DenseIds;
use scalefree_mf::{data, Isa, LocalOptions, LocalTrainer, MfError, Model, Ratings, Schedule, TrainerState};

use crate::buffer::Buf;

fn mf_err(py: Python<'_>, e: MfError) -> PyErr {
    let class = match &e {
        MfError::InvalidArgument(_) => "InvalidArgumentError",
        MfError::OutOfBudget(_) => "OutOfBudgetError",
        MfError::Flash(_) => "FlashIOError",
        _ => "DataError",
    };
    let msg = e.to_string();
    py.import("scalefree.errors")
        .and_then(|m| m.getattr(class))
        .and_then(|c| c.call1((msg.clone(),)))
        .map(PyErr::from_value)
        .unwrap_or_else(|_| pyo3::exceptions::PyValueError::new_err(msg))
}

fn u64s(b: &[u8]) -> Vec<u64> {
    b.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap())).collect()
}

#[pyclass(name = "MfRatings", module = "scalefree._native")]
#[derive(Clone)]
pub struct PyMfRatings {
    pub r: Ratings,
}

#[pymethods]
impl PyMfRatings {
    /// Read a rating file (any supported format, gzip ok), through the cache in `cache_dir`.
    #[staticmethod]
    #[pyo3(signature = (path, cache_dir=None))]
    fn load(py: Python<'_>, path: PathBuf, cache_dir: Option<PathBuf>) -> PyResult<Self> {
        let r = py.detach(|| data::load(&path, cache_dir.as_deref())).map_err(|e| mf_err(py, e))?;
        Ok(PyMfRatings { r })
    }
    /// From int64 user ids, int64 item ids and float32 ratings, as bytes.
    #[staticmethod]
    fn from_bytes(py: Python<'_>, users: &[u8], items: &[u8], ratings: &[u8]) -> PyResult<Self> {
        let v: Vec<f32> = ratings.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
        let r = Ratings::from_triples(&u64s(users), &u64s(items), &v).map_err(|e| mf_err(py, e))?;
        Ok(PyMfRatings { r })
    }
    /// From dense ids (uint32 bytes, below the id maps' lengths), float32 ratings and the id
    /// maps (int64 original ids as bytes): the test set of a streamed split, sharing the
    /// training set's id maps.
    #[staticmethod]
    fn from_dense(py: Python<'_>, users: &[u8], items: &[u8], ratings: &[u8], user_ids: &[u8], item_ids: &[u8]) -> PyResult<Self> {
        let bad = |msg: String| mf_err(py, MfError::InvalidArgument(msg));
        let u32s = |b: &[u8]| -> Vec<u32> { b.chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().unwrap())).collect() };
        let (users, items) = (u32s(users), u32s(items));
        let values: Vec<f32> = ratings.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
        let (user_ids, item_ids) = (u64s(user_ids), u64s(item_ids));
        if users.len() != items.len() || users.len() != values.len() {
            return Err(bad(format!("users, items and ratings differ in length ({}, {}, {})", users.len(), items.len(), values.len())));
        }
        if users.iter().any(|&u| u as usize >= user_ids.len()) || items.iter().any(|&i| i as usize >= item_ids.len()) {
            return Err(bad(format!("dense ids must be below {} users and {} items", user_ids.len(), item_ids.len())));
        }
        let (users, items) = (DenseIds::Narrow(users), DenseIds::Narrow(items));
        Ok(PyMfRatings { r: Ratings { users, items, values, user_ids, item_ids, base: 0 } })
    }
    /// The ratings at `indices` (ascending positions, little-endian words of `itemsize` 4 or
    /// 8 bytes: what `mf_split_test_indices` returns) of the rating cache `path`, with its id
    /// maps, read a column chunk at a time (the test set of a streamed split).
    #[staticmethod]
    #[pyo3(signature = (path, indices, itemsize = 4))]
    fn load_cache_subset(py: Python<'_>, path: PathBuf, indices: &[u8], itemsize: usize) -> PyResult<Self> {
        let r = match itemsize {
            4 => {
                let idx: Vec<u32> = indices.chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().unwrap())).collect();
                py.detach(|| scalefree_mf::stream::read_cache_subset(&path, &idx))
            }
            8 => {
                let idx: Vec<u64> = indices.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap())).collect();
                py.detach(|| scalefree_mf::stream::read_cache_subset(&path, &idx))
            }
            _ => return Err(pyo3::exceptions::PyValueError::new_err(format!("load_cache_subset: itemsize must be 4 or 8, got {itemsize}"))),
        };
        Ok(PyMfRatings { r: r.map_err(|e| mf_err(py, e))? })
    }
    fn split(&self, py: Python<'_>, test_fraction: f64, seed: u64) -> PyResult<(Self, Self)> {
        let (a, b) = self.r.split(test_fraction, seed).map_err(|e| mf_err(py, e))?;
        Ok((PyMfRatings { r: a }, PyMfRatings { r: b }))
    }
    /// These ratings renumbered into `base`'s id maps (ids compared as given, so two files
    /// loaded separately line up) → (aligned ratings, (unseen users, unseen items, ratings
    /// with an unseen id)).
    fn align_to(&self, py: Python<'_>, base: &PyMfRatings) -> (Self, (usize, usize, usize)) {
        let (r, u) = py.detach(|| self.r.align_to(&base.r));
        (PyMfRatings { r }, (u.users, u.items, u.ratings))
    }
    /// Whether these ratings number users and items as `base` does.
    fn shares_ids_with(&self, base: &PyMfRatings) -> bool {
        self.r.shares_ids_with(&base.r.user_ids, &base.r.item_ids)
    }
    fn __len__(&self) -> usize {
        self.r.len()
    }
    #[getter]
    fn n_users(&self) -> usize {
        self.r.n_users()
    }
    #[getter]
    fn n_items(&self) -> usize {
        self.r.n_items()
    }
    /// (users, items as dense ids, ratings float32) as bytes — the ids the model uses, from
    /// `dense_base`: little-endian words of `dense_widths` bytes (4 while every id fits, else 8;
    /// read them as unsigned).
    fn dense<'py>(&self, py: Python<'py>) -> (Bound<'py, PyBytes>, Bound<'py, PyBytes>, Bound<'py, PyBytes>) {
        let (u, i) = (self.r.users.to_le_bytes(self.r.users.width()), self.r.items.to_le_bytes(self.r.items.width()));
        let v: Vec<u8> = self.r.values.iter().flat_map(|v| v.to_le_bytes()).collect();
        (PyBytes::new(py, &u), PyBytes::new(py, &i), PyBytes::new(py, &v))
    }
    /// Bytes per dense user id and per dense item id in `dense()`: 4 or 8.
    #[getter]
    fn dense_widths(&self) -> (usize, usize) {
        (self.r.users.width(), self.r.items.width())
    }
    /// The dense id of the first user and item (0 but under `SCALEFREE_TEST_MF_DENSE_BASE`):
    /// a dense id minus it is the row of P / Q.
    #[getter]
    fn dense_base(&self) -> u64 {
        self.r.base
    }
    /// (users as int64 original ids, items as int64 original ids, ratings float32) as bytes.
    fn triples<'py>(&self, py: Python<'py>) -> (Bound<'py, PyBytes>, Bound<'py, PyBytes>, Bound<'py, PyBytes>) {
        let r = &self.r;
        let u: Vec<u8> = (0..r.len()).flat_map(|n| r.user_ids[r.user_row(n)].to_le_bytes()).collect();
        let i: Vec<u8> = (0..r.len()).flat_map(|n| r.item_ids[r.item_row(n)].to_le_bytes()).collect();
        let v: Vec<u8> = self.r.values.iter().flat_map(|v| v.to_le_bytes()).collect();
        (PyBytes::new(py, &u), PyBytes::new(py, &i), PyBytes::new(py, &v))
    }
}

fn available_isas() -> Vec<&'static str> {
    [Isa::Avx512, Isa::Avx2, Isa::Portable].into_iter().filter(|i| i.available()).map(Isa::name).collect()
}

#[pyclass(name = "MfTrainer", module = "scalefree._native")]
pub struct PyMfTrainer {
    t: LocalTrainer,
}

#[pymethods]
impl PyMfTrainer {
    #[new]
    #[pyo3(signature = (train, k=40, eta=0.1, lam=0.05, schedule="adagrad", threads=2, blocks=None, seed=0, init_max=None, isa=None, normalize=true, memory_budget=None, flash_dir=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        train: &PyMfRatings,
        k: usize,
        eta: f32,
        lam: f32,
        schedule: &str,
        threads: usize,
        blocks: Option<usize>,
        seed: u64,
        init_max: Option<f32>,
        isa: Option<&str>,
        normalize: bool,
        memory_budget: Option<u64>,
        flash_dir: Option<PathBuf>,
    ) -> PyResult<Self> {
        let isa = match isa.map(|s| (s, Isa::parse(s))) {
            None => None,
            Some((_, Some(i))) if i.available() => Some(i),
            Some((s, _)) => return Err(mf_err(py, MfError::InvalidArgument(format!("isa {s:?} is not available on this CPU (have {})", available_isas().join(", "))))),
        };
        let schedule = match schedule {
            "adagrad" => Schedule::Adagrad,
            "constant" => Schedule::Constant,
            s => return Err(mf_err(py, MfError::InvalidArgument(format!("schedule must be 'adagrad' or 'constant', got {s:?}")))),
        };
        let o = LocalOptions { k, eta, lambda: lam, schedule, threads, blocks, seed, init_max, isa, normalize, memory_budget, flash_dir };
        let t = py.detach(|| LocalTrainer::new(&train.r, &o)).map_err(|e| mf_err(py, e))?;
        Ok(PyMfTrainer { t })
    }
    /// Run `n` epochs; returns the training MSE of the last one.
    #[pyo3(signature = (n=1))]
    fn epochs(&mut self, py: Python<'_>, n: usize) -> PyResult<f64> {
        let t = &mut self.t;
        let losses = py.detach(move || t.try_run_epochs(n)).map_err(|e| mf_err(py, e))?;
        Ok(losses.last().copied().unwrap_or(f64::NAN))
    }
    /// Out of core (`memory_budget`): the block reader's counters (as
    /// `FlashBlockReader.stats()`); None in memory.
    fn flash_stats<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, pyo3::types::PyDict>>> {
        self.t.flash_stats().map(|s| crate::flash_reader::reader_stats_dict(py, &s)).transpose()
    }
    fn rmse(&self, py: Python<'_>, r: &PyMfRatings) -> PyResult<f64> {
        py.detach(|| self.t.rmse(&r.r)).map_err(|e| mf_err(py, e))
    }
    fn model(&self) -> PyMfModel {
        PyMfModel { m: self.t.model() }
    }
    /// The state a checkpoint needs: (p, q, pg, qg as float32 bytes, block counts as uint32
    /// bytes, epochs done).
    #[allow(clippy::type_complexity)]
    fn state<'py>(&self, py: Python<'py>) -> (Bound<'py, PyBytes>, Bound<'py, PyBytes>, Bound<'py, PyBytes>, Bound<'py, PyBytes>, Bound<'py, PyBytes>, u64) {
        let s = self.t.state();
        let f = |v: &[f32]| PyBytes::new(py, &v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>());
        let c: Vec<u8> = s.counts.iter().flat_map(|x| x.to_le_bytes()).collect();
        (f(&s.p), f(&s.q), f(&s.pg), f(&s.qg), PyBytes::new(py, &c), s.epochs)
    }
    /// Restores a `state()` of a trainer built from the same ratings and options.
    #[allow(clippy::too_many_arguments)]
    fn set_state(&mut self, py: Python<'_>, p: &[u8], q: &[u8], pg: &[u8], qg: &[u8], counts: &[u8], epochs: u64) -> PyResult<()> {
        let f = |b: &[u8]| b.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect::<Vec<f32>>();
        let counts = counts.chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().unwrap())).collect();
        let s = TrainerState { p: f(p), q: f(q), pg: f(pg), qg: f(qg), counts, epochs };
        self.t.set_state(s).map_err(|e| mf_err(py, e))
    }
    /// The first row of each block row and the first column of each block column, then the
    /// ends (64-bit, from the ratings' dense base): what the entries' 32-bit offsets count from.
    fn block_starts(&self) -> (Vec<u64>, Vec<u64>) {
        let (u, i) = self.t.block_starts();
        (u.to_vec(), i.to_vec())
    }
    #[getter]
    fn n_ratings(&self) -> usize {
        self.t.n_ratings()
    }
    /// The kernel build in use: "avx512", "avx2" or "portable".
    #[getter]
    fn isa(&self) -> &'static str {
        self.t.isa().name()
    }
}

/// A file of `user item [rating]` lines (every rating-file format, gzip ok) → (int64 users,
/// int64 items, float32 ratings; NaN where the file has none) as bytes.
#[pyfunction]
pub fn mf_read_pairs<'py>(py: Python<'py>, path: PathBuf) -> PyResult<(Bound<'py, PyBytes>, Bound<'py, PyBytes>, Bound<'py, PyBytes>)> {
    let (u, i, v) = py.detach(|| data::read_pairs(&path)).map_err(|e| mf_err(py, e))?;
    let b64 = |x: &[u64]| -> Vec<u8> { x.iter().flat_map(|v| v.to_le_bytes()).collect() };
    let vb: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    Ok((PyBytes::new(py, &b64(&u)), PyBytes::new(py, &b64(&i)), PyBytes::new(py, &vb)))
}

#[pyclass(name = "MfModel", module = "scalefree._native")]
pub struct PyMfModel {
    m: Model,
}

#[pymethods]
impl PyMfModel {
    /// Predictions (float32 bytes) for int64 user/item original ids given as bytes.
    fn predict<'py>(&self, py: Python<'py>, users: &[u8], items: &[u8]) -> PyResult<Bound<'py, PyBytes>> {
        let (u, i) = (u64s(users), u64s(items));
        let out = py.detach(|| self.m.predict(&u, &i)).map_err(|e| mf_err(py, e))?;
        let b: Vec<u8> = out.iter().flat_map(|v| v.to_le_bytes()).collect();
        Ok(PyBytes::new(py, &b))
    }
    fn rmse(&self, py: Python<'_>, r: &PyMfRatings) -> PyResult<f64> {
        self.m.rmse(&r.r).map_err(|e| mf_err(py, e))
    }
    /// 1 per pair (uint8 bytes) whose user and item both had ratings in training.
    fn known<'py>(&self, py: Python<'py>, users: &[u8], items: &[u8]) -> PyResult<Bound<'py, PyBytes>> {
        let (u, i) = (u64s(users), u64s(items));
        let out = py.detach(|| self.m.known(&u, &i)).map_err(|e| mf_err(py, e))?;
        Ok(PyBytes::new(py, &out.iter().map(|&b| b as u8).collect::<Vec<u8>>()))
    }
    fn save(&self, py: Python<'_>, path: PathBuf) -> PyResult<()> {
        py.detach(|| self.m.save(&path)).map_err(|e| mf_err(py, e))
    }
    #[staticmethod]
    fn load(py: Python<'_>, path: PathBuf) -> PyResult<Self> {
        let m = py.detach(|| Model::load(&path)).map_err(|e| mf_err(py, e))?;
        Ok(PyMfModel { m })
    }
    /// A model from factors trained elsewhere (the multi-rank modes): `p` (n_users × k) and
    /// `q` (n_items × k) float32 bytes in the dense id order of `train`, whose ids, mean and
    /// seen users/items the model takes.
    #[staticmethod]
    fn from_factors(py: Python<'_>, train: &PyMfRatings, k: usize, p: &[u8], q: &[u8]) -> PyResult<Self> {
        let r = &train.r;
        let (m, n) = (r.n_users(), r.n_items());
        if k == 0 || p.len() != m * k * 4 || q.len() != n * k * 4 {
            return Err(mf_err(py, MfError::InvalidArgument(format!("factors must be {m} x {k} and {n} x {k} float32"))));
        }
        let f = |b: &[u8]| -> Vec<f32> { b.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect() };
        let (mut known_u, mut known_i) = (vec![false; m], vec![false; n]);
        r.rows().for_each(|(u, i, _)| {
            known_u[u] = true;
            known_i[i] = true;
        });
        let m = Model { k, p: f(p), q: f(q), user_ids: r.user_ids.clone(), item_ids: r.item_ids.clone(), mean: r.mean() as f32, known_u, known_i };
        Ok(PyMfModel { m })
    }
    /// A model from factors and the parts `from_factors` takes from the training ratings
    /// (id maps as int64 bytes, training mean, seen users / items as uint8 bytes): for a
    /// training set that was never in memory as a whole (a streamed split).
    #[staticmethod]
    #[allow(clippy::too_many_arguments)]
    fn from_parts(py: Python<'_>, k: usize, p: &[u8], q: &[u8], user_ids: &[u8], item_ids: &[u8], mean: f32, known_u: &[u8], known_i: &[u8]) -> PyResult<Self> {
        let (user_ids, item_ids) = (u64s(user_ids), u64s(item_ids));
        let (m, n) = (user_ids.len(), item_ids.len());
        if k == 0 || p.len() != m * k * 4 || q.len() != n * k * 4 || known_u.len() != m || known_i.len() != n {
            return Err(mf_err(py, MfError::InvalidArgument(format!("factors must be {m} x {k} and {n} x {k} float32, seen flags {m} and {n} bytes"))));
        }
        let f = |b: &[u8]| -> Vec<f32> { b.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect() };
        let m = Model { k, p: f(p), q: f(q), user_ids, item_ids, mean, known_u: known_u.iter().map(|&x| x != 0).collect(), known_i: known_i.iter().map(|&x| x != 0).collect() };
        Ok(PyMfModel { m })
    }
    /// (p, q float32 bytes, user_ids, item_ids int64 bytes, mean, known_u, known_i uint8 bytes):
    /// what `from_parts` takes (fold-in builds a grown model from them).
    #[allow(clippy::type_complexity)]
    fn parts<'py>(&self, py: Python<'py>) -> (Bound<'py, PyBytes>, Bound<'py, PyBytes>, Bound<'py, PyBytes>, Bound<'py, PyBytes>, f32, Bound<'py, PyBytes>, Bound<'py, PyBytes>) {
        let f = |x: &[f32]| -> Vec<u8> { x.iter().flat_map(|v| v.to_le_bytes()).collect() };
        let g = |x: &[u64]| -> Vec<u8> { x.iter().flat_map(|v| v.to_le_bytes()).collect() };
        let b = |x: &[bool]| -> Vec<u8> { x.iter().map(|&v| v as u8).collect() };
        let m = &self.m;
        (PyBytes::new(py, &f(&m.p)), PyBytes::new(py, &f(&m.q)), PyBytes::new(py, &g(&m.user_ids)), PyBytes::new(py, &g(&m.item_ids)), m.mean, PyBytes::new(py, &b(&m.known_u)), PyBytes::new(py, &b(&m.known_i)))
    }
    #[getter]
    fn k(&self) -> usize {
        self.m.k
    }
    #[getter]
    fn n_users(&self) -> usize {
        self.m.n_users()
    }
    #[getter]
    fn n_items(&self) -> usize {
        self.m.n_items()
    }
}

/// `schedule`, `k`, `eta` and `lam` of an SGD call, checked.
fn sgd_params(bad: &dyn Fn(String) -> PyErr, k: usize, eta: f32, lam: f32, schedule: &str) -> PyResult<SgdParams> {
    let schedule = match schedule {
        "adagrad" => Schedule::Adagrad,
        "constant" => Schedule::Constant,
        // LIBMF's split rule (two accumulators per row), all lanes or the first pass's first 8.
        "adagrad-split" => Schedule::AdagradSplit { slow_only: false },
        "adagrad-split-slow" => Schedule::AdagradSplit { slow_only: true },
        s => return Err(bad(format!("schedule must be 'adagrad', 'adagrad-split', 'adagrad-split-slow' or 'constant', got {s:?}"))),
    };
    if k == 0 || !(eta > 0.0 && eta.is_finite() && lam >= 0.0 && lam.is_finite()) {
        return Err(bad(format!("need k >= 1, eta > 0, lam >= 0; got {k}, {eta}, {lam}")));
    }
    Ok(SgdParams { k, eta, lambda: lam, schedule })
}

/// The factor arrays of an SGD call, checked (float32, whole rows of k, an accumulator per
/// row) and held for the call: (views, rows of p, rows of q).
#[allow(clippy::type_complexity)]
fn factor_bufs(
    bad: &dyn Fn(String) -> PyErr,
    k: usize,
    p: &Bound<'_, PyAny>,
    q: &Bound<'_, PyAny>,
    pg: &Bound<'_, PyAny>,
    qg: &Bound<'_, PyAny>,
    acc_per_row: usize,
) -> PyResult<([Buf; 4], usize, usize)> {
    let bufs = [Buf::get(p, true, "p")?, Buf::get(q, true, "q")?, Buf::get(pg, true, "pg")?, Buf::get(qg, true, "qg")?];
    for (b, w) in bufs.iter().zip(["p", "q", "pg", "qg"]) {
        if b.dtype != Some(DType::F32) {
            return Err(bad(format!("{w} must be float32, got buffer format {:?}", b.format)));
        }
    }
    let [pb, qb, pgb, qgb] = &bufs;
    if pb.count() % k != 0 || qb.count() % k != 0 {
        return Err(bad(format!("p and q must hold whole rows of k = {k}")));
    }
    let (prows, qrows) = (pb.count() / k, qb.count() / k);
    if pgb.count() < prows * acc_per_row || qgb.count() < qrows * acc_per_row {
        return Err(bad(format!("pg and qg need {acc_per_row} accumulator(s) per row of p and q for this schedule")));
    }
    Ok((bufs, prows, qrows))
}

fn factors_of(b: &[Buf; 4]) -> Factors {
    Factors { p: b[0].ptr() as *mut f32, q: b[1].ptr() as *mut f32, pg: b[2].ptr() as *mut f32, qg: b[3].ptr() as *mut f32 }
}

/// `scalefree._native.mf_sgd_block(users, items, ratings, p, q, pg, qg, k, eta, lam, schedule)`:
/// one SGD pass, in order, over the ratings of one block, updating the numpy arrays `p`
/// (rows × k float32), `q`, and the per-row AdaGrad accumulators `pg`, `qg` in place. `users`
/// and `items` (int32) index rows of `p` and `q` (block-local ids). Returns Σ e² seen before
/// each update. The multi-rank modes (`rima`, `dsgd-ps`) run it on the blocks they hold.
#[pyfunction]
#[pyo3(signature = (users, items, ratings, p, q, pg, qg, k, eta=0.1, lam=0.05, schedule="adagrad"))]
#[allow(clippy::too_many_arguments)]
pub fn mf_sgd_block(
    py: Python<'_>,
    users: &Bound<'_, PyAny>,
    items: &Bound<'_, PyAny>,
    ratings: &Bound<'_, PyAny>,
    p: &Bound<'_, PyAny>,
    q: &Bound<'_, PyAny>,
    pg: &Bound<'_, PyAny>,
    qg: &Bound<'_, PyAny>,
    k: usize,
    eta: f32,
    lam: f32,
    schedule: &str,
) -> PyResult<f64> {
    let bad = |msg: String| mf_err(py, MfError::InvalidArgument(msg));
    let prm = sgd_params(&bad, k, eta, lam, schedule)?;
    let want = |b: &Buf, d: DType, what: &str| -> PyResult<()> {
        if b.dtype == Some(d) {
            Ok(())
        } else {
            Err(bad(format!("{what} must be {}, got buffer format {:?}", if d == DType::F32 { "float32" } else { "int32" }, b.format)))
        }
    };
    let (ub, ib, rb) = (Buf::get(users, false, "users")?, Buf::get(items, false, "items")?, Buf::get(ratings, false, "ratings")?);
    want(&ub, DType::I32, "users")?;
    want(&ib, DType::I32, "items")?;
    want(&rb, DType::F32, "ratings")?;
    let (fb, prows, qrows) = factor_bufs(&bad, k, p, q, pg, qg, prm.schedule.acc_per_row())?;
    let n = rb.count();
    if ub.count() != n || ib.count() != n {
        return Err(bad(format!("users, items and ratings differ in length ({}, {}, {n})", ub.count(), ib.count())));
    }
    // SAFETY: the buffers are held (and so stay alive and unresized) until the end of this
    // function; the id arrays are int32, read as u32 (a negative id becomes huge and fails the
    // bounds check below).
    let (us, is, rs) = unsafe {
        (
            std::slice::from_raw_parts(ub.ptr() as *const u32, n),
            std::slice::from_raw_parts(ib.ptr() as *const u32, n),
            std::slice::from_raw_parts(rb.ptr() as *const f32, n),
        )
    };
    if let Some(&u) = us.iter().find(|&&u| u as usize >= prows) {
        return Err(bad(format!("user row {} is outside p ({prows} rows)", u as i32)));
    }
    if let Some(&i) = is.iter().find(|&&i| i as usize >= qrows) {
        return Err(bad(format!("item row {} is outside q ({qrows} rows)", i as i32)));
    }
    let block: Vec<Entry> = us.iter().zip(is).zip(rs).map(|((&u, &i), &r)| Entry { u, i, r }).collect();
    let f = factors_of(&fb);
    // SAFETY: every id was checked against the rows of p/q (and pg/qg have at least as many);
    // the arrays are exclusively ours for this call as far as Rust is concerned (the caller
    // must not hand the same memory to two concurrent calls).
    Ok(py.detach(move || unsafe { sgd_block(&block, f, &prm) }))
}

/// `scalefree._native.mf_sgd_entries(entries, p, q, pg, qg, k, eta, lam, schedule, shuffle_seed, scale, source)`:
/// [`mf_sgd_block`] over one block held as packed records — `entries` is a writable, contiguous
/// array of 4-byte elements (numpy uint32, shape (n, 3)): user row, item row, rating (float32
/// bits). With `shuffle_seed` the records are first put in a fresh random order in place
/// (Fisher–Yates ascending, SplitMix64 from that seed), so a block read from disk is trained
/// without another copy of it. With `source` (records of the same length) `entries` is first
/// filled from it in that order in the same pass (a scratch buffer for an in-memory block that
/// must keep its own order): the same records in the same order as copying `source` into
/// `entries` and shuffling in place. With `scale` ≠ 1 the ratings are divided by it first
/// (normalised training); the Σ e² is then in those units. Returns Σ e² seen before each update.
#[pyfunction]
#[pyo3(signature = (entries, p, q, pg, qg, k, eta=0.1, lam=0.05, schedule="adagrad", shuffle_seed=None, scale=1.0, source=None))]
#[allow(clippy::too_many_arguments)]
pub fn mf_sgd_entries(
    py: Python<'_>,
    entries: &Bound<'_, PyAny>,
    p: &Bound<'_, PyAny>,
    q: &Bound<'_, PyAny>,
    pg: &Bound<'_, PyAny>,
    qg: &Bound<'_, PyAny>,
    k: usize,
    eta: f32,
    lam: f32,
    schedule: &str,
    shuffle_seed: Option<u64>,
    scale: f32,
    source: Option<&Bound<'_, PyAny>>,
) -> PyResult<f64> {
    let bad = |msg: String| mf_err(py, MfError::InvalidArgument(msg));
    let prm = sgd_params(&bad, k, eta, lam, schedule)?;
    let eb = Buf::get(entries, true, "entries")?;
    let sb = source.map(|s| Buf::get(s, false, "source")).transpose()?;
    if let Some(sb) = &sb {
        if sb.itemsize() != 4 || sb.len_bytes() != eb.len_bytes() {
            return Err(bad(format!(
                "source must be uint32 records like entries ({} bytes); got format {:?}, {} bytes",
                eb.len_bytes(),
                sb.format,
                sb.len_bytes()
            )));
        }
    }
    if eb.itemsize() != 4 || eb.len_bytes() % 12 != 0 {
        return Err(bad(format!(
            "entries must be uint32 records (user, item, rating bits), 3 per rating; got format {:?}, {} bytes",
            eb.format,
            eb.len_bytes()
        )));
    }
    let (fb, prows, qrows) = factor_bufs(&bad, k, p, q, pg, qg, prm.schedule.acc_per_row())?;
    let n = eb.len_bytes() / 12;
    // SAFETY: Entry is repr(C) {u32, u32, f32} (12 bytes, 4-aligned) and the buffer is 4-aligned
    // (checked by Buf::get), writable and held until the end of this function.
    let block: &mut [Entry] = unsafe { std::slice::from_raw_parts_mut(eb.ptr() as *mut Entry, n) };
    if let Some(sb) = &sb {
        let (a, b) = (eb.ptr() as usize, sb.ptr() as usize);
        if a < b + sb.len_bytes() && b < a + eb.len_bytes() {
            return Err(bad("source and entries overlap; source must be a different array".into()));
        }
    }
    // SAFETY: as above, read only, disjoint from `entries` (checked); held until the end of
    // this function.
    let src: Option<&[Entry]> = sb.as_ref().map(|sb| unsafe { std::slice::from_raw_parts(sb.ptr() as *const Entry, n) });
    let records = src.unwrap_or(block);
    if let Some(e) = records.iter().find(|e| e.u as usize >= prows || e.i as usize >= qrows) {
        return Err(bad(format!("entry ({}, {}) is outside p ({prows} rows) or q ({qrows} rows)", e.u, e.i)));
    }
    let f = factors_of(&fb);
    py.detach(move || {
        // Normalised training (LIBMF's): the ratings divided by their standard deviation.
        let scaled = |mut e: Entry| {
            e.r /= scale;
            e
        };
        match (src, shuffle_seed) {
            (Some(src), Some(seed)) if scale != 1.0 => scalefree_mf::rng::Rng::new(seed).shuffled_copy(src, block, scaled),
            (Some(src), Some(seed)) => scalefree_mf::rng::Rng::new(seed).shuffled_copy(src, block, |e| e),
            (Some(src), None) => block.copy_from_slice(src),
            (None, Some(seed)) => scalefree_mf::rng::Rng::new(seed).shuffle_forward(block),
            (None, None) => {}
        }
        if scale != 1.0 && !(src.is_some() && shuffle_seed.is_some()) {
            for e in block.iter_mut() {
                e.r /= scale;
            }
        }
        // SAFETY: every id was checked against the rows of p/q (and pg/qg have at least as
        // many); the caller must not hand the same memory to two concurrent calls.
        Ok(unsafe { sgd_block(block, f, &prm) })
    })
}

/// Parse a rating file into the binary rating cache `out` in bounded memory (streaming);
/// returns (ratings, users, items).
#[pyfunction]
pub fn mf_write_cache(py: Python<'_>, path: PathBuf, out: PathBuf) -> PyResult<(u64, u64, u64)> {
    let i = py.detach(|| scalefree_mf::stream::write_cache(&path, &out)).map_err(|e| mf_err(py, e))?;
    Ok((i.ratings, i.users, i.items))
}

/// (ratings, users, items) of a rating cache, checked against its size.
#[pyfunction]
pub fn mf_cache_header(py: Python<'_>, path: PathBuf) -> PyResult<(u64, u64, u64)> {
    let i = scalefree_mf::stream::cache_header(&path).map_err(|e| mf_err(py, e))?;
    Ok((i.ratings, i.users, i.items))
}

/// (header bytes, bytes per dense id, dense base) of a rating cache: (32, 4, 0) for version
/// 1, (40, 8, base) for version 2 (dense ids that do not fit 4 bytes).
#[pyfunction]
pub fn mf_cache_layout(py: Python<'_>, path: PathBuf) -> PyResult<(u64, u64, u64)> {
    let i = scalefree_mf::stream::cache_header(&path).map_err(|e| mf_err(py, e))?;
    Ok((i.header_bytes, i.id_bytes, i.base))
}

/// The test-set indices (ascending) of `MfRatings.split(test_fraction, seed)` on `n`
/// ratings, in O(test set) memory: little-endian uint32 bytes while every position of `n`
/// ratings fits 32 bits (n ≤ 2^32), uint64 bytes past that.
#[pyfunction]
pub fn mf_split_test_indices<'py>(py: Python<'py>, n: usize, test_fraction: f64, seed: u64) -> PyResult<Bound<'py, PyBytes>> {
    use scalefree_mf::stream::{positions_fit_u32, split_test_indices};
    let b: Vec<u8> = if positions_fit_u32(n) {
        let v = py.detach(|| split_test_indices::<u32>(n, test_fraction, seed)).map_err(|e| mf_err(py, e))?;
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    } else {
        let v = py.detach(|| split_test_indices::<u64>(n, test_fraction, seed)).map_err(|e| mf_err(py, e))?;
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    };
    Ok(PyBytes::new(py, &b))
}

/// Where `MfRatings.load(path, cache_dir)` keeps the cache of `path` (keyed by path, size, mtime).
#[pyfunction]
pub fn mf_cache_path(py: Python<'_>, path: PathBuf, cache_dir: PathBuf) -> PyResult<PathBuf> {
    data::cache_path(&path, &cache_dir).map_err(|e| mf_err(py, e))
}

/// Whether `path` is a rating cache (its magic bytes).
#[pyfunction]
pub fn mf_is_cache(py: Python<'_>, path: PathBuf) -> PyResult<bool> {
    data::is_cache(&path).map_err(|e| mf_err(py, e))
}
