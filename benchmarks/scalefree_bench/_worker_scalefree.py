"""One rank of ``scalefree bench allreduce`` for scalefree (started by the scalefree
launcher): ``g.allreduce(a, algorithm=...)`` in place (``g.allgather``, ``g.broadcast``
with ``--op``)."""

from __future__ import annotations

import sys
import time


def main(argv: list[str] | None = None) -> int:
    import numpy as np

    import scalefree

    from .allreduce import ALGORITHMS, run_rank, worker_parser

    p = worker_parser(__doc__)
    p.add_argument("--algorithm", choices=ALGORITHMS, default="auto")
    p.add_argument("--variant", default=None, help="label of this run's rows (default: the algorithm)")
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
        return lambda: allreduce(a, "sum", algorithm)

    try:
        run_rank(impl="scalefree", variant=args.variant or algorithm, rank=g.rank, world_size=g.size,
                 make_op=make_op, barrier=g.barrier, allmax=allmax, args=args,
                 refusals=(scalefree.InvalidArgumentError, scalefree.UnsupportedError),
                 init_s=init_s)
    finally:
        g.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
