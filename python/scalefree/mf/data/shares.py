"""Partitioned input for the multi-rank MF modes (``rima``, ``dsgd-ps``): every rank reads only
its share of the rating file, and no rank ever holds all ratings, with or without a memory
budget.

1. **Read.** Rank r of P parses the lines whose first byte lies in its 1/P of the file's bytes
   (``_native.read_ratings_share``, the syntax of the mf reader; a part directory is one body
   cut the same way). A ``.gz`` of several members is cut by members; a single gzip stream
   cannot be split: rank 0 decompresses it once and hands its chunks to the other ranks,
   which parse them (:mod:`scalefree._text_stream`; rank 0 then reads no ratings). A binary rating cache
   (``.sfr``, ``mf_write_cache``) gives rank r the r-th 1/P of its rating columns. With a
   memory budget the share is read in pieces (the share's byte range cut again, each piece a
   round of steps 2–4), so a rank holds one piece at a time.
2. **Split.** A rating is a test rating iff ``splitmix64(splitmix64(user + splitmix64(seed)) ^
   item) >> 11 < test_fraction · 2⁵³`` (:func:`in_test_set`): decided per rating from its raw ids
   and the seed, so the split is the same whatever the number of ranks, and a user–item pair
   rated twice is on one side only. About ``test_fraction`` of the ratings; not the split of
   ``split_ratings`` (a seeded permutation of the whole file).
3. **Ids.** Each rank sends its distinct user (item) ids to rank ``hash(id) mod P``
   (``alltoallv``); each owner deduplicates its ids and all owners' lists go to every rank: the
   sorted distinct ids of the whole file, the same on every rank. A compact id is the position in
   that list. O(ids) per rank.
4. **Route.** The block partition (:class:`~scalefree.mf.data.blocks.Partition`: the seeded
   permutations of users and items, cut into ``nb`` ranges per side) follows from (users, items,
   nb, seed) alone, so every rank computes it. Each training rating becomes a record (block, user
   row, item row, rating) and goes, by ``alltoallv``, to every rank that trains its block:
   in ``dsgd-ps`` worker a trains block row a − 1 (the rows of R stay with their worker, as in
   DSGD; only factor blocks move); in ``rima`` a rank trains the blocks its virtual workers meet
   in the pattern sequence — a block row and a block column each — which is (2V − 1)/V² of R per
   virtual worker, about 2/w of R per rank (3/4 at 2 ranks, 7/16 at 4, 15/64 at 8).
5. **Blocks.** A rank sorts what it received by (block, user row, item row, rating) — an order
   that does not depend on which rank read what, or in how many pieces — and puts each block in
   the order of a permutation seeded by (seed, block). The blocks stay in
   memory, or, with a budget, go to the rank's block file (``mf_preload``) a block at a time,
   from a spill file of the pieces received.

The test share stays on the rank that read it (compact ids). Evaluation broadcasts P and Q
from rank 0 (O(ids · k)); each rank sums the squared errors of its test share and the RMSE is
``sqrt(Σ sse / Σ n)`` after one allreduce.

A rank that finds a bad line raises ``DataError`` (``PATH:LINE: problem``); the others learn
of it in the next collective step and raise :class:`ShareFailedElsewhere` (a ``DataError``
naming the rank), so every rank stops and none waits.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import numpy as np

from ... import _native
from ..._rss import peak_rss_bytes
from ...errors import DataError, InvalidArgumentError
from ..._agree import ShareFailedElsewhere, agree  # noqa: F401  (ShareFailedElsewhere: what the CLI catches)
from .blocks import ENTRY_BYTES, Partition, rating_scale
from .stream import CacheLayout, pread_into

_EVAL_ROWS = 1 << 16  # test ratings scored at a time
_PIECE = 1 << 16  # records per write when laying a block out

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser, elementwise on uint64 (wrapping)."""
    x = x + _GOLDEN
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def in_test_set(users: np.ndarray, items: np.ndarray, test_fraction: float, seed: int) -> np.ndarray:
    """True for the ratings the split puts into the test set (see the module doc, step 2)."""
    s = _mix64(np.array([int(seed) & (2**64 - 1)], np.uint64))
    with np.errstate(over="ignore"):
        h = _mix64(_mix64(np.asarray(users).astype(np.uint64) + s) ^ np.asarray(items).astype(np.uint64))
    return (h >> np.uint64(11)) < np.uint64(int(float(test_fraction) * 2**53))


