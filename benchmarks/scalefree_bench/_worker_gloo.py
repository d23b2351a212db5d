"""One rank of ``scalefree bench allreduce`` for gloo (``torch.distributed``, started by
the scalefree launcher, rank and size from ``SCALEFREE_RANK``/``SCALEFREE_WORLD_SIZE``):
``dist.all_reduce`` of a ``torch.from_numpy`` view, in place (``all_gather`` into views of
the output rows, ``broadcast`` with ``--op``)."""

from __future__ import annotations

import datetime
import os
import sys
import time


def main(argv: list[str] | None = None) -> int:
    from .allreduce import run_rank, worker_parser

    p = worker_parser(__doc__)
    p.add_argument("--port", type=int, required=True, help="TCP rendezvous port on the master address")
    p.add_argument("--master-addr", default="127.0.0.1", help="rank 0's address (across hosts)")
    p.add_argument("--timeout", type=float, default=600.0, help="gloo's collective timeout, seconds")
    args = p.parse_args(argv)
    rank = int(os.environ["SCALEFREE_RANK"])
    world_size = int(os.environ["SCALEFREE_WORLD_SIZE"])

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)  # gloo does not use the intra-op pool; keep it off the cores
    t0 = time.perf_counter()
    dist.init_process_group(
        backend="gloo", init_method=f"tcp://{args.master_addr}:{args.port}", rank=rank,
        world_size=world_size, timeout=datetime.timedelta(seconds=args.timeout),
    )
    init_s = time.perf_counter() - t0
    cell = torch.zeros(1, dtype=torch.float64)

    def allmax(x: float) -> float:
        cell[0] = x
        dist.all_reduce(cell, op=dist.ReduceOp.MAX)
        return float(cell[0])

    def make_op(a, out):
        t = torch.from_numpy(a)
        if args.op == "allgather":
            parts = list(torch.from_numpy(out).unbind(0))
            return lambda: dist.all_gather(parts, t)
        if args.op == "broadcast":
            return lambda: dist.broadcast(t, 0)
        all_reduce = dist.all_reduce
        return lambda: all_reduce(t)

    try:
        run_rank(impl="gloo", variant="", rank=rank, world_size=world_size, make_op=make_op,
                 barrier=dist.barrier, allmax=allmax, args=args, init_s=init_s)
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
