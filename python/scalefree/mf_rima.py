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
from .errors import InvalidArgumentError
from .mf_blocks import FactorBlock, Partition, train_block


def directions(iterations: int, seed: int) -> np.ndarray:
    """Per iteration: 0 = pass Q blocks, 1 = pass P blocks (the same on every rank)."""
    return np.random.default_rng([seed, 0x5249_4D41]).integers(0, 2, size=iterations)


def train(group, train_ratings, opts: dict) -> dict:
    """Runs on every rank of ``group``; rank 0 returns P, Q (dense id order) and the
    accounting, the others their own accounting. ``opts``: k, eta, lam, schedule, iterations,
    seed, init_max, blocks_per_worker (1: w × w blocks; 2: 2w × 2w), on_iteration (called on
    rank 0 with the number of iterations done), eval_every and evaluate (rank 0: ``evaluate(P,
    Q)`` → test RMSE after every eval_every-th iteration; the blocks are gathered for it, and
    that time and those bytes are not counted as training)."""
    w, r = group.size, group.rank
    k, iters, seed = opts["k"], opts["iterations"], opts["seed"]
    c = int(opts.get("blocks_per_worker") or 1)
    if c not in (1, 2):
        raise InvalidArgumentError(f"rima: blocks_per_worker must be 1 or 2, got {c}")
    V = c * w  # virtual workers: v = r·c + j is rank r's j-th block pair
    part = Partition(train_ratings, V, k, seed, opts.get("init_max"))
    pred = (r - 1) % w  # slot "{side}{r}" goes to the successor, "{side}{pred}" comes in
    psize, qsize = FactorBlock.size(part.urows_max, k), FactorBlock.size(part.irows_max, k)
    specs = []
    if w > 1:
        for a in range(w):
            specs += [dict(name=f"p{a}", src=a, dst=(a + 1) % w, shape=(psize,), dtype="float32"),
                      dict(name=f"q{a}", src=a, dst=(a + 1) % w, shape=(qsize,), dtype="float32")]
        for a in range(1, w):
            specs += [dict(name=f"gp{a}", src=a, dst=0, shape=(c, psize), dtype="float32"),
                      dict(name=f"gq{a}", src=a, dst=0, shape=(c, qsize), dtype="float32"),
                      dict(name=f"st{a}", src=a, dst=0, shape=(3 + iters,), dtype="float64")]
    slots = tensors.static_slots(group, specs)
    # Which block every virtual worker holds, tracked identically on every rank.
    blk = {"p": np.arange(V), "q": np.arange(V)}
    rows = {"p": (part.urows, part.urows_max), "q": (part.irows, part.irows_max)}
    # Rank r's factor blocks: per side, the c flat blocks are the rows of one array (the
    # final gather is one send per side); order[side][j] is the row virtual worker r·c + j uses.
    held = {"p": np.stack([part.p_block(r * c + j).flat for j in range(c)]),
            "q": np.stack([part.q_block(r * c + j).flat for j in range(c)])}
    order = {"p": list(range(c)), "q": list(range(c))}

    def view(side: str, j: int) -> FactorBlock:
        nrows, rmax = rows[side]
        return FactorBlock(held[side][order[side][j]], nrows(int(blk[side][r * c + j])), rmax, k)

    def gather():
        """Every rank's blocks to rank 0; there, P and Q in dense id order (else None)."""
        mine_p, mine_q = held["p"][order["p"]], held["q"][order["q"]]
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

    dirs = directions(iters, seed)
    rng = np.random.default_rng([seed, r, 0x53])
    sent = recvd = 0
    losses = np.zeros(iters)
    total = iters * V
    evaluate, every = opts.get("evaluate"), int(opts.get("eval_every") or 0)
    evals = []  # (iteration, test RMSE, training seconds so far) on rank 0
    group.barrier()
    t0 = time.perf_counter()
    comm = paused = 0.0
    tick = opts.get("on_iteration") if r == 0 else None
    for step in range(total):
        it = step // V
        if step > 0 and step % V == 0:
            if every and it % every == 0:
                # Test RMSE for the curve: gather the current blocks (not counted as training).
                e0 = time.perf_counter()
                pq = gather()
                if pq is not None and evaluate is not None:
                    evals.append((it, evaluate(*pq), e0 - t0 - paused))
                paused += time.perf_counter() - e0
            if tick is not None:
                tick(it)
        side = None if step + 1 == total else "qp"[dirs[(step + 1) // V]]
        fut = None
        # The last pair first: its moving block goes to the successor while the others train.
        for n, j in enumerate([c - 1] + list(range(c - 1))):
            losses[it] += train_block(part, int(blk["p"][r * c + j]), int(blk["q"][r * c + j]),
                                      view("p", j), view("q", j), opts, rng)
            if n == 0 and side is not None and w > 1:
                out = held[side][order[side][c - 1]]
                fut = slots[f"{side}{r}"].send_async(out)
                sent += out.nbytes
        if side is None:
            continue
        c0 = time.perf_counter()
        if fut is not None:
            fut.result()
        # One-step transformation: virtual worker v takes the block of v − 1.
        o = order[side]
        order[side] = [o[c - 1]] + o[:c - 1]
        blk[side] = np.roll(blk[side], 1)
        if w > 1:
            buf = held[side][order[side][0]]
            buf[:] = slots[f"{side}{pred}"].recv()
            slots[f"{side}{pred}"].release()
            recvd += buf.nbytes
        comm += time.perf_counter() - c0
    seconds = time.perf_counter() - t0 - paused
    if tick is not None:
        tick(iters)
    g0 = time.perf_counter()
    pq = gather()
    mine = np.concatenate([[sent, recvd, comm], losses])
    if r != 0:
        slots[f"st{r}"].send(mine)
        group.barrier()
        return {"rank": r, "bytes_sent": sent, "bytes_received": recvd, "seconds": seconds}
    stats = [mine]
    for a in range(1, w):
        stats.append(slots[f"st{a}"].recv().copy())
        slots[f"st{a}"].release()
    gather_s = time.perf_counter() - g0
    group.barrier()
    st = np.array(stats)
    return {"rank": 0, "p": pq[0], "q": pq[1], "seconds": seconds, "gather_seconds": gather_s, "evals": evals,
            "train_mse": list(st[:, 3:].sum(axis=0) / part.n_ratings),
            "bytes_sent": [int(x) for x in st[:, 0]], "bytes_received": [int(x) for x in st[:, 1]],
            "comm_seconds": [float(x) for x in st[:, 2]], "workers": w, "blocks_per_side": V,
            "connections": 2 if w > 2 else (1 if w == 2 else 0), "directions": ["QP"[d] for d in dirs]}
