"""torch's env:// variables from the launcher that started this process, so that
``init_process_group("scalefree")`` (or any backend) works unchanged under ``scalefree run``,
mpirun and srun as under torchrun. Only variables torch would otherwise miss are set."""

from __future__ import annotations

import os
import zlib

# (rank, size, local rank, local size) variables of each launcher, in the transport's order.
_LAUNCHERS = [
    ("SCALEFREE_RANK", "SCALEFREE_WORLD_SIZE", "SCALEFREE_LOCAL_RANK", "SCALEFREE_LOCAL_SIZE", "SCALEFREE_JOB_ID"),
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE",
     "PMIX_NAMESPACE"),
    ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS", "PMI_KVSNAME"),
    ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE", "SLURM_JOB_ID"),
]


def fill_torch_env(environ=os.environ) -> bool:
    """Sets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT from
    the launcher's variables when RANK is not set (torchrun sets them all). MASTER_ADDR is
    ``SCALEFREE_MASTER_ADDR`` or, when every rank is on this host, 127.0.0.1; MASTER_PORT is
    ``SCALEFREE_MASTER_PORT`` + 2, else derived from the job id (the same on every rank).
    True when it set them."""
    if environ.get("RANK"):
        return False
    for rank_v, size_v, lrank_v, lsize_v, job_v in _LAUNCHERS:
        rank, size = environ.get(rank_v), environ.get(size_v)
        if not rank or not size:
            continue
        local_size = environ.get(lsize_v) or size
        environ.setdefault("RANK", rank)
        environ.setdefault("WORLD_SIZE", size)
        environ.setdefault("LOCAL_RANK", environ.get(lrank_v) or rank)
        environ.setdefault("LOCAL_WORLD_SIZE", local_size)
        addr = environ.get("SCALEFREE_MASTER_ADDR") or ("127.0.0.1" if local_size == size else None)
        if addr and not environ.get("MASTER_ADDR"):
            environ["MASTER_ADDR"] = addr
        if not environ.get("MASTER_PORT"):
            if environ.get("SCALEFREE_MASTER_PORT"):
                port = int(environ["SCALEFREE_MASTER_PORT"]) + 2
            else:
                job = environ.get(job_v) or f"ppid{os.getppid()}"
                port = 20000 + zlib.crc32(job.encode()) % 20000
            environ["MASTER_PORT"] = str(port)
        return True
    return False