def _distinct(a: np.ndarray) -> np.ndarray:
    """Sorted distinct values (sort and compare: faster here than ``np.unique``'s hashing)."""
    a = np.sort(a)
    return a[np.concatenate(([True], a[1:] != a[:-1]))] if len(a) else a


def canonical_order(block: np.ndarray, urow: np.ndarray, irow: np.ndarray, rbits: np.ndarray,
                    widths: tuple[int, int, int]) -> np.ndarray:
    """The permutation sorting records by (block, user row, item row, rating bits): one argsort
    of a packed 64-bit key when ``widths`` (bits of each) fit, then the rare records with equal
    (block, user row, item row) — a pair rated twice — sorted by rating; else a lexsort."""
    if sum(widths) > 64:
        return np.lexsort((rbits, irow, urow, block))
    key = (block.astype(np.uint64) << np.uint64(widths[1] + widths[2])) | \
        (urow.astype(np.uint64) << np.uint64(widths[2])) | irow.astype(np.uint64)
    order = np.argsort(key, kind="stable")
    ks = key[order]
    same = ks[1:] == ks[:-1]
    if same.any():
        tie = np.zeros(len(ks), bool)
        tie[1:] |= same
        tie[:-1] |= same
        at = np.flatnonzero(tie)
        sub = order[at]
        order[at] = sub[np.lexsort((rbits[sub], key[sub]))]
    return order


def _owner(ids: np.ndarray, size: int) -> np.ndarray:
    with np.errstate(over="ignore"):
        return (_mix64(ids.astype(np.uint64) ^ np.uint64(0x4F574E)) % np.uint64(size)).astype(np.int64)


def compact_id_dtype(count: int):
    """The dtype of compact ids (positions among ``count`` distinct ids) held per test
    rating: uint32 (half the memory) up to 2**32 distinct ids, int64 past that."""
    return np.uint32 if count <= 1 << 32 else np.int64


def global_ids(group, distinct: np.ndarray) -> np.ndarray:
    """Collective: the sorted union of every rank's ``distinct`` (sorted, int64) ids, on every
    rank, by way of owner ranks (O(ids) per rank, never O(ratings))."""
    if group.size == 1:
        return distinct
    P = group.size
    owner = _owner(distinct, P)
    order = np.argsort(owner, kind="stable")
    mine = np.unique(group.alltoallv(distinct[order], np.bincount(owner, minlength=P)))
    return np.sort(group.alltoallv(np.tile(mine, P), np.full(P, len(mine), np.int64)))


