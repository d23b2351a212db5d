"""Blocks of the rating matrix for the multi-rank MF modes (``rima``, ``dsgd-ps``).

Every rank builds the same :class:`Partition` from the same training ratings and seed: users
and items are permuted at random, then cut into ``nb`` contiguous ranges each, so R splits
into ``nb × nb`` blocks of similar size. A factor block travels as one flat float32 array
(:class:`FactorBlock`): ``rows_max × k`` factors, then ``2 · rows_max`` AdaGrad accumulators
(LIBMF's split rule: two per row) — one fixed size per side, so it fits a static tensor slot
whatever block it holds.

Training is LIBMF's (and ``local`` mode's): the ratings divided by their standard deviation σ
(:attr:`Partition.scale`, over all training ratings, the same on every rank), λ/σ, split
AdaGrad with a first iteration over the first 8 lanes only; the factors are scaled by √σ when
they leave the blocks (:meth:`Partition.dense_factors`), so they predict raw ratings.

A block of R is one ``(n, 3)`` uint32 array of packed records — user row, item row, rating
(float32 bits) — which the kernel binding (``_native.mf_sgd_entries``) shuffles and trains in
place; it is also the layout of the on-flash block file of ``mf_preload``.
"""

from __future__ import annotations

import numpy as np

from ... import _native
from ...errors import InvalidArgumentError

ENTRY_BYTES = 12  # one rating: user row u32, item row u32, rating f32
_INIT_SLAB = 1 << 14  # rows of initial factors drawn at a time when only some blocks' are kept


