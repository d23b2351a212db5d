"""``rima`` under bounded staleness (``--slack S``): a worker that has trained its blocks
need not wait for its predecessor's block to start the next ring step.

The ring and its pattern sequence are :mod:`.rima`'s. At each step one side moves: rank r
passes its block of that side to r + 1 and takes the one r − 1 trained in the previous
step. Synchronous Rima waits for it. Here, while fewer than ``S`` blocks are still owed to
it, rank r trains on the copy of that block it holds — the version that left it one lap
earlier (older copies, the initial factors included, are never used: their delta would count
much of what the others did since twice) — and keeps that copy as the block's *base*. The
incoming block is resolved when its pair is first trained, as late as possible. When the
predecessor's block arrives, the two lines of updates are merged by delta::

    merged = fresh + (trained − base)

(factors and AdaGrad accumulators alike: both are sums of updates). Only then is the block
passed on, so the successor always gets every update made to it so far: nothing is lost,
nothing counted twice (the SSP thesis's rule, a contribution is its history's delta). A
block trained on the fresh version (always, at ``S = 0``) is trained in place with no
delta: slack 0 is today's Rima, bit for bit.

Bound: a worker is never more than ``S`` blocks ahead of what its predecessor has
delivered, so at most ``S`` steps ahead of its predecessor and ``S·(w − 1)`` of the
slowest worker; every block it trains is at most ``S`` of its owner's steps stale.

Evaluation is off the critical path: at the end of every iteration each rank records its
blocks as they will be once merged (a block still owed is corrected when it arrives), and
rank 0 scores those models after training; iteration i's time is when its last block was
final on any rank.

Blocks travel through static tensor slots (``S + 2`` per side and ring edge), sent in order
by one sender thread per side, so a rank never blocks on a send.
"""

from __future__ import annotations

import concurrent.futures
import time
from collections import deque

import numpy as np

from ...errors import InvalidArgumentError
from ...ssp.straggler import StragglerSchedule
from ...tensors import slots as tensors
from ..data.blocks import FactorBlock, train_block


class Held:
    """A factor block this rank trains: its id, the flat array trained in place and, while
    its fresh version is owed by the predecessor, the stale copy training started from
    (``base``), the receive it waits for (``seq``) and the iteration-end records to correct."""

    __slots__ = ("side", "id", "cur", "base", "seq", "snaps", "final_at", "sent_after")

    def __init__(self, side: str, bid: int, cur: np.ndarray):
        self.side, self.id, self.cur = side, bid, cur
        self.base = None
        self.seq = -1
        self.snaps: list[np.ndarray] = []
        self.final_at = 0.0
        self.sent_after = -1

    def merge(self, fresh: np.ndarray, now: float) -> None:
        """The owner's version arrived: ``cur = fresh + (cur − base)``, and the same for every
        record taken of it while it was owed."""
        d = fresh - self.base
        self.cur += d
        for s in self.snaps:
            s += d
        self.base, self.snaps, self.final_at = None, [], now


def check_options(opts: dict, streamed: bool) -> None:
    """What the stale ring does not do (yet): one line naming the option."""
    for key, what in (("memory_budget", "a memory budget"), ("checkpoint", "checkpoints"),
                      ("validate", "a validation split / early stopping")):
        if opts.get(key) is not None:
            raise InvalidArgumentError(f"rima: --slack with {what} is not supported; use --slack 0")
    if streamed:
        raise InvalidArgumentError("rima: --slack needs the ratings in memory or read in shares, not streamed")


