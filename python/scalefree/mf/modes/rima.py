"""``rima`` mode: ring-based model parallelism for MF (the Rima paper, section III).

w ranks, R cut into w × w blocks. Rank r starts with user block P_r and item block Q_r
(pattern₀ is the diagonal). After each step every rank sends one of its two factor blocks to
its successor (r + 1 mod w) and receives the same kind from its predecessor — a one-step
transformation of the pattern, so the blocks in use stay interchangeable (distinct rows and
columns) and each rank has only two ring connections (plus rank 0 for the final gather; the
reports count bytes and connections at the transport, see ``scalefree._traffic``). Which kind moves (P or Q) is the direction;
it is drawn from the shared seed, the same on every rank (direction randomness), once per
iteration: an iteration is w steps in one direction, which visits every block of R exactly
once. Each block visit samples its ratings in a fresh random order (intra-block randomness).
At the end every rank sends its two blocks to rank 0, which assembles P and Q.

With ``opts["slack"] = S`` a worker need not wait for its predecessor's block: it trains on
the copy it holds and merges by delta when the block arrives (:mod:`.rima_ssp`; S = 0 gives
this module's result bit for bit).

Blocks move through static tensor slots (``scalefree.tensors.slots.static_slots``): one write into
the receiver's buffer, which it copies and releases so the sender may send again.

The whole pattern sequence follows from the seed (:func:`block_states`), so every rank knows
in advance which R blocks it will train, in which order. With ``memory_budget`` the blocks stay
on flash and the flash runtime's program cache reads them ahead in that order within the
budget (``mf_preload``, section III-D); the training itself is the same, visit for visit. Given the ratings as
``mf_stream.StreamedRatings`` (what the CLI passes with ``--memory-budget``), the set-up is
streamed too: no rank ever holds all ratings (``mf_stream``).
"""

from __future__ import annotations

import time

import numpy as np

from ...tensors import slots as tensors
from ..._rss import peak_rss_bytes, reset_peak_rss
from ..._traffic import Meter, summarize
from ...errors import InvalidArgumentError, OutOfBudgetError
from ..data import preload as mf_preload
from ..data import shares as mf_shares
from ..data import stream as mf_stream
from ..data.blocks import ENTRY_BYTES, FactorBlock, Partition, train_block
from ..data import checkpoint as mf_ckpt
from ..data.checkpoint import Plan
from . import rima_ssp


_NSTAT = 9  # per-worker scalars sent to rank 0 before the per-iteration rows


def _account(it, pre, held, resident, rss, waited) -> None:
    """Close iteration ``it``'s accounting: peak R bytes held in it, peak RSS so far, time
    spent waiting for block reads in it."""
    if pre is None:
        resident[it] = held
    else:
        resident[it] = pre.take_peak()
        waited[it] = pre.wait_seconds - waited[:it].sum()
    rss[it] = peak_rss_bytes()


def directions(iterations: int, seed: int) -> np.ndarray:
    """Per iteration: 0 = pass Q blocks, 1 = pass P blocks (the same on every rank)."""
    return np.random.default_rng([seed, 0x5249_4D41]).integers(0, 2, size=iterations)