class Partition:
    """The ``nb × nb`` blocks of ``train`` (native ratings), the same on every rank."""

    def __init__(self, train, nb: int, k: int, seed: int, init_max: float | None = None, spill=None):
        """``spill(b, entries)``, if given, receives every block ``b = ru·nb + ri`` as it is
        built instead of the partition keeping it (``blocks[b]`` is then None); the blocks and
        the initial factors are the same either way."""
        u, i, r = dense_rows(train)
        rng = self._begin(train.n_users, train.n_items, nb, k, seed)
        r64 = r.astype(np.float64)
        self.scale = rating_scale(len(r), float(r64.sum()), float(r64 @ r64))
        del r64
        up, ip = self.upos[u], self.ipos[i]
        del u, i
        bu = np.searchsorted(self.ustart, up, side="right") - 1
        bi = np.searchsorted(self.istart, ip, side="right") - 1
        key = bu * nb + bi
        order = np.argsort(key, kind="stable")
        bounds = np.searchsorted(key[order], np.arange(nb * nb + 1))
        self.blocks = []
        self.counts = np.diff(bounds).astype(np.int64)  # ratings per block
        for b in range(nb * nb):
            sel = order[bounds[b]:bounds[b + 1]]
            sel = sel[rng.permutation(len(sel))]
            ru, ri = divmod(b, nb)
            ent = np.empty((len(sel), 3), np.uint32)
            ent[:, 0] = up[sel] - self.ustart[ru]
            ent[:, 1] = ip[sel] - self.istart[ri]
            ent[:, 2] = r[sel].view(np.uint32)
            if spill is None:
                self.blocks.append(ent)
            else:
                spill(b, ent)
                self.blocks.append(None)
            del ent
        self._end(rng, len(r), init_max)

    def _begin(self, m: int, n: int, nb: int, k: int, seed: int) -> np.random.Generator:
        """The user and item permutations and block boundaries; returns the generator, whose
        next draws are the blocks' record orders (one ``permutation(count)`` per block, in
        block order) and then the initial factors (:meth:`_end`)."""
        if nb < 1:
            raise InvalidArgumentError(f"need at least one block per side, got {nb}")
        self.m, self.n, self.k, self.nb = int(m), int(n), int(k), int(nb)
        if self.m < nb or self.n < nb:
            raise InvalidArgumentError(f"{self.m} users and {self.n} items cannot be cut into {nb} blocks per side")
        rng = np.random.default_rng(seed)
        self.scale = 1.0  # σ of the training ratings: set by the constructor / the streamed build
        # pos[u]: the row of user u in the permuted order; blocks are contiguous ranges of it.
        self.upos = rng.permutation(self.m).astype(np.int64)
        self.ipos = rng.permutation(self.n).astype(np.int64)
        self.ustart = np.array([b * self.m // nb for b in range(nb + 1)])
        self.istart = np.array([b * self.n // nb for b in range(nb + 1)])
        return rng

    def _end(self, rng: np.random.Generator, n_ratings: int, init_max: float | None, keep=None) -> None:
        """``keep``: None (all initial factors), or (P blocks, Q blocks) whose initial factors are
        kept — the others are drawn (the generator moves on alike) and dropped."""
        self.n_ratings = int(n_ratings)
        self._scratch = None
        self.urows_max = int(np.diff(self.ustart).max())
        self.irows_max = int(np.diff(self.istart).max())
        # The initial factors, uniform in [0, init_max] (LIBMF's 1/√k by default), in permuted order.
        # (A Python float scale keeps them float32; a numpy float64 one would double them.)
        k = self.k
        init_max = float(1.0 / np.sqrt(k) if init_max is None else init_max)
        self._init_blocks = None
        if keep is None:
            self.p0 = rng.random((self.m, k), dtype=np.float32) * np.float32(init_max)
            self.q0 = rng.random((self.n, k), dtype=np.float32) * np.float32(init_max)
            return
        # Only the rows of the kept blocks, drawn a slab of rows at a time: the same values (the
        # generator's float32 stream does not depend on how the draws are cut), O(kept rows).
        self.p0 = self.q0 = None
        self._init_blocks = {}
        for side, start, blocks in (("p", self.ustart, keep[0]), ("q", self.istart, keep[1])):
            want = {int(b): np.empty((int(start[b + 1] - start[b]), k), np.float32) for b in blocks}
            rows = int(start[-1])
            for a in range(0, rows, _INIT_SLAB):
                slab = rng.random((min(_INIT_SLAB, rows - a), k), dtype=np.float32) * np.float32(init_max)
                for b, out in want.items():
                    lo, hi = max(a, int(start[b])), min(a + len(slab), int(start[b + 1]))
                    if lo < hi:
                        out[lo - int(start[b]):hi - int(start[b])] = slab[lo - a:hi - a]
            self._init_blocks.update({(side, b): out for b, out in want.items()})

    @classmethod
    def streamed(cls, m: int, n: int, nb: int, k: int, seed: int, init_max: float | None, build,
                 keep=None) -> "Partition":
        """The partition of ratings that are never in memory as a whole: ``build(part, rng)``
        (``mf_stream``) buckets them into blocks — with ``part.upos``, ``part.ipos``,
        ``part.ustart``, ``part.istart`` set — sets ``part.counts`` and ``part.blocks`` (None
        for blocks kept on disk), draws each block's ``rng.permutation(count)`` in block order
        as the in-memory constructor does, and returns the number of ratings. The blocks, their
        record order and the initial factors are then those of ``Partition(train, ...)``;
        ``keep`` = (P blocks, Q blocks): only those blocks' initial factors are kept
        (:meth:`p_block` / :meth:`q_block` of another block is an error). ``build`` (or the
        caller, once the sums are known everywhere) sets ``part.scale`` (:func:`rating_scale`)."""
        self = cls.__new__(cls)
        rng = self._begin(m, n, nb, k, seed)
        self._end(rng, build(self, rng), init_max, keep)
        return self

    def drop_initial(self) -> None:
        """Free the initial factors once the blocks needing them were made (p_block/q_block)."""
        self.p0 = self.q0 = self._init_blocks = None

    def _initial(self, side: str, b: int) -> np.ndarray:
        full, start = (self.p0, self.ustart) if side == "p" else (self.q0, self.istart)
        if full is not None:
            return full[start[b]:start[b + 1]]
        if self._init_blocks is None or (side, b) not in self._init_blocks:
            raise InvalidArgumentError(f"the initial factors of {side.upper()} block {b} were not kept "
                                       f"(or were dropped)")
        return self._init_blocks[(side, b)]

    def urows(self, b: int) -> int:
        return int(self.ustart[b + 1] - self.ustart[b])

    def irows(self, b: int) -> int:
        return int(self.istart[b + 1] - self.istart[b])

    def block(self, ru: int, ri: int) -> np.ndarray:
        """Block (ru, ri) as ``(n, 3)`` uint32 records (None if it was spilled)."""
        return self.blocks[ru * self.nb + ri]

    def block_bytes(self, ru: int, ri: int) -> int:
        return int(self.counts[ru * self.nb + ri]) * ENTRY_BYTES

    def resident_bytes(self) -> int:
        """Bytes of R blocks this partition holds in memory."""
        return sum(b.nbytes for b in self.blocks if b is not None)

    def scratch(self, n: int) -> np.ndarray:
        """A reused ``(n, 3)`` buffer for shuffling a copy of an in-memory block."""
        if self._scratch is None or len(self._scratch) < n:
            self._scratch = np.empty((int(self.counts.max()), 3), np.uint32)
        return self._scratch[:n]

    def p_block(self, b: int) -> "FactorBlock":
        return FactorBlock.initial(self._initial("p", b), self.urows_max, self.k)

    def q_block(self, b: int) -> "FactorBlock":
        return FactorBlock.initial(self._initial("q", b), self.irows_max, self.k)

    def dense_factors(self, p_blocks: dict, q_blocks: dict) -> tuple[np.ndarray, np.ndarray]:
        """Whole P and Q in dense id order from ``{block: flat array}`` of every block, scaled
        by √σ (trained on ratings / σ, they then predict raw ratings; ``local`` mode's model)."""
        p = np.empty((self.m, self.k), np.float32)
        q = np.empty((self.n, self.k), np.float32)
        for b, a in p_blocks.items():
            p[self.ustart[b]:self.ustart[b + 1]] = FactorBlock(a, self.urows(b), self.urows_max, self.k).factors
        for b, a in q_blocks.items():
            q[self.istart[b]:self.istart[b + 1]] = FactorBlock(a, self.irows(b), self.irows_max, self.k).factors
        p, q = p[self.upos], q[self.ipos]
        if self.scale != 1.0:
            c = np.float32(np.sqrt(np.float32(self.scale)))
            p *= c
            q *= c
        return p, q


def dense_rows(train) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(user rows, item rows, ratings) of native ratings: their dense ids (unsigned, 4 or 8
    bytes each: ``train.dense_widths``) minus the dense base (0 but under the test knob
    ``SCALEFREE_TEST_MF_DENSE_BASE``), which index P and Q."""
    (u, i, r), (wu, wi), base = train.dense(), train.dense_widths, train.dense_base
    u, i = np.frombuffer(u, f"<u{wu}"), np.frombuffer(i, f"<u{wi}")
    if base:
        u, i = u - np.uint64(base), i - np.uint64(base)
    return u, i, np.frombuffer(r, np.float32)


def rating_scale(n: int, total: float, total_sq: float) -> float:
    """σ of ``n`` ratings from their sum and sum of squares (float32, at least 1e-4): what
    ``local`` mode divides the ratings by (LIBMF's ``calc_std``); 1 for no ratings."""
    if n <= 0:
        return 1.0
    mean = total / n
    var = max(total_sq / n - mean * mean, 0.0)
    return float(max(np.float32(np.sqrt(var)), np.float32(1e-4)))


ACC_PER_ROW = 2  # split AdaGrad (LIBMF's): the first 8 lanes' accumulator and the others'


class FactorBlock:
    """Views of one flat block array: ``factors`` (rows × k) and ``acc`` (2 · rows: two
    accumulators per row, ``acc[2u]`` and ``acc[2u + 1]``)."""

    def __init__(self, flat: np.ndarray, rows: int, rows_max: int, k: int):
        self.flat = flat
        self.factors = flat[:rows * k].reshape(rows, k)
        self.acc = flat[rows_max * k:rows_max * k + ACC_PER_ROW * rows]

    @staticmethod
    def size(rows_max: int, k: int) -> int:
        return rows_max * (k + ACC_PER_ROW)

    @classmethod
    def initial(cls, factors: np.ndarray, rows_max: int, k: int) -> "FactorBlock":
        flat = np.zeros(cls.size(rows_max, k), np.float32)
        fb = cls(flat, len(factors), rows_max, k)
        fb.factors[:] = factors
        fb.acc[:] = 1.0
        return fb


def train_block(part: Partition, ru: int, ri: int, p: FactorBlock, q: FactorBlock, opts: dict,
                rng: np.random.Generator | None, entries: np.ndarray | None = None, first: bool = False) -> float:
    """SGD over block (ru, ri) with the factor blocks ``p`` and ``q`` (updated in place);
    with ``rng``, in a fresh random order (intra-block random sampling). ``entries``: the
    block's records read from flash (``mf_preload``; read-only); by default the in-memory
    block. Either is copied into a scratch buffer first (in its fresh order, scaled, by the
    kernel in one pass), so that every visit starts from the same order and ratings whichever
    way the block came.
    LIBMF's update (``local`` mode's): ratings / ``part.scale``, λ / ``part.scale``;
    ``"adagrad"`` is the split rule, over the first 8 lanes only in the ``first`` iteration.
    Returns Σ e² in the units of the scaled ratings."""
    scale = float(part.scale)
    source = None
    if entries is None:
        entries = part.block(ru, ri)
        if (rng is not None or scale != 1.0) and len(entries):
            # The kernel copies the block into the scratch buffer in its fresh order, scaled,
            # in one pass.
            source, entries = entries, part.scratch(len(entries))
    elif len(entries):
        # Read from flash (read-only, the cache's copy): copied into the scratch buffer alike.
        source, entries = entries, part.scratch(len(entries))
    if len(entries) == 0:
        return 0.0
    seed = None if rng is None else int(rng.integers(0, 2**63))
    schedule = opts["schedule"]
    if schedule == "adagrad":
        schedule = "adagrad-split-slow" if first else "adagrad-split"
    return _native.mf_sgd_entries(entries, p.factors, q.factors, p.acc, q.acc, part.k,
                                  eta=opts["eta"], lam=opts["lam"] / scale, schedule=schedule, shuffle_seed=seed,
                                  scale=scale, source=source)
