"""Extreme multi-label (XML) inference out of core: the BLAS-on-flash paper's second application.

    from scalefree import flash
    from scalefree.flash import xml
    xml.import_omikuji("omikuji-model/", "model.sfxml")          # or xml.train("train.txt", "model.sfxml")
    rt = flash.Runtime(memory_budget="1G")
    p = xml.predict("model.sfxml", "test.txt", k=5, beam=10, runtime=rt)
    p.labels, p.scores, p.metrics["precision@1"]

A model is an ensemble of label trees (Parabel, as omikuji trains them): every node holds a
linear classifier per child (a leaf: per label). On flash it is laid out level by level —
one contiguous segment per (tree, level): the nodes' weights as sparse or dense blocks, the
leaves' labels — with a small table of nodes held in memory (``crates/scalefree-xml``).

``predict`` scores points in batches by a breadth-first beam search: one flash-scheduler task
per (tree, level chunk, batch) reads that part of the level (prefetched under the runtime's
memory budget, shared between the batches in flight through the program cache) and scores the
batch's points sitting at its nodes; a merge task per level keeps each point's ``beam`` best
candidates and injects the next level's tasks. Scores are omikuji's: the point L2-normalized
with a bias feature, the loss's log-probability (log-sigmoid or squared hinge) of each linear
score summed along the path, ``exp`` at the leaves, averaged over trees; top ``k`` per point.
Text input (the Extreme Classification Repository's ``N F L`` header and ``l1,l2 f:v`` lines,
or the same without the header) is read a batch at a time, so any number of points is scored
in memory bounded by the budget plus the batches in flight.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from .. import _native
from ..errors import InvalidArgumentError
from .core import Csr, Runtime, default_runtime
from .xml_generate import XmlDataSpec, generate_xml

__all__ = ["ModelInfo", "concat_models", "Predictions", "XmlDataSpec", "generate_xml", "import_omikuji", "model_info", "predict",
           "read_xc", "train", "write_model"]


@dataclass(frozen=True)
class ModelInfo:
    """A model file's header: sizes, loss, bytes."""

    path: str
    n_features: int
    n_labels: int
    n_trees: int
    loss: str
    file_bytes: int
    level_bytes: int
    n_nodes: int
    depth: int
    largest_level_bytes: int


def _info(d: dict) -> ModelInfo:
    return ModelInfo(**{k: (os.fspath(v) if k == "path" else v) for k, v in d.items()})


def model_info(path) -> ModelInfo:
    """Reads and checks a model file's header and node table."""
    return _info(_native.xml_model_info(os.fspath(path)))


def import_omikuji(model_dir, out) -> ModelInfo:
    """Converts a model saved by omikuji (``settings.json``, ``tree*.cbor``) into a model
    file at ``out`` (written atomically)."""
    return _info(_native.xml_import_omikuji(os.fspath(model_dir), os.fspath(out)))


def _weights(w, n_features: int, n_out: int):
    import scipy.sparse as sp

    shape = (n_features + 1, n_out)
    if sp.issparse(w):
        if w.shape != shape:
            raise InvalidArgumentError(f"weights of shape {w.shape}, expected {shape} (features + bias, outputs)")
        m = sp.csr_matrix(w, dtype=np.float32)
        m.sum_duplicates()
        m.sort_indices()
        m.eliminate_zeros()
        rows = np.flatnonzero(np.diff(m.indptr)).astype(np.uint32)
        row_ptr = np.concatenate([[0], np.cumsum(np.diff(m.indptr)[rows])]).astype(np.uint32)
        return ("sparse", rows, row_ptr, m.indices.astype(np.uint32), m.data.astype(np.float32))
    w = np.asarray(w, dtype=np.float32)
    if w.shape != shape:
        raise InvalidArgumentError(f"weights of shape {w.shape}, expected {shape} (features + bias, outputs)")
    return ("dense", np.ascontiguousarray(w).ravel())