class _Source:
    """Where a rank's pieces of the input come from: a rating file read by byte range, or a rating
    cache read by rating range. ``pieces`` per rank; :meth:`read` returns raw (users, items,
    ratings) of piece j."""

    def __init__(self, path: Path, rank: int, size: int, piece_bytes: int | None, delimiter: str | None = None,
                 header: str = "auto", columns=None, group=None):
        from ... import _columnar, _text_stream

        self.path, self.rank, self.size = path, rank, size
        self.group = group
        self.delimiter, self.header, self.columns = delimiter, header, columns
        if not path.exists():
            raise DataError(f"{path}: no such file")
        self.parts = _native.resolve_parts(str(path))
        # Parquet / Arrow IPC: by row groups; piece j of rank r is share r·S + j of P·S (the
        # row-group owners nest exactly, as the byte ranges of text do).
        self.columnar = _columnar.columnar_parts(path)
        self.cache = self.columnar is None and not path.is_dir() and bool(_native.mf_is_cache(str(path)))
        self.gz = any(p.lower().endswith(".gz") for p in self.parts)
        if self.columnar is not None:
            total = sum(os.path.getsize(p) for p in self.columnar)
            self.pieces = 1 if piece_bytes is None else max(1, -(-total // size // piece_bytes))
            self.pieces_all = self.pieces
        elif self.cache:
            self.layout = CacheLayout(path)
            self.n, self.nu, self.ni = self.layout.n, self.layout.nu, self.layout.ni
            lo, hi = self.n * rank // size, self.n * (rank + 1) // size
            self.lo = lo
            per = max(1, (piece_bytes or 1 << 62) // 12)
            self.bounds = list(range(lo, hi, per)) + [hi] if hi > lo else [lo, hi]
            self.pieces = len(self.bounds) - 1
            # The same on every rank: the rounds are collective.
            self.pieces_all = max(1, -(-(self.n // size + 1) // per))
        else:
            total = sum(os.path.getsize(p) for p in self.parts)
            self.pieces = 1 if (piece_bytes is None or self.gz) else max(1, -(-total // size // piece_bytes))
            self.pieces_all = self.pieces
        # One gzip stream read by a group: rank 0 decompresses it once and hands its chunks
        # to the others (read(0) is then collective; rank 0 holds no ratings).
        self.stream = None
        if group is not None and size > 1 and self.columnar is None and not self.cache and len(self.parts) == 1:
            self.stream = _text_stream.single_gzip_stream(self.parts[0], "ratings", delimiter, header, size)
        self._ids = None

    def read(self, j: int):
        if j >= self.pieces:
            return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.float32)
        if self.stream is not None:
            from ... import _text_stream

            got = _text_stream.stream_share(self.group, self.stream)
            return got[0] if got else (np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.float32))
        if self.columnar is not None:
            from ... import _columnar

            S = self.pieces
            return _columnar.read_share(self.columnar, self.rank * S + j, self.size * S, "ratings", self.columns)
        if not self.cache:
            S = self.pieces
            # Piece j of the rank's share: share rank·S + j of size·S (the byte ranges nest exactly).
            return _native.read_ratings_share(self.parts, self.rank * S + j, self.size * S, delimiter=self.delimiter,
                                              header=self.header)
        lo, hi = self.bounds[j], self.bounds[j + 1]
        fd = os.open(self.path, os.O_RDONLY)
        try:
            cu, ci, cv = self.layout.read(fd, lo, hi - lo)
            if self._ids is None:
                u, i = self.layout.ids(fd)
                self._ids = u.astype(np.int64), i.astype(np.int64)
        finally:
            os.close(fd)
        return self._ids[0][cu], self._ids[1][ci], cv.view(np.float32)


class ShareTest:
    """The test half of a :class:`ShareRatings` split: on each rank its own test share."""

    def __init__(self, train: "ShareRatings"):
        self._train = train

    def __len__(self) -> int:
        return self._train.n_test


class ShareRatings:
    """The training half of a hash split (module doc, step 2) of a rating file that every rank
    of the job reads a share of. ``test`` is the other half. Used by ``rima`` and ``dsgd-ps``:
    :meth:`partition` reads, splits, numbers the ids and routes the ratings to the ranks that
    train them."""

    def __init__(self, path, test_fraction: float = 0.1, seed: int = 0, delimiter: str | None = None,
                 header: str = "auto", columns=None):
        if not 0 <= float(test_fraction) < 1:
            raise InvalidArgumentError(f"test fraction must be in [0, 1), got {test_fraction}")
        self.path = Path(path)
        self.delimiter, self.header = delimiter, header
        self.columns = columns  # user, item, rating columns of a Parquet / Arrow IPC input
        self.test_fraction, self.seed = float(test_fraction), int(seed)
        self.test = ShareTest(self)
        self.n_train = self.n_test = self.n_users = self.n_items = 0
        self.user_ids = self.item_ids = None
        self.known_u = self.known_i = None
        self.mean = 0.0
        self.stats = None  # rank 0: per rank, what it read, kept and received (:meth:`partition`)
        self._test = (np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.float32))
        # A validation share of the training ratings (early stopping, set by ``fit``): a second
        # seeded hash of (user, item), seed + 1; kept like the test share, by the rank that read it.
        self.valid_fraction = 0.0
        self._valid = self._test
        # An explicit test file instead of the hash split (``--test FILE``): each rank reads its
        # share of it once the training ids are known (:meth:`_read_test_file`).
        self.test_path = None
        self.test_unseen = None  # {"users", "items", "ratings"} of the test file unseen in training

    def __len__(self) -> int:
        return self.n_train

    # ------------------------------------------------------------------ set-up

    def partition(self, group, nb: int, k: int, seed: int, init_max, *, trains, keep=None, spill_to=None,
                  budget_check=None, piece_bytes: int | None = None) -> Partition:
        """Collective. The ``nb × nb`` :class:`Partition` of the training ratings, holding the
        blocks this rank trains: ``trains`` is a (size, nb²) bool array, ``trains[d, b]`` when
        rank d trains block b. The blocks go to ``spill_to`` (a ``BlockFile``) instead of
        memory if given; ``budget_check(part)`` runs once the global block sizes are known.
        ``piece_bytes``: read the share in pieces of about this many bytes (default: whole).
        ``keep``: as for :meth:`Partition.streamed`."""
        t0 = time.perf_counter()
        P, rank = group.size, group.rank
        trains = np.asarray(trains, bool).reshape(P, nb * nb)
        src = err = None
        try:
            src = _Source(self.path, rank, P, piece_bytes, self.delimiter, self.header, self.columns, group)
        except (DataError, OSError) as e:
            err = e
        agree(group, err)
        pieces = src.pieces_all
        S = src.pieces
        # Pass 1: the distinct ids of the share (one piece at a time), then the global id lists.
        du, di = np.zeros(0, np.int64), np.zeros(0, np.int64)
        read = 0
        cached = None
        for j in range(S):
            err = None
            try:
                u, i, r = src.read(j)
            except (DataError, OSError) as e:
                err, u = e, None
            if pieces == 1:
                agree(group, err)
            elif err is not None:
                break
            read += len(u)
            du, di = _distinct(np.concatenate((du, u))), _distinct(np.concatenate((di, i)))
            if pieces == 1:
                cached = (u, i, r)  # one piece: kept for pass 2 instead of read twice
            del u, i, r
        if pieces != 1:
            agree(group, err)
        uids, iids = global_ids(group, du), global_ids(group, di)
        del du, di
        self.user_ids, self.item_ids = uids, iids
        m, n = len(uids), len(iids)
        self.n_users, self.n_items = m, n
        cid = compact_id_dtype(max(m, n))
        t_ids = time.perf_counter() - t0
        state = dict(sent=0, received=0, test=0, train=0, sum=0.0, sumsq=0.0, rounds=0)
        seen_u, seen_i = np.zeros(m, np.int64), np.zeros(n, np.int64)
        tests = []
        valids = []

        def build(part: Partition, rng) -> int:
            if part.nb != nb:
                raise AssertionError("partition size")
            nblocks = nb * nb
            tall = max(int(np.diff(part.ustart).max(initial=0)), int(np.diff(part.istart).max(initial=0)))
            if tall > 1 << 32:
                # Rows within a block are the 32-bit rows of the SGD kernels' 12-byte entries.
                raise InvalidArgumentError(f"a block of R spans {tall} users or items, more than 2**32 (rows within a "
                                           f"block are 32-bit): use more blocks than {nb} per side")
            ublk = np.searchsorted(part.ustart, part.upos, side="right") - 1
            urow = (part.upos - part.ustart[ublk]).astype(np.uint32)
            iblk = np.searchsorted(part.istart, part.ipos, side="right") - 1
            irow = (part.ipos - part.istart[iblk]).astype(np.uint32)
            ublk = ublk.astype(np.int64) * nb
            counts = np.zeros(nblocks, np.int64)
            widths = tuple(max(1, int(x).bit_length()) for x in (nblocks - 1, np.diff(part.ustart).max(), np.diff(part.istart).max()))
            received = []  # in memory: the pieces received; with a block file: (block, offset, n) runs
            runs: list[list[tuple[int, int]]] = [[] for _ in range(nblocks)]
            spill = None if spill_to is None else tempfile.TemporaryFile(prefix="scalefree-mf-spill-",
                                                                         dir=spill_to.directory)
            ssize = 0
            try:
                for j in range(pieces):
                    if cached is not None and j == 0:
                        u, i, r = cached
                    else:
                        u, i, r = src.read(j)  # read once already: no error this time
                    tm = in_test_set(u, i, self.test_fraction, self.seed)
                    cu, ci = np.searchsorted(uids, u), np.searchsorted(iids, i)
                    cu_raw_u, cu_raw_i = u, i
                    del u, i
                    tests.append((cu[tm].astype(cid), ci[tm].astype(cid), r[tm]))
                    state["test"] += int(tm.sum())
                    keep_ = ~tm
                    if self.valid_fraction:
                        vm = keep_ & in_test_set(cu_raw_u, cu_raw_i, self.valid_fraction, self.seed + 1)
                        valids.append((cu[vm].astype(cid), ci[vm].astype(cid), r[vm]))
                        keep_ &= ~vm
                        del vm
                    cu, ci, r = cu[keep_], ci[keep_], r[keep_]
                    del tm, keep_, cu_raw_u, cu_raw_i
                    state["train"] += len(r)
                    r64 = r.astype(np.float64)
                    state["sum"] += float(r64.sum())
                    state["sumsq"] += float(r64 @ r64)  # for σ (the scale of normalised training)
                    del r64
                    seen_u[:] += np.bincount(cu, minlength=m)
                    seen_i[:] += np.bincount(ci, minlength=n)
                    key = ublk[cu] + iblk[ci]
                    counts += np.bincount(key, minlength=nblocks)
                    rec = np.empty((len(key), 4), np.uint32)
                    rec[:, 0] = key
                    rec[:, 1] = urow[cu]
                    rec[:, 2] = irow[ci]
                    rec[:, 3] = r.view(np.uint32)
                    del cu, ci, r
                    # To every rank that trains the record's block (rima: often two ranks).
                    sel = [np.flatnonzero(trains[d][key]) for d in range(P)]
                    del key
                    send = rec[np.concatenate(sel)] if P > 1 else rec
                    cnt = np.array([len(s) for s in sel], np.int64)
                    del rec, sel
                    state["sent"] += int(cnt.sum())
                    got = group.alltoallv(send, cnt)
                    del send
                    state["received"] += len(got)
                    state["rounds"] += 1
                    if spill is None:
                        received.append(got)
                        continue
                    order = np.argsort(got[:, 0], kind="stable")
                    got = got[order]
                    bounds = np.searchsorted(got[:, 0], np.arange(nblocks + 1))
                    body = np.ascontiguousarray(got[:, 1:])
                    data = memoryview(body.reshape(-1).view(np.uint8))
                    done = 0
                    while done < len(data):
                        done += os.pwrite(spill.fileno(), data[done:], ssize + done)
                    for b in np.flatnonzero(np.diff(bounds)):
                        runs[b].append((ssize + int(bounds[b]) * ENTRY_BYTES, int(bounds[b + 1] - bounds[b])))
                    ssize += len(data)
                    del got, order, body, data
                group.allreduce(counts)
                part.counts = counts
                part.blocks = [None] * nblocks
                if budget_check is not None:
                    budget_check(part)
                mine = np.flatnonzero(trains[rank])
                if spill is None:
                    got = np.concatenate(received) if len(received) != 1 else received[0]
                    received.clear()
                    # Canonical order (block, user row, item row, rating), whatever came from where.
                    order = canonical_order(got[:, 0], got[:, 1], got[:, 2], got[:, 3], widths)
                    bounds = np.searchsorted(got[order, 0], np.arange(nblocks + 1))
                    for b in mine:
                        sel = order[bounds[b]:bounds[b + 1]]
                        sel = sel[np.random.default_rng([seed, 0x424C4B, int(b)]).permutation(len(sel))]
                        part.blocks[b] = np.ascontiguousarray(got[sel, 1:])
                    del got, order
                else:
                    for b in mine:
                        have = sum(c for _, c in runs[b])
                        ent = np.empty((have, 3), np.uint32)
                        at = 0
                        for off, c in runs[b]:
                            pread_into(spill.fileno(), ent[at:at + c], off, "spill file")
                            at += c
                        b0 = np.full(len(ent), b, np.uint32)
                        ent = ent[canonical_order(b0, ent[:, 0], ent[:, 1], ent[:, 2], widths)]  # canonical
                        del b0
                        perm = np.random.default_rng([seed, 0x424C4B, int(b)]).permutation(have)
                        spill_to.append(int(b), (ent[perm[j:j + _PIECE]] for j in range(0, have, _PIECE)))
                        del ent, perm
                        runs[b] = []
            finally:
                if spill is not None:
                    spill.close()
            return int(counts.sum())

        part = Partition.streamed(m, n, nb, k, seed, init_max, build, keep)
        del cached
        # Test share, seen users/items, the training mean: the same on every rank.
        if tests:
            self._test = tuple(np.concatenate([t[c] for t in tests]) for c in range(3))
        tests.clear()
        if valids:
            self._valid = tuple(np.concatenate([t[c] for t in valids]) for c in range(3))
        valids.clear()
        group.allreduce(seen_u)
        group.allreduce(seen_i)
        self.known_u, self.known_i = seen_u > 0, seen_i > 0
        tot = np.array([state["sum"], state["train"], state["test"], state["sumsq"]], np.float64)
        group.allreduce(tot)
        self.n_train, self.n_test = int(tot[1]), int(tot[2])
        self.mean = tot[0] / tot[1] if tot[1] else 0.0
        part.scale = rating_scale(self.n_train, float(tot[0]), float(tot[3]))  # σ over all shares
        held = part.resident_bytes() // ENTRY_BYTES if spill_to is None else \
            sum(c for _, c in spill_to.index.values())
        mine = np.array([read, state["train"], state["test"], state["sent"], state["received"], held,
                         peak_rss_bytes(), time.perf_counter() - t0, t_ids, state["rounds"]], np.float64)
        st = group.allgather(mine)
        self.stats = {name: st[:, c].tolist() for c, name in enumerate(
            ("ratings_read", "train_ratings_read", "test_ratings_kept", "records_sent", "records_received",
             "ratings_held", "load_peak_rss_bytes", "load_seconds", "load_ids_seconds", "load_rounds"))}
        for name in ("ratings_read", "train_ratings_read", "test_ratings_kept", "records_sent", "records_received",
                     "ratings_held", "load_peak_rss_bytes", "load_rounds"):
            self.stats[name] = [int(x) for x in self.stats[name]]
        if self.test_path is not None:
            self._read_test_file(group)
        return part

    # ------------------------------------------------------------------ evaluation

    def test_rmse(self, group, p: np.ndarray | None, q: np.ndarray | None) -> float:
        """Collective: the RMSE of factors ``p``, ``q`` (dense id order, given on rank 0) over
        the whole test set; each rank scores its own test share. Unknown users or items are
        predicted as the training mean (as ``MfModel.rmse`` does)."""
        return self._rmse(group, p, q, self._test)

    def valid_rmse(self, group, p: np.ndarray | None, q: np.ndarray | None) -> float:
        """Collective: as :meth:`test_rmse` over the validation share; the same value on every rank."""
        return self._rmse(group, p, q, self._valid)

    def _rmse(self, group, p, q, triple) -> float:
        k = None
        if group.rank == 0:
            k = p.shape[1]
        shape = np.array([0 if k is None else k], np.int64)
        group.broadcast(shape, root=0)
        k = int(shape[0])
        if group.rank != 0:
            p = np.empty((self.n_users, k), np.float32)
            q = np.empty((self.n_items, k), np.float32)
        else:
            p, q = np.ascontiguousarray(p, np.float32), np.ascontiguousarray(q, np.float32)
        if group.size > 1:
            group.broadcast(p, root=0)
            group.broadcast(q, root=0)
        tu, ti, tr = triple[:3]
        seen = triple[3] if len(triple) > 3 else None  # a test file: its pairs with ids known in training
        mean = np.float32(self.mean)
        sse = 0.0
        for a in range(0, len(tr), _EVAL_ROWS):
            u, i, r = tu[a:a + _EVAL_ROWS], ti[a:a + _EVAL_ROWS], tr[a:a + _EVAL_ROWS]
            pred = np.einsum("ij,ij->i", p[u], q[i])
            ok = self.known_u[u] & self.known_i[i]
            if seen is not None:
                ok &= seen[a:a + _EVAL_ROWS]
            pred = np.where(ok, pred, mean)
            e = (r - pred).astype(np.float64)
            sse += float(e @ e)
        tot = np.array([sse, len(tr)], np.float64)
        group.allreduce(tot)
        return float(np.sqrt(tot[0] / tot[1])) if tot[1] else float("nan")

    def _read_test_file(self, group) -> None:
        """Collective, once the training ids are numbered: this rank's share of ``test_path`` (by
        bytes, as the training file is read) as compact ids. A test id unseen in training is
        counted (distinct users and items over all ranks, ratings) and answered with the mean."""
        err = None
        u = i = r = np.zeros(0, np.int64)
        try:
            u, i, r = _Source(Path(self.test_path), group.rank, group.size, None, self.delimiter, self.header,
                              self.columns, group).read(0)
            if len(r) and np.isnan(r[0]):
                raise DataError(f"{self.test_path}:1: a test line has no rating (expected 'user item rating')")
        except (DataError, OSError) as e:
            err = e
        agree(group, err)
        compact, seen = [], np.ones(len(r), bool)
        unseen = []
        for raw, ids in ((u, self.user_ids), (i, self.item_ids)):
            c = np.searchsorted(ids, raw)
            hit = c < len(ids)
            hit[hit] = ids[c[hit]] == raw[hit]
            seen &= hit
            unseen.append(len(global_ids(group, _distinct(np.asarray(raw[~hit], np.int64)))))
            compact.append(np.where(hit, c, 0).astype(compact_id_dtype(len(ids))))
        self._test = (compact[0], compact[1], np.asarray(r, np.float32), seen)
        tot = np.array([len(r), int((~seen).sum())], np.int64)
        group.allreduce(tot)
        self.n_test = int(tot[0])
        self.stats["test_file_ratings_read"] = [int(x) for x in group.allgather(np.array([len(r)], np.int64))[:, 0]]
        self.test_unseen = {"users": unseen[0], "items": unseen[1], "ratings": int(tot[1])}

    def model(self, k: int, p: np.ndarray, q: np.ndarray):
        """The native model of factors ``p``, ``q`` (dense id order): the global ids, the training
        mean and the users / items seen in training."""
        return _native.MfModel.from_parts(k, np.ascontiguousarray(p, np.float32).tobytes(),
                                          np.ascontiguousarray(q, np.float32).tobytes(),
                                          self.user_ids.astype("<u8").tobytes(), self.item_ids.astype("<u8").tobytes(),
                                          float(np.float32(self.mean)),
                                          self.known_u.astype(np.uint8).tobytes(),
                                          self.known_i.astype(np.uint8).tobytes())


def split(path, test_fraction: float = 0.1, seed: int = 0, delimiter: str | None = None,
          header: str = "auto", columns=None, test_file=None) -> tuple[ShareRatings, ShareTest]:
    """``(train, test)`` of a rating file (or part directory) read in shares by the ranks of a
    ``rima`` / ``dsgd-ps`` job (module doc); nothing is read until ``fit``. ``columns``: of a
    Parquet / Arrow IPC input. ``test_file``: the test set is that file (each rank reads its
    share, in the same dialect and columns; ids matched to the training file's, unseen ones
    answered with the mean) and all of ``path`` trains (``test_fraction`` must be 0)."""
    if test_file is not None and test_fraction:
        raise InvalidArgumentError(f"a test file and a test fraction ({test_fraction}) exclude each other")
    train = ShareRatings(path, test_fraction, seed, delimiter, header, columns)
    train.test_path = None if test_file is None else Path(test_file)
    return train, train.test


def piece_bytes_for(budget: int | None) -> int | None:
    """Input bytes read per piece under a memory budget (text: ~5 bytes of set-up memory per
    input byte, so budget / 8, at least 64 KiB); None: the whole share at once."""
    if budget is None:
        return None
    return max(64 << 10, int(budget) // 8)
