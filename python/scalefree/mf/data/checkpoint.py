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

The file format and the per-rank protocol are :mod:`scalefree.checkpoint`'s (shared by every
resumable command).
"""

from __future__ import annotations

import os
from pathlib import Path

from ... import checkpoint as _shared
from ...checkpoint import Plan, fingerprint, rank_path  # noqa: F401  (the MF modes use them from here)

VERSION = 2  # 2: rima/dsgd-ps blocks hold two AdaGrad accumulators per row (LIBMF's update)


def nothing_to_resume(path) -> bool:
    """True when a job that ``scalefree run --max-restarts`` started (``SCALEFREE_RESTART_COUNT``
    set) finds no checkpoint ``path`` at all (neither the file nor any rank's): it is the job's
    first start, or it died before its first checkpoint, so ``resume`` starts at the beginning
    (as :meth:`scalefree.checkpoint.Checkpoints.restore` does for the other commands). Every
    rank decides alike: none can write a checkpoint before all have started training."""
    if os.environ.get("SCALEFREE_RESTART_COUNT") is None:
        return False
    p = Path(path)
    return not p.exists() and not any(f.name.startswith(p.name + ".rank") for f in p.parent.glob("*"))


def save(path, meta: dict, arrays: dict) -> None:
    """Writes ``meta`` and ``arrays`` to ``path`` atomically."""
    _shared.save(path, meta, arrays, VERSION)


def load(path, expect: dict) -> tuple[dict, dict]:
    """Reads a checkpoint and checks that its ``meta`` agrees with ``expect`` on every key of
    ``expect``; returns ``(meta, arrays)``."""
    return _shared.load(path, expect, VERSION, "MF")


def save_rank(path, rank: int, size: int, meta: dict, arrays: dict) -> None:
    """Rank ``rank``'s checkpoint; its previous one is kept as ``.prev``."""
    _shared.save_rank(path, rank, size, meta, arrays, VERSION)


def load_rank(group, path, expect: dict) -> tuple[dict, dict]:
    """Collective: this rank's part of the newest checkpoint every rank of ``group`` has (its
    latest file or the one before)."""
    return _shared.load_rank(group, path, expect, VERSION, "MF")
