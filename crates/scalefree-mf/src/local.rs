//! `local` mode: one process, several threads, FPSGD-style block scheduling.
//!
//! R is cut into `nb × nb` blocks (default 2t × 2t for t threads) after a random permutation
//! of users and items, so blocks hold similar numbers of ratings. A thread asks the scheduler
//! for a block whose row block and column block are both free, preferring the block updated
//! least often (ties broken at random); the blocks running at once therefore touch disjoint
//! rows of P and Q and need no locks. With nb ≥ t + 1 a free block always exists, so nobody
//! waits. One epoch is nb² block runs — every rating is seen about once.

use std::sync::Mutex;

use crate::error::{MfError, Result};
use crate::kernel::{sgd_block, Entry, Factors, Schedule, SgdParams};
use crate::model::Model;
use crate::rng::Rng;
use crate::Ratings;

#[derive(Clone, Debug)]
pub struct LocalOptions {
    pub k: usize,
    pub eta: f32,
    pub lambda: f32,
    pub schedule: Schedule,
    pub threads: usize,
    /// Blocks per side; default 2 × threads.
    pub blocks: Option<usize>,
    pub seed: u64,
    /// Factors start uniform in [0, init_max]; default 1/√k (LIBMF's scale).
    pub init_max: Option<f32>,
}

impl Default for LocalOptions {
    fn default() -> Self {
        LocalOptions { k: 40, eta: 0.1, lambda: 0.05, schedule: Schedule::Adagrad, threads: 2, blocks: None, seed: 0, init_max: None }
    }
}

struct Sched {
    row_busy: Vec<bool>,
    col_busy: Vec<bool>,
    counts: Vec<u32>,
    remaining: usize,
}

pub struct LocalTrainer {
    prm: SgdParams,
    threads: usize,
    nb: usize,
    blocks: Vec<Vec<Entry>>,
    counts: Vec<u32>,
    p: Vec<f32>,
    q: Vec<f32>,
    pg: Vec<f32>,
    qg: Vec<f32>,
    user_ids: Vec<u64>,
    item_ids: Vec<u64>,
    mean: f32,
    known_u: Vec<bool>,
    known_i: Vec<bool>,
    n: usize,
    seed: u64,
    epochs: u64,
}

impl LocalTrainer {
    pub fn new(train: &Ratings, o: &LocalOptions) -> Result<LocalTrainer> {
        if o.k == 0 || o.threads == 0 {
            return Err(MfError::InvalidArgument("k and threads must be at least 1".into()));
        }
        if !(o.eta > 0.0 && o.eta.is_finite() && o.lambda >= 0.0 && o.lambda.is_finite()) {
            return Err(MfError::InvalidArgument(format!("need eta > 0 and lambda >= 0, got {} and {}", o.eta, o.lambda)));
        }
        if train.is_empty() {
            return Err(MfError::InvalidArgument("no training ratings".into()));
        }
        let nb = o.blocks.unwrap_or(2 * o.threads).max(1);
        if nb < o.threads + 1 && o.threads > 1 {
            return Err(MfError::InvalidArgument(format!("blocks per side ({nb}) must exceed threads ({})", o.threads)));
        }
        let (m, n, k) = (train.n_users(), train.n_items(), o.k);
        let mut rng = Rng::new(o.seed);
        let mut up: Vec<u32> = (0..m as u32).collect();
        let mut ip: Vec<u32> = (0..n as u32).collect();
        rng.shuffle(&mut up);
        rng.shuffle(&mut ip);
        let mut blocks: Vec<Vec<Entry>> = vec![Vec::new(); nb * nb];
        let (mut known_u, mut known_i) = (vec![false; m], vec![false; n]);
        for ((&u, &i), &r) in train.users.iter().zip(&train.items).zip(&train.values) {
            let bu = up[u as usize] as usize * nb / m;
            let bi = ip[i as usize] as usize * nb / n;
            blocks[bu * nb + bi].push(Entry { u, i, r });
            known_u[u as usize] = true;
            known_i[i as usize] = true;
        }
        for b in &mut blocks {
            rng.shuffle(b);
        }
        let mean = train.mean() as f32;
        let init_max = o.init_max.unwrap_or(1.0 / (k as f32).sqrt());
        let mut init = |len: usize| (0..len).map(|_| rng.unit_f32() * init_max).collect::<Vec<f32>>();
        let p = init(m * k);
        let q = init(n * k);
        Ok(LocalTrainer {
            prm: SgdParams { k, eta: o.eta, lambda: o.lambda, schedule: o.schedule },
            threads: o.threads,
            nb,
            counts: vec![0; nb * nb],
            blocks,
            p,
            q,
            pg: vec![1.0; m],
            qg: vec![1.0; n],
            user_ids: train.user_ids.clone(),
            item_ids: train.item_ids.clone(),
            mean,
            known_u,
            known_i,
            n: train.len(),
            seed: o.seed,
            epochs: 0,
        })
    }

