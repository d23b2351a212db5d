"""Mini-batch SGD for sparse logistic regression on the sparse allreduce, with a config per
mini-batch (section III-B of the sparse allreduce paper):

    scalefree sgd generate data.svm --rows 200000 --dim 1000000
    scalefree sgd logreg data.svm -n 4 --vs sklearn

Each rank reads only its share of the file (``--test FILE`` too); without a test file, a row
is held out when a seeded hash of its contents says so (the same split at any rank count).
Every rank keeps a copy of the weights. Per step each rank
takes a mini-batch of its rows, computes the log-loss gradient at the features the batch
touches, and one ``config_reduce`` (indices and values together, a new pattern per batch)
sums the gradients, the bias gradient and the number of rows over all ranks, returning
them at this rank's features; the rank then steps on those features with the mean gradient ``G / B + alpha * w`` (B: rows
in the global mini-batch), by AdaGrad (default) or plain SGD. A feature a rank did not touch
in a step is not updated in its copy; at the end the copies are averaged (one dense
allreduce) into the model that is evaluated.

Data: svmlight/libsvm text (``label idx:value ...``, ``#`` comments; labels 0/1 or -1/+1;
indices 1-based unless a 0 occurs, or as ``--zero-based`` says), or a seeded power-law
data set with a planted model (:func:`generate`), written to disk in blocks.
"""

from __future__ import annotations

import gzip
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .._atomic import atomic_path
from ..errors import DataError
from ..ssp.straggler import StragglerSchedule


class SvmlightError(DataError):
    """A line of an svmlight file that cannot be read (names the file and line)."""


@dataclass
class SparseRows:
    """Rows in CSR form: row ``i`` has ``indices[indptr[i]:indptr[i+1]]`` with ``data``."""

    indptr: np.ndarray
    indices: np.ndarray
    data: np.ndarray
    labels: np.ndarray  # 0/1 as float64
    dim: int

    def __len__(self) -> int:
        return len(self.indptr) - 1

    def take(self, rows) -> "SparseRows":
        rows = np.asarray(rows, np.int64)
        lo, hi = self.indptr[rows], self.indptr[rows + 1]
        pos = _ranges(lo, hi)
        indptr = np.zeros(len(rows) + 1, np.int64)
        np.cumsum(hi - lo, out=indptr[1:])
        return SparseRows(indptr, self.indices[pos], self.data[pos], self.labels[rows], self.dim)

    def to_scipy(self):
        import scipy.sparse as sp

        return sp.csr_matrix((self.data, self.indices, self.indptr), shape=(len(self), self.dim))