def train(group, part, opts: dict, w: int, r: int, c: int, V: int, bp, bq, dirs, order: list[int]) -> dict:
    """Runs on every rank; the result has :func:`scalefree.mf.modes.rima.train`'s keys that
    :class:`~scalefree.mf.MatrixFactorization` reads (rank 0: P, Q, evaluations)."""
    k, iters, seed = opts["k"], opts["iterations"], opts["seed"]
    S = int(opts["slack"])
    if not opts.get("normalize", True):
        part.scale = 1.0
    pred = (r - 1) % w
    K = S + 2
    psize, qsize = FactorBlock.size(part.urows_max, k), FactorBlock.size(part.irows_max, k)
    specs = []
    for a in range(w):
        for t in range(K):
            specs += [dict(name=f"p{a}_{t}", src=a, dst=(a + 1) % w, shape=(psize,), dtype="float32"),
                      dict(name=f"q{a}_{t}", src=a, dst=(a + 1) % w, shape=(qsize,), dtype="float32")]
    for a in range(1, w):
        specs += [dict(name=f"sp{a}", src=a, dst=0, shape=(iters + 1, c, psize), dtype="float32"),
                  dict(name=f"sq{a}", src=a, dst=0, shape=(iters + 1, c, qsize), dtype="float32"),
                  dict(name=f"st{a}", src=a, dst=0, shape=(2 * iters + 4,), dtype="float64")]
    slots = tensors.static_slots(group, specs)
    # The version of each block that last left this rank, and the step after which it left:
    # what a stale step starts from, if it left one lap ago (never the initial factors).
    cache: dict[str, list] = {"p": [None] * V, "q": [None] * V}
    cached_at = {"p": [-V - 1] * V, "q": [-V - 1] * V}
    held = {"p": [Held("p", int(bp[0][r * c + j]), part.p_block(int(bp[0][r * c + j])).flat) for j in range(c)],
            "q": [Held("q", int(bq[0][r * c + j]), part.q_block(int(bq[0][r * c + j])).flat) for j in range(c)]}
    part.drop_initial()  # every other block reaches this rank through the ring
    rows = {"p": (part.urows, part.urows_max), "q": (part.irows, part.irows_max)}
    owed: deque[Held] = deque()  # blocks trained on a stale copy, oldest first
    outq = {"p": deque(), "q": deque()}  # passed on, sent once final, in order
    nrecv = {"p": 0, "q": 0}
    nsend = {"p": 0, "q": 0}
    senders = {s: concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"rima-send-{s}")
               for s in "pq"}
    futures: list[concurrent.futures.Future] = []
    # Per iteration end: the c P and c Q blocks (corrected when an owed block arrives).
    snaps = np.empty((iters + 1, 2, c), object)
    snap_t = np.zeros(iters + 1)
    snap_of: list[list[Held]] = [[] for _ in range(iters + 1)]
    rng = np.random.default_rng([seed, r, 0x53])
    losses = np.zeros(iters)
    delays = StragglerSchedule(float(opts.get("straggler_ms") or 0.0), seed, w).delays_s(r, iters * V)
    stale_steps = 0
    waited = 0.0
    tick = opts.get("on_iteration") if r == 0 else None

    def now() -> float:
        return time.perf_counter() - t0

    def view(h: Held) -> FactorBlock:
        nrows, rmax = rows[h.side]
        return FactorBlock(h.cur, nrows(h.id), rmax, k)

    def receive(h: Held, block: bool) -> bool:
        """The owner's version of ``h`` (the oldest owed), merged; False if not there yet."""
        slot = slots[f"{h.side}{pred}_{h.seq % K}"]
        if not block and not slot.poll():
            return False
        h.merge(slot.recv(), now())
        slot.release()
        return True

    def send_ready() -> None:
        for side in "pq":
            q = outq[side]
            while q and q[0].base is None:
                h = q.popleft()
                cache[side][h.id] = h.cur  # no longer trained here: the copy a later stale step uses
                cached_at[side][h.id] = h.sent_after
                slot = slots[f"{side}{r}_{nsend[side] % K}"]
                nsend[side] += 1
                futures.append(senders[side].submit(slot.send, h.cur))

    def service(block_until=None) -> None:
        """Merges what arrived (in order), sends what became final; with ``block_until``,
        waits until it holds."""
        nonlocal waited
        while owed and receive(owed[0], False):
            owed.popleft()
        send_ready()
        while block_until is not None and not block_until():
            w0 = time.perf_counter()
            receive(owed.popleft(), True)
            waited += time.perf_counter() - w0
            while owed and receive(owed[0], False):
                owed.popleft()
            send_ready()

    def resolve(h: Held, step: int) -> None:
        """The block that came in for ``step``: the predecessor's version, or (room and a copy
        of its last lap permitting) the copy here, to be merged when the version comes."""
        nonlocal waited, stale_steps
        side = h.side
        service()
        # A stale step needs room (fewer than S blocks owed) and a copy from the block's last
        # lap through this rank: an older one (the initial factors, a side that has not moved
        # for a while) would make the delta count much of what the others did since twice.
        lap = cached_at[side][h.id] == step - 1 + c - V  # it left from the last of our c places
        if S == 0 or not lap or (not owed and slots[f"{side}{pred}_{h.seq % K}"].poll()):
            # The predecessor sends in order: what is owed comes first (and frees the slots
            # it would need), so waiting for it costs nothing more.
            service(block_until=lambda: not owed)
            w0 = time.perf_counter()
            slot = slots[f"{side}{pred}_{h.seq % K}"]
            h.cur = slot.recv().copy()
            slot.release()
            waited += time.perf_counter() - w0
        else:
            h.cur = cache[side][h.id].copy()
            h.base = cache[side][h.id].copy()
            owed.append(h)
            service(block_until=lambda: len(owed) <= S)
            stale_steps += h.base is not None

    group.barrier()
    t0 = time.perf_counter()
    total = iters * V
    for step in range(total):
        it = step // V
        side = None if step + 1 == total else "qp"[dirs[(step + 1) // V]]
        for n, j in enumerate(order):
            hp, hq = held["p"][j], held["q"][j]
            for h in (hp, hq):
                if h.cur is None:
                    resolve(h, step)  # as late as it can be: the predecessor had the most time
            if n == 0 and delays[step]:
                time.sleep(delays[step])  # a slow step: its training takes longer, with its blocks in hand
            losses[it] += train_block(part, hp.id, hq.id, view(hp), view(hq), opts, rng, None, first=it == 0)
            if n == 0 and side is not None:
                held[side][c - 1].sent_after = step
                outq[side].append(held[side][c - 1])  # the moving block goes on as soon as it is final
                service()
        if (step + 1) % V == 0:
            # Iteration `it` is done here: record the blocks as they will be once final.
            for si, s in enumerate("pq"):
                for j, h in enumerate(held[s]):
                    snaps[it + 1, si, j] = h.cur.copy()
                    if h.base is not None:
                        h.snaps.append(snaps[it + 1, si, j])
                        snap_of[it + 1].append(h)
            snap_t[it + 1] = now()
            if tick is not None:
                tick(it + 1)
        if side is None:
            continue
        # One-step transformation: virtual worker v takes the block of v − 1 (resolved when
        # first trained).
        h = Held(side, int((bp if side == "p" else bq)[step + 1][r * c]), None)
        h.seq = nrecv[side]
        nrecv[side] += 1
        held[side] = [h] + held[side][:c - 1]
    service(block_until=lambda: not owed)
    for f in futures:
        f.result()
    for s in senders.values():
        s.shutdown()
    seconds = now()
    for i in range(1, iters + 1):
        snap_t[i] = max([snap_t[i]] + [h.final_at for h in snap_of[i] if h.final_at])
    # Row i: this rank's blocks at the end of iteration i (row 0 unused), every one final now.
    mine_p, mine_q = np.zeros((iters + 1, c, psize), np.float32), np.zeros((iters + 1, c, qsize), np.float32)
    for i in range(1, iters + 1):
        for j in range(c):
            mine_p[i, j], mine_q[i, j] = snaps[i, 0, j], snaps[i, 1, j]
    sent = nsend["p"] * psize * 4 + nsend["q"] * qsize * 4
    stats = np.concatenate([snap_t[1:], losses, [seconds, waited, stale_steps, sent]])
    final_blk = {"p": bp[-1], "q": bq[-1]}
    evaluate, every = opts.get("evaluate"), int(opts.get("eval_every") or 0)
    collective = bool(opts.get("evaluate_collective"))
    if r != 0:
        slots[f"sp{r}"].send(mine_p)
        slots[f"sq{r}"].send(mine_q)
        slots[f"st{r}"].send(stats)
        all_p = all_q = None
    else:
        all_p, all_q, all_st = [mine_p], [mine_q], [stats]
        for a in range(1, w):
            all_p.append(slots[f"sp{a}"].recv().copy())
            all_q.append(slots[f"sq{a}"].recv().copy())
            all_st.append(slots[f"st{a}"].recv().copy())
            for nm in ("sp", "sq", "st"):
                slots[f"{nm}{a}"].release()
    # The pattern at the end of iteration i: the blocks of its last step.
    evals = []
    if evaluate is not None and every:
        for i in range(1, iters + 1):
            if i % every and i != iters:
                continue
            pq = None
            if r == 0:
                last = i * V - 1
                pb = {int(bp[last][a * c + j]): all_p[a][i, j] for a in range(w) for j in range(c)}
                qb = {int(bq[last][a * c + j]): all_q[a][i, j] for a in range(w) for j in range(c)}
                pq = part.dense_factors(pb, qb)
            if pq is not None or collective:
                rmse = evaluate(*(pq if pq is not None else (None, None)))
                if r == 0:
                    evals.append((i, rmse, float(max(st[i - 1] for st in all_st))))
    group.barrier()
    if r != 0:
        return {"rank": r, "bytes_sent": int(sent), "seconds": seconds}
    pb = {int(final_blk["p"][a * c + j]): all_p[a][iters, j] for a in range(w) for j in range(c)}
    qb = {int(final_blk["q"][a * c + j]): all_q[a][iters, j] for a in range(w) for j in range(c)}
    p, q = part.dense_factors(pb, qb)
    st = np.array(all_st)
    loss = st[:, iters:2 * iters].sum(axis=0)
    return {"rank": 0, "p": p, "q": q, "seconds": float(st[:, 2 * iters].max()), "iterations_done": iters,
            "evals": evals, "train_mse": list(loss * part.scale ** 2 / part.n_ratings), "workers": w,
            "blocks_per_side": V, "slack": S,
            "wait_seconds": [float(x) for x in st[:, 2 * iters + 1]],
            "stale_steps": [int(x) for x in st[:, 2 * iters + 2]],
            "connections": [2] * w, "block_bytes_sent": [int(x) for x in st[:, 2 * iters + 3]],
            "bytes_sent": [int(x) for x in st[:, 2 * iters + 3]], "bytes_received": [],
            "comm_seconds": [float(x) for x in st[:, 2 * iters + 1]],
            "directions": ["QP"[d] for d in dirs]}
