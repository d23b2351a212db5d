"""``rima`` mode: ring-based model parallelism for MF (the Rima paper, section III).

w ranks, R cut into w × w blocks. Rank r starts with user block P_r and item block Q_r
(pattern₀ is the diagonal). After each step every rank sends one of its two factor blocks to
its successor (r + 1 mod w) and receives the same kind from its predecessor — a one-step
transformation of the pattern, so the blocks in use stay interchangeable (distinct rows and
columns) and each rank has only two connections. Which kind moves (P or Q) is the direction;
it is drawn from the shared seed, the same on every rank (direction randomness), once per
iteration: an iteration is w steps in one direction, which visits every block of R exactly
once. Each block visit samples its ratings in a fresh random order (intra-block randomness).
At the end every rank sends its two blocks to rank 0, which assembles P and Q.

Blocks move through static tensor slots (``scalefree.tensors.static_slots``): one write into
the receiver's buffer, which it copies and releases so the sender may send again.
"""

from __future__ import annotations

import time

import numpy as np

from . import tensors
from .mf_blocks import FactorBlock, Partition, train_block


def directions(iterations: int, seed: int) -> np.ndarray:
    """Per iteration: 0 = pass Q blocks, 1 = pass P blocks (the same on every rank)."""
    return np.random.default_rng([seed, 0x5249_4D41]).integers(0, 2, size=iterations)


def train(group, train_ratings, opts: dict) -> dict:
    """Runs on every rank of ``group``; rank 0 returns P, Q (dense id order) and the
    accounting, the others their own accounting. ``opts``: k, eta, lam, schedule, iterations,
    seed, init_max."""
    w, r = group.size, group.rank
    k, iters, seed = opts["k"], opts["iterations"], opts["seed"]
    part = Partition(train_ratings, w, k, seed, opts.get("init_max"))
    succ, pred = (r + 1) % w, (r - 1) % w
    psize, qsize = FactorBlock.size(part.urows_max, k), FactorBlock.size(part.irows_max, k)
    specs = []
    if w > 1:
        for a in range(w):
            specs += [dict(name=f"p{a}", src=a, dst=(a + 1) % w, shape=(psize,), dtype="float32"),
                      dict(name=f"q{a}", src=a, dst=(a + 1) % w, shape=(qsize,), dtype="float32")]
        for a in range(1, w):
            specs += [dict(name=f"gp{a}", src=a, dst=0, shape=(psize,), dtype="float32"),
                      dict(name=f"gq{a}", src=a, dst=0, shape=(qsize,), dtype="float32"),
                      dict(name=f"st{a}", src=a, dst=0, shape=(3 + iters,), dtype="float64")]
    slots = tensors.static_slots(group, specs)
    # Which block every rank holds, tracked identically everywhere.
    pblk, qblk = np.arange(w), np.arange(w)
    p, q = part.p_block(r), part.q_block(r)
    dirs = directions(iters, seed)
    rng = np.random.default_rng([seed, r, 0x53])
    sent = recvd = 0
    losses = np.zeros(iters)
    group.barrier()
    t0 = time.perf_counter()
    comm = 0.0
    for step in range(iters * w):
        it = step // w
        if step > 0 and w > 1:
            c0 = time.perf_counter()
            if dirs[it] == 0:
                slots[f"q{r}"].send(q.flat)
                q.flat[:] = slots[f"q{pred}"].recv()
                slots[f"q{pred}"].release()
                qblk = np.roll(qblk, 1)
                q = FactorBlock(q.flat, part.irows(qblk[r]), part.irows_max, k)
                sent, recvd = sent + q.flat.nbytes, recvd + q.flat.nbytes
            else:
                slots[f"p{r}"].send(p.flat)
                p.flat[:] = slots[f"p{pred}"].recv()
                slots[f"p{pred}"].release()
                pblk = np.roll(pblk, 1)
                p = FactorBlock(p.flat, part.urows(pblk[r]), part.urows_max, k)
                sent, recvd = sent + p.flat.nbytes, recvd + p.flat.nbytes
            comm += time.perf_counter() - c0
        losses[it] += train_block(part, int(pblk[r]), int(qblk[r]), p, q, opts, rng)
    seconds = time.perf_counter() - t0
    mine = np.concatenate([[sent, recvd, comm], losses])
    if r != 0:
        slots[f"gp{r}"].send(p.flat)
        slots[f"gq{r}"].send(q.flat)
        slots[f"st{r}"].send(mine)
        group.barrier()
        return {"rank": r, "bytes_sent": sent, "bytes_received": recvd, "seconds": seconds}
    pb, qb, stats = {int(pblk[0]): p.flat}, {int(qblk[0]): q.flat}, [mine]
    for a in range(1, w):
        pb[int(pblk[a])] = slots[f"gp{a}"].recv().copy()
        qb[int(qblk[a])] = slots[f"gq{a}"].recv().copy()
        stats.append(slots[f"st{a}"].recv().copy())
        for s in ("gp", "gq", "st"):
            slots[f"{s}{a}"].release()
    P, Q = part.dense_factors(pb, qb)
    gather = time.perf_counter() - t0 - seconds
    group.barrier()
    st = np.array(stats)
    return {"rank": 0, "p": P, "q": Q, "seconds": time.perf_counter() - t0, "gather_seconds": gather,
            "train_mse": list(st[:, 3:].sum(axis=0) / part.n_ratings),
            "bytes_sent": [int(x) for x in st[:, 0]], "bytes_received": [int(x) for x in st[:, 1]],
            "comm_seconds": [float(x) for x in st[:, 2]], "workers": w, "connections": 2 if w > 2 else (1 if w == 2 else 0),
            "directions": ["PQ"[d] for d in dirs]}
