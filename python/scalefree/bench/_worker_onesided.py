"""Rank side of ``scalefree bench onesided``: rank 0 writes ``--window`` blocks of ``--size``
bytes into rank 1's region per round, three ways, then notifies; rank 1 answers with a
notification once it has seen it, so every round's time covers the data landing:

* ``blocking``: ``Channel.write(...)`` (the blocking form) ``window`` times in a row;
* ``posted-serial``: ``start_write(...).wait()`` ``window`` times in a row (the posted path,
  one at a time);
* ``posted``: ``window`` ``start_write`` calls outstanding at once, then all waited for;
* with ``--compute-ms``, also ``blocking+compute`` (the blocking writes, then a fixed amount
  of numpy work calibrated to about that long) and ``posted+compute`` (post the writes, do
  the same work, then wait for them): what posting buys when the caller has work to do.

Writes one JSON object to ``--out`` (rank 0)."""

from __future__ import annotations

import argparse
import json
import time

import numpy as np


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--size", type=int, required=True)
    p.add_argument("--window", type=int, required=True)
    p.add_argument("--rounds", type=int, required=True)
    p.add_argument("--compute-ms", type=float, default=0.0)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    import scalefree

    g = scalefree.init(timeout=120)
    if g.size != 2:
        raise SystemExit("bench onesided runs on exactly 2 ranks")
    dev = g.device
    n, w = args.size, args.window
    src = dev.alloc_region(n * w)
    dst = dev.alloc_region(n * w)
    np.frombuffer(src, np.uint8)[:] = 7
    h = np.frombuffer(dst.handle, np.uint8)
    hs = np.asarray(g.allgather(h)).reshape(-1)
    other = 1 - g.rank
    remote = dev.attach(bytes(hs[other * len(h):(other + 1) * len(h)]))
    ch = dev.channel(other)

    def blocking():
        for i in range(w):
            ch.write(src, i * n, remote, i * n, n).wait()

    def posted_serial():
        for i in range(w):
            ch.start_write(src, i * n, remote, i * n, n).wait()

    def posted():
        done = [ch.start_write(src, i * n, remote, i * n, n) for i in range(w)]
        for c in done:
            c.wait()

    work = np.ones(1 << 20, np.float64)
    reps = 0
    if args.compute_ms > 0:
        # Calibrate: numpy passes over 8 MiB taking about --compute-ms on this rank.
        t = time.perf_counter()
        k = 0
        while time.perf_counter() - t < 0.2:
            work.sum()
            k += 1
        reps = max(1, int(k * args.compute_ms / 200))

    def compute():
        for _ in range(reps):
            work.sum()

    def blocking_compute():
        blocking()
        compute()

    def posted_compute():
        done = [ch.start_write(src, i * n, remote, i * n, n) for i in range(w)]
        compute()
        for c in done:
            c.wait()

    out = {"transport": g.transport, "ucx_transports": g._ucx_transports(other), "size": n, "window": w, "modes": {},
           "compute_reps": reps}
    seq = 0
    for rep in range(2):  # the first pass warms up, the second is measured
        ways = [("blocking", blocking), ("posted-serial", posted_serial), ("posted", posted)]
        if reps:
            ways += [("blocking+compute", blocking_compute), ("posted+compute", posted_compute)]
        for name, fn in ways:
            times = []
            for _ in range(args.rounds):
                seq += 1
                g.barrier()
                t = time.perf_counter()
                if g.rank == 0:
                    fn()
                    ch.notify(1, seq)
                    dev.wait(2)
                else:
                    dev.wait(1)
                    ch.notify(2, seq)
                times.append(time.perf_counter() - t)
            if rep == 1:
                out["modes"][name] = times
    if g.rank == 1:
        assert (np.frombuffer(dst, np.uint8) == 7).all(), "the written bytes did not land"
    from scalefree._rss import peak_rss_bytes

    out["peak_rss_bytes"] = [int(x) for x in g.allgather(np.array([peak_rss_bytes()], np.int64)).reshape(-1)]
    if g.rank == 0:
        with open(args.out, "w") as f:
            json.dump(out, f)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
