"""scalefree: one-sided transport, collectives and out-of-core kernels for ML workloads
that outgrow one machine.

    import numpy as np, scalefree
    g = scalefree.init()          # rank and size from `scalefree run`, mpirun, srun, torchrun
    a = np.ones(1 << 20, np.float32)
    g.allreduce(a)                # in place, op="sum"
"""

from __future__ import annotations

from .errors import (
    BootstrapError,
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
    # The native module is imported on first use, so `python -m scalefree.launcher`
    # works without it.
    if name == "Group":
        from .group import Group

        return Group
    raise AttributeError(f"module 'scalefree' has no attribute {name!r}")


def init(timeout: float | None = None, bootstrap_timeout: float | None = None):
    """Joins this process's job and returns its :class:`Group`.

    Rank and size come from the launcher's environment: ``scalefree run``, Open MPI's
    ``mpirun``, MPICH's ``mpiexec``, Slurm's ``srun`` or ``torchrun``; without any, the
    group has one rank. Every rank must call it. Calling it again returns the same open
    group.

    ``timeout`` (seconds, default ``SCALEFREE_TIMEOUT`` or 1800) bounds how long a
    collective waits for a peer that is alive but silent; a peer that dies is reported
    within about a second as :class:`PeerLostError`. ``bootstrap_timeout`` (default
    ``SCALEFREE_BOOTSTRAP_TIMEOUT`` or 120) bounds how long ranks take to find each other.
    """
    global _default_group
    if _default_group is not None and not _default_group.closed:
        return _default_group
    from .group import Group

    _default_group = Group(timeout=timeout, bootstrap_timeout=bootstrap_timeout)
    return _default_group
