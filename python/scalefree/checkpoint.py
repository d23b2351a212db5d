"""Checkpoints of long jobs, shared by every command that resumes (``mf train``, ``graph
pagerank``, ``graph diameter``, ``sgd logreg``, ...).

A checkpoint file is one ``.npz`` archive written through :func:`scalefree._atomic.atomic_path`
(a temporary file beside the target, renamed onto it), so a killed job leaves the previous one
whole. It holds a JSON ``meta`` record — a format version, the iteration, the options that
change the result and a fingerprint of the input, checked on resume (a mismatch is an
:class:`~scalefree.errors.InvalidArgumentError`, one line) — plus the arrays of the job's
state. State that lives on every rank is saved **one file per rank**, ``PATH.rank{r}-of-{w}``
(:func:`rank_path`); each rank keeps its previous file as ``.prev``, and on resume the ranks
agree on the newest iteration all of them have (:func:`load_rank`): a job killed while its
ranks write may leave them one checkpoint apart.

:class:`Checkpoints` runs the save/stop/resume plan of an iterative loop: every ``every``
iterations and at ``stop_after`` (a job in slices: stop there, with a checkpoint), and restores
the state on ``resume``.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import sys
from pathlib import Path

import numpy as np

from ._atomic import atomic_path
from .errors import InvalidArgumentError


def rank_path(path, rank: int, size: int) -> Path:
    """Rank ``rank``'s file of a ``size``-rank job's checkpoint ``path``."""
    path = Path(path)
    return path.with_name(f"{path.name}.rank{rank}-of-{size}")


def fingerprint(*arrays: bytes) -> str:
    """A short hash of some bytes (the input data, its ids and values)."""
    h = hashlib.blake2b(digest_size=16)
    for a in arrays:
        h.update(len(a).to_bytes(8, "little"))
        h.update(a)
    return h.hexdigest()


def files_fingerprint(paths) -> str:
    """A short hash of input files by absolute path, size and modification time (nanoseconds):
    cheap for inputs of any size; a file rewritten or replaced changes it."""
    parts = []
    for p in paths:
        st = os.stat(p)
        parts.append(f"{Path(p).resolve()}\0{st.st_size}\0{st.st_mtime_ns}".encode())
    return fingerprint(*parts)


def save(path, meta: dict, arrays: dict, version: int) -> None:
    """Writes ``meta`` (with ``version``) and ``arrays`` to ``path`` atomically."""
    doc = {"version": version, **meta}
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        np.savez(f, meta=np.frombuffer(json.dumps(doc).encode(), np.uint8), **arrays)


def load(path, expect: dict, version: int, kind: str) -> tuple[dict, dict]:
    """Reads a checkpoint of ``kind`` (a word for messages: "MF", "PageRank") and checks that
    its ``meta`` agrees with ``expect`` on every key of ``expect``; returns ``(meta, arrays)``."""
    path = Path(path)
    if not path.exists():
        raise InvalidArgumentError(f"checkpoint {path} does not exist (nothing to resume)")
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {name: z[name] for name in z.files}
        meta = json.loads(arrays.pop("meta").tobytes().decode())
    except (OSError, ValueError, KeyError) as e:
        raise InvalidArgumentError(f"checkpoint {path} is not a scalefree {kind} checkpoint ({e})") from None
    if meta.get("version") != version:
        raise InvalidArgumentError(f"checkpoint {path} has version {meta.get('version')}, this build reads {version}")
    bad = [f"{k} {meta.get(k)!r} (now {v!r})" for k, v in expect.items() if meta.get(k) != v]
    if bad:
        raise InvalidArgumentError(f"checkpoint {path} does not match this run: it has {'; '.join(bad)}")
    return meta, arrays


def save_rank(path, rank: int, size: int, meta: dict, arrays: dict, version: int) -> None:
    """Rank ``rank``'s checkpoint; its previous one is kept as ``.prev``."""
    p = rank_path(path, rank, size)
    if p.exists():
        os.replace(p, p.with_name(p.name + ".prev"))
    save(p, meta, arrays, version)


def load_rank(group, path, expect: dict, version: int, kind: str) -> tuple[dict, dict]:
    """Collective: this rank's part of the newest checkpoint every rank of ``group`` has (its
    latest file or the one before). An error on any rank is raised on every rank. ``group``
    None: a job of one process (its newest file)."""
    from .mf.shares import _agree

    if group is None:
        group = _OneProcess()
    p = rank_path(path, group.rank, group.size)
    have, err = {}, None
    try:
        for f in (p, p.with_name(p.name + ".prev")):
            if f.exists() or f == p:
                try:
                    meta, arrays = load(f, expect, version, kind)
                except InvalidArgumentError:
                    if f == p and p.with_name(p.name + ".prev").exists() and not p.exists():
                        continue  # killed between keeping the previous file and writing the new one
                    raise
                have[int(meta["iteration"])] = (meta, arrays)
    except InvalidArgumentError as e:
        err = e
    _agree(group, err)
    newest = group.allgather(np.array([max(have)], np.int64))[:, 0]
    agreed = int(newest.min())
    _agree(group, None if agreed in have else InvalidArgumentError(
        f"checkpoint {p} holds iterations {sorted(have)}, not iteration {agreed} that every rank has"))
    return have[agreed]


