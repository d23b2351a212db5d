"""Checkpoints of an MF training run (``fit(..., checkpoint=PATH, checkpoint_every=N, resume=True)``).

A checkpoint is one ``.npz`` archive written through :func:`scalefree._atomic.atomic_path`
(temporary file beside the target, renamed onto it), so a killed job leaves the previous
checkpoint whole. It holds a JSON ``meta`` record — the hyperparameters and a fingerprint of the
training data, checked on resume (a mismatch is an :class:`InvalidArgumentError`) — plus the
arrays of the mode's state:

* ``local``: the trainer's padded P and Q rows, the AdaGrad accumulators, the block
  scheduler's run counts and the epochs done (each epoch's thread RNGs derive from the seed
  and that count), the history so far and, with ``patience``, the best model;
* ``rima``: **one file per rank**, ``PATH.rank{r}-of-{w}`` (:func:`rank_path`): the factor
  blocks (with their AdaGrad accumulators) the rank holds at the iteration boundary, its SGD
  RNG state and its losses so far; which blocks it holds follows from the iteration count and
  the seed. Nothing is gathered for a checkpoint.
* ``dsgd-ps``: one file per rank too: the server's holds all of P and Q (it has them between
  steps), a worker's its SGD RNG state and losses.

Every rank saves (and, with ``stop_after``, stops) at the same iteration boundaries. A job
killed while its ranks write may leave them one checkpoint apart (the ring and the server keep
the ranks within one iteration of each other), so each rank keeps its previous file too
(``...rank{r}-of-{w}.prev``) and on resume the ranks agree on the newest iteration all of them
have (:func:`load_rank`).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np

from .._atomic import atomic_path
from ..errors import InvalidArgumentError

VERSION = 2  # 2: rima/dsgd-ps blocks hold two AdaGrad accumulators per row (LIBMF's update)


def rank_path(path, rank: int, size: int) -> Path:
    """Rank ``rank``'s file of a ``size``-rank job's checkpoint ``path``."""
    path = Path(path)
    return path.with_name(f"{path.name}.rank{rank}-of-{size}")


def nothing_to_resume(path) -> bool:
    """True when a job that ``scalefree run --max-restarts`` started (``SCALEFREE_RESTART_COUNT``
    set) finds no checkpoint ``path`` at all (neither the file nor any rank's): it is the job's
    first start, or it died before its first checkpoint, so ``resume`` starts at the beginning.
    Every rank decides alike: none can write a checkpoint before all have started training."""
    if os.environ.get("SCALEFREE_RESTART_COUNT") is None:
        return False
    p = Path(path)
    return not p.exists() and not any(f.name.startswith(p.name + ".rank") for f in p.parent.glob("*"))


def fingerprint(*arrays: bytes) -> str:
    """A short hash of the training data (ids and ratings as bytes)."""
    h = hashlib.blake2b(digest_size=16)
    for a in arrays:
        h.update(len(a).to_bytes(8, "little"))
        h.update(a)
    return h.hexdigest()


def save(path, meta: dict, arrays: dict) -> None:
    """Writes ``meta`` and ``arrays`` to ``path`` atomically."""
    doc = {"version": VERSION, **meta}
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        np.savez(f, meta=np.frombuffer(json.dumps(doc).encode(), np.uint8), **arrays)


def load(path, expect: dict) -> tuple[dict, dict]:
    """Reads a checkpoint and checks that its ``meta`` agrees with ``expect`` on every key of
    ``expect``; returns ``(meta, arrays)``."""
    path = Path(path)
    if not path.exists():
        raise InvalidArgumentError(f"checkpoint {path} does not exist (nothing to resume)")
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {name: z[name] for name in z.files}
        meta = json.loads(arrays.pop("meta").tobytes().decode())
    except (OSError, ValueError, KeyError) as e:
        raise InvalidArgumentError(f"checkpoint {path} is not a scalefree MF checkpoint ({e})") from None
    if meta.get("version") != VERSION:
        raise InvalidArgumentError(f"checkpoint {path} has version {meta.get('version')}, this build reads {VERSION}")
    bad = [f"{k} {meta.get(k)!r} (now {v!r})" for k, v in expect.items() if meta.get(k) != v]
    if bad:
        raise InvalidArgumentError(f"checkpoint {path} does not match this run: it has {'; '.join(bad)}")
    return meta, arrays


def save_rank(path, rank: int, size: int, meta: dict, arrays: dict) -> None:
    """Rank ``rank``'s checkpoint; its previous one is kept as ``.prev``."""
    p = rank_path(path, rank, size)
    if p.exists():
        os.replace(p, p.with_name(p.name + ".prev"))
    save(p, meta, arrays)


def load_rank(group, path, expect: dict) -> tuple[dict, dict]:
    """Collective: this rank's part of the newest checkpoint every rank of ``group`` has (its
    latest file or the one before). An error on any rank is raised on every rank."""
    from .shares import _agree

    p = rank_path(path, group.rank, group.size)
    have, err = {}, None
    try:
        for f in (p, p.with_name(p.name + ".prev")):
            if f.exists() or f == p:
                try:
                    meta, arrays = load(f, expect)
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
