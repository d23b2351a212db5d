"""Data-parallel matrix factorization on the stale-synchronous allreduce (the SSP paper's
"history of contributions" formulation, section 4).

Every rank holds a random share of the training ratings and the same seeded initial model
``(P, Q)``. Each iteration it computes a gradient step on its own ratings from the model it
currently sees and contributes that *increment*; the SSP allreduce returns the sum of every
increment so far (its own all in, others' at most ``slack`` iterations old), and the model is
``initial + that sum``. With ``slack=0`` this is synchronous full-batch gradient descent; with
a larger slack a rank that is delayed no longer holds the others back.

    scalefree run -n 2 -- python -m scalefree_bench._worker_ssp_mf sgd u.data --slack 4
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np


def load_ratings(path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(user, item, rating) from a rating file (every format of the mf reader: MovieLens
    ``u.data``, ``ratings.dat``, ``ratings.csv``, ``user item rating`` text, ``.mtx``; ``.gz``
    ok); ids (any up to 2**64 - 1, read as integers) become dense 0-based indices. A bad line
    is a ``DataError`` (a ``ValueError``) naming the file and line."""
    from .. import _native

    path = Path(path)
    ub, ib, rb = _native.mf_read_pairs(str(path))
    users, items, r = np.frombuffer(ub, np.uint64), np.frombuffer(ib, np.uint64), np.frombuffer(rb, np.float32)
    if len(r) == 0:
        raise ValueError(f"{path}: no ratings")
    if np.isnan(r[0]):
        raise ValueError(f"{path}:1: a 'user item rating' line has no rating")
    _, u = np.unique(users, return_inverse=True)
    _, i = np.unique(items, return_inverse=True)
    return u.astype(np.int64), i.astype(np.int64), r.copy()


class Partition:
    """One rank's training ratings, as sparse matrices whose values are refilled with the
    errors each iteration (so the gradient is two sparse-dense products)."""

    def __init__(self, u, i, r, n_users, n_items, counts_u, counts_i):
        import scipy.sparse as sp

        order = np.lexsort((i, u))
        self.u, self.i, self.r = u[order], i[order], r[order]
        ones = np.ones(len(self.r), np.float32)
        self.E = sp.csr_matrix((ones, (self.u, self.i)), shape=(n_users, n_items))
        pos = sp.csr_matrix((np.arange(1, len(self.r) + 1, dtype=np.float64), (self.u, self.i)),
                            shape=(n_users, n_items)).T.tocsr()
        self.ET = pos.astype(np.float32)
        self.to_t = (pos.data - 1).astype(np.int64)
        self.cu = np.bincount(self.u, minlength=n_users).astype(np.float32)[:, None]
        self.ci = np.bincount(self.i, minlength=n_items).astype(np.float32)[:, None]
        self.norm_u = 1.0 / np.maximum(counts_u, 1).astype(np.float32)[:, None]
        self.norm_i = 1.0 / np.maximum(counts_i, 1).astype(np.float32)[:, None]

    def step(self, P, Q, mu, lam, eta):
        """This rank's share of one gradient step, ``(dP, dQ)``: summed over ranks it is the
        full-batch step on all ratings."""
        e = self.r - mu - np.einsum("ij,ij->i", P[self.u], Q[self.i])
        self.E.data = e
        self.ET.data = e[self.to_t]
        dP = (self.E @ Q - lam * self.cu * P) * (eta * self.norm_u)
        dQ = (self.ET @ P - lam * self.ci * Q) * (eta * self.norm_i)
        return dP, dQ


def rmse(P, Q, mu, u, i, r) -> float:
    if len(r) == 0:
        return float("nan")
    p = mu + np.einsum("ij,ij->i", P[u], Q[i])
    return float(np.sqrt(np.mean((r - p) ** 2)))