class _OneProcess:
    """The group of a job of one process (no collectives to agree with)."""

    rank, size = 0, 1

    @staticmethod
    def allgather(a):
        return np.asarray(a)[None]


class Plan:
    """When a multi-rank run (``rima``, ``dsgd-ps``) saves and stops, the same on every rank:
    ``ck`` is the run's checkpoint options (None: no checkpoints) with keys ``every``,
    ``stop_after`` and ``resume``; the run continues from iteration ``start`` of ``iters``."""

    def __init__(self, ck: dict | None, start: int, iters: int):
        self.ck, self.start, self.iters = ck, start, iters
        self.stop_at = iters
        if ck is not None and ck["stop_after"] is not None and start < iters:
            self.stop_at = min(iters, max(int(ck["stop_after"]), start + 1))

    def boundary(self, it: int, save) -> bool:
        """At the boundary after iteration ``it`` (after its validation, so that the file holds
        it): calls ``save(it)`` when a checkpoint is due; true when the run stops here."""
        if self.ck is not None and (it == self.stop_at or (self.ck["every"] and it % self.ck["every"] == 0)):
            save(it)
        return it == self.stop_at

    def finish(self, done: int, save) -> None:
        """After the loop: the end state of a run that trained to the last iteration."""
        if self.ck is not None and done == self.iters and self.start < self.iters:
            save(self.iters)


class Checkpoints:
    """The checkpoints of one iterative loop on every rank of ``group`` (one file per rank,
    ``rank_path(path, rank, size)``; ``group`` None: one process, ``PATH.rank0-of-1``):
    ``every`` iterations (0: only at ``stop_after``),
    and at ``stop_after`` (the loop then ends there: a job in slices). ``expect`` is the
    record a resumed run must match (the input's fingerprint and the options that change the
    result); ``kind`` and ``version`` name the format.

    In the loop::

        start, state = ck.restore()       # collective; (0, None) unless resuming
        for it in range(start + 1, ...):
            ...one iteration...
            if ck.after(it, lambda: {...arrays...}):
                break                     # stopped at stop_after, checkpoint written
    """

    def __init__(self, group, path, *, every: int = 0, stop_after: int | None = None, resume: bool = False,
                 expect: dict, kind: str, version: int = 1):
        self.group, self.path = group or _OneProcess(), Path(path)
        self.every, self.stop_after, self.resume = int(every), stop_after, bool(resume)
        self.expect = {**expect, "ranks": self.group.size}
        self.kind, self.version = kind, version
        self.stopped = False  # true once the loop stopped at stop_after
        self.saved_s = []  # seconds per checkpoint written by this rank
        self.saved_bytes = 0  # size of this rank's last checkpoint file

    def restore(self) -> tuple[int, dict | None]:
        """Collective: ``(iteration, arrays)`` of the newest checkpoint every rank has when
        resuming, else ``(0, None)``; a checkpoint of other data or options is an error on
        every rank. Resuming where no rank finds a file of ``PATH`` (of any rank count) starts
        from the beginning, so that a job restarted with the same command line (``--resume``
        from the start) works before its first checkpoint."""
        if not self.resume:
            return 0, None
        mine = rank_path(self.path, self.group.rank, self.group.size)
        here = self.path.parent if str(self.path.parent) else Path(".")
        found = mine.exists() or mine.with_name(mine.name + ".prev").exists() or any(
            here.glob(f"{glob.escape(self.path.name)}.rank*-of-*"))
        if not self.group.allgather(np.array([int(found)], np.int64)).any():
            if self.group.rank == 0:
                print(f"no checkpoint {self.path} yet: starting from the beginning", file=sys.stderr, flush=True)
            return 0, None
        meta, arrays = load_rank(self.group, self.path, {**self.expect, "rank": self.group.rank},
                                 self.version, self.kind)
        return int(meta["iteration"]), arrays

    def after(self, it: int, state) -> bool:
        """After iteration ``it``: saves ``state()`` (a dict of arrays) when due; true when the
        loop stops here (``stop_after``)."""
        stop = self.stop_after is not None and it >= self.stop_after
        if stop or (self.every and it % self.every == 0):
            self.save(it, state())
        self.stopped = stop
        return stop

    def save(self, it: int, arrays: dict) -> None:
        """This rank's file of iteration ``it``."""
        import time

        t0 = time.perf_counter()
        g = self.group
        save_rank(self.path, g.rank, g.size, {**self.expect, "rank": g.rank, "iteration": int(it)}, arrays,
                  self.version)
        self.saved_s.append(time.perf_counter() - t0)
        self.saved_bytes = rank_path(self.path, g.rank, g.size).stat().st_size
