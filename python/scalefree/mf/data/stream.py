"""Streaming set-up for ``rima --memory-budget``: ratings larger than memory (the Rima paper,
section III-D).

The in-memory path loads every rating into every rank and cuts the blocks from that. Here no
rank ever holds all ratings:

1. The rating file becomes the binary rating cache (the one ``MfRatings.load`` keeps) in one
   streaming pass in Rust (``_native.mf_write_cache``: ids remapped through hash maps, ratings
   straight to disk) — by rank 0 while the others wait, skipped when the cache is there or the
   file is a cache already.
2. Every rank computes which ratings the seeded split puts into the test set
   (``_native.mf_split_test_indices``: the same set as ``MfRatings.split``, in O(test set)
   memory).
3. Every rank reads the cache's rating columns a chunk at a time, drops the test ratings,
   maps each rating to its block and row (the partition's permutations, O(users + items)),
   and appends the records of the blocks it will train to runs in an anonymous spill file
   (in ``block_dir``), each chunk sorted by block, keeping the file order within a block.
4. Block by block, it reads a block's runs back, puts them in the partition's random order
   (the same generator draws as :class:`~scalefree.mf.data.blocks.Partition`) and appends the
   block to the rank's block file; the spill file goes.

What a rank holds after set-up is the budget's arena, P and Q, the id maps and, on rank 0,
the test set; during set-up, one chunk and one block more. The blocks, their record order, the
initial factors, the test set and the model are those of the in-memory path: training is the
same, visit for visit.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np

from ... import _native
from ...errors import DataError, InvalidArgumentError
from .blocks import ENTRY_BYTES, Partition, rating_scale

_PIECE = 1 << 16  # records per write when laying a block out


def default_cache_dir() -> Path:
    """Where parsed rating files are cached (``SCALEFREE_CACHE_DIR`` or ~/.cache/scalefree/mf)."""
    env = os.environ.get("SCALEFREE_CACHE_DIR")
    if env:
        return Path(env) / "mf"
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "scalefree" / "mf"


def pread_into(fd: int, arr: np.ndarray, off: int, what: str) -> None:
    view = memoryview(arr.reshape(-1).view(np.uint8))
    got = 0
    while got < len(view):
        k = os.preadv(fd, [view[got:]], off + got)
        if k <= 0:
            raise DataError(f"{what}: short read ({got} of {len(view)} bytes at offset {off})")
        got += k


class CacheLayout:
    """Where a rating cache keeps what: a header of ``header`` bytes (32, or 40 in version 2),
    the user and item id maps (``nu`` and ``ni`` uint64), then the user and item columns of ``n``
    dense ids of ``width`` bytes (4, or 8 in version 2: ids past 2**32), counted from ``base`` (0
    but under the test knob ``SCALEFREE_TEST_MF_DENSE_BASE``), then the ``n`` ratings."""

    def __init__(self, path):
        self.path = str(path)
        self.n, self.nu, self.ni = (int(x) for x in _native.mf_cache_header(self.path))
        self.header, self.width, self.base = (int(x) for x in _native.mf_cache_layout(self.path))

    def ids(self, fd: int) -> tuple[np.ndarray, np.ndarray]:
        """The user and item id maps (``<u8``)."""
        u = np.empty(self.nu, "<u8")
        i = np.empty(self.ni, "<u8")
        pread_into(fd, u, self.header, self.path)
        pread_into(fd, i, self.header + 8 * self.nu, self.path)
        return u, i

    def buffers(self, c: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Arrays for :meth:`read` of up to ``c`` ratings, to reuse from chunk to chunk."""
        return np.empty(c, f"<u{self.width}"), np.empty(c, f"<u{self.width}"), np.empty(c, np.uint32)

    def read(self, fd: int, lo: int, c: int, out=None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Ratings ``lo`` to ``lo + c``: user rows, item rows (dense id − base: unsigned, 4 or 8
        bytes) and the ratings' float32 bits as uint32; an id outside the maps is a DataError.
        ``out``: arrays from :meth:`buffers` to read into (views of their first ``c``)."""
        col, w, n = self.header + 8 * (self.nu + self.ni), self.width, self.n
        cu, ci, cv = (a[:c] for a in (out if out is not None else self.buffers(c)))
        pread_into(fd, cu, col + w * lo, self.path)
        pread_into(fd, ci, col + w * (n + lo), self.path)
        pread_into(fd, cv, col + w * 2 * n + 4 * lo, self.path)
        if self.base and c:
            b = np.uint64(self.base)
            if cu.min() < b or ci.min() < b:
                raise DataError(f"{self.path}: corrupt rating cache: id out of range in ratings {lo}..{lo + c}")
            cu -= b
            ci -= b
        if cu.max(initial=0) >= self.nu or ci.max(initial=0) >= self.ni:
            raise DataError(f"{self.path}: corrupt rating cache: id out of range in ratings {lo}..{lo + c}")
        return cu, ci, cv


def fix_mmap_threshold(nbytes: int = 256 << 10) -> bool:
    """glibc raises its mmap threshold (up to 32 MiB) each time a large mmapped block is freed,
    so the next large arrays come from the heap, which keeps their pages after they are freed:
    a set-up that allocates and frees chunk- and block-sized arrays would hold far more than it
    uses. A fixed threshold keeps every large array mmapped, returned to the system when freed.
    Process-wide; False where there is no glibc ``mallopt``."""
    try:
        import ctypes

        return bool(ctypes.CDLL(None).mallopt(-3, int(nbytes)))  # M_MMAP_THRESHOLD
    except (OSError, AttributeError):
        return False


def chunk_ratings(budget: int | None) -> int:
    """Ratings per set-up chunk: about budget / 64 (set-up transients are ~60 bytes a rating),
    within [64 Ki, 1 Mi]."""
    if budget is None:
        return 1 << 20
    return int(min(1 << 20, max(1 << 16, budget // 64)))


class StreamedTest:
    """The test half of a :class:`StreamedRatings` split: its size on every rank; the ratings
    (``ratings``, native, sharing the training id maps) on the rank that built its blocks with
    ``collect_test`` (rank 0)."""

    def __init__(self, train: "StreamedRatings"):
        self._train = train
        self.ratings = None

    def __len__(self) -> int:
        return self._train._n_test


class StreamedRatings:
    """The training half of a seeded split of a rating file, never loaded as a whole: it is
    read a chunk at a time when a rank cuts its blocks (:meth:`partition`). ``test`` is the other
    half. Same split as ``MfRatings.load(path).split(test_fraction, seed)``."""

    def __init__(self, path, test_fraction: float = 0.1, seed: int = 0, cache_dir=None):
        if not 0 <= float(test_fraction) < 1:
            raise InvalidArgumentError(f"test fraction must be in [0, 1), got {test_fraction}")
        self.path = Path(path)
        self.test_fraction, self.seed = float(test_fraction), int(seed)
        self.cache_dir = None if cache_dir is None else Path(cache_dir)
        self.test = StreamedTest(self)
        self.cache: Path | None = None
        self.test_idx = np.zeros(0, np.uint32)
        self._n = self._n_test = self.n_users = self.n_items = 0
        self._known_u = self._known_i = self._user_ids = self._item_ids = None
        self._mean = 0.0

    def __len__(self) -> int:
        return self._n - self._n_test

    def _cache_file(self) -> Path:
        if not self.path.exists():
            raise DataError(f"{self.path}: no such file")
        if _native.mf_is_cache(str(self.path)):
            return self.path
        if self.cache_dir is None:
            self.cache_dir = default_cache_dir()
        return Path(_native.mf_cache_path(str(self.path), str(self.cache_dir)))

    def _ensure_cache(self, cache: Path) -> None:
        try:
            _native.mf_cache_header(str(cache))
        except (DataError, OSError):
            _native.mf_write_cache(str(self.path), str(cache))

    def prepare(self, group=None) -> None:
        """Make sure the cache exists (rank 0 writes it while the others wait) and compute the
        split's test indices. Idempotent."""
        if self.cache is not None:
            return
        fix_mmap_threshold()
        cache = self._cache_file()
        if cache != self.path:
            if group is None or group.rank == 0:
                self._ensure_cache(cache)
            if group is not None:
                group.barrier()
                self._ensure_cache(cache)  # a rank on another host: its own cache
        self._n, self.n_users, self.n_items = (int(x) for x in _native.mf_cache_header(str(cache)))
        self.test_idx = self._test_indices()
        self._n_test = len(self.test_idx)
        self.cache = cache

    def _test_indices(self) -> np.ndarray:
        """The split's test positions, ascending: uint32 while every position of the ratings
        fits (at most 2**32 ratings), uint64 past that (the width the native split returns)."""
        dt = np.uint32 if self._n <= 1 << 32 else np.uint64
        return np.frombuffer(_native.mf_split_test_indices(self._n, self.test_fraction, self.seed), dt)

    def partition(self, nb: int, k: int, seed: int, init_max, *, needed, spill_to, budget_check=None,
                  collect_test: bool = False, chunk: int = 1 << 20, keep=None) -> Partition:
        """The ``nb × nb`` :class:`Partition` with the blocks in ``needed`` appended to
        ``spill_to`` (a :class:`~scalefree.mf.data.preload.BlockFile`, whose directory also takes
        the transient spill file) and none in memory. ``budget_check(part)`` runs once the block
        sizes are known, before any block is laid out. With ``collect_test`` the test set is
        kept (``self.test.ratings``), as are the model's parts (:meth:`model`). ``keep`` =
        (P blocks, Q blocks): the only blocks whose initial factors are kept (default all)."""
        if self.cache is None:
            self.prepare()
        if len(self.test_idx) != self._n_test:  # dropped after an earlier partition: once more
            self.test_idx = self._test_indices()
        return Partition.streamed(self.n_users, self.n_items, nb, k, seed, init_max,
                                  lambda part, rng: self._build(part, rng, set(int(b) for b in needed), spill_to,
                                                                budget_check, collect_test, int(chunk)),
                                  keep)

    def _build(self, part: Partition, rng, needed: set, bfile, budget_check, collect_test: bool, chunk: int) -> int:
        nb, n, nu, ni = part.nb, self._n, self.n_users, self.n_items
        nblocks = nb * nb
        # Per user / item: its block and its row in the block (the partition's permutation).
        ublk = np.searchsorted(part.ustart, part.upos, side="right") - 1
        urow = (part.upos - part.ustart[ublk]).astype(np.uint32)
        ublk = ublk.astype(np.int32) * np.int32(nb)
        iblk = np.searchsorted(part.istart, part.ipos, side="right") - 1
        irow = (part.ipos - part.istart[iblk]).astype(np.uint32)
        iblk = iblk.astype(np.int32)
        counts = np.zeros(nblocks, np.int64)
        runs: list[list[tuple[int, int]]] = [[] for _ in range(nblocks)]  # block → [(offset, records)]
        wanted = np.zeros(nblocks, bool)
        wanted[sorted(needed)] = True
        known_u, known_i = np.zeros(nu, bool), np.zeros(ni, bool)
        total = np.zeros(1, np.float64)  # Σ training ratings, summed in order (as MfRatings.mean does)
        total_sq = 0.0  # Σ r², for σ (the same on every rank: every rank reads every chunk)
        test = self.test_idx
        layout = CacheLayout(self.cache)
        spill = tempfile.TemporaryFile(prefix="scalefree-mf-spill-", dir=bfile.directory)
        try:
            sfd, ssize = spill.fileno(), 0
            fd = os.open(self.cache, os.O_RDONLY)
            try:
                bufs = layout.buffers(min(chunk, n))
                for s in range(0, n, chunk):
                    c = min(chunk, n - s)
                    cu, ci, cv = layout.read(fd, s, c, bufs)
                    lo, hi = np.searchsorted(test, [s, s + c])
                    if hi > lo:
                        keep = np.ones(c, bool)
                        keep[test[lo:hi] - s] = False
                        cu, ci, cv = cu[keep], ci[keep], cv[keep]
                    known_u[cu] = True
                    known_i[ci] = True
                    r64 = cv.view(np.float32).astype(np.float64)
                    total = np.cumsum(np.concatenate([total[-1:], r64]))[-1:]
                    total_sq += float(r64 @ r64)
                    del r64
                    key = ublk[cu] + iblk[ci]
                    counts += np.bincount(key, minlength=nblocks)
                    sel = np.flatnonzero(wanted[key])  # the records of blocks this rank trains
                    if not len(sel):
                        continue
                    order = sel[np.argsort(key[sel], kind="stable")]
                    rec = np.empty((len(order), 3), np.uint32)
                    rec[:, 0] = urow[cu[order]]
                    rec[:, 1] = irow[ci[order]]
                    rec[:, 2] = cv[order]
                    ks = key[order]
                    bounds = np.searchsorted(ks, np.arange(nblocks + 1))
                    data = memoryview(rec.reshape(-1).view(np.uint8))
                    done = 0
                    while done < len(data):
                        done += os.pwrite(sfd, data[done:], ssize + done)
                    for b in np.flatnonzero(np.diff(bounds)):
                        runs[b].append((ssize + int(bounds[b]) * ENTRY_BYTES, int(bounds[b + 1] - bounds[b])))
                    ssize += len(data)
                    del rec, order, key, sel, data
                cu = ci = cv = bufs = None
                if collect_test:
                    self._user_ids, self._item_ids = layout.ids(fd)
            finally:
                os.close(fd)
            part.counts = counts
            part.blocks = [None] * nblocks
            if budget_check is not None:
                budget_check(part)
            for b in range(nblocks):
                perm = rng.permutation(int(counts[b]))  # the in-memory partition's draw for block b
                if not wanted[b]:
                    continue
                ent = np.empty((int(counts[b]), 3), np.uint32)
                at = 0
                for off, m in runs[b]:
                    pread_into(sfd, ent[at:at + m], off, "spill file")
                    at += m
                # In the partition's order, a piece at a time: no second copy of the block.
                bfile.append(b, (ent[perm[j:j + _PIECE]] for j in range(0, len(perm), _PIECE)))
                del ent, perm
        except OSError as e:
            raise OSError(e.errno, f"streaming the ratings of {self.path} into blocks (in {bfile.directory}): "
                                   f"{e.strerror or e}") from e
        finally:
            spill.close()
        n_train = n - len(test)
        part.scale = rating_scale(n_train, float(total[-1]), total_sq)
        self._n_test, self.test_idx = len(test), np.zeros(0, np.uint32)  # the indices have served
        if collect_test:
            # The test set straight from the cache, a column chunk at a time, in Rust.
            self.test.ratings = _native.MfRatings.load_cache_subset(str(self.cache), test.tobytes(), test.itemsize)
            self._known_u, self._known_i = known_u, known_i
            self._mean = float(total[-1]) / n_train if n_train else 0.0
        return n_train

    def model(self, k: int, p: np.ndarray, q: np.ndarray):
        """The native model of factors ``p``, ``q`` (dense id order) with this training set's id
        maps, mean and seen users / items (on the rank that partitioned with ``collect_test``)."""
        if self._known_u is None:
            raise InvalidArgumentError("the model's parts are kept by the rank that partitioned with collect_test")
        return _native.MfModel.from_parts(k, np.ascontiguousarray(p, np.float32).tobytes(),
                                          np.ascontiguousarray(q, np.float32).tobytes(),
                                          self._user_ids.tobytes(), self._item_ids.tobytes(),
                                          float(np.float32(self._mean)),
                                          self._known_u.astype(np.uint8).tobytes(),
                                          self._known_i.astype(np.uint8).tobytes())


def split(path, test_fraction: float = 0.1, seed: int = 0, cache_dir=None) -> tuple[StreamedRatings, StreamedTest]:
    """The streamed counterpart of ``mf.split_ratings(path, test_fraction, seed)``."""
    train = StreamedRatings(path, test_fraction, seed, cache_dir)
    return train, train.test
