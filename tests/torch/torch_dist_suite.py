"""PyTorch's own distributed test suite (``torch.testing._internal.distributed.distributed_test``,
shipped in the torch wheel) as torch's ``test/distributed/test_distributed_spawn.py`` runs it:
one class, ``TestDistBackend`` + ``DistributedTest._DistTestBase``, every test in fresh
processes (``multiprocessing`` spawn), the backend named by ``BACKEND``, the world size by
``WORLD_SIZE``, and ``TEMP_DIR`` a directory holding a ``barrier`` folder.

Run by ``scripts/conformance_torch.py`` (full counts) and ``test_torch_conformance.py`` (the
CI subset) through pytest; not collected on its own (its name does not start with test_).

``BACKEND=scalefree``: the backend declared as a plugin with gloo's feature set (every
``DistTestCases.backend_feature`` set that holds gloo, before the suite is imported: its
skip decorators read them when the class is made). Tests gated on the *name* gloo
(``BACKEND != "gloo"``) skip, as they would for any plugin.

``SCALEFREE_SUITE_AS_GLOO=1`` (with ``BACKEND=scalefree``): scalefree runs under gloo's name.
The suite's module is imported with ``BACKEND=gloo`` and keeps it, so its skip decorators and
the branches of its test bodies decide as they do for gloo. Only the module's view of
``torch.distributed`` changes (``distributed_test.dist``): ``init_process_group`` and
``new_group`` asked for gloo make scalefree groups, and ``get_backend`` of a scalefree group
says ``"gloo"``. Our backend records no profiler events, so gloo is taken out of the suite's
lists of backends whose profiler events it checks (the lists say which backends record them).
Nothing in torch's files is changed.

Every process group the suite's module makes (default or new) is logged, with the backend
torch really made, as one file in ``SCALEFREE_SUITE_GROUPS_DIR`` when set (the suite makes a
``TEMP_DIR`` of its own per test and deletes it); ``conformance_torch.py`` counts them, so a
run says which backend ran.
"""

from __future__ import annotations

import os
import tempfile
import types

# Where the runner is started from, scalefree may be in a work tree (PYTHONPATH) or installed.
import scalefree.torch  # noqa: F401  (registers the "scalefree" backend)
import torch.distributed as _dist
import torch.multiprocessing
from torch.testing._internal.common_distributed import DistTestCases

BACKEND = os.environ["BACKEND"]
AS_GLOO = os.environ.get("SCALEFREE_SUITE_AS_GLOO", "0") not in ("", "0")
# SCALEFREE_SUITE_START=fork: ranks forked from the runner (which has imported torch and the
# suite once) instead of spawned fresh interpreters, each importing them again (torch's way).
FORK = os.environ.get("SCALEFREE_SUITE_START", "spawn") == "fork"
if BACKEND not in ("gloo", "scalefree"):
    raise RuntimeError(f"torch_dist_suite: BACKEND must be gloo or scalefree, got {BACKEND!r}")

if BACKEND == "scalefree":
    for features in DistTestCases.backend_feature.values():
        if "gloo" in features:
            features.add("scalefree")
    DistTestCases.backend_feature["plugin"].add("scalefree")
    if AS_GLOO:
        os.environ["BACKEND"] = "gloo"

try:
    from torch.testing._internal.distributed import distributed_test
finally:
    os.environ["BACKEND"] = BACKEND


def _log_group(pg) -> None:
    """One file in SCALEFREE_SUITE_GROUPS_DIR (if set) named after the backend torch made for ``pg``."""
    d = os.environ.get("SCALEFREE_SUITE_GROUPS_DIR")
    if d:
        fd, _ = tempfile.mkstemp(prefix=f"{_dist.get_backend(pg)}.", dir=d)
        os.close(fd)


def _ours(backend):
    """The backend name the suite asked for, gloo's meaning scalefree's."""
    return "scalefree" if AS_GLOO and backend is not None and str(backend).lower() == "gloo" else backend


def _init_process_group(*args, **kwargs):
    if args:
        args = (_ours(args[0]), *args[1:])
    elif "backend" in kwargs:
        kwargs["backend"] = _ours(kwargs["backend"])
    _dist.init_process_group(*args, **kwargs)
    _log_group(None)


def _new_group(*args, **kwargs):
    if len(args) >= 3:
        args = (*args[:2], _ours(args[2]), *args[3:])
    elif "backend" in kwargs:
        kwargs["backend"] = _ours(kwargs["backend"])
    pg = _dist.new_group(*args, **kwargs)
    if pg is not None and pg is not _dist.GroupMember.NON_GROUP_MEMBER:
        _log_group(pg)
    return pg


def _get_backend(group=None):
    name = _dist.get_backend(group)
    return _dist.Backend.GLOO if AS_GLOO and name == "scalefree" else name


class _DistAsGloo(types.ModuleType):
    """``torch.distributed`` as the suite's module sees it: every name is torch's but the three
    that create or name groups."""

    def __getattr__(self, name):
        return getattr(_dist, name)


_view = _DistAsGloo("torch.distributed")
_view.init_process_group = _init_process_group
_view.new_group = _new_group
if AS_GLOO:
    _view.get_backend = _get_backend
    for _name in ("PROFILING_SUPPORTED_BACKENDS", "CUDA_PROFILING_SUPPORTED_BACKENDS",
                  "SEND_RECV_PROFILING_SUPPORTED_BACKENDS"):
        setattr(distributed_test, _name, [b for b in getattr(distributed_test, _name) if b != "gloo"])
distributed_test.dist = _view

from torch.testing._internal.distributed.distributed_test import DistributedTest, TestDistBackend  # noqa: E402


class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()
        if FORK:
            self._start_processes(torch.multiprocessing.get_context("fork").Process)
        else:
            self._spawn_processes()


_suffix = BACKEND.upper() + ("_AS_GLOO" if AS_GLOO and BACKEND == "scalefree" else "")
TestDistBackendWithSpawn.__name__ = TestDistBackendWithSpawn.__qualname__ = f"TestDistBackendWithSpawn{_suffix}"
globals()[TestDistBackendWithSpawn.__name__] = TestDistBackendWithSpawn
del TestDistBackendWithSpawn
