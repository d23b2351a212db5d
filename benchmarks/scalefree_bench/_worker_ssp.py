"""One rank of ``scalefree bench ssp`` (ours under the scalefree launcher, MPI under
mpiexec): the straggler loop for every requested configuration, results written to
``<out-dir>/rank<r>.json`` after each one."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--impl", choices=("scalefree", "mpi"), required=True)
    p.add_argument("--out-dir", type=Path, required=True)
    p.add_argument("--bytes", type=int, required=True)
    p.add_argument("--calls", type=int, required=True)
    p.add_argument("--delays", required=True, help="comma-separated max straggler delays (ms)")
    p.add_argument("--configs", required=True,
                   help="variant:slack[:push_order],... ('dense:0' = allreduce)")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def main(argv=None) -> int:
    import numpy as np

    from scalefree.ssp.straggler import StragglerSchedule

    args = parse(argv)
    if args.impl == "mpi":
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
        rank, size, barrier = comm.Get_rank(), comm.Get_size(), comm.Barrier
    else:
        import scalefree

        g = scalefree.init(timeout=300)
        rank, size, barrier = g.rank, g.size, g.barrier
    count = args.bytes // 4
    c = np.full(count, rank + 1, dtype=np.float32)
    out = np.empty_like(c)
    results = []
    path = args.out_dir / f"rank{rank}.json"
    try:
        for delay_ms in [float(d) for d in args.delays.split(",")]:
            sched = StragglerSchedule(delay_ms, args.seed, size)
            delays = sched.delays_s(rank, args.calls)
            totals = [sum(sched.delays_s(r, args.calls)) for r in range(size)]
            for cfg in args.configs.split(","):
                variant, slack, *rest = cfg.split(":")
                slack = int(slack)
                order = rest[0] if rest else "cyclic"
                red = None
                if args.impl == "mpi":
                    op = lambda: comm.Allreduce(c, out, op=MPI.SUM)  # noqa: E731
                elif variant == "dense":
                    def op():
                        np.copyto(out, c)
                        g.allreduce(out)
                else:
                    red = g.ssp_reduction(count, "float32", variant=variant, push_order=order)
                    op = lambda: red.allreduce(c, slack=slack, out=out)  # noqa: E731
                op_warm = 3 if red is None else 0   # an SSP warm-up call would be a contribution
                for _ in range(op_warm):
                    op()
                barrier()
                times, slept = [], []
                t0 = time.perf_counter()
                for d in delays:
                    t1 = time.perf_counter()
                    if d:
                        time.sleep(d)
                        t2 = time.perf_counter()
                        slept.append(t2 - t1)
                        t1 = t2
                    else:
                        slept.append(0.0)
                    op()
                    times.append(time.perf_counter() - t1)
                wall = time.perf_counter() - t0
                shown = f"auto={red.variant}" if red is not None and variant == "auto" else variant
                row = {"variant": shown, "push_order": order, "slack": slack, "delay_ms": delay_ms, "wall_s": wall,
                       "times_s": times, "slept_s": slept, "my_delay_s": sum(delays), "bound_s": max(totals)}
                if red is not None:
                    t2 = time.perf_counter()
                    final = red.flush()
                    row["flush_s"] = time.perf_counter() - t2
                    want = args.calls * size * (size + 1) / 2
                    if not (final.min() == want and final.max() == want):
                        raise RuntimeError(f"{variant} slack {slack}: flushed total is "
                                           f"[{final.min()}, {final.max()}], want {want}")
                    st = red.stats()
                    row["wait_s"] = st["wait_seconds"].tolist()
                    row["age_diff"] = st["age_diff"].tolist()
                    red.close()
                results.append(row)
                barrier()
                tmp = path.with_suffix(".tmp")
                tmp.write_text(json.dumps({"rank": rank, "size": size, "rows": results}))
                os.replace(tmp, path)
                if rank == 0:
                    print(f"  {args.impl} n={size} {variant} ({order}) slack {slack} delay {delay_ms:g} ms: "
                          f"wall {wall:.3f} s", file=sys.stderr, flush=True)
    except BaseException:
        traceback.print_exc()
        sys.stderr.flush()
        if args.impl == "mpi":
            comm.Abort(1)
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