def _ranges(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """The concatenation of ``arange(lo[i], hi[i])`` over i."""
    n = hi - lo
    total = int(n.sum())
    if total == 0:
        return np.zeros(0, np.int64)
    offs = np.repeat(lo - np.concatenate([[0], np.cumsum(n)[:-1]]), n)
    return offs + np.arange(total, dtype=np.int64)


MAX_FEATURES = 1 << 31
"""Feature indices are bounded before anything is allocated: every rank keeps a dense weight
vector of the dimension, so an index of 2**40 in a file is an error, not 8 TiB."""


def read_svmlight_share(path, rank: int = 0, size: int = 1, max_index: int = MAX_FEATURES - 1, header: str = "auto"):
    """Rank's share of an svmlight/libsvm file or part directory (the lines that start in
    its ``1/size`` of the bytes, parsed in native code; ``.gz`` of several members cut by
    members, a single gzip stream decompressed by every rank, each parsing its chunks):
    ``(labels, indptr, indices as written, values)``. ``header``: whether the first line (of
    every part) is a header to skip (``auto``: when its first token is not a number). Raises
    :class:`SvmlightError` naming the file and line (NaN/inf values, an index past
    ``max_index``, binary data, an empty file)."""
    from .. import _native

    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file")
    try:
        return _native.read_svmlight_share(str(path), rank, size, max_index, header=header)
    except DataError as e:
        raise SvmlightError(str(e)) from None


def _share_or_stream(group, path, header: str):
    """Collective: this rank's rows of ``path`` as :func:`read_svmlight_share` gives them, a
    single gzip stream read by rank 0 and parsed by the others."""
    from .. import _text_stream

    stream = None
    if group.size > 1 and Path(path).is_file():
        try:
            stream = _text_stream.single_gzip_stream(path, "svmlight", None, header, group.size,
                                                     max_index=MAX_FEATURES - 1)
        except DataError as e:
            raise SvmlightError(str(e)) from None
    if stream is None:
        return read_svmlight_share(path, group.rank, group.size, header=header)
    try:
        got = _text_stream.stream_share(group, stream)
    except DataError as e:
        raise SvmlightError(str(e)) from None
    return got[0] if got else (np.zeros(0), np.zeros(1, np.int64), np.zeros(0, np.int64), np.zeros(0))


def _rows(path, labels, indptr, indices, values, zero_based: bool, dim: int) -> SparseRows:
    if not zero_based:
        indices = indices - 1
    y = (labels > 0).astype(np.float64)
    return SparseRows(np.asarray(indptr, np.int64), np.asarray(indices, np.int64), np.asarray(values, np.float64),
                      y, int(dim))


def read_svmlight(path, zero_based="auto", dim: int | None = None, header: str = "auto") -> SparseRows:
    """Reads svmlight/libsvm text (``.gz`` allowed) in one process. Labels > 0 become 1,
    others 0 (so 0/1 and -1/+1 both work). ``zero_based``: True, False or "auto" (1-based
    unless an index 0 occurs). Raises :class:`SvmlightError` naming the file and line of a
    bad line. :func:`load_rows` reads a share per rank instead."""
    labels, indptr, indices, values = read_svmlight_share(path, header=header)
    lo = int(indices.min()) if len(indices) else 1
    hi = int(indices.max()) if len(indices) else -1
    zb = (lo == 0) if zero_based == "auto" else bool(zero_based)
    if not zb and lo == 0:
        raise SvmlightError(f"{path}: index 0 in a file read as 1-based")
    need = hi + (1 if zb else 0) if len(indices) else 0
    if dim is None:
        dim = need
    elif need > dim:
        raise SvmlightError(f"{path}: feature index {need - 1} is past the dimension {dim}")
    return _rows(path, labels, indptr, indices, values, zb, dim)


def load_rows(group, path, zero_based="auto", dim: int | None = None, header: str = "auto") -> SparseRows:
    """Collective: this rank's share of an svmlight file (:func:`read_svmlight_share`) as
    rows, with the index base and the dimension agreed by every rank (the largest index
    over all ranks sets the dimension). No rank reads more than its share; a file in one gzip
    stream is decompressed once, by rank 0, which hands its chunks to the others
    (:mod:`scalefree._text_stream`; rank 0 then holds no rows)."""
    labels, indptr, indices, values = _share_or_stream(group, path, header)
    ext = np.array([-(int(indices.min()) if len(indices) else MAX_FEATURES), int(indices.max()) if len(indices) else -1],
                   np.int64)
    group.allreduce(ext, op="max")
    lo, hi = -int(ext[0]), int(ext[1])
    zb = (lo == 0) if zero_based == "auto" else bool(zero_based)
    if not zb and lo == 0:
        raise SvmlightError(f"{path}: index 0 in a file read as 1-based")
    need = hi + (1 if zb else 0) if hi >= 0 else 0
    if dim is None:
        dim = need
    elif need > dim:
        raise SvmlightError(f"{path}: feature index {need - 1} is past the dimension {dim}")
    return _rows(path, labels, indptr, indices, values, zb, dim)


def row_hash(rows: SparseRows, seed: int = 0) -> np.ndarray:
    """A seeded 64-bit hash of each row's label, indices and values: the train/test split
    by it is the same whatever the rank count or the order the ranks read the rows in."""
    with np.errstate(over="ignore"):
        h = rows.indices.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
        h ^= rows.data.view(np.uint64) if rows.data.dtype == np.float64 else rows.data.astype(np.float64).view(np.uint64)
        h *= np.uint64(0xBF58476D1CE4E5B9)
        h ^= h >> np.uint64(29)
        cs = np.zeros(len(h) + 1, np.uint64)
        np.cumsum(h, out=cs[1:])
        r = cs[rows.indptr[1:]] - cs[rows.indptr[:-1]]
        r += rows.labels.astype(np.uint64) * np.uint64(0x94D049BB133111EB) + np.uint64(seed & 0xFFFFFFFF)
        r *= np.uint64(0xD6E8FEB86659FD93)
        r ^= r >> np.uint64(32)
    return r


def hash_split(rows: SparseRows, test_fraction: float, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(train rows, test rows) of this rank's rows: a row is in the test set when its
    :func:`row_hash` falls in the lowest ``test_fraction`` of the hash range."""
    if not 0.0 <= test_fraction < 1.0:
        raise ValueError(f"test fraction must be in [0, 1), got {test_fraction}")
    test = (row_hash(rows, seed) >> np.uint64(11)).astype(np.float64) * 2.0**-53 < test_fraction
    return np.flatnonzero(~test), np.flatnonzero(test)


def generate_rows(rows: int, dim: int, nnz: int = 20, zipf: float = 1.3, seed: int = 0, noise: float = 0.5,
                  block: int = 65536):
    """Yields ``SparseRows`` blocks of a seeded power-law data set with a planted model.
    Every row has ``nnz`` distinct features drawn from Zipf(``zipf``) (feature ids scrambled
    by a fixed permutation), values 1/sqrt(nnz); its label is 1 where ``x . w* + noise *
    N(0, 1) > 0`` with planted weights ``w* ~ N(0, 1)``."""
    if rows < 0 or dim < 1 or nnz < 1:
        raise ValueError(f"need rows >= 0, dim >= 1, nnz >= 1 (got {rows}, {dim}, {nnz})")
    nnz = min(nnz, dim)
    w = planted_model(dim, seed)
    perm = np.random.default_rng([seed, 2]).permutation(dim)
    rng = np.random.default_rng([seed, 3])
    done = 0
    while done < rows:
        m = min(block, rows - done)
        cols = np.empty((m, nnz), np.int64)
        # Distinct features per row: redraw the duplicates (few, since the tail is long).
        cols[:] = (rng.zipf(zipf, (m, nnz)) - 1) % dim
        for _ in range(20):
            s = np.sort(cols, axis=1)
            dup = np.zeros_like(cols, dtype=bool)
            dup[:, 1:] = s[:, 1:] == s[:, :-1]
            if not dup.any():
                break
            s[dup] = rng.integers(0, dim, int(dup.sum()))
            cols = s
        else:  # nnz close to dim: draw the rows still short of distinct features uniformly
            s = np.sort(cols, axis=1)
            for i in np.flatnonzero((s[:, 1:] == s[:, :-1]).any(axis=1)):
                cols[i] = rng.choice(dim, nnz, replace=False)
        cols = np.sort(perm[cols], axis=1)
        data = np.full(m * nnz, 1.0 / np.sqrt(nnz))
        margin = (w[cols] * (1.0 / np.sqrt(nnz))).sum(axis=1) + noise * rng.standard_normal(m)
        yield SparseRows(np.arange(m + 1, dtype=np.int64) * nnz, cols.ravel(), data,
                         (margin > 0).astype(np.float64), dim)
        done += m


def planted_model(dim: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng([seed, 1]).standard_normal(dim)


def write_svmlight(path, blocks, header: str = "") -> int:
    """Writes ``SparseRows`` blocks as svmlight text (1-based indices, ``.gz`` compresses),
    atomically (temporary file, then rename). Returns the rows written."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    rows = 0
    with atomic_path(path) as tmp, opener(tmp, "wt") as f:
        if header:
            f.write(f"# {header}\n")
        for b in blocks:
            lines = []
            for i in range(len(b)):
                lo, hi = b.indptr[i], b.indptr[i + 1]
                feats = " ".join(f"{j + 1}:{v:.6g}" for j, v in zip(b.indices[lo:hi].tolist(), b.data[lo:hi].tolist()))
                lines.append(f"{int(b.labels[i])} {feats}")
            f.write("\n".join(lines) + ("\n" if lines else ""))
            rows += len(b)
    return rows


def concat_rows(blocks, dim: int) -> SparseRows:
    blocks = list(blocks)
    if not blocks:
        return SparseRows(np.zeros(1, np.int64), np.zeros(0, np.int64), np.zeros(0), np.zeros(0), dim)
    indptr = [np.zeros(1, np.int64)]
    base = 0
    for b in blocks:
        indptr.append(b.indptr[1:] + base)
        base += int(b.indptr[-1])
    return SparseRows(np.concatenate(indptr), np.concatenate([b.indices for b in blocks]),
                      np.concatenate([b.data for b in blocks]), np.concatenate([b.labels for b in blocks]), dim)


def split_rows(n: int, test_fraction: float, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(train rows, test rows): a seeded random split, the same on every rank."""
    if not 0.0 <= test_fraction < 1.0:
        raise ValueError(f"test fraction must be in [0, 1), got {test_fraction}")
    perm = np.random.default_rng([seed, 4]).permutation(n)
    k = int(round(n * test_fraction))
    return np.sort(perm[k:]), np.sort(perm[:k])


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * z))


def predict(w: np.ndarray, bias: float, x: SparseRows) -> np.ndarray:
    """Probability of label 1 for each row."""
    rowid = np.repeat(np.arange(len(x)), np.diff(x.indptr))
    margin = np.bincount(rowid, weights=x.data * w[x.indices], minlength=len(x)) + bias
    return _sigmoid(margin)


def accuracy(w: np.ndarray, bias: float, x: SparseRows) -> float:
    if len(x) == 0:
        return float("nan")
    return float(((predict(w, bias, x) > 0.5) == (x.labels > 0.5)).mean())


def train(group, rows: SparseRows, epochs: int = 5, batch: int = 256, lr: float = 0.5, alpha: float = 1e-6,
          seed: int = 0, degrees="auto", progress: bool = False, optimizer: str = "adagrad", checkpoints=None,
          fixed: bool = False, slack: int | None = None, straggler_ms: float = 0.0):
    """Collective: mini-batch SGD of logistic regression over this rank's ``rows`` (every
    rank must pass the same ``dim``). ``batch`` rows per rank per step. ``optimizer``:
    "adagrad" (per-coordinate steps ``lr / sqrt(sum of squared gradients)``, suited to
    features of very different frequencies) or "sgd" (plain steps ``lr``). Returns (weights,
    bias, stats) with the weights averaged over the ranks' copies; stats has the steps,
    the median seconds per step and the median config_reduce seconds. ``checkpoints``: a
    :class:`~scalefree.checkpoint.Checkpoints` counting epochs (the run resumes from it, saves
    this rank's copy of the weights, its AdaGrad sums and its shuffle RNG at epoch ends, and
    ends early at its ``stop_after``: the weights are then this rank's copy, not averaged).

    ``fixed``: one sparse allreduce configured once on a fixed feature set (every feature of
    this rank's rows, plus the bias and the row count) instead of a ``config_reduce`` per
    mini-batch. Each rank contributes its *cumulative* gradient sums (the history of its
    contributions), so the change of the reduced sums since its previous step is every
    gradient not yet applied, each exactly once (gradients are scaled by the rows of a full
    global mini-batch, so a change spanning k steps moves the model as k steps do).
    ``slack=s`` (implies ``fixed``): the reduce
    may use other ranks' sums up to ``s`` steps old instead of waiting for a slow rank; a
    flush at the end applies what the last steps missed, so no gradient is lost.
    ``straggler_ms``: before each step one rank drawn by
    :class:`~scalefree.ssp.straggler.StragglerSchedule` sleeps up to that long (benchmarks)."""
    me, size = group.rank, group.size
    dim = rows.dim
    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch}")
    if epochs < 0:
        raise ValueError(f"epochs must be >= 0, got {epochs}")
    if optimizer not in ("adagrad", "sgd"):
        raise ValueError(f'optimizer must be "adagrad" or "sgd", got {optimizer!r}')
    chk = np.array([float(dim), -float(dim)])
    group.allreduce(chk, op="max")
    if chk[0] != -chk[1]:
        raise ValueError(f"ranks disagree on the dimension (this rank: {dim})")
    # Every rank makes the same number of steps: the largest share sets it.
    steps_per_epoch = np.array([float(-(-len(rows) // batch))])
    group.allreduce(steps_per_epoch, op="max")
    steps_per_epoch = int(steps_per_epoch[0])
    if slack is not None or fixed:
        if checkpoints is not None:
            from ..errors import InvalidArgumentError

            raise InvalidArgumentError("checkpoints need the per-mini-batch reduce (no fixed features, no slack)")
        return _train_fixed(group, rows, epochs, batch, lr, alpha, seed, degrees, progress, optimizer,
                            steps_per_epoch, slack, straggler_ms)
    # Indices dim, dim+1 carry the bias gradient and the row count of the mini-batch.
    sa = group.sparse_allreduce(dim + 2, degrees=degrees)
    w = np.zeros(dim + 1)  # the last entry is the bias
    h = np.zeros(dim + 1)  # AdaGrad: sums of squared gradients
    rng = np.random.default_rng([seed, 5, me])
    start, state = (0, None) if checkpoints is None else checkpoints.restore()
    if state is not None:
        if state["w"].shape != w.shape:
            from ..errors import InvalidArgumentError

            raise InvalidArgumentError(f"checkpoint has {len(state['w']) - 1} features, the data {dim}")
        if start > epochs:
            from ..errors import InvalidArgumentError

            raise InvalidArgumentError(f"checkpoint is at epoch {start}, past --epochs {epochs}")
        w, h = state["w"], state["h"]
        rng.bit_generator.state = json.loads(state["rng"].tobytes().decode())
    step_s, reduce_s = [], []
    delays = StragglerSchedule(straggler_ms, seed, size).delays_s(me, steps_per_epoch * epochs)
    for epoch in range(start, epochs):
        order = rng.permutation(len(rows))
        for s in range(steps_per_epoch):
            if delays[epoch * steps_per_epoch + s]:
                time.sleep(delays[epoch * steps_per_epoch + s])
            t0 = time.perf_counter()
            mb = rows.take(order[s * batch:(s + 1) * batch])  # empty once this rank's share runs out
            rowid = np.repeat(np.arange(len(mb)), np.diff(mb.indptr))
            feats, inv = np.unique(mb.indices, return_inverse=True)
            margin = np.bincount(rowid, weights=mb.data * w[mb.indices], minlength=len(mb)) + w[dim]
            resid = _sigmoid(margin) - mb.labels
            g = np.bincount(inv, weights=mb.data * resid[rowid], minlength=len(feats))
            idx = np.concatenate([feats, [dim, dim + 1]])
            vals = np.concatenate([g, [resid.sum(), float(len(mb))]])
            t1 = time.perf_counter()
            got = sa.config_reduce(idx, vals, idx)
            reduce_s.append(time.perf_counter() - t1)
            total = got[-1]
            if total > 0:
                at = idx[:-1]  # features and the bias
                grad = got[:-1] / total
                grad[:-1] += alpha * w[feats]
                if optimizer == "adagrad":
                    h[at] += grad * grad
                    w[at] -= lr * grad / (np.sqrt(h[at]) + 1e-12)
                else:
                    w[at] -= lr * grad
            step_s.append(time.perf_counter() - t0)
        if progress and me == 0:
            print(f"epoch {epoch + 1}: {steps_per_epoch} steps, {np.median(step_s) * 1e3:.2f} ms/step",
                  file=sys.stderr, flush=True)
        if checkpoints is not None and checkpoints.after(epoch + 1, lambda: {
                "w": w, "h": h, "rng": np.frombuffer(json.dumps(rng.bit_generator.state).encode(), np.uint8)}):
            return w[:-1], float(w[-1]), {"steps": 0, "step_s": 0.0, "config_reduce_s": 0.0}
    # The copies differ at the features a rank did not touch in some step: average them.
    model = w
    group.allreduce(model)
    model /= size
    stats = {"steps": steps_per_epoch * epochs,
             "step_s": float(np.median(step_s)) if step_s else 0.0,
             "config_reduce_s": float(np.median(reduce_s)) if reduce_s else 0.0}
    return model[:-1], float(model[-1]), stats


def _step_update(w, h, at, sums, count, alpha, lr, optimizer, feats_w, steps: float = 1.0) -> None:
    """One optimizer step on the coordinates ``at`` (features then the bias) from gradient
    ``sums`` over ``count`` rows, L2 on the features ``feats_w``. ``steps``: how many
    mini-batches' worth of rows the gradient spans (AdaGrad adds ``grad**2 / steps``: what
    that many steps of ``grad / steps`` each would add)."""
    grad = sums / count
    grad[:-1] += alpha * w[feats_w]
    if optimizer == "adagrad":
        h[at] += grad * grad / steps
        w[at] -= lr * grad / (np.sqrt(h[at]) + 1e-12)
    else:
        w[at] -= lr * grad


def _train_fixed(group, rows, epochs, batch, lr, alpha, seed, degrees, progress, optimizer, steps_per_epoch,
                 slack, straggler_ms):
    """:func:`train` with ``fixed`` / ``slack`` (see there)."""
    me, size = group.rank, group.size
    dim = rows.dim
    feats = np.unique(rows.indices).astype(np.int64)
    keys = np.concatenate([feats, [dim, dim + 1]])
    sa = group.sparse_allreduce(dim + 2, degrees=degrees, slack=slack)
    sa.config(keys, keys)
    w = np.zeros(dim + 1)
    h = np.zeros(dim + 1)
    at_all = np.append(feats, dim)  # the rank's coordinates of w: its features, then the bias
    cum = np.zeros(len(keys))  # this rank's gradient sums so far (its contribution)
    seen = np.zeros(len(keys))  # the reduced sums already applied
    got = np.zeros(len(keys))
    rng = np.random.default_rng([seed, 5, me])
    delays = StragglerSchedule(straggler_ms, seed, size).delays_s(me, steps_per_epoch * epochs)
    scale = 1.0 / (batch * size)  # rows of a full global mini-batch

    def apply(got):
        # The change of the reduced sums: every rank's gradients since the last apply, each
        # scaled by the global mini-batch (one step's mean gradient per step they span).
        d = got - seen
        seen[...] = got
        if d[-1] > 0:
            live = np.flatnonzero(d[:-2] != 0)
            at = np.append(at_all[live], dim)
            _step_update(w, h, at, np.append(d[live], d[-2]), 1.0, alpha, lr, optimizer, feats[live],
                         d[-1] * scale)

    step_s, reduce_s, ages = [], [], []
    for epoch in range(epochs):
        order = rng.permutation(len(rows))
        for s in range(steps_per_epoch):
            if delays[epoch * steps_per_epoch + s]:
                time.sleep(delays[epoch * steps_per_epoch + s])
            t0 = time.perf_counter()
            mb = rows.take(order[s * batch:(s + 1) * batch])
            rowid = np.repeat(np.arange(len(mb)), np.diff(mb.indptr))
            margin = np.bincount(rowid, weights=mb.data * w[mb.indices], minlength=len(mb)) + w[dim]
            resid = _sigmoid(margin) - mb.labels
            pos = np.searchsorted(feats, mb.indices)
            cum[:-2] += np.bincount(pos, weights=mb.data * resid[rowid], minlength=len(feats)) * scale
            cum[-2] += resid.sum() * scale
            cum[-1] += len(mb)
            t1 = time.perf_counter()
            sa.reduce(cum, out=got)
            reduce_s.append(time.perf_counter() - t1)
            if sa.last is not None:
                ages.append(sa.last.age_diff)
            apply(got)
            step_s.append(time.perf_counter() - t0)
        if progress and me == 0:
            print(f"epoch {epoch + 1}: {steps_per_epoch} steps, {np.median(step_s) * 1e3:.2f} ms/step",
                  file=sys.stderr, flush=True)
    if slack is not None and steps_per_epoch * epochs:
        apply(sa.flush(out=got))  # what the last steps saw stale: every gradient applied once
    model = w
    group.allreduce(model)
    model /= size
    stats = {"steps": steps_per_epoch * epochs,
             "step_s": float(np.median(step_s)) if step_s else 0.0,
             "config_reduce_s": float(np.median(reduce_s)) if reduce_s else 0.0,
             "mean_age_diff": float(np.mean(ages)) if ages else 0.0}
    return model[:-1], float(model[-1]), stats


def sklearn_baseline(train_rows: SparseRows, test_rows: SparseRows, epochs: int, alpha: float, seed: int = 0):
    """Accuracy of scikit-learn's SGDClassifier (log loss) on the same split, and its fit
    time; None when scikit-learn is not installed."""
    try:
        from sklearn.linear_model import SGDClassifier
    except ImportError:
        return None
    import warnings

    clf = SGDClassifier(loss="log_loss", alpha=alpha, max_iter=max(1, epochs), tol=None, random_state=seed)
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ConvergenceWarning at max_iter
        clf.fit(train_rows.to_scipy(), train_rows.labels)
    fit_s = time.perf_counter() - t0
    acc = float(clf.score(test_rows.to_scipy(), test_rows.labels)) if len(test_rows) else float("nan")
    return acc, fit_s


def local_rows(group, data, zero_based="auto", *, rows: int = 0, dim: int = 0, nnz: int = 20, zipf: float = 1.3,
               data_seed: int = 0, header: str = "auto") -> SparseRows:
    """Collective: this rank's rows of ``data`` — an svmlight file (:func:`load_rows`: its
    share of the bytes) or ``"synthetic"`` (the generator's blocks ``rank, rank + size,
    ...``; every rank runs the generator, keeping only its blocks)."""
    if data == "synthetic":
        mine = [b for i, b in enumerate(generate_rows(rows, dim, nnz, zipf, data_seed))
                if i % group.size == group.rank]
        return concat_rows(mine, dim)
    return load_rows(group, data, zero_based, header=header)
