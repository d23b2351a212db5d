"""``dsgd-ps`` mode: DSGD with a parameter server (the Rima paper's baseline, section II-C).

Rank 0 is the parameter server and holds all of P and Q; ranks 1..w are workers (w = size − 1),
and R is cut into w × w blocks. Every step the server picks a pattern of w interchangeable
blocks (distinct row blocks, distinct column blocks): per iteration a random order of the w
diagonals, from the shared seed; worker a always trains block row a − 1, so its ratings stay
with it (given a rating file as ``mf_shares.ShareRatings``, each worker receives only its block
row and the server no ratings). Each worker pulls its P block and Q block, runs SGD on its block of R, and pushes
both back; an iteration is w steps and visits every block once.

Pulls and pushes are static tensor slots (``scalefree.tensors.slots.static_slots``). A worker trains
in the pull buffer itself, pushes from it and then releases it.

With ``memory_budget`` a worker's block row stays on flash: the steps' diagonals follow from the
shared seed (:func:`patterns`), so the worker knows its blocks in training order and the flash
runtime's program cache reads them ahead within the budget (``mf_preload``, as rima's).
"""

from __future__ import annotations

import time

import numpy as np

from ..._traffic import Meter, summarize
from ...tensors import slots as tensors
from ...errors import InvalidArgumentError
from ..data.blocks import FactorBlock, Partition, train_block
from ..data import checkpoint as mf_ckpt
from ..data.checkpoint import Plan
from .rima import EarlyStop
from ..data import preload as mf_preload
from ..data.blocks import ENTRY_BYTES
from ..data.preload import outside_arena
from ..data.shares import ShareRatings, piece_bytes_for
from ...errors import OutOfBudgetError


def patterns(w: int, iterations: int, seed: int):
    """Per step: (row block, column block) for each worker, the same on every rank. Worker a
    always trains block row a − 1 (its ratings stay put, as in DSGD); the column block is the
    step's diagonal, the diagonals in a random order per iteration."""
    rng = np.random.default_rng([seed, 0x4453_4744])
    for _ in range(iterations):
        for off in rng.permutation(w):
            yield [(b, int((b + off) % w)) for b in range(w)]


def trained_blocks(w: int) -> np.ndarray:
    """(w + 1, w²) bool: the R blocks each rank trains — none on the server, block row a − 1 on
    worker a."""
    out = np.zeros((w + 1, w * w), bool)
    for a in range(1, w + 1):
        out[a, (a - 1) * w:a * w] = True
    return out


def train(group, train_ratings, opts: dict) -> dict:
    """Runs on every rank of ``group`` (at least 2); rank 0 (the server) returns P, Q (dense
    id order) and the accounting, workers their own accounting. ``opts`` as for rima (without
    blocks_per_worker; the server evaluates on its own copy, nothing is gathered)."""
    if group.size < 2:
        raise InvalidArgumentError("dsgd-ps needs at least 2 ranks (rank 0 is the parameter server)")
    w, r = group.size - 1, group.rank
    k, iters, seed = opts["k"], opts["iterations"], opts["seed"]
    budget = opts.get("memory_budget")
    bfile = None
    if budget is not None:
        budget = mf_preload.parse_bytes(budget)
        bfile = mf_preload.BlockFile(opts.get("block_dir")) if r else None
    try:
        part = _partition(group, train_ratings, w, r, k, seed, opts, budget, bfile)
        if bfile is not None:
            bfile.finish()
        return _train(group, part, opts, w, r, k, iters, seed, bfile, budget)
    finally:
        if bfile is not None:
            bfile.close()


def _partition(group, train_ratings, w, r, k, seed, opts, budget, bfile) -> Partition:
    """This rank's blocks: in memory, or (workers, with a budget) in ``bfile``."""
    check = None if budget is None else (lambda part: _check_budget(part, budget, w))
    if isinstance(train_ratings, ShareRatings):
        keep = None if r == 0 else ([], [])  # initial factors: the server's
        return outside_arena(lambda: train_ratings.partition(
            group, w, k, seed, opts.get("init_max"), trains=trained_blocks(w), keep=keep, spill_to=bfile,
            budget_check=check, piece_bytes=piece_bytes_for(budget)))
    mine = set(range((r - 1) * w, r * w)) if r else set()
    spill = None if bfile is None else (lambda b, ent: bfile.append(b, ent) if b in mine else None)
    part = outside_arena(lambda: Partition(train_ratings, w, k, seed, opts.get("init_max"), spill=spill))
    if check is not None:
        check(part)
    return part


def _check_budget(part, budget: int, w: int) -> None:
    """The same on every rank: all fail together (as rima's)."""
    raw = int(part.counts.max()) * ENTRY_BYTES
    need = mf_preload.min_budget(raw)
    if need > budget:
        raise OutOfBudgetError(
            f"dsgd-ps: memory budget {budget / 2**20:.2f} MiB ({budget} bytes) is smaller than one R block: "
            f"the largest of the {w} x {w} blocks holds {int(part.counts.max())} ratings = {raw / 2**20:.2f} MiB "
            f"({raw} bytes); training it takes {need} bytes (its whole 4 KiB pages in the cache and its shuffled "
            f"copy); raise --memory-budget to at least that, or run more ranks (blocks shrink as 1/workers²)")