def write_model(path, trees, n_features: int, loss: str = "hinge") -> ModelInfo:
    """Writes a model from arrays. Each tree is its root node; a node is a dict with
    ``weights`` — an ``(n_features + 1) x n_out`` numpy array (dense block) or scipy sparse
    matrix (sparse block), row ``n_features`` being the bias — and either ``children`` (a list
    of nodes, one per column) or ``labels`` (one label id per column). ``loss``: ``"hinge"``
    (squared hinge, omikuji's default) or ``"log"``."""
    flat = []
    for root in trees:
        levels, level = [], [root]
        while level:
            nodes, nxt = [], []
            for node in level:
                if "children" in node:
                    kids = list(node["children"])
                    n_out = len(kids)
                    nodes.append((len(nxt), n_out, None, _weights(node["weights"], n_features, n_out)))
                    nxt.extend(kids)
                else:
                    labels = np.asarray(node["labels"], dtype=np.uint32)
                    nodes.append((-1, labels.size, labels, _weights(node["weights"], n_features, labels.size)))
            levels.append(nodes)
            level = nxt
        flat.append(levels)
    _native.xml_write_model(os.fspath(path), int(n_features), loss, flat)
    return model_info(path)


def concat_models(out, models) -> ModelInfo:
    """Writes a model made of the trees of ``models`` (files of the same features and loss),
    in order: forests trained apart become one ensemble (their segments are copied as they
    are)."""
    return _info(_native.xml_concat_models(os.fspath(out), [os.fspath(m) for m in models]))


@dataclass
class Predictions:
    """Top-k predictions: ``labels`` (points x k, int64, -1 where a point has fewer than k),
    ``scores`` (float32, NaN there), ``metrics`` (``precision@1..`` and ``ndcg@1..`` when the
    input has labels, else None) and ``stats`` (points, seconds, the flash run's counters)."""

    labels: np.ndarray
    scores: np.ndarray
    metrics: dict | None
    stats: dict = field(default_factory=dict)


def read_xc(path):
    """Reads a small XC-repository (or multi-label svmlight) text file into memory: a scipy
    CSR matrix of features and a list of label lists (for tests and references; ``predict``
    streams large files itself)."""
    import scipy.sparse as sp

    with open(path) as f:
        lines = [ln.split("#")[0].split() for ln in f]
    lines = [t for t in lines if t]
    header = None
    if lines and len(lines[0]) == 3 and all(x.isdigit() for x in lines[0]):
        header, lines = [int(x) for x in lines[0]], lines[1:]
    labels, rows, cols, vals = [], [], [], []
    for i, toks in enumerate(lines):
        if ":" not in toks[0]:
            labels.append([int(x) for x in toks[0].split(",") if x])
            toks = toks[1:]
        else:
            labels.append([])
        for t in toks:
            f_, v = t.split(":")
            rows.append(i)
            cols.append(int(f_))
            vals.append(float(v))
    n_features = header[1] if header else (max(cols) + 1 if cols else 0)
    x = sp.csr_matrix((np.asarray(vals, np.float32), (rows, cols)), shape=(len(lines), n_features))
    return x, labels


def _npy_stream(zf, name: str):
    """An open ``.npy`` member of a zip and its (shape, dtype), positioned at its data."""
    f = zf.open(name)
    version = np.lib.format.read_magic(f)
    if version == (1, 0):
        shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
    else:
        shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
    if dtype.hasobject or (fortran and len(shape) > 1):
        raise InvalidArgumentError(f"{name} of the .npz is not a plain array")
    return f, shape, dtype


def _take(f, dtype, count: int, what: str):
    data = f.read(count * dtype.itemsize)
    if len(data) != count * dtype.itemsize:
        raise InvalidArgumentError(f"{what}: the .npz ends early (truncated?)")
    return np.frombuffer(data, dtype=dtype)