def block_states(V: int, dirs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The pattern sequence: ``(bp, bq)``, each (steps, V), the P and Q block virtual worker v
    holds in each step. After every step but the last the moving side (the direction of the
    next step's iteration) passes one virtual worker on: v takes the block of v − 1."""
    total = len(dirs) * V
    bp, bq = np.empty((total, V), np.int64), np.empty((total, V), np.int64)
    cur = {"p": np.arange(V), "q": np.arange(V)}
    for step in range(total):
        bp[step], bq[step] = cur["p"], cur["q"]
        if step + 1 < total:
            side = "qp"[dirs[(step + 1) // V]]
            cur[side] = np.roll(cur[side], 1)
    return bp, bq


def trained_blocks(w: int, c: int, bp: np.ndarray, bq: np.ndarray) -> np.ndarray:
    """(w, V²) bool: which R blocks each rank trains at some step of the pattern sequence — the
    block row and block column of each of its virtual workers (about 2/w of R)."""
    V = c * w
    out = np.zeros((w, V * V), bool)
    for d in range(w):
        js = [d * c + j for j in range(c)]
        out[d, np.unique(bp[:, js] * V + bq[:, js])] = True
    return out


def visit_order(c: int) -> list[int]:
    """The order in which a rank trains its c block pairs in a step: the last pair first (its
    moving block goes to the successor while the others train)."""
    return [c - 1] + list(range(c - 1))


class EarlyStop:
    """Patience on the validation RMSE (the same on every rank, so every rank decides alike);
    rank 0 keeps a copy of the best iteration's P and Q."""

    def __init__(self, patience):
        self.patience = patience
        self.best, self.stale, self.best_pq, self.stopped_at = float("inf"), 0, None, None
        self.history = []  # (iteration, validation RMSE)

    def state(self) -> tuple[dict, dict]:
        """For a checkpoint: (meta, arrays); the best model's factors on rank 0."""
        arrays = {} if self.best_pq is None else {"best_p": self.best_pq[0], "best_q": self.best_pq[1]}
        return {"early": {"best": self.best, "stale": self.stale, "history": self.history}}, arrays

    def restore(self, meta: dict, arrays: dict) -> None:
        e = meta.get("early")
        if e is not None:
            self.best, self.stale, self.history = e["best"], e["stale"], [tuple(h) for h in e["history"]]
        if "best_p" in arrays:
            self.best_pq = (arrays["best_p"], arrays["best_q"])

    def due(self, done: int) -> bool:
        """Whether the last iteration run (``done``) still needs its validation RMSE."""
        return not self.stopped_at and (not self.history or self.history[-1][0] != done)

    def update(self, it: int, v: float, pq) -> bool:
        """Records iteration ``it``'s validation RMSE; true when training should stop."""
        self.history.append((it, v))
        if v < self.best:
            self.best, self.stale = v, 0
            if pq is not None and self.patience is not None:
                self.best_pq = (pq[0].copy(), pq[1].copy())
        else:
            self.stale += 1
        if self.patience is not None and self.stale >= self.patience:
            self.stopped_at = it
            return True
        return False


def train(group, train_ratings, opts: dict) -> dict:
    """Runs on every rank of ``group``; rank 0 returns P, Q (dense id order) and the
    accounting, the others their own accounting. ``opts``: k, eta, lam, schedule, iterations,
    seed, init_max, blocks_per_worker (1: w × w blocks; 2: 2w × 2w), on_iteration (called on
    rank 0 with the number of iterations done), eval_every and evaluate (rank 0: ``evaluate(P,
    Q)`` → test RMSE after every eval_every-th iteration; the blocks are gathered for it, and
    that time and those bytes are not counted as training), memory_budget (bytes of R blocks
    this rank may hold; the rest stay on disk, read ahead by a loader thread) and block_dir
    (where the block file goes; default the temp directory)."""
    w, r = group.size, group.rank
    k, iters, seed = opts["k"], opts["iterations"], opts["seed"]
    c = int(opts.get("blocks_per_worker") or 1)
    if c not in (1, 2):
        raise InvalidArgumentError(f"rima: blocks_per_worker must be 1 or 2, got {c}")
    V = c * w  # virtual workers: v = r·c + j is rank r's j-th block pair
    dirs = directions(iters, seed)
    bp, bq = block_states(V, dirs)
    mine_j = [r * c + j for j in visit_order(c)]
    sequence = (bp[:, mine_j] * V + bq[:, mine_j]).reshape(-1)  # this rank's blocks, in training order
    budget = opts.get("memory_budget")
    streamed = isinstance(train_ratings, mf_stream.StreamedRatings)
    # Bounded staleness (rima_ssp) when a slack is given, 0 included (the same result as here).
    stale = opts.get("slack") is not None and w > 1
    if stale:
        rima_ssp.check_options(opts, streamed)
    if streamed and budget is None:
        raise InvalidArgumentError("rima: streamed ratings (mf_stream) need a memory budget; "
                                   "load the ratings into memory for an in-memory run")
    bfile = pre = None
    ck = opts.get("checkpoint")
    resumed = None
    if ck is not None and ck["resume"]:
        resumed = mf_ckpt.load_rank(group, ck["path"], {**ck["expect"], "rank": r, "ranks": w})
    skip = 0 if resumed is None else int(resumed[0]["iteration"]) * V * c  # visits already done
    shared = isinstance(train_ratings, mf_shares.ShareRatings)
    if shared:
        trains = trained_blocks(w, c, bp, bq)
        keep = ([r * c + j for j in range(c)],) * 2  # initial P/Q: this rank's blocks only
    try:
        if shared:
            # Every rank reads its share of the file; the ratings of each block go to the ranks
            # that train it (mf_shares), in memory or into this rank's block file.
            if budget is not None:
                budget = mf_preload.parse_bytes(budget)
                bfile = mf_preload.BlockFile(opts.get("block_dir"))
                part = mf_preload.outside_arena(lambda: train_ratings.partition(
                    group, V, k, seed, opts.get("init_max"), trains=trains, keep=keep, spill_to=bfile,
                    budget_check=lambda part: _check_budget(part, budget, w, c, V),
                    piece_bytes=mf_shares.piece_bytes_for(budget)))
                bfile.finish()
                pre = mf_preload.Preloader(bfile, [int(b) for b in sequence[skip:]], budget,
                                           scratch_bytes=int(part.counts.max()) * ENTRY_BYTES)
            else:
                part = mf_preload.outside_arena(lambda: train_ratings.partition(
                    group, V, k, seed, opts.get("init_max"), trains=trains, keep=keep))
        elif budget is not None:
            budget = mf_preload.parse_bytes(budget)
            bfile = mf_preload.BlockFile(opts.get("block_dir"))
            needed = set(int(b) for b in sequence)
            check = lambda part: _check_budget(part, budget, w, c, V)  # noqa: E731
            if streamed:
                # Bounded memory: the ratings are read a chunk at a time, never all at once.
                train_ratings.prepare(group)
                part = mf_preload.outside_arena(lambda: train_ratings.partition(
                    V, k, seed, opts.get("init_max"), needed=needed, spill_to=bfile, budget_check=check,
                    collect_test=r == 0, chunk=mf_stream.chunk_ratings(budget),
                    keep=([r * c + j for j in range(c)],) * 2))  # initial P/Q: this rank's blocks only
            else:
                part = mf_preload.outside_arena(lambda: Partition(
                    train_ratings, V, k, seed, opts.get("init_max"),
                    spill=lambda b, ent: bfile.append(b, ent) if b in needed else None))
                check(part)
            bfile.finish()
            pre = mf_preload.Preloader(bfile, [int(b) for b in sequence[skip:]], budget,
                                       scratch_bytes=int(part.counts.max()) * ENTRY_BYTES)
        else:
            part = mf_preload.outside_arena(lambda: Partition(train_ratings, V, k, seed, opts.get("init_max")))
        if stale:
            return rima_ssp.train(group, part, opts, w, r, c, V, bp, bq, dirs, visit_order(c))
        return _train(group, part, opts, w, r, c, V, bp, bq, dirs, pre, budget, resumed)
    finally:
        if pre is not None:
            pre.close()
        if bfile is not None:
            bfile.close()


def _check_budget(part, budget: int, w: int, c: int, V: int) -> None:
    """The same on every rank: all fail together. The budget holds a block's whole 4 KiB pages
    in the flash runtime's cache and the shuffled copy the kernel trains (``mf_preload``)."""
    raw = int(part.counts.max()) * ENTRY_BYTES
    need = mf_preload.min_budget(raw)
    if need > budget:
        more = (f"cut R into {2 * w} x {2 * w} blocks (--blocks {2 * w}), " if c == 1 else "") + \
            "run more ranks (blocks shrink as 1/ranks²)"
        raise OutOfBudgetError(
            f"rima: memory budget {budget / 2**20:.2f} MiB ({budget} bytes) is smaller than one R block: "
            f"the largest of the {V} x {V} blocks holds {int(part.counts.max())} ratings = "
            f"{raw / 2**20:.2f} MiB ({raw} bytes); training it takes {need} bytes (its whole 4 KiB pages in the "
            f"cache and its shuffled copy); raise --memory-budget to at least that, "
            f"or make the blocks smaller: {more}")


def _train(group, part, opts, w, r, c, V, bp, bq, dirs, pre, budget, resumed=None) -> dict:
    k, iters, seed = opts["k"], opts["iterations"], opts["seed"]
    if not opts.get("normalize", True):
        part.scale = 1.0  # raw ratings (LIBMF's normalisation off)
    pred = (r - 1) % w  # slot "{side}{r}" goes to the successor, "{side}{pred}" comes in
    psize, qsize = FactorBlock.size(part.urows_max, k), FactorBlock.size(part.irows_max, k)
    specs = []
    if w > 1:
        # c + 1 slots per side and ring edge: a received block is trained where it landed and
        # released when it has been passed on, c steps later, so the c blocks a rank holds and
        # the one coming in each need a buffer.
        for a in range(w):
            for t in range(c + 1):
                specs += [dict(name=f"p{a}_{t}", src=a, dst=(a + 1) % w, shape=(psize,), dtype="float32"),
                          dict(name=f"q{a}_{t}", src=a, dst=(a + 1) % w, shape=(qsize,), dtype="float32")]
        for a in range(1, w):
            specs += [dict(name=f"gp{a}", src=a, dst=0, shape=(c, psize), dtype="float32"),
                      dict(name=f"gq{a}", src=a, dst=0, shape=(c, qsize), dtype="float32"),
                      dict(name=f"st{a}", src=a, dst=0, shape=(_NSTAT + 4 * iters + 3 * w,), dtype="float64")]
    slots = tensors.static_slots(group, specs)
    # Which block every virtual worker holds, tracked identically on every rank.
    blk = {"p": bp[0], "q": bq[0]}
    rows = {"p": (part.urows, part.urows_max), "q": (part.irows, part.irows_max)}
    # Rank r's factor blocks: bufs[side][j] is the flat block virtual worker r·c + j uses —
    # first its initial block, later the receive slot the block arrived in (trained in place,
    # no copy); inslot[side][j] is that slot (None for an initial block), released once the
    # block has been passed on.
    bufs = {"p": [part.p_block(r * c + j).flat for j in range(c)],
            "q": [part.q_block(r * c + j).flat for j in range(c)]}
    inslot = {"p": [None] * c, "q": [None] * c}
    nsent = {"p": 0, "q": 0}
    part.drop_initial()  # every other block's initial factors reach this rank through the ring

    def view(side: str, j: int) -> FactorBlock:
        nrows, rmax = rows[side]
        return FactorBlock(bufs[side][j], nrows(int(blk[side][r * c + j])), rmax, k)

    def gather():
        """Every rank's blocks to rank 0; there, P and Q in dense id order (else None)."""
        mine_p, mine_q = np.stack(bufs["p"]), np.stack(bufs["q"])
        if r != 0:
            slots[f"gp{r}"].send(mine_p)
            slots[f"gq{r}"].send(mine_q)
            return None
        pb = {int(blk["p"][j]): mine_p[j] for j in range(c)}
        qb = {int(blk["q"][j]): mine_q[j] for j in range(c)}
        for a in range(1, w):
            gp, gq = slots[f"gp{a}"].recv(), slots[f"gq{a}"].recv()
            for j in range(c):
                pb[int(blk["p"][a * c + j])] = gp[j].copy()
                qb[int(blk["q"][a * c + j])] = gq[j].copy()
            slots[f"gp{a}"].release()
            slots[f"gq{a}"].release()
        return part.dense_factors(pb, qb)

    rng = np.random.default_rng([seed, r, 0x53])
    sent = recvd = 0
    losses = np.zeros(iters)
    # Per iteration: peak bytes of R blocks held, peak RSS so far, time waiting for a block read.
    resident, rss, waited = np.zeros(iters), np.zeros(iters), np.zeros(iters)
    held_r = part.resident_bytes()
    setup_rss = peak_rss_bytes()
    reset_peak_rss()
    visit = 0
    total = iters * V
    evals = []  # (iteration, test RMSE, training seconds so far) on rank 0
    ck = opts.get("checkpoint")
    start_it = 0
    if resumed is not None:
        # Continue at the iteration boundary of the checkpoint: this rank's blocks, its SGD RNG
        # and losses; which blocks it holds follows from the pattern sequence.
        meta, a = resumed
        start_it = min(int(meta["iteration"]), iters)
        blk = {"p": bp[start_it * V] if start_it < iters else bp[-1], "q": bq[start_it * V] if start_it < iters else bq[-1]}
        for j in range(c):
            bufs["p"][j][:] = a["p"][j]
            bufs["q"][j][:] = a["q"][j]
        rng.bit_generator.state = meta["rng"]
        n = min(len(a["losses"]), iters)
        losses[:n] = a["losses"][:n]
        evals.extend(tuple(e) for e in meta.get("evals", []))
        visit = start_it * V * c
    skip = visit  # the preloader's sequence starts here
    plan = Plan(ck, start_it, iters)

    def save_checkpoint(done: int) -> None:
        em, ea = early.state()
        meta = {**ck["expect"], "rank": r, "ranks": w, "iteration": done, "rng": rng.bit_generator.state,
                "evals": [list(e) for e in evals], **em}
        mf_ckpt.save_rank(ck["path"], r, w, meta,
                          {"p": np.stack(bufs["p"]), "q": np.stack(bufs["q"]), "losses": losses[:done], **ea})

    evaluate, every = opts.get("evaluate"), int(opts.get("eval_every") or 0)
    collective = bool(opts.get("evaluate_collective"))
    validate = opts.get("validate")  # collective: validation RMSE, the same on every rank
    early = EarlyStop(opts.get("patience"))
    if resumed is not None:
        early.restore(*resumed)
    group.barrier()
    # Bytes and connections as the transport counts them, from here to the final gather
    # (evaluation left out).
    meter = Meter(group)
    t0 = time.perf_counter()
    # Set-up: from the caller's start (opts["t_start"]: the CLI's, before loading the ratings) to now.
    setup_s = t0 - opts.get("t_start", t0)
    comm = paused = 0.0
    tick = opts.get("on_iteration") if r == 0 else None
    step = start_it * V
    for step in range(start_it * V, total):
        it = step // V
        if step > start_it * V and step % V == 0:
            _account(it - 1, pre, held_r, resident, rss, waited)
            if (every and it % every == 0) or validate is not None:
                # Test RMSE for the curve, validation RMSE for early stopping: gather the current
                # blocks (not counted as training).
                e0 = time.perf_counter()
                meter.pause()
                pq = gather()
                if every and it % every == 0 and evaluate is not None and (pq is not None or collective):
                    # Collective evaluation (mf_shares): every rank scores its test share.
                    rmse = evaluate(*(pq if pq is not None else (None, None)))
                    if pq is not None:
                        evals.append((it, rmse, e0 - t0 - paused))
                halt = validate is not None and early.update(it, validate(*(pq if pq is not None else (None, None))), pq)
                meter.resume()
                paused += time.perf_counter() - e0
                if halt:
                    break  # the same decision on every rank (the validation RMSE is allreduced)
            if plan.boundary(it, save_checkpoint):
                break
            if tick is not None:
                tick(it)
        side = None if step + 1 == total else "qp"[dirs[(step + 1) // V]]
        fut = None
        # The last pair first: its moving block goes to the successor while the others train.
        for n, j in enumerate(visit_order(c)):
            ent = None if pre is None else pre.get(visit - skip)
            losses[it] += train_block(part, int(blk["p"][r * c + j]), int(blk["q"][r * c + j]),
                                      view("p", j), view("q", j), opts, rng, ent, first=it == 0)
            if pre is not None:
                ent = None  # no view of the block left when the cache takes it back
                pre.release(visit - skip)
            visit += 1
            if n == 0 and side is not None and w > 1:
                out = bufs[side][c - 1]
                fut = slots[f"{side}{r}_{nsent[side] % (c + 1)}"].send_async(out)
                sent += out.nbytes
        if side is None:
            continue
        c0 = time.perf_counter()
        if fut is not None:
            fut.result()
        # One-step transformation: virtual worker v takes the block of v − 1.
        blk = {"p": bp[step + 1], "q": bq[step + 1]}
        if w == 1:
            bufs[side] = [bufs[side][c - 1]] + bufs[side][:c - 1]
        else:
            if inslot[side][c - 1] is not None:
                inslot[side][c - 1].release()  # passed on: the predecessor may refill it
            slot = slots[f"{side}{pred}_{nsent[side] % (c + 1)}"]
            nsent[side] += 1  # sends and receives per side advance together
            buf = slot.recv()
            bufs[side] = [buf] + bufs[side][:c - 1]
            inslot[side] = [slot] + inslot[side][:c - 1]
            recvd += buf.nbytes
        comm += time.perf_counter() - c0
    seconds = time.perf_counter() - t0 - paused
    done = early.stopped_at or (plan.stop_at if start_it * V < total else iters)
    plan.finish(done, save_checkpoint)  # the end state
    _account(max(done - 1, 0), pre, held_r, resident, rss, waited)
    if tick is not None:
        tick(done)
    g0 = time.perf_counter()
    pq = gather()
    if validate is not None:
        if early.due(done):
            early.update(done, validate(*(pq if pq is not None else (None, None))), pq)
        pq = early.best_pq if early.best_pq is not None else pq  # rank 0: the best iteration's model
    moved = meter.moved()
    if pre is not None:
        pre.close()  # the loader has read everything; its CPU time is final
    # Read seconds and loader CPU are the flash runtime's IO threads' now (not measured per rank).
    io = [0.0, 0.0, 0.0, 0.0] if pre is None else [float("nan"), pre.bytes_read, float("nan"), float(pre.direct)]
    mine = np.concatenate([[sent, recvd, comm, *io, setup_rss, setup_s], losses, resident, rss, waited,
                           moved.ravel()])
    if r != 0:
        slots[f"st{r}"].send(mine)
        group.barrier()
        return {"rank": r, "bytes_sent": int(moved[:, 0].sum()), "bytes_received": recvd, "seconds": seconds}
    stats = [mine]
    for a in range(1, w):
        stats.append(slots[f"st{a}"].recv().copy())
        slots[f"st{a}"].release()
    gather_s = time.perf_counter() - g0
    group.barrier()
    st = np.array(stats)
    per_it = st[:, _NSTAT:_NSTAT + 4 * iters].reshape(w, 4, iters)  # worker, (loss, resident, rss, wait), iteration
    traffic = summarize(st[:, _NSTAT + 4 * iters:].reshape(w, w, 3).astype(np.int64))
    return {"rank": 0, "p": pq[0], "q": pq[1], "seconds": seconds, "iterations_done": done, "start_iteration": start_it,
            "valid_rmse": early.history, "stopped_at": early.stopped_at, "gather_seconds": gather_s, "evals": evals,
            # Σ e² was in the units of the ratings / σ.
            "train_mse": list(per_it[:, 0].sum(axis=0) * part.scale ** 2 / part.n_ratings),
            "rating_bytes_resident": per_it[:, 1].T.astype(np.int64).tolist(),
            "peak_rss_bytes": per_it[:, 2].T.astype(np.int64).tolist(),
            "preload_wait_seconds": per_it[:, 3].T.tolist(),
            "preload_read_seconds": [float(x) for x in st[:, 3]], "bytes_read": [int(x) for x in st[:, 4]],
            "preload_loader_cpu_seconds": [float(x) for x in st[:, 5]],
            "preload_direct_io": [bool(x) for x in st[:, 6]],  # read with O_DIRECT to the end
            "setup_peak_rss_bytes": [int(x) for x in st[:, 7]], "setup_seconds": [float(x) for x in st[:, 8]],
            "memory_budget": budget,
            "rating_bytes": part.n_ratings * ENTRY_BYTES,
            # Measured at the transport (training steps and the final gather): per worker.
            "bytes_sent": traffic["bytes_sent"], "bytes_received": traffic["bytes_received"],
            "connections": traffic["connections"], "connected_to": traffic["peers"],
            "operations": traffic["operations"],
            # What the ring steps handed to the slots (the blocks alone, no gather).
            "block_bytes_sent": [int(x) for x in st[:, 0]], "block_bytes_received": [int(x) for x in st[:, 1]],
            "comm_seconds": [float(x) for x in st[:, 2]], "workers": w, "blocks_per_side": V,
            "directions": ["QP"[d] for d in dirs]}
