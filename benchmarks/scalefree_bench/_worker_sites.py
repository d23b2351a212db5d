"""Rank side of ``scalefree bench sites``: a training-style loop with no site names. Every
iteration rank 0 computes a fresh gradient array (numpy, ``--bytes``) and sends it to rank 1
through a dynamic channel and a static slot; rank 1 receives. Then rank 1 trains against a
parameter server on rank 0 (slot transport), pushing a fresh gradient per step. Per
iteration the bytes each way copied and the send times; JSON to ``--out``."""

from __future__ import annotations

import argparse
import json
import time

import numpy as np


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--bytes", type=int, required=True)
    p.add_argument("--iters", type=int, required=True)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    import scalefree
    import scalefree.arena
    from scalefree import tensors
    from scalefree.tensors.ps import ParameterServer

    g = scalefree.init(timeout=120)
    n = args.bytes // 4
    w = np.linspace(-1, 1, n, dtype=np.float32)
    chan = tensors.dynamic_channels(g, [(0, 1)])[(0, 1)]
    slot = tensors.static_slots(g, [dict(name="g", src=0, dst=1, shape=(n,), dtype="float32")])["g"]
    # Rank 0 serves, rank 1 works (one worker): a push is a static slot write of the gradient.
    ps = ParameterServer(g, {"w": w}, lr=0.01, n_servers=1, mode="slots") if g.size == 2 else None
    rows = []

    def gradient(x, it):
        return np.tanh(x * (1 + it % 7)) * 0.5

    for it in range(args.iters):
        if g.rank == 0:
            row = {}
            for name, send, stats in (("dynamic", chan.send, chan.stats), ("static", slot.send, slot.stats)):
                before = stats()["bytes_copied"]
                grad = gradient(w, it)
                t = time.perf_counter()
                send(grad)
                row[name] = {"copied": stats()["bytes_copied"] - before, "send_s": time.perf_counter() - t}
            rows.append(row)
        else:
            chan.recv()
            slot.recv()
            slot.release()
    ps_rows = []
    if ps is not None:
        # The parameter server: rank 0 serves, rank 1 pulls and pushes fresh gradients.
        if ps.is_server:
            ps.serve(args.iters)
        else:
            for it in range(args.iters):
                before = ps.stats()["bytes_copied"]
                params = ps.pull()
                grad = gradient(params["w"], it)
                t = time.perf_counter()
                ps.push({"w": grad})
                ps_rows.append({"copied": ps.stats()["bytes_copied"] - before, "send_s": time.perf_counter() - t})
            with open(args.out + ".ps", "w") as f:
                json.dump(ps_rows, f)
    from scalefree._rss import peak_rss_bytes

    rss = [int(x) for x in g.allgather(np.array([peak_rss_bytes()], np.int64)).reshape(-1)]
    if g.rank == 0:
        if ps is not None:
            with open(args.out + ".ps") as f:
                for row, ps_row in zip(rows, json.load(f)):
                    row["ps"] = ps_row
        with open(args.out, "w") as f:
            json.dump({"rows": rows, "traced_sites": tensors.traced_allocation_sites(), "peak_rss_bytes": rss,
                       "arena": scalefree.arena.threshold() is not None}, f)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