def _npz_blocks(path: str, batch_points: int, n_features: int):
    """CSR blocks ``(indptr int64, indices int32, values float32)`` of a scipy ``.npz`` (as
    ``scipy.sparse.save_npz`` writes it, compressed or not), read from the zip a batch of rows at
    a time: memory is one batch whatever the file's size. Another sparse format than CSR is
    read whole and converted. A feature id at or past ``n_features`` is an error naming the
    file and row."""
    import zipfile

    import scipy.sparse as sp

    try:
        zf = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as e:
        raise InvalidArgumentError(f"{path}: not a scipy .npz ({e})") from e
    with zf:
        names = set(zf.namelist())
        if not {"format.npy", "shape.npy", "indptr.npy", "indices.npy", "data.npy"} <= names:
            raise InvalidArgumentError(f"{path}: not a scipy sparse .npz (no CSR arrays in it)")
        fmt = np.lib.format.read_array(zf.open("format.npy")).item()
        fmt = fmt.decode() if isinstance(fmt, bytes) else str(fmt)
        if fmt != "csr":
            x = sp.csr_matrix(sp.load_npz(path), dtype=np.float32)
            x.sum_duplicates()
            for a in range(0, x.shape[0], batch_points):
                b = min(a + batch_points, x.shape[0])
                yield (x.indptr[a:b + 1].astype(np.int64), x.indices[x.indptr[a]:x.indptr[b]].astype(np.int32),
                       x.data[x.indptr[a]:x.indptr[b]])
            return
        rows = int(np.lib.format.read_array(zf.open("shape.npy"))[0])
        if rows == 0:
            raise InvalidArgumentError(f"{path}: no data points (the matrix has no rows)")
        fp, (n_ptr,), dp = _npy_stream(zf, "indptr.npy")
        fi, (nnz,), di = _npy_stream(zf, "indices.npy")
        fv, (nnz_v,), dv = _npy_stream(zf, "data.npy")
        if n_ptr != rows + 1 or nnz != nnz_v:
            raise InvalidArgumentError(f"{path}: inconsistent CSR arrays")
        with fp, fi, fv:
            last = _take(fp, dp, 1, path).astype(np.int64)
            done = 0
            while done < rows:
                count = min(batch_points, rows - done)
                ptr = np.concatenate([last, _take(fp, dp, count, path).astype(np.int64)])
                if np.any(np.diff(ptr) < 0) or ptr[-1] > nnz:
                    raise InvalidArgumentError(f"{path}: indptr of rows {done}..{done + count} out of order")
                n = int(ptr[-1] - ptr[0])
                idx = _take(fi, di, n, path)
                bad = np.flatnonzero((idx < 0) | (idx >= n_features))
                if bad.size:
                    row = done + int(np.searchsorted(ptr, ptr[0] + bad[0], side="right")) - 1
                    raise InvalidArgumentError(f"{path}: row {row}: feature id {idx[bad[0]]} is past the model's "
                                               f"{n_features} features")
                yield ptr, idx.astype(np.int32), _take(fv, dv, n, path).astype(np.float32)
                last = ptr[-1:]
                done += count


def _source(X, batch_points: int, n_features: int):
    """What ``_native.xml_predict`` reads: a text path, an iterator of CSR blocks (``.npz``), a
    native ``FlashCsr``, or CSR arrays (a matrix in memory)."""
    import scipy.sparse as sp

    if isinstance(X, (str, os.PathLike)):
        path = os.fspath(X)
        if not path.endswith(".npz"):
            return path
        return _npz_blocks(path, batch_points, n_features)
    if isinstance(X, Csr):
        if X.col_ids is not None or X.row_ids is not None:
            raise InvalidArgumentError("a flash.Csr with row_ids / col_ids (ids past 2**32) has no feature ids a model knows")
        return X._m
    if not sp.issparse(X):
        X = sp.csr_matrix(np.atleast_2d(np.asarray(X, dtype=np.float32)))
    X = sp.csr_matrix(X, dtype=np.float32)
    X.sum_duplicates()
    return (np.ascontiguousarray(X.indptr, dtype=np.int64), np.ascontiguousarray(X.indices, dtype=np.int32),
            np.ascontiguousarray(X.data, dtype=np.float32))


