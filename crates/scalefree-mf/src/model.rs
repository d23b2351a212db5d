//! A trained model: P (users × k), Q (items × k), the original ids, the training mean (the
//! answer for ids never seen in training), and atomic save/load.

use std::collections::HashMap;
use std::path::Path;

use crate::data::write_atomic;
use crate::error::{MfError, Result};
use crate::kernel::sq_error;
use crate::Ratings;

#[derive(Clone, Debug, PartialEq)]
pub struct Model {
    pub k: usize,
    pub p: Vec<f32>,
    pub q: Vec<f32>,
    pub user_ids: Vec<u64>,
    pub item_ids: Vec<u64>,
    pub mean: f32,
    /// Whether each user / item had ratings in training; the others are answered with `mean`.
    pub known_u: Vec<bool>,
    pub known_i: Vec<bool>,
}

const MAGIC: &[u8; 8] = b"SFMFMOD2";

impl Model {
    pub fn n_users(&self) -> usize {
        self.user_ids.len()
    }
    pub fn n_items(&self) -> usize {
        self.item_ids.len()
    }

    /// Predictions for pairs of original ids; an unknown user or item gets the training mean.
    pub fn predict(&self, users: &[u64], items: &[u64]) -> Result<Vec<f32>> {
        if users.len() != items.len() {
            return Err(MfError::InvalidArgument(format!("{} users but {} items", users.len(), items.len())));
        }
        let um: HashMap<u64, usize> = self.user_ids.iter().enumerate().map(|(n, &u)| (u, n)).collect();
        let im: HashMap<u64, usize> = self.item_ids.iter().enumerate().map(|(n, &i)| (i, n)).collect();
        let k = self.k;
        Ok(users
            .iter()
            .zip(items)
            .map(|(u, i)| match (um.get(u), im.get(i)) {
                (Some(&u), Some(&i)) if self.known_u[u] && self.known_i[i] => self.p[u * k..u * k + k].iter().zip(&self.q[i * k..i * k + k]).map(|(a, b)| a * b).sum(),
                _ => self.mean,
            })
            .collect())
    }

    /// Whether each pair's user and item both had ratings in training (the others get `mean`).
    pub fn known(&self, users: &[u64], items: &[u64]) -> Result<Vec<bool>> {
        if users.len() != items.len() {
            return Err(MfError::InvalidArgument(format!("{} users but {} items", users.len(), items.len())));
        }
        let um: HashMap<u64, usize> = self.user_ids.iter().enumerate().map(|(n, &u)| (u, n)).collect();
        let im: HashMap<u64, usize> = self.item_ids.iter().enumerate().map(|(n, &i)| (i, n)).collect();
        Ok(users.iter().zip(items).map(|(u, i)| matches!((um.get(u), im.get(i)), (Some(&u), Some(&i)) if self.known_u[u] && self.known_i[i])).collect())
    }

    /// RMSE on ratings whose dense ids share this model's id maps (e.g. the test half of a split,
    /// or a set aligned with [`Ratings::align_to`]); ids past the maps get the mean. Ratings
    /// numbered otherwise are an error, never a wrong number.
    pub fn rmse(&self, r: &Ratings) -> Result<f64> {
        if !r.shares_ids_with(&self.user_ids, &self.item_ids) {
            return Err(MfError::InvalidArgument("ratings do not share the model's id maps (numbered separately: align them first)".into()));
        }
        if r.is_empty() {
            return Ok(f64::NAN);
        }
        let it = r.rows();
        Ok((sq_error(it, &self.p, &self.q, self.k, &self.known_u, &self.known_i, self.mean) / r.len() as f64).sqrt())
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(MAGIC);
        for v in [self.k as u64, self.n_users() as u64, self.n_items() as u64] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(&self.mean.to_le_bytes());
        self.user_ids.iter().chain(&self.item_ids).for_each(|x| out.extend_from_slice(&x.to_le_bytes()));
        self.p.iter().chain(&self.q).for_each(|x| out.extend_from_slice(&x.to_le_bytes()));
        self.known_u.iter().chain(&self.known_i).for_each(|&x| out.push(x as u8));
        out
    }

    pub fn from_bytes(b: &[u8], path: &Path) -> Result<Model> {
        let bad = |m: &str| MfError::Format { path: path.into(), msg: format!("not a scalefree MF model: {m}") };
        if b.len() < 36 || &b[..8] != MAGIC {
            return Err(bad("bad header"));
        }
        let rd = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap()) as usize;
        let (k, m, n) = (rd(8), rd(16), rd(24));
        let mean = f32::from_le_bytes(b[32..36].try_into().unwrap());
        let need = (m.checked_add(n)).and_then(|s| s.checked_mul(8)).and_then(|ids| ids.checked_add(m.checked_add(n)?.checked_mul(k)?.checked_mul(4)?)).and_then(|x| x.checked_add(36 + m + n));
        if need != Some(b.len()) {
            return Err(bad("size mismatch (truncated?)"));
        }
        let u64s = |o: usize, c: usize| -> Vec<u64> { b[o..o + 8 * c].chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap())).collect() };
        let f32s = |o: usize, c: usize| -> Vec<f32> { b[o..o + 4 * c].chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect() };
        let mut o = 36;
        let user_ids = u64s(o, m);
        o += 8 * m;
        let item_ids = u64s(o, n);
        o += 8 * n;
        let p = f32s(o, m * k);
        o += 4 * m * k;
        let q = f32s(o, n * k);
        o += 4 * n * k;
        let known_u = b[o..o + m].iter().map(|&x| x != 0).collect();
        let known_i = b[o + m..o + m + n].iter().map(|&x| x != 0).collect();
        Ok(Model { k, p, q, user_ids, item_ids, mean, known_u, known_i })
    }

    /// Write atomically (temp file + rename): a crash never leaves a half-written model.
    pub fn save(&self, path: &Path) -> Result<()> {
        write_atomic(path, &self.to_bytes())
    }

    pub fn load(path: &Path) -> Result<Model> {
        let b = std::fs::read(path).map_err(|e| MfError::io(path, e))?;
        Model::from_bytes(&b, path)
    }
}
