"""Matrix factorization R ≈ P Qᵀ by SGD (``scalefree mf``; the Rima paper, eqs. 3–7).

``MatrixFactorization(k=40, mode="local").fit(data)`` trains on one machine with
multi-threaded FPSGD-style block scheduling (the Rust crate ``scalefree-mf``). ``data`` is a
rating file (MovieLens ``u.data`` / ``ratings.dat`` / ``ratings.csv``, LIBMF text, Matrix
Market, gzip of each) or a ``(users, items, ratings)`` triple of arrays. Ids are kept as the
user gave them; ``predict`` answers in those ids (unknown ids get the training mean).

The multi-rank modes run on every rank of a job (``scalefree run -n 4`` or
``scalefree mf train DATA --mode rima -n 4``). Given native ratings (``split_ratings``) every
rank holds all of them; given a file path or ``split_ratings_partitioned`` (what the CLI uses)
each rank reads only its share and keeps only the blocks it trains (``mf_shares``):

* ``rima`` (``mf/modes/rima.py``): ring model parallelism, every rank a worker, one factor block
  passed to the successor per step;
* ``dsgd-ps`` (``mf/modes/dsgd_ps.py``): rank 0 is a parameter server, the others pull and push
  both factor blocks every step.

After ``fit`` rank 0 holds the model; ``history[-1]`` has the bytes each worker sent.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import numpy as np

import scalefree

from .. import _native
from .._cores import usable_cores
from .._rss import peak_rss_bytes
from ..errors import DataError, InvalidArgumentError
from . import fold_in as mf_fold_in
from . import libmf
from .data import checkpoint as mf_ckpt
from .data import shares as mf_shares
from .data import stream as mf_stream
from .data.preload import parse_bytes
from .data.shares import ShareRatings
from .data.stream import StreamedRatings, StreamedTest, default_cache_dir
from .modes import dsgd_ps as mf_dsgd_ps
from .modes import local as mf_local
from .modes import rima as mf_rima

MODES = ("local", "rima", "dsgd-ps")
BUDGET_MODES = MODES  # modes that take a memory_budget (the blocks on flash)


def load_ratings(data, cache: bool = True, delimiter: str | None = None, header: str = "auto",
                 columns=None) -> "_native.MfRatings":
    """A rating file path, a (users, items, ratings) triple of arrays, or a table (pandas,
    polars, pyarrow, a 2-D array, a scipy sparse matrix: :mod:`scalefree._tables`) → native
    ratings. A part directory (Spark, Dask, Hive), a ``delimiter`` (tab, space, comma,
    semicolon; default detected) or a ``header`` rule other than ``auto`` read the file
    through the partitioned text reader (``_native.read_ratings_share``). Parquet and Arrow
    IPC files (or directories of their parts) are read by ``scalefree._columnar``;
    ``columns``: the user, item and rating columns of those or of a table, by name."""
    if isinstance(data, _native.MfRatings):
        return data
    from .. import _columnar, _tables

    if isinstance(data, (StreamedRatings, ShareRatings)):
        return data  # read by the ranks as they partition it (mf_stream, mf_shares)
    if isinstance(data, (str, os.PathLike)):
        parts = _columnar.columnar_parts(data)
        if parts is not None:
            data = _columnar.read_share(parts, 0, 1, "ratings", columns)
        elif os.path.isdir(data) or delimiter is not None or header != "auto":
            data = _native.read_ratings_share(str(data), 0, 1, delimiter=delimiter, header=header)
        else:
            return _native.MfRatings.load(str(data), str(default_cache_dir()) if cache else None)
    elif _tables.is_table(data):
        data = _tables.table_columns(data, (_tables.ID, _tables.ID, _tables.NUMBER), columns, "ratings")
    users, items, ratings = data
    u = np.ascontiguousarray(users, dtype=np.int64)
    i = np.ascontiguousarray(items, dtype=np.int64)
    r = np.ascontiguousarray(ratings, dtype=np.float32)
    if (u < 0).any() or (i < 0).any():
        raise InvalidArgumentError("user and item ids must be non-negative")
    return _native.MfRatings.from_bytes(u.tobytes(), i.tobytes(), r.tobytes())


def default_blocks(mode: str, workers: int, slack: int | None = None) -> int:
    """Blocks per side of ``rima`` and ``dsgd-ps`` when ``blocks`` is not given: rima 2w
    (its second block pair per step trains while the first one's moving block is sent), but w
    with a positive slack — a stale step trains on the copy of a block from its last lap through
    the rank, and a lap of 2w steps leaves that copy twice as far behind (``rima_ssp``;
    ``docs/benchmarks/ssp.md``); dsgd-ps w."""
    return 2 * workers if mode == "rima" and not slack else workers


def default_threads() -> int:
    """The cores this process may run on (its CPU affinity), at least 1."""
    return usable_cores()


class _Bar:
    """Iteration progress on stderr (:func:`scalefree._progress.bar`: tqdm with ETA on a
    terminal, nothing in a log file)."""

    def __init__(self, total: int, enabled: bool):
        from .._progress import bar

        self.done = 0
        self.bar = bar(total, "mf", " it", show=enabled and sys.stderr.isatty())

    def update(self, n: int, msg: str) -> None:
        self.bar.set_postfix_str(msg, refresh=False)
        self.bar.update(n - self.done)
        self.done = n
        if n >= self.bar.total:
            self.bar.close()


class MatrixFactorization:
    """SGD matrix factorization.

    k: rank; eta: learning rate; lam: L2 regularisation λ; iterations: epochs;
    schedule: ``"adagrad"`` (per-row adaptive step, LIBMF's rule) or ``"constant"`` (the
    paper's plain SGD); threads: worker threads; blocks: blocks per side (local: default max(20, 2·threads + 1));
    init_max: factors start uniform in [0, init_max] (default 1/√k); seed;
    slack (``rima`` only): bounded staleness — a worker may train up to ``slack`` steps ahead
    of its predecessor on its copy of the block still owed, merged by delta when the block comes
    (``mf/modes/rima_ssp.py``; 0 is synchronous, the same result as None); a positive slack
    cuts R into w × w blocks unless ``blocks`` says otherwise (2w × 2w without); straggler_ms
    (with ``slack``, for benchmarks): before each ring step one seeded-random rank sleeps up to
    this many ms (``scalefree.ssp.straggler``).
    memory_budget (``rima``, ``dsgd-ps``, ``local``): bytes (or ``"64M"``) of rating blocks a
    rank (``local``: the process) may hold — the blocks stay on flash in an anonymous file in
    ``block_dir`` (default: the temp directory; ``local``: the flash runtime's scratch
    directory) and the flash runtime's program cache reads them ahead in schedule order
    (``mf_preload``; ``local``: the grid's pass order); same result as in memory. Given a file
    path (or ``split_ratings_streamed``) rather than loaded ratings, the set-up of ``rima`` is
    streamed too and no rank ever holds all ratings (``mf_stream``).
    normalize (default on, every mode): train on ratings divided by their standard
    deviation s with λ divided by s, as LIBMF does (the same objective on the raw ratings;
    predictions are scaled back; in ``rima`` / ``dsgd-ps`` s is over all ranks' ratings).
    In every mode ``adagrad`` is LIBMF's rule: two AdaGrad
    accumulators per row (the first 8 lanes and the rest) and a first pass over the first 8
    lanes only; in ``local`` mode blocks default to max(20, 2·threads + 1) per side, sorted as LIBMF sorts them.
    threads: default all cores this process may use (``os.sched_getaffinity``).
    """

    def __init__(self, k: int = 40, mode: str = "local", *, eta: float = 0.1, lam: float = 0.05,
                 iterations: int = 20, schedule: str = "adagrad", threads: int | None = None,
                 blocks: int | None = None, init_max: float | None = None, seed: int = 0,
                 memory_budget: int | str | None = None, block_dir: str | os.PathLike | None = None,
                 normalize: bool | None = None, slack: int | None = None, straggler_ms: float = 0.0):
        if mode not in MODES:
            raise InvalidArgumentError(f"mode {mode!r} is not available; have {', '.join(MODES)}")
        self.normalize = True if normalize is None else bool(normalize)
        if memory_budget is not None:
            if mode not in BUDGET_MODES:
                raise InvalidArgumentError(f"memory_budget is for modes {', '.join(BUDGET_MODES)} (their block "
                                           f"schedules tell which blocks to read ahead); mode {mode!r} keeps R in memory")

            memory_budget = parse_bytes(memory_budget)
        self.memory_budget, self.block_dir = memory_budget, block_dir
        if slack is not None and (mode != "rima" or int(slack) < 0):
            raise InvalidArgumentError(f"slack is for mode 'rima' and at least 0 (got {slack!r} in mode {mode!r})")
        self.slack = None if slack is None else int(slack)
        self.straggler_ms = float(straggler_ms)
        self.k, self.mode, self.eta, self.lam = int(k), mode, float(eta), float(lam)
        self.iterations, self.schedule, self.seed = int(iterations), schedule, int(seed)
        self.threads = int(threads) if threads else default_threads()
        self.blocks, self.init_max = blocks, init_max
        self.history: list[dict] = []
        self.rank = 0
        self._model = None
        self.test_unseen: dict | None = None

    _PARAMS = ("k", "mode", "eta", "lam", "iterations", "schedule", "threads", "blocks", "init_max", "seed",
               "memory_budget", "block_dir", "normalize", "slack", "straggler_ms")

    def get_params(self, deep: bool = True) -> dict:
        """The constructor's arguments (scikit-learn style)."""
        return {name: getattr(self, name) for name in self._PARAMS}

    def set_params(self, **params) -> "MatrixFactorization":
        """Changes constructor arguments (checked as the constructor checks them)."""
        bad = sorted(set(params) - set(self._PARAMS))
        if bad:
            raise InvalidArgumentError(f"unknown parameter(s) {', '.join(bad)}; have {', '.join(self._PARAMS)}")
        merged = {**self.get_params(), **params}
        if "mode" in params and "normalize" not in params:
            merged["normalize"] = None  # the new mode's default
        self.__init__(**merged)
        return self

    def score(self, data) -> float:
        """Negative RMSE on ``data`` (a rating file, a (users, items, ratings) triple or native
        ratings), its ids mapped through the model's; higher is better (scikit-learn style)."""
        return -self.evaluate(data)["rmse"]

    def evaluate(self, data) -> dict:
        """RMSE, MAE, count and unseen-id counts of the model's predictions on ``data`` (same
        forms as ``fit``'s), matched by the original ids."""
        r = load_ratings(data, cache=False) if not isinstance(data, _native.MfRatings) else data
        u, i, v = (np.frombuffer(b, dt) for b, dt in zip(r.triples(), (np.int64, np.int64, np.float32)))
        pred = self.predict(u, i)
        known = np.frombuffer(self._need().known(u.tobytes(), i.tobytes()), np.uint8)
        err = pred.astype(np.float64) - v
        n = len(v)
        return {"n": n, "rmse": float(np.sqrt(np.mean(err ** 2))) if n else float("nan"),
                "mae": float(np.mean(np.abs(err))) if n else float("nan"), "unknown": int(n - known.sum())}

    def fit(self, data, test=None, *, progress: bool = False, on_iteration=None, eval_every: int = 1,
            validation_fraction: float = 0.0, patience: int | None = None, checkpoint=None,
            checkpoint_every: int = 0, resume: bool = False, stop_after: int | None = None):
        """Train on ``data``; ``test`` (a rating file, a (users, items, ratings) triple or native
        ratings; ids matched to the training ids, unseen ids counted in ``test_unseen`` and
        answered with the mean) is evaluated every ``eval_every`` epochs (0: after the last
        only; in rima the blocks are gathered on rank 0 for it).
        ``on_iteration(record)`` gets each history record (iteration, train_mse, test_rmse, seconds).
        ``validation_fraction`` holds a seeded share of the training ratings out as a
        validation set (RMSE in ``valid_rmse`` after every epoch; ``rima`` / ``dsgd-ps``: given
        the ratings as a file, each rank keeps the share it read); with ``patience`` the
        training stops once that many epochs in a row did not improve it, and the model is
        the best epoch's.
        ``checkpoint`` (a path): the training state is written there atomically every
        ``checkpoint_every`` iterations (0: only at the end) and at the end (``mf/data/checkpoint.py``;
        in ``rima`` one file per rank beside it). ``resume=True`` continues from that checkpoint,
        which must come from the same data and hyperparameters (``iterations`` may differ): the
        result equals an uninterrupted run's (exactly in ``local`` with one thread).
        ``stop_after``: end after that many iterations in all, with a checkpoint (a job cut into
        time slices; the model is the one reached so far)."""
        if (resume or checkpoint_every or stop_after) and checkpoint is None:
            raise InvalidArgumentError("resume, checkpoint_every and stop_after need a checkpoint path")
        if checkpoint_every < 0 or (stop_after is not None and stop_after < 1):
            raise InvalidArgumentError("checkpoint_every must be >= 0 and stop_after >= 1")
        ckpt = None if checkpoint is None else {"path": checkpoint, "every": int(checkpoint_every),
                                                "resume": bool(resume), "stop_after": stop_after}

        if isinstance(data, (str, os.PathLike)) and self.mode != "local":
            data = ShareRatings(data, 0.0, self.seed)  # every rank reads its share (mf_shares)
        train = load_ratings(data)
        test_r = None
        if isinstance(train, ShareRatings):
            if isinstance(test, (str, os.PathLike)) and train.test_path is None and not train.test_fraction:
                train.test_path = Path(test)  # a test file: each rank reads its share (mf_shares)
                test = train.test
            if test is not None and test is not train.test:
                raise InvalidArgumentError("pass test as a file path or the second half of "
                                           "split_ratings_partitioned(...)")
            test_r = None if test is None else train.test
        elif isinstance(train, StreamedRatings):
            if test is not None and test is not train.test:
                raise InvalidArgumentError("pass test as the second half of split_ratings_streamed(...) so ids agree")
            test_r = None if test is None else train.test
        elif test is not None:
            # Any form (path, triple, native ratings): mapped through the training ids, so two
            # separately numbered sets never mix; ids unseen in training get the mean.
            test_r = test if isinstance(test, _native.MfRatings) else load_ratings(test)
            if not test_r.shares_ids_with(train):
                test_r, (uu, ui, ur) = test_r.align_to(train)
                self.test_unseen = {"users": uu, "items": ui, "ratings": ur}
            else:
                self.test_unseen = None
        if self.mode != "local":
            return self._fit_ranks(train, test_r, progress, eval_every, ckpt, validation_fraction, patience)
        expect = None
        if ckpt is not None:
            expect = {"mode": "local", "k": self.k, "eta": self.eta, "lam": self.lam, "schedule": self.schedule,
                      "blocks": self.blocks or max(20, 2 * self.threads + 1), "seed": self.seed,
                      "init_max": self.init_max, "normalize": self.normalize,
                      "validation_fraction": float(validation_fraction), "data": mf_ckpt.fingerprint(*train.triples())}
        valid = None
        if validation_fraction:
            if not 0 < validation_fraction < 1:
                raise InvalidArgumentError(f"validation_fraction must be in (0, 1), got {validation_fraction}")
            train, valid = train.split(float(validation_fraction), self.seed + 1)
        if patience is not None and (valid is None or patience < 1):
            raise InvalidArgumentError("patience needs a validation_fraction and must be at least 1")
        self.history, self.stopped_at, self._model = mf_local.train(
            train, valid, test_r, k=self.k, eta=self.eta, lam=self.lam, schedule=self.schedule, threads=self.threads,
            blocks=self.blocks, seed=self.seed, init_max=self.init_max, normalize=self.normalize,
            memory_budget=self.memory_budget, block_dir=self.block_dir,
            iterations=self.iterations, patience=patience, eval_every=eval_every, ckpt=ckpt, expect=expect,
            on_iteration=on_iteration, bar=_Bar(self.iterations, progress))
        return self

    def _fit_ranks(self, train, test_r, progress: bool = False, eval_every: int = 0, ckpt: dict | None = None,
                   validation_fraction: float = 0.0, patience: int | None = None):
        """``rima`` / ``dsgd-ps`` on the ranks of this job (every rank calls fit)."""
        t_fit = time.perf_counter()

        if self.schedule not in ("adagrad", "constant"):
            raise InvalidArgumentError(f"schedule must be 'adagrad' or 'constant', got {self.schedule!r}")
        group = scalefree.init()
        run = mf_rima.train if self.mode == "rima" else mf_dsgd_ps.train
        w = group.size if self.mode == "rima" else group.size - 1
        allowed = (2 * w, w) if self.mode == "rima" else (w,)
        nb = default_blocks(self.mode, w, self.slack) if self.blocks is None else int(self.blocks)
        if w >= 1 and nb not in allowed:
            raise InvalidArgumentError(f"{self.mode} with {w} workers cuts R into "
                                       f"{' or '.join(f'{b} x {b}' for b in allowed)} blocks, not {nb} x {nb}")
        opts = dict(k=self.k, eta=self.eta, lam=self.lam, schedule=self.schedule, iterations=self.iterations,
                    seed=self.seed, init_max=self.init_max, blocks_per_worker=max(1, nb // max(w, 1)),
                    normalize=self.normalize,
                    t_start=getattr(self, "_t_start", None) or t_fit)
        if self.memory_budget is not None:
            opts.update(memory_budget=self.memory_budget, block_dir=self.block_dir)
        if self.slack is not None:
            opts.update(slack=self.slack, straggler_ms=self.straggler_ms)
        shared = isinstance(train, ShareRatings)
        self.stopped_at = None
        if validation_fraction or patience is not None:
            if not 0 < validation_fraction < 1 or (patience is not None and patience < 1):
                raise InvalidArgumentError("validation_fraction must be in (0, 1) and patience at least 1")
            if not shared:
                raise InvalidArgumentError(f"a validation split in mode {self.mode!r} needs the ratings as a file "
                                           f"(a path or split_ratings_partitioned), read in shares by the ranks")
            train.valid_fraction = float(validation_fraction)
            opts["validate"] = lambda p, q: train.valid_rmse(group, p, q)  # collective, same on every rank
            opts["patience"] = patience
        if ckpt is not None:
            if isinstance(train, _native.MfRatings):
                data = mf_ckpt.fingerprint(*train.triples())
            else:  # read by the ranks in shares: the file's name and size and the split
                data = (f"{Path(train.path).name}:{os.path.getsize(train.path)}:"
                        f"{getattr(train, 'test_fraction', '')}:{getattr(train, 'seed', '')}")
            expect = {"mode": self.mode, "k": self.k, "eta": self.eta, "lam": self.lam, "schedule": self.schedule,
                      "blocks": nb, "seed": self.seed, "init_max": self.init_max, "data": data,
                      "normalize": self.normalize,
                      "validation_fraction": float(validation_fraction)}
            opts["checkpoint"] = {**ckpt, "expect": expect}
        bar = _Bar(self.iterations, progress and group.rank == 0)
        opts["on_iteration"] = lambda done: bar.update(done, f"{self.mode}, {w} workers")
        if test_r is not None and eval_every:
            k = self.k
            opts["eval_every"] = eval_every
            if shared:  # every rank scores its own test share (collective)
                opts["evaluate"] = lambda p, q: train.test_rmse(group, p, q)
                opts["evaluate_collective"] = True
            else:
                opts["evaluate"] = lambda p, q: _model_of(train, k, p, q).rmse(_native_test(test_r))
        res = run(group, train, opts)
        self.rank = group.rank
        if shared:
            self.test_unseen = train.test_unseen  # a test file's ids unseen in training (else None)
        final_rmse = None
        if shared and test_r is not None:
            final_rmse = train.test_rmse(group, res.get("p"), res.get("q"))
        end_rss = group.allgather(np.array([peak_rss_bytes()], np.int64))[:, 0] if shared else None
        if group.rank != 0:
            self.history = [{"rank": group.rank, "bytes_sent": res["bytes_sent"], "seconds": res["seconds"]}]
            return self
        self._model = _model_of(train, self.k, res["p"], res["q"])
        done = res.get("iterations_done", self.iterations)
        self.history = [{"iteration": it + 1, "train_mse": mse} for it, mse in enumerate(res["train_mse"][:done])]
        for name in ("rating_bytes_resident", "peak_rss_bytes", "preload_wait_seconds"):
            for rec, per_worker in zip(self.history, res.get(name, ())):
                rec[name] = per_worker  # one value per worker
        for name in ("memory_budget", "rating_bytes", "setup_peak_rss_bytes", "setup_seconds", "preload_read_seconds",
                     "preload_loader_cpu_seconds", "preload_direct_io", "bytes_read"):
            if name in res:
                self.history[-1][name] = res[name]
        for it, v in res.get("valid_rmse", ()):
            self.history[it - 1]["valid_rmse"] = v
        self.stopped_at = res.get("stopped_at")
        for it, rmse, secs in res["evals"]:
            self.history[it - 1].update(test_rmse=rmse, seconds=secs)
        last = self.history[-1]
        last.update(seconds=res["seconds"], workers=res["workers"], blocks_per_side=res.get("blocks_per_side", res["workers"]), connections=res["connections"],
                    bytes_sent=res["bytes_sent"], bytes_received=res["bytes_received"],
                    comm_seconds=res["comm_seconds"])
        # Measured at the transport (scalefree._traffic); the blocks alone as the steps sent them.
        for name in ("connected_to", "operations", "block_bytes_sent", "block_bytes_received", "server_bytes_sent",
                     "server_connections", "slack", "stale_steps", "wait_seconds"):
            if name in res:
                last[name] = res[name]
        if shared:
            last.update(train.stats)
            last["peak_rss_bytes_end"] = [int(x) for x in end_rss]  # per rank, set-up and training
            if test_r is not None:
                last["test_rmse"] = final_rmse
        elif test_r is not None:
            last["test_rmse"] = self._model.rmse(_native_test(test_r))
        return self

    def _need(self):
        if self._model is None:
            raise InvalidArgumentError("model is not trained; call fit() or load() first")
        return self._model

    def predict(self, users, items) -> np.ndarray:
        u = np.ascontiguousarray(users, dtype=np.int64)
        i = np.ascontiguousarray(items, dtype=np.int64)
        return np.frombuffer(self._need().predict(u.tobytes(), i.tobytes()), dtype=np.float32)

    def rmse(self, ratings) -> float:
        """RMSE on native ratings sharing the training id maps (the test half of a split)."""
        return self._need().rmse(ratings)

    def fold_in(self, data, side: str = "user", lam: float | None = None, columns=None, delimiter: str | None = None,
                header: str = "auto") -> dict:
        """Adds factors for the users (``side="item"``: items) that ``data`` rates (a rating
        file, a (users, items, ratings) triple or native ratings) without retraining: each row
        is a ridge solve against the fixed other side (``mf/fold_in.py``); λ defaults to this
        model's ``lam``. Rows already in the model are solved again from ``data`` alone.
        ``columns``, ``delimiter``, ``header``: as :func:`load_ratings` (Parquet columns, text
        dialect). Returns counts (rows, new rows, ratings used / ignored)."""
        r = data if isinstance(data, _native.MfRatings) else load_ratings(data, cache=False, delimiter=delimiter,
                                                                           header=header, columns=columns)
        u, i, v = (np.frombuffer(b, dt) for b, dt in zip(r.triples(), (np.int64, np.int64, np.float32)))
        self._model, stats = mf_fold_in.fold_in(self._need(), u, i, v, self.lam if lam is None else float(lam), side)
        return stats

    def save(self, path, format: str = "native") -> None:
        """Write the model atomically (temp file + rename): ``format="native"`` (ours, every id
        kept) or ``"libmf"`` (LIBMF's text model, rows indexed by id; ``mf/libmf.py``)."""
        if format == "libmf":
            libmf.write_model(self._need(), path)
        elif format == "native":
            self._need().save(str(path))
        else:
            raise InvalidArgumentError(f"format must be 'native' or 'libmf', got {format!r}")

    @classmethod
    def load(cls, path, format: str = "auto") -> "MatrixFactorization":
        """A saved model: ours, or LIBMF's text model (``format="auto"`` tells them by the
        first line, ``f <loss>`` in LIBMF's; ``"native"`` / ``"libmf"`` insist)."""
        if format not in ("auto", "native", "libmf"):
            raise InvalidArgumentError(f"format must be 'auto', 'native' or 'libmf', got {format!r}")
        if format == "libmf" or (format == "auto" and libmf.is_libmf_model(path)):
            m = libmf.read_model(path)
        else:
            try:
                m = _native.MfModel.load(str(path))
            except DataError as e:
                if format == "auto" and "bad header" in str(e):
                    raise DataError(f"{e} (nor LIBMF's text model, whose first line is 'f <loss>')") from None
                raise
        obj = cls(k=m.k)
        obj._model = m
        return obj


def split_ratings(data, test_fraction: float = 0.1, seed: int = 0, delimiter: str | None = None, header: str = "auto",
                  columns=None):
    """Seeded random split → (train, test) native ratings sharing id maps. ``data``: what
    :func:`load_ratings` takes (a file, arrays or a table; ``columns`` by name)."""
    return load_ratings(data, delimiter=delimiter, header=header, columns=columns).split(float(test_fraction), int(seed))


def split_ratings_streamed(path, test_fraction: float = 0.1, seed: int = 0):
    """The same split of a rating file (or rating cache) as :func:`split_ratings`, never
    loaded as a whole: for ``mode="rima"`` with a ``memory_budget``, whose ranks then read it a
    chunk at a time while cutting their blocks (``mf_stream``). The test half is in memory
    on rank 0 after ``fit``."""
    return mf_stream.split(path, test_fraction, seed)


def split_ratings_partitioned(path, test_fraction: float = 0.1, seed: int = 0, delimiter: str | None = None,
                              header: str = "auto", columns=None, test_file=None):
    """``(train, test)`` of a rating file for ``mode="rima"`` / ``"dsgd-ps"``, read by the ranks
    in ``fit``, each rank only its share of the file; the split is a seeded hash of (user, item),
    the same for any number of ranks (``mf_shares``). No rank ever holds all ratings, with or
    without a ``memory_budget``; each rank keeps its own test share and the test RMSE is summed
    over the ranks. ``path`` may be a part directory; ``delimiter``/``header`` as
    :func:`load_ratings`; ``columns``: the user, item and rating columns of a Parquet /
    Arrow IPC input, by name. ``test_file``: test on that file instead (``test_fraction`` 0;
    each rank reads its share; ids matched to the training file's, unseen ones counted in
    ``test_unseen`` and answered with the mean)."""
    return mf_shares.split(path, test_fraction, seed, delimiter, header, columns, test_file)


def _model_of(train, k: int, p, q):
    """The native model of factors p, q with ``train``'s id maps, mean and seen ids."""
    if isinstance(train, (StreamedRatings, ShareRatings)):
        return train.model(k, p, q)
    return _native.MfModel.from_factors(train, k, p.tobytes(), q.tobytes())


def _native_test(test):

    return test.ratings if isinstance(test, StreamedTest) else test
