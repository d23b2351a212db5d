"""Rank side of ``scalefree bench ucx``: one-sided put bandwidth and small-message latency
between rank 0 and rank 1 (started by ``scalefree run`` across two simulated hosts).

Bandwidth: rank 0 puts ``size`` bytes into rank 1's region ``reps`` times (each put waited
for locally, as ``ucp_put_bw`` posts them), then one notification (flush first); rank 1 waits
for it. Latency: ping-pong of ``write_notify`` with an 8-byte payload; half the round trip.
Writes one JSON object to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from . import common


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--sizes", required=True, help="comma-separated byte counts")
    p.add_argument("--target-seconds", type=float, default=0.5)
    p.add_argument("--lat-iters", type=int, default=20000)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    import scalefree

    g = scalefree.init(timeout=120)
    if g.size != 2:
        raise SystemExit("bench ucx runs on exactly 2 ranks")
    dev = g.device
    sizes = [int(s) for s in args.sizes.split(",")]
    cap = max(sizes + [4096])
    src = dev.alloc_region(cap)
    dst = dev.alloc_region(cap)
    np.frombuffer(src, np.uint8)[:] = 1 + g.rank
    h = np.frombuffer(dst.handle, np.uint8)
    hs = np.asarray(g.allgather(h)).reshape(-1)
    other = 1 - g.rank
    remote = dev.attach(bytes(hs[other * len(h):(other + 1) * len(h)]))
    ch = dev.channel(other)

    def any_rank(flag: bool) -> bool:
        return bool(np.asarray(g.allgather(np.array([flag], np.int32))).any())

    out = {"transport": g.transport, "ucx_transports": g._ucx_transports(other), "put": [], "lat": {}}
    for size in sizes:
        # Enough puts per round for ~20 ms, enough rounds for the target time.
        reps = max(1, int(0.02 * 1e9 / max(size, 1) / 1.0))
        reps = min(reps, 10000)
        rounds = []
        deadline = time.perf_counter() + args.target_seconds
        # At least 5 rounds, then until any rank's deadline has passed (all ranks agree).
        for r in common.agreed_rounds(any_rank, lambda: time.perf_counter() >= deadline, min_rounds=5, max_rounds=1000):
            g.barrier()
            t = time.perf_counter()
            if g.rank == 0:
                for _ in range(reps):
                    ch.write(src, 0, remote, 0, size).wait()
                ch.notify(1, r)
            else:
                dev.wait(1)
            rounds.append((time.perf_counter() - t) / reps)
        if g.rank == 0:
            out["put"].append({"bytes": size, "reps": reps, "times_s": rounds})
    # Latency: 8-byte write_notify ping-pong.
    for k in range(2):
        g.barrier()
        n = args.lat_iters if k else 200
        t = time.perf_counter()
        for i in range(1, n + 1):
            if g.rank == 0:
                ch.write_notify(src, 0, remote, 0, 8, 2, i).wait()
                dev.wait(2)
            else:
                dev.wait(2)
                ch.write_notify(src, 0, remote, 0, 8, 2, i).wait()
        dt = time.perf_counter() - t
    out["lat"] = {"iters": args.lat_iters, "half_rtt_s": dt / args.lat_iters / 2}
    # The same loop in Rust (no interpreter between the calls), as ucx_perftest runs.
    for k in range(2):
        g.barrier()
        n = args.lat_iters if k else 200
        dt = dev._ping_pong(other, src, remote, 8, n, 3, g.rank == 0)
    out["lat_native"] = {"iters": args.lat_iters, "half_rtt_s": dt / args.lat_iters / 2}
    if g.rank == 0:
        with open(args.out, "w") as f:
            json.dump(out, f)
    g.barrier()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