    pub fn epochs(&self) -> u64 {
        self.epochs
    }
    pub fn n_ratings(&self) -> usize {
        self.n
    }

    /// One pass (nb² block runs over `threads` threads). Returns the mean squared error seen
    /// during the pass (each rating's error just before its update).
    pub fn epoch(&mut self) -> f64 {
        let nb = self.nb;
        let sched = Mutex::new(Sched { row_busy: vec![false; nb], col_busy: vec![false; nb], counts: std::mem::take(&mut self.counts), remaining: nb * nb });
        let f = Factors { p: self.p.as_mut_ptr(), q: self.q.as_mut_ptr(), pg: self.pg.as_mut_ptr(), qg: self.qg.as_mut_ptr() };
        let (blocks, prm) = (&self.blocks, &self.prm);
        let base = self.seed.wrapping_mul(0x100_0000).wrapping_add(self.epochs * 1000);
        let work = |tid: usize| -> f64 {
            let mut rng = Rng::new(base + tid as u64);
            let mut loss = 0f64;
            let mut held: Option<usize> = None;
            loop {
                let b = {
                    let mut s = sched.lock().unwrap();
                    if let Some(h) = held.take() {
                        s.row_busy[h / nb] = false;
                        s.col_busy[h % nb] = false;
                        s.counts[h] += 1;
                    }
                    if s.remaining == 0 {
                        break;
                    }
                    let (mut best, mut best_c, mut ties) = (usize::MAX, u32::MAX, 0usize);
                    for bi in 0..nb * nb {
                        if s.row_busy[bi / nb] || s.col_busy[bi % nb] {
                            continue;
                        }
                        let c = s.counts[bi];
                        if c < best_c {
                            (best, best_c, ties) = (bi, c, 1);
                        } else if c == best_c {
                            ties += 1;
                            if rng.below(ties) == 0 {
                                best = bi;
                            }
                        }
                    }
                    // nb > threads guarantees a free block; the guard keeps a bug from hanging.
                    assert!(best != usize::MAX, "no free block (nb={nb})");
                    s.remaining -= 1;
                    s.row_busy[best / nb] = true;
                    s.col_busy[best % nb] = true;
                    best
                };
                held = Some(b);
                // SAFETY: block b's rows and columns are marked busy, so no other thread
                // touches the rows of P/Q (and their accumulators) it indexes; ids are dense.
                loss += unsafe { sgd_block(&blocks[b], f, prm) };
            }
            loss
        };
        let loss = if self.threads == 1 {
            work(0)
        } else {
            std::thread::scope(|sc| {
                let hs: Vec<_> = (1..self.threads).map(|t| sc.spawn(move || work(t))).collect();
                let mut l = work(0);
                for h in hs {
                    l += h.join().expect("MF worker thread panicked");
                }
                l
            })
        };
        self.counts = sched.into_inner().unwrap().counts;
        self.epochs += 1;
        loss / self.n as f64
    }

    /// RMSE on ratings sharing the training id maps (e.g. the test half of `Ratings::split`).
    pub fn rmse(&self, r: &Ratings) -> Result<f64> {
        if r.n_users() > self.user_ids.len() || r.n_items() > self.item_ids.len() {
            return Err(MfError::InvalidArgument("ratings do not share the training id maps".into()));
        }
        if r.is_empty() {
            return Ok(f64::NAN);
        }
        let k = self.prm.k;
        let t = self.threads.max(1);
        let chunk = r.len().div_ceil(t);
        let (p, q, ku, ki, mean) = (&self.p, &self.q, &self.known_u, &self.known_i, self.mean);
        let total: f64 = std::thread::scope(|sc| {
            let hs: Vec<_> = (0..t)
                .map(|c| {
                    sc.spawn(move || {
                        let lo = (c * chunk).min(r.len());
                        let hi = ((c + 1) * chunk).min(r.len());
                        let it = (lo..hi).map(|n| (r.users[n] as usize, r.items[n] as usize, r.values[n]));
                        crate::kernel::sq_error(it, p, q, k, ku, ki, mean)
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).sum()
        });
        Ok((total / r.len() as f64).sqrt())
    }

    pub fn model(&self) -> Model {
        Model { k: self.prm.k, p: self.p.clone(), q: self.q.clone(), user_ids: self.user_ids.clone(), item_ids: self.item_ids.clone(), mean: self.mean, known_u: self.known_u.clone(), known_i: self.known_i.clone() }
    }
}
