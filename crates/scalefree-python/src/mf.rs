//! `scalefree._native.MfRatings`, `MfTrainer`, `MfModel`: thin wrappers over `scalefree-mf`.
//! Arrays cross as little-endian bytes (numpy's `tobytes` / `frombuffer`); long calls
//! release the GIL.

use std::path::PathBuf;

use pyo3::prelude::*;
use pyo3::types::PyBytes;
use scalefree_mf::{data, LocalOptions, LocalTrainer, MfError, Model, Ratings, Schedule};

fn mf_err(py: Python<'_>, e: MfError) -> PyErr {
    let class = match &e {
        MfError::InvalidArgument(_) => "InvalidArgumentError",
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
    fn split(&self, py: Python<'_>, test_fraction: f64, seed: u64) -> PyResult<(Self, Self)> {
        let (a, b) = self.r.split(test_fraction, seed).map_err(|e| mf_err(py, e))?;
        Ok((PyMfRatings { r: a }, PyMfRatings { r: b }))
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
    /// (users as int64 original ids, items as int64 original ids, ratings float32) as bytes.
    fn triples<'py>(&self, py: Python<'py>) -> (Bound<'py, PyBytes>, Bound<'py, PyBytes>, Bound<'py, PyBytes>) {
        let u: Vec<u8> = self.r.users.iter().flat_map(|&u| self.r.user_ids[u as usize].to_le_bytes()).collect();
        let i: Vec<u8> = self.r.items.iter().flat_map(|&i| self.r.item_ids[i as usize].to_le_bytes()).collect();
        let v: Vec<u8> = self.r.values.iter().flat_map(|v| v.to_le_bytes()).collect();
        (PyBytes::new(py, &u), PyBytes::new(py, &i), PyBytes::new(py, &v))
    }
}

#[pyclass(name = "MfTrainer", module = "scalefree._native")]
pub struct PyMfTrainer {
    t: LocalTrainer,
}

#[pymethods]
impl PyMfTrainer {
    #[new]
    #[pyo3(signature = (train, k=40, eta=0.1, lam=0.05, schedule="adagrad", threads=2, blocks=None, seed=0, init_max=None))]
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
    ) -> PyResult<Self> {
        let schedule = match schedule {
            "adagrad" => Schedule::Adagrad,
            "constant" => Schedule::Constant,
            s => return Err(mf_err(py, MfError::InvalidArgument(format!("schedule must be 'adagrad' or 'constant', got {s:?}")))),
        };
        let o = LocalOptions { k, eta, lambda: lam, schedule, threads, blocks, seed, init_max };
        let t = py.detach(|| LocalTrainer::new(&train.r, &o)).map_err(|e| mf_err(py, e))?;
        Ok(PyMfTrainer { t })
    }
    /// Run `n` epochs; returns the training MSE of the last one.
    #[pyo3(signature = (n=1))]
    fn epochs(&mut self, py: Python<'_>, n: usize) -> f64 {
        let t = &mut self.t;
        py.detach(move || (0..n).map(|_| t.epoch()).last().unwrap_or(f64::NAN))
    }
    fn rmse(&self, py: Python<'_>, r: &PyMfRatings) -> PyResult<f64> {
        py.detach(|| self.t.rmse(&r.r)).map_err(|e| mf_err(py, e))
    }
    fn model(&self) -> PyMfModel {
        PyMfModel { m: self.t.model() }
    }
    #[getter]
    fn n_ratings(&self) -> usize {
        self.t.n_ratings()
    }
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
    fn rmse(&self, r: &PyMfRatings) -> f64 {
        self.m.rmse(&r.r)
    }
    fn save(&self, py: Python<'_>, path: PathBuf) -> PyResult<()> {
        py.detach(|| self.m.save(&path)).map_err(|e| mf_err(py, e))
    }
    #[staticmethod]
    fn load(py: Python<'_>, path: PathBuf) -> PyResult<Self> {
        let m = py.detach(|| Model::load(&path)).map_err(|e| mf_err(py, e))?;
        Ok(PyMfModel { m })
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
