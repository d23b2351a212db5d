"""Blocks of the rating matrix for the multi-rank MF modes (``rima``, ``dsgd-ps``).

Every rank builds the same :class:`Partition` from the same training ratings and seed: users
and items are permuted at random, then cut into ``nb`` contiguous ranges each, so R splits
into ``nb × nb`` blocks of similar size. A factor block travels as one flat float32 array
(:class:`FactorBlock`): ``rows_max × k`` factors, then ``rows_max`` AdaGrad accumulators —
one fixed size per side, so it fits a static tensor slot whatever block it holds.
"""

from __future__ import annotations

import numpy as np

from . import _native
from .errors import InvalidArgumentError


class Partition:
    """The ``nb × nb`` blocks of ``train`` (native ratings), the same on every rank."""

    def __init__(self, train, nb: int, k: int, seed: int, init_max: float | None = None):
        if nb < 1:
            raise InvalidArgumentError(f"need at least one block per side, got {nb}")
        u, i, r = (np.frombuffer(b, dtype=d) for b, d in zip(train.dense(), ("int32", "int32", "float32")))
        self.m, self.n, self.k, self.nb = train.n_users, train.n_items, int(k), int(nb)
        if self.m < nb or self.n < nb:
            raise InvalidArgumentError(f"{self.m} users and {self.n} items cannot be cut into {nb} blocks per side")
        rng = np.random.default_rng(seed)
        # pos[u]: the row of user u in the permuted order; blocks are contiguous ranges of it.
        self.upos = rng.permutation(self.m).astype(np.int64)
        self.ipos = rng.permutation(self.n).astype(np.int64)
        self.ustart = np.array([b * self.m // nb for b in range(nb + 1)])
        self.istart = np.array([b * self.n // nb for b in range(nb + 1)])
        up, ip = self.upos[u], self.ipos[i]
        bu = np.searchsorted(self.ustart, up, side="right") - 1
        bi = np.searchsorted(self.istart, ip, side="right") - 1
        key = bu * nb + bi
        order = np.argsort(key, kind="stable")
        bounds = np.searchsorted(key[order], np.arange(nb * nb + 1))
        self.blocks = []
        for b in range(nb * nb):
            sel = order[bounds[b]:bounds[b + 1]]
            sel = sel[rng.permutation(len(sel))]
            ru, ri = divmod(b, nb)
            self.blocks.append(((up[sel] - self.ustart[ru]).astype(np.int32),
                                (ip[sel] - self.istart[ri]).astype(np.int32),
                                np.ascontiguousarray(r[sel])))
        self.n_ratings = len(r)
        self.urows_max = int(np.diff(self.ustart).max())
        self.irows_max = int(np.diff(self.istart).max())
        # The initial factors, uniform in [0, init_max] (LIBMF's 1/√k by default), in permuted order.
        init_max = 1.0 / np.sqrt(k) if init_max is None else float(init_max)
        self.p0 = (rng.random((self.m, k), dtype=np.float32) * init_max)
        self.q0 = (rng.random((self.n, k), dtype=np.float32) * init_max)

    def urows(self, b: int) -> int:
        return int(self.ustart[b + 1] - self.ustart[b])

    def irows(self, b: int) -> int:
        return int(self.istart[b + 1] - self.istart[b])

    def block(self, ru: int, ri: int):
        return self.blocks[ru * self.nb + ri]

    def p_block(self, b: int) -> "FactorBlock":
        return FactorBlock.initial(self.p0[self.ustart[b]:self.ustart[b + 1]], self.urows_max, self.k)

    def q_block(self, b: int) -> "FactorBlock":
        return FactorBlock.initial(self.q0[self.istart[b]:self.istart[b + 1]], self.irows_max, self.k)

    def dense_factors(self, p_blocks: dict, q_blocks: dict) -> tuple[np.ndarray, np.ndarray]:
        """Whole P and Q in dense id order from ``{block: flat array}`` of every block."""
        p = np.empty((self.m, self.k), np.float32)
        q = np.empty((self.n, self.k), np.float32)
        for b, a in p_blocks.items():
            p[self.ustart[b]:self.ustart[b + 1]] = FactorBlock(a, self.urows(b), self.urows_max, self.k).factors
        for b, a in q_blocks.items():
            q[self.istart[b]:self.istart[b + 1]] = FactorBlock(a, self.irows(b), self.irows_max, self.k).factors
        return p[self.upos], q[self.ipos]


class FactorBlock:
    """Views of one flat block array: ``factors`` (rows × k) and ``acc`` (rows,)."""

    def __init__(self, flat: np.ndarray, rows: int, rows_max: int, k: int):
        self.flat = flat
        self.factors = flat[:rows * k].reshape(rows, k)
        self.acc = flat[rows_max * k:rows_max * k + rows]

    @staticmethod
    def size(rows_max: int, k: int) -> int:
        return rows_max * (k + 1)

    @classmethod
    def initial(cls, factors: np.ndarray, rows_max: int, k: int) -> "FactorBlock":
        flat = np.zeros(cls.size(rows_max, k), np.float32)
        fb = cls(flat, len(factors), rows_max, k)
        fb.factors[:] = factors
        fb.acc[:] = 1.0
        return fb


def train_block(part: Partition, ru: int, ri: int, p: FactorBlock, q: FactorBlock, opts: dict,
                rng: np.random.Generator | None) -> float:
    """SGD over block (ru, ri) with the factor blocks ``p`` and ``q`` (updated in place);
    with ``rng``, in a fresh random order (intra-block random sampling). Returns Σ e²."""
    users, items, ratings = part.block(ru, ri)
    if len(ratings) == 0:
        return 0.0
    if rng is not None:
        o = rng.permutation(len(ratings))
        users, items, ratings = users[o], items[o], ratings[o]
    return _native.mf_sgd_block(users, items, ratings, p.factors, q.factors, p.acc, q.acc, part.k,
                                eta=opts["eta"], lam=opts["lam"], schedule=opts["schedule"])
