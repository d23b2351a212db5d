"""One rank of ``scalefree bench allreduce`` for scalefree (started by the scalefree
launcher): ``g.allreduce(a, algorithm=..., wire=...)`` in place (``g.allgather``,
``g.broadcast`` with ``--op``); each point records the algorithm the allreduce used (and,
with ``--wire``, the largest relative error on random data)."""

from __future__ import annotations

import sys
import time


def main(argv: list[str] | None = None) -> int:
    import numpy as np

    import scalefree

    from .allreduce import ALGORITHMS, WIRES, run_rank, wire_error, worker_parser

    p = worker_parser(__doc__)
    p.add_argument("--algorithm", choices=ALGORITHMS, default="auto")
    p.add_argument("--variant", default=None, help="label of this run's rows (default: the algorithm)")
    p.add_argument("--wire", choices=WIRES, default="exact", help="what the step between hosts carries")
    args = p.parse_args(argv)

    t0 = time.perf_counter()
    g = scalefree.init()
    init_s = time.perf_counter() - t0
    algorithm = args.algorithm
    cell = np.zeros(1, dtype=np.float64)

    def allmax(x: float) -> float:
        cell[0] = x
        g.allreduce(cell, op="max")
        return float(cell[0])

    def make_op(a, out):
        if args.op == "allgather":
            allgather = g.allgather
            return lambda: allgather(a, out, algorithm)
        if args.op == "broadcast":
            broadcast = g.broadcast
            return lambda: broadcast(a, 0, algorithm)
        allreduce = g.allreduce
        wire = None if args.wire == "exact" else args.wire
        return lambda: allreduce(a, "sum", algorithm, wire)

    def point_extra(nbytes: int) -> dict:
        if args.op != "allreduce":
            return {}
        if args.wire != "exact" and args.dtype == "float32":
            return wire_error(g, args.wire, nbytes)
        return {"algorithm_used": g.last_algorithm}

    try:
        run_rank(impl="scalefree", variant=args.variant or algorithm, rank=g.rank, world_size=g.size,
                 make_op=make_op, barrier=g.barrier, allmax=allmax, args=args,
                 refusals=(scalefree.InvalidArgumentError, scalefree.UnsupportedError),
                 point_extra=point_extra, init_s=init_s)
    finally:
        g.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