def train(group, path, *, k: int = 32, iters: int = 100, slack: int = 0,
          variant: str = "sharded_async_thread", straggler_ms: float = 0.0, lam: float = 0.1,
          eta: float = 0.5, seed: int = 0, test_fraction: float = 0.1, log=None, checkpoints=None) -> dict:
    """Trains on every rank of ``group``; returns rank-local history
    ``[(seconds, iteration, test_rmse), ...]`` (test RMSE of the model this rank sees) and the
    exact final model's test RMSE after the flush.

    ``checkpoints``: a :class:`~scalefree.checkpoint.Checkpoints` counting iterations. At a
    checkpoint every rank flushes the reduction (the exact sum so far, the same on every rank),
    adds it into the base model ``(P0, Q0)`` and starts a new reduction from zero; the file
    holds that base model and the history. A run resumed from it continues with the
    uninterrupted run's arithmetic (the same checkpoint steps), so with ``slack=0`` and a
    deterministic variant (``hypercube``, ``sharded``) the result is bit-identical. Returns
    ``{"stopped": True, ...}`` when it stopped at the checkpoints' ``stop_after``."""
    from .straggler import StragglerSchedule

    u, i, r = load_ratings(path)
    n_users, n_items = int(u.max()) + 1, int(i.max()) + 1
    rng = np.random.default_rng(seed)
    perm = rng.permutation(len(r))
    n_test = int(len(r) * test_fraction)
    test, train_ = perm[:n_test], perm[n_test:]
    mu = float(r[train_].mean())
    # Random rating partition over ranks (the same on every rank).
    owner = np.random.default_rng(seed + 1).integers(0, group.size, len(train_))
    mine = train_[owner == group.rank]
    part = Partition(u[mine], i[mine], r[mine], n_users, n_items,
                     np.bincount(u[train_], minlength=n_users), np.bincount(i[train_], minlength=n_items))
    init_rng = np.random.default_rng(seed + 2)
    P0 = ((init_rng.random((n_users, k), dtype=np.float32) - 0.5) * 0.2)
    Q0 = ((init_rng.random((n_items, k), dtype=np.float32) - 0.5) * 0.2)
    nP = P0.size
    red = group.ssp_reduction(P0.size + Q0.size, "float32", variant=variant)
    state = np.zeros(P0.size + Q0.size, np.float32)
    contribution = np.empty_like(state)
    delays = StragglerSchedule(straggler_ms, seed, group.size).delays_s(group.rank, iters)
    tu, ti, tr = u[test], i[test], r[test]
    history = []
    start, saved = (0, None) if checkpoints is None else checkpoints.restore()
    if saved is not None:
        if saved["P0"].shape != P0.shape or saved["Q0"].shape != Q0.shape:
            from ..errors import InvalidArgumentError

            raise InvalidArgumentError("checkpoint does not fit this data's users, items and k")
        P0, Q0 = saved["P0"], saved["Q0"]
        history = [(float(a), int(b), float(c), int(d)) for a, b, c, d in saved["history"]]

    def rebase() -> dict:
        """Collective: the exact sum so far into the base model, a new reduction from zero."""
        nonlocal red, P0, Q0
        total = red.flush()
        P0 = P0 + total[:nP].reshape(P0.shape)
        Q0 = Q0 + total[nP:].reshape(Q0.shape)
        red.close()
        red = group.ssp_reduction(P0.size + Q0.size, "float32", variant=variant)
        state[:] = 0
        return {"P0": P0, "Q0": Q0, "history": np.array(history, np.float64).reshape(-1, 4)}

    group.barrier()
    t0 = time.perf_counter()
    for it in range(start, iters):
        if delays[it]:
            time.sleep(delays[it])
        P = P0 + state[:nP].reshape(P0.shape)
        Q = Q0 + state[nP:].reshape(Q0.shape)
        dP, dQ = part.step(P, Q, mu, lam, eta)
        contribution[:nP] = dP.ravel()
        contribution[nP:] = dQ.ravel()
        red.allreduce(contribution, slack=slack, out=state)
        P = P0 + state[:nP].reshape(P0.shape)
        Q = Q0 + state[nP:].reshape(Q0.shape)
        history.append((time.perf_counter() - t0, it + 1, rmse(P, Q, mu, tu, ti, tr), red.age_diff))
        if log:
            log(history[-1])
        if checkpoints is not None and checkpoints.after(it + 1, rebase):
            red.close()
            return {"stopped": True, "history": history}
    loop_s = time.perf_counter() - t0
    final = red.flush()
    P = P0 + final[:nP].reshape(P0.shape)
    Q = Q0 + final[nP:].reshape(Q0.shape)
    out = {"history": history, "loop_s": loop_s, "final_rmse": rmse(P, Q, mu, tu, ti, tr),
           "stats": {k2: v.tolist() for k2, v in red.stats().items()}}
    red.close()
    return out