def _train(group, part, opts, w, r, k, iters, seed, bfile, budget) -> dict:
    if not opts.get("normalize", True):
        part.scale = 1.0  # raw ratings (LIBMF's normalisation off)
    psize, qsize = FactorBlock.size(part.urows_max, k), FactorBlock.size(part.irows_max, k)
    # Checkpoints (mf/data/checkpoint.py): one file per rank; the server's holds all of P and Q, a
    # worker's its SGD RNG state and losses. Every rank stops and saves at the same boundaries.
    ck = opts.get("checkpoint")
    start_it, resumed = 0, None
    if ck is not None and ck["resume"]:
        resumed = mf_ckpt.load_rank(group, ck["path"], {**ck["expect"], "rank": r, "ranks": group.size})
        start_it = min(int(resumed[0]["iteration"]), iters)
    plan = Plan(ck, start_it, iters)

    def save_checkpoint(done: int, meta: dict, arrays: dict) -> None:
        em, ea = early.state()
        mf_ckpt.save_rank(ck["path"], r, group.size,
                          {**ck["expect"], "rank": r, "ranks": group.size, "iteration": done, **meta, **em},
                          {**arrays, **ea})

    def boundary(step: int, save) -> bool:
        """Whether the run stops at this step: at an iteration boundary after the start, the
        plan's checkpoint and stop (after the iteration's validation)."""
        return step > start_it * w and step % w == 0 and plan.boundary(step // w, save)

    steps = list(patterns(w, iters, seed))[start_it * w:]
    validate = opts.get("validate")  # collective: validation RMSE, the same on every rank
    early = EarlyStop(opts.get("patience"))
    if resumed is not None:
        early.restore(*resumed)
    specs = []
    for a in range(1, w + 1):
        specs += [dict(name=f"pull_p{a}", src=0, dst=a, shape=(psize,), dtype="float32"),
                  dict(name=f"pull_q{a}", src=0, dst=a, shape=(qsize,), dtype="float32"),
                  dict(name=f"push_p{a}", src=a, dst=0, shape=(psize,), dtype="float32"),
                  dict(name=f"push_q{a}", src=a, dst=0, shape=(qsize,), dtype="float32"),
                  dict(name=f"st{a}", src=a, dst=0, shape=(3 + iters + 3 * (w + 1),), dtype="float64")]
    slots = tensors.static_slots(group, specs)
    group.barrier()
    meter = Meter(group)  # bytes and connections as the transport counts them (evaluation left out)
    t0 = time.perf_counter()
    if r == 0:
        pb = {b: part.p_block(b).flat for b in range(w)}
        qb = {b: part.q_block(b).flat for b in range(w)}
        sent = 0
        tick = opts.get("on_iteration")
        evaluate, every = opts.get("evaluate"), int(opts.get("eval_every") or 0)
        evals, paused = [], 0.0
        if resumed is not None:
            for b in range(w):
                pb[b][:] = resumed[1]["p"][b]
                qb[b][:] = resumed[1]["q"][b]
            evals = [tuple(e) for e in resumed[0].get("evals", [])]

        def save(done):
            save_checkpoint(done, {"evals": [list(e) for e in evals]},
                            {"p": np.stack([pb[b] for b in range(w)]), "q": np.stack([qb[b] for b in range(w)])})

        done = iters
        for step, pat in enumerate(steps, start=start_it * w):
            if step > 0 and step % w == 0:
                it = step // w
                if every and evaluate is not None and it % every == 0:
                    e0 = time.perf_counter()
                    meter.pause()
                    evals.append((it, evaluate(*part.dense_factors(pb, qb)), e0 - t0 - paused))
                    meter.resume()
                    paused += time.perf_counter() - e0
                if validate is not None and step > start_it * w:
                    e0 = time.perf_counter()
                    meter.pause()
                    pq = part.dense_factors(pb, qb)
                    halt = early.update(it, validate(*pq), pq)
                    meter.resume()
                    paused += time.perf_counter() - e0
                    if halt:
                        done = it
                        break
            if boundary(step, save):
                done = step // w
                break
            if step > 0 and step % w == 0 and tick is not None:
                tick(step // w)
            for a, (ru, ri) in enumerate(pat, start=1):
                slots[f"pull_p{a}"].send(pb[ru])
                slots[f"pull_q{a}"].send(qb[ri])
                sent += pb[ru].nbytes + qb[ri].nbytes
            for a, (ru, ri) in enumerate(pat, start=1):
                pb[ru][:] = slots[f"push_p{a}"].recv()
                qb[ri][:] = slots[f"push_q{a}"].recv()
                slots[f"push_p{a}"].release()
                slots[f"push_q{a}"].release()
        seconds = time.perf_counter() - t0 - paused
        plan.finish(done, save)
        moved = [meter.moved()]
        if tick is not None:
            tick(done)
        stats = []
        for a in range(1, w + 1):
            stats.append(slots[f"st{a}"].recv().copy())
            slots[f"st{a}"].release()
        P, Q = part.dense_factors(pb, qb)
        if validate is not None:
            if early.due(done):
                early.update(done, validate(P, Q), (P, Q))
            if early.best_pq is not None:
                P, Q = early.best_pq  # the best iteration's model
        group.barrier()
        st = np.array(stats)
        moved += [row.reshape(w + 1, 3).astype(np.int64) for row in st[:, 3 + iters:]]
        traffic = summarize(np.stack(moved))  # rank 0 (the server), then the workers
        return {"rank": 0, "p": P, "q": Q, "seconds": seconds, "iterations_done": done, "start_iteration": start_it,
                "valid_rmse": early.history, "stopped_at": early.stopped_at, "server_bytes_sent": traffic["bytes_sent"][0],
                "server_connections": traffic["connections"][0], "evals": evals,
                # Σ e² was in the units of the ratings / σ.
                "train_mse": list(st[:, 3:3 + iters].sum(axis=0) * part.scale ** 2 / part.n_ratings),
                # Measured at the transport: per worker (ranks 1..w).
                "bytes_sent": traffic["bytes_sent"][1:], "bytes_received": traffic["bytes_received"][1:],
                "connections": traffic["connections"][1:], "connected_to": traffic["peers"][1:],
                "operations": traffic["operations"][1:],
                # What the steps handed to the slots (the blocks alone).
                "block_bytes_sent": [int(x) for x in st[:, 0]], "block_bytes_received": [int(x) for x in st[:, 1]],
                "comm_seconds": [float(x) for x in st[:, 2]], "workers": w}
    rng = np.random.default_rng([seed, r, 0x53])
    pre = None
    if bfile is not None:
        # This worker's blocks in training order, read ahead through the flash runtime.
        seq = [ru * w + ri for ru, ri in (pat[r - 1] for pat in steps)]
        pre = mf_preload.Preloader(bfile, seq, budget, scratch_bytes=int(part.counts.max()) * ENTRY_BYTES)
    try:
        return _work(group, part, opts, w, r, k, iters, rng, steps, slots, meter, t0, plan, start_it, resumed, early,
                     validate, save_checkpoint, boundary, pre)
    finally:
        if pre is not None:
            pre.close()


def _work(group, part, opts, w, r, k, iters, rng, steps, slots, meter, t0, plan, start_it, resumed, early, validate,
          save_checkpoint, boundary, pre) -> dict:
    """A worker's steps: pull, train its block of R, push."""
    sent = recvd = 0
    comm = 0.0
    losses = np.zeros(iters)
    pull_p, pull_q, push_p, push_q = (slots[f"{s}{r}"] for s in ("pull_p", "pull_q", "push_p", "push_q"))
    evaluate, every = opts.get("evaluate"), int(opts.get("eval_every") or 0)
    collective = evaluate is not None and every and opts.get("evaluate_collective")
    if resumed is not None:
        rng.bit_generator.state = resumed[0]["rng"]
        n = min(len(resumed[1]["losses"]), iters)
        losses[:n] = resumed[1]["losses"][:n]

    def save(done):
        save_checkpoint(done, {"rng": rng.bit_generator.state}, {"losses": losses[:done]})

    done = iters
    for step, pat in enumerate(steps, start=start_it * w):
        if collective and step > 0 and step % w == 0 and (step // w) % every == 0:
            meter.pause()
            evaluate(None, None)  # the server's evaluation is collective: score this rank's test share
            meter.resume()
        if validate is not None and step > start_it * w and step % w == 0:
            meter.pause()
            halt = early.update(step // w, validate(None, None), None)
            meter.resume()
            if halt:
                done = step // w
                break
        if boundary(step, save):
            done = step // w
            break
        ru, ri = pat[r - 1]
        c0 = time.perf_counter()
        p = FactorBlock(pull_p.recv(), part.urows(ru), part.urows_max, k)
        q = FactorBlock(pull_q.recv(), part.irows(ri), part.irows_max, k)
        c1 = time.perf_counter()
        n = step - start_it * w
        ent = None if pre is None else pre.get(n)
        losses[step // w] += train_block(part, ru, ri, p, q, opts, rng, ent, first=step < w)
        if pre is not None:
            ent = None  # no view of the block left when the cache takes it back
            pre.release(n)
        c2 = time.perf_counter()
        push_p.send(p.flat)
        push_q.send(q.flat)
        pull_p.release()
        pull_q.release()
        comm += (c1 - c0) + (time.perf_counter() - c2)
        sent += p.flat.nbytes + q.flat.nbytes
        recvd += p.flat.nbytes + q.flat.nbytes
    seconds = time.perf_counter() - t0
    plan.finish(done, save)
    moved = meter.moved()
    slots[f"st{r}"].send(np.concatenate([[sent, recvd, comm], losses, moved.ravel()]))
    if validate is not None and early.due(done):
        early.update(done, validate(None, None), None)  # with the server's, after it has the stats
    group.barrier()
    return {"rank": r, "bytes_sent": int(moved[:, 0].sum()), "bytes_received": recvd, "seconds": seconds}
