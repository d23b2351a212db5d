"""One rank of ``scalefree bench allreduce`` for MPI (mpi4py under mpiexec):
``comm.Allreduce(MPI.IN_PLACE, a, op=MPI.SUM)`` (``Allgather``, ``Bcast`` with ``--op``)."""

from __future__ import annotations

import sys
import time
import traceback


def main(argv: list[str] | None = None) -> int:
    from .allreduce import run_rank, worker_parser

    args = worker_parser(__doc__).parse_args(argv)
    t0 = time.perf_counter()
    from mpi4py import MPI  # initializes MPI

    init_s = time.perf_counter() - t0
    comm = MPI.COMM_WORLD
    try:
        run_rank(
            impl="mpi",
            variant=_mpi_flavour(MPI.Get_library_version()),
            rank=comm.Get_rank(),
            world_size=comm.Get_size(),
            make_op=lambda a, out: _op(comm, MPI, args.op, a, out),
            barrier=comm.Barrier,
            allmax=lambda x: comm.allreduce(x, op=MPI.MAX),
            args=args,
            init_s=init_s,
        )
    except BaseException:
        # An exception on one rank would leave the others blocked in a collective.
        traceback.print_exc()
        sys.stderr.flush()
        comm.Abort(1)
    return 0


def _op(comm, MPI, op: str, a, out):
    if op == "allgather":
        return lambda: comm.Allgather(a, out)
    if op == "broadcast":
        return lambda: comm.Bcast(a, root=0)
    return lambda: comm.Allreduce(MPI.IN_PLACE, a, op=MPI.SUM)


def _mpi_flavour(version: str) -> str:
    v = version.lower()
    if "open mpi" in v:
        return "openmpi"
    if "mpich" in v:
        return "mpich"
    return v.split()[0] if v.split() else "unknown"


if __name__ == "__main__":
    sys.exit(main())
