"""scalefree: one-sided transport, collectives and out-of-core kernels for ML workloads
that outgrow one machine.

    import numpy as np, scalefree
    g = scalefree.init()          # rank and size from `scalefree run`, mpirun, srun, torchrun
    a = np.ones(1 << 20, np.float32)
    g.allreduce(a)                # in place, op="sum"
"""

from __future__ import annotations

import os
import warnings

from .errors import (
    BootstrapError,
    DataError,
    InvalidArgumentError,
    MismatchError,
    PeerLostError,
    ScalefreeError,
    ScalefreeTimeoutError,
    TransportIOError,
    UnsupportedError,
)

__version__ = "0.1.0"

__all__ = [
    "init",
    "Group",
    "BootstrapError",
    "DataError",
    "InvalidArgumentError",
    "MismatchError",
    "PeerLostError",
    "ScalefreeError",
    "ScalefreeTimeoutError",
    "TransportIOError",
    "UnsupportedError",
]

_default_group = None


def __getattr__(name):
    # The native module is imported on first use, so `scalefree run`
    # works without it.
    if name == "Group":
        from .group import Group

        return Group
    raise AttributeError(f"module 'scalefree' has no attribute {name!r}")


def init(timeout: float | None = None, bootstrap_timeout: float | None = None, arena: bool | None = None):
    """Joins this process's job and returns its :class:`Group`.

    Rank and size come from the launcher's environment: ``scalefree run``, Open MPI's
    ``mpirun``, MPICH's ``mpiexec``, Slurm's ``srun`` or ``torchrun``; without any, the
    group has one rank. Every rank must call it. Calling it again returns the same open
    group. Across hosts, ranks meet at ``SCALEFREE_MASTER_ADDR``; under ``mpirun`` without
    it, rank 0's address is asked of MPI when mpi4py is installed.

    ``timeout`` (seconds, default ``SCALEFREE_TIMEOUT`` or 1800) bounds how long a
    collective waits for a peer that is alive but silent; a peer that dies is reported
    within about a second as :class:`PeerLostError`. ``bootstrap_timeout`` (default
    ``SCALEFREE_BOOTSTRAP_TIMEOUT`` or 120) bounds how long ranks take to find each other.

    ``arena`` (default on; ``SCALEFREE_ARENA=0`` turns it off) makes numpy allocate arrays of at least
    ``SCALEFREE_ARENA_MIN`` bytes (64 KiB) in this rank's registered shared-memory arena
    (in the calling thread), which peers on its host map and peers on other hosts reach by
    its UCX key: collectives on such arrays move no extra
    copy. Every rank must pass the same value. A process forked afterwards keeps its
    inherited arrays copy-on-write (its writes never reach the parent) and allocates
    ordinary memory.
    """
    global _default_group
    if _default_group is not None and not _default_group.closed:
        return _default_group
    from .launch.mpi_master import from_mpi
    from .group import Group
    from .launch.ucx import prepare

    prepare()
    # Under mpirun across hosts, rank 0's address comes from MPI (mpi4py) when not given.
    from_mpi()
    g = Group(timeout=timeout, bootstrap_timeout=bootstrap_timeout)
    if arena is None:
        arena = os.environ.get("SCALEFREE_ARENA", "1").strip().lower() not in ("0", "false", "no", "off")
    # Over UCX too: the arena is then registered with UCX (peers on other hosts reach it by
    # its remote key), so tensors allocated there are sent without staging.
    threshold = None
    if arena:
        try:
            g._enable_arena(_env_bytes("SCALEFREE_ARENA_MIN", 64 << 10))
            threshold = _env_bytes("SCALEFREE_ARENA_MIN", 64 << 10)
        except UnsupportedError as e:
            # Same outcome on every rank (the arena set-up agrees first): run without it.
            warnings.warn(f"scalefree: running without the registered arena ({e})", RuntimeWarning, stacklevel=2)
    from . import arena as arena_state

    arena_state.attach(g, threshold)
    _default_group = g
    return g


def _env_bytes(name: str, default: int) -> int:
    from ._units import env_bytes

    return env_bytes(name, default)
