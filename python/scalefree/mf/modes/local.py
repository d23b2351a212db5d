"""``local``: matrix factorization on one machine, the Rust kernels on its threads (LIBMF's
scheme: the rating matrix cut into blocks that threads take in turn; ``scalefree-mf``), with
early stopping on a validation set and checkpoints (:mod:`scalefree.mf.data.checkpoint`). The
estimator (:class:`scalefree.mf.MatrixFactorization`) prepares the data and calls :func:`train`.

With ``memory_budget`` the grid's blocks stay on flash (a scratch file of the flash runtime) and
the threads read them through its program cache, which prefetches each pass's blocks in the
order the scheduler hands them out (``scalefree-mf``'s ``local.rs``; LIBMF's ``--disk``): the
same blocks and schedule as in memory; each pass starts with the blocks the previous one ended
with (those the budget still holds), so they are not read again."""

from __future__ import annotations

import os
import time

import numpy as np

from ... import _native
from ..data import checkpoint as mf_ckpt


def train(train, valid, test_r, *, k: int, eta: float, lam: float, schedule: str, threads: int, blocks, seed: int,
          init_max, normalize: bool, iterations: int, patience: int | None, eval_every: int, ckpt: dict | None,
          expect: dict | None, on_iteration, bar, memory_budget: int | None = None, block_dir=None):
    """Trains on the native ratings ``train`` for ``iterations`` epochs → ``(history, stopped_at,
    model)``. ``valid``: ratings whose RMSE picks the best epoch (with ``patience``: stop after
    that many epochs without improvement); ``test_r``: ratings evaluated every ``eval_every``
    epochs and at the end; ``ckpt`` (path, every, resume, stop_after) with ``expect`` (what a
    checkpoint must match); ``on_iteration(record)`` after each epoch; ``bar.update(n, msg)``
    shows progress. ``memory_budget``: bytes of rating blocks in memory at most (the rest on flash,
    in ``block_dir``); the last record then has ``rating_bytes_resident`` (the cache's peak),
    ``memory_budget``, ``bytes_read``, ``preload_wait_seconds`` and ``carried_blocks`` (blocks
    each pass takes over from the end of the one before, which are not read again)."""
    tr = _native.MfTrainer(train, k=k, eta=eta, lam=lam, schedule=schedule, threads=threads, blocks=blocks, seed=seed,
                           init_max=init_max, normalize=normalize, memory_budget=memory_budget,
                           flash_dir=None if block_dir is None else os.fspath(block_dir))
    history = []
    elapsed = 0.0
    best, best_model, stale = float("inf"), None, 0
    stopped_at = None
    start = 0
    if ckpt is not None and ckpt["resume"]:
        meta, a = mf_ckpt.load(ckpt["path"], expect)
        tr.set_state(*(a[n].tobytes() for n in ("p", "q", "pg", "qg", "counts")), int(meta["iteration"]))
        start, history, best, stale = int(meta["iteration"]), meta["history"], meta["best"], meta["stale"]
        elapsed = history[-1]["seconds"] if history else 0.0
        if "best_p" in a:
            best_model = _native.MfModel.from_parts(k, *(a[n].tobytes() for n in (
                "best_p", "best_q", "best_user_ids", "best_item_ids")), float(meta["best_mean"]),
                *(a[n].tobytes() for n in ("best_known_u", "best_known_i")))
        if start >= iterations or meta.get("stopped_at"):
            stopped_at = meta.get("stopped_at")
            return history, stopped_at, best_model if best_model is not None else tr.model()

    def save_checkpoint(it):
        p, q, pg, qg, counts, _ = tr.state()
        arrays = {n: np.frombuffer(b, np.uint8) for n, b in zip(("p", "q", "pg", "qg", "counts"), (p, q, pg, qg, counts))}
        meta = {**expect, "iteration": it, "history": history, "best": best, "stale": stale,
                "stopped_at": stopped_at}
        if best_model is not None:
            bp, bq, bu, bi, mean, ku, ki = best_model.parts()
            arrays.update({f"best_{n}": np.frombuffer(b, np.uint8) for n, b in zip(
                ("p", "q", "user_ids", "item_ids", "known_u", "known_i"), (bp, bq, bu, bi, ku, ki))})
            meta["best_mean"] = float(mean)
        mf_ckpt.save(ckpt["path"], meta, arrays)

    if start:
        bar.update(start, "resumed")
    for it in range(start + 1, iterations + 1):
        t0 = time.perf_counter()
        mse = tr.epochs(1)
        elapsed += time.perf_counter() - t0
        rec = {"iteration": it, "train_mse": mse, "seconds": elapsed}
        last = it == iterations
        if valid is not None:
            rec["valid_rmse"] = v = tr.rmse(valid)
            if v < best:
                best, stale = v, 0
                best_model = tr.model() if patience is not None else None
            else:
                stale += 1
            if patience is not None and stale >= patience:
                last, stopped_at = True, it
        if test_r is not None and ((eval_every and it % eval_every == 0) or last):
            rec["test_rmse"] = tr.rmse(test_r) if best_model is None or not last else best_model.rmse(test_r)
        fs = tr.flash_stats()
        if fs is not None:
            rec.update(memory_budget=fs["budget_bytes"], rating_bytes_resident=fs["peak_resident_bytes"],
                       bytes_read=fs["bytes_read"], preload_wait_seconds=fs["wait_seconds"], carried_blocks=fs["carry"])
        history.append(rec)
        if on_iteration is not None:
            on_iteration(rec)
        stop = ckpt is not None and ckpt["stop_after"] is not None and it >= ckpt["stop_after"]
        if ckpt is not None and (last or stop or (ckpt["every"] and it % ckpt["every"] == 0)):
            save_checkpoint(it)
        bar.update(iterations if last or stop else it,
                   f"test_rmse={rec['test_rmse']:.4f}" if "test_rmse" in rec else f"train_mse={mse:.4f}")
        if last or stop:
            break
    return history, stopped_at, best_model if best_model is not None else tr.model()
