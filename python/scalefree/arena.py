"""The registered arena's state in this process, below everything that uses it:
:func:`scalefree.init` records the group and the arena's threshold here; tensor slots, the
parameter server and torch's allocation sites allocate registered memory from here.

With the arena on, numpy allocates arrays of at least :func:`threshold` bytes in this rank's
registered shared memory, which peers map; with it off, registered memory is a region of
the group's device."""

from __future__ import annotations

import os

import numpy as np

from . import _native
from .errors import InvalidArgumentError

_group = None  # the group of scalefree.init(), whose device allocates regions
_threshold: int | None = None  # bytes from which numpy allocates in the arena; None: off


def attach(group, threshold: int | None) -> None:
    """Records this process's group and the arena's threshold (None: the arena is off)."""
    global _group, _threshold
    _group, _threshold = group, threshold


def threshold() -> int | None:
    """The size from which numpy allocates in the arena, or None when the arena is off."""
    return _threshold


def registered_empty(shape, dtype) -> np.ndarray:
    """An uninitialized array in registered memory: the arena when it is on (an allocation
    padded to the arena's threshold), else a region of its own."""
    dtype = np.dtype(dtype)
    shape = tuple(int(d) for d in shape)
    n = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if _threshold is not None:
        return np.empty(max(n, _threshold), np.uint8)[:n].view(dtype).reshape(shape)
    if _group is None or _group.closed:
        raise InvalidArgumentError("registered memory needs a group: call scalefree.init() first")
    return _group.device.alloc_region(max(n, 1)).array(np.uint8)[:n].view(dtype).reshape(shape)


def release_cached() -> int:
    """Returns the pages of the arena's freed blocks to the kernel: a phase's temporaries,
    once dropped for good, stop counting in this process's resident memory (the arena keeps
    freed memory resident for reuse, up to ``SCALEFREE_ARENA_CACHE`` or the largest block
    handed out). The bytes released; 0 with the arena off."""
    if _threshold is None:
        return 0
    return int(_native.arena_release_cached())


def tracing(trace: bool | None = None) -> bool:
    """Whether sends stage tensors by allocation-site tracing (the RDMA tensor paper, §3.4):
    ``trace`` when given, else ``SCALEFREE_TRACE`` (default on; ``0`` turns it off)."""
    if trace is not None:
        return bool(trace)
    return os.environ.get("SCALEFREE_TRACE", "1").strip().lower() not in ("0", "false", "no", "off")


def is_registered(a: np.ndarray) -> bool:
    """Whether the bytes of ``a`` lie in registered memory of this process's group (the
    arena or a region): a one-sided write sends them without a staging copy."""
    if _group is None or _group.closed or a.nbytes == 0:
        return False
    return _group.device._is_registered(a.ctypes.data, a.nbytes)