def predict(model, X, k: int = 5, beam: int = 10, *, runtime: Runtime | None = None, batch_points: int = 8192,
            batches_in_flight: int = 4, max_chunk_bytes: int | None = None, out=None, collect: bool = True,
            progress=None, in_memory: bool = False) -> Predictions:
    """Top-``k`` labels of every point of ``X`` by the model file ``model``, with a beam of
    ``beam`` per tree. ``X``: a text file path (XC repository format or multi-label svmlight),
    a ``.npz`` path (scipy sparse) or a ``flash.Csr`` — all three read a batch at a time, so
    their size does not matter — or a scipy sparse matrix or numpy array (in memory). ``out``: also write ``label:score`` lines (one per point, best first) there,
    atomically. ``collect=False`` keeps no arrays (a stream of any length; use ``out``).
    ``progress(points_done, seconds)`` is called about every second from this thread.
    ``in_memory=True`` is the in-memory twin: every level is read into memory first (outside
    the runtime's budget; ``stats["load_seconds"]``), then scored with no IO."""
    if k < 1 or beam < 1 or batch_points < 1 or batches_in_flight < 1:
        raise InvalidArgumentError("k, beam, batch_points and batches_in_flight must be at least 1")
    rt = runtime or default_runtime()
    model = os.fspath(model)
    info = model_info(model)
    src = _source(X, batch_points, info.n_features)
    counters = _native.XmlProgress()
    result: dict = {}

    def work():
        try:
            result["value"] = _native.xml_predict(rt._rt, model, src, k, beam, batch_points, batches_in_flight,
                                                  max_chunk_bytes, None if out is None else os.fspath(out),
                                                  collect, counters, in_memory)
        except BaseException as e:  # re-raised in the caller's thread
            result["error"] = e

    t0 = time.perf_counter()
    if progress is None:
        work()
    else:
        thread = threading.Thread(target=work, name="scalefree-xml-predict", daemon=True)
        thread.start()
        while thread.is_alive():
            thread.join(1.0)
            progress(counters.points_done, time.perf_counter() - t0)
    if "error" in result:
        raise result["error"]
    d = result["value"]
    n = d["points"]
    if collect:
        labels = np.frombuffer(d.pop("labels"), dtype=np.uint32).reshape(n, k).astype(np.int64)
        labels[labels == 0xFFFFFFFF] = -1
        scores = np.frombuffer(d.pop("scores"), dtype=np.float32).reshape(n, k).copy()
    else:
        labels, scores = np.empty((0, k), np.int64), np.empty((0, k), np.float32)
    metrics = d.pop("metrics", None)
    return Predictions(labels=labels, scores=scores, metrics=metrics, stats=d)


def train(data, out, *, n_trees: int = 3, threads: int | None = None, loss: str = "hinge", max_depth: int = 20,
          min_branch_size: int = 100, cluster_k: int = 2, model_dir=None) -> ModelInfo:
    """Trains a Parabel model on ``data`` (XC repository text format) with omikuji (the
    ``xml`` extra: ``pip install omikuji``) and imports it to ``out``. ``model_dir`` keeps
    omikuji's own saved model there too (default: a temporary directory)."""
    try:
        import omikuji
    except ImportError as e:
        raise InvalidArgumentError("training needs omikuji (pip install 'scalefree[xml]' or pip install omikuji)") from e
    import tempfile

    hp = omikuji.Model.default_hyper_param()
    hp.n_trees = n_trees
    hp.max_depth = max_depth
    hp.min_branch_size = min_branch_size
    hp.cluster_k = cluster_k
    if loss not in ("hinge", "log"):
        raise InvalidArgumentError(f"loss must be 'hinge' or 'log', got {loss!r}")
    hp.linear_loss_type = (omikuji.LossType.LOG if loss == "log" else omikuji.LossType.HINGE).value
    m = omikuji.Model.train_on_data(os.fspath(data), hp, n_threads=threads)
    with tempfile.TemporaryDirectory(prefix="scalefree-omikuji-") as tmp:
        target = os.fspath(model_dir) if model_dir is not None else os.path.join(tmp, "model")
        m.save(target)
        return import_omikuji(target, out)

