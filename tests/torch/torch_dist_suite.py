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

``SCALEFREE_SUITE_AS_GLOO=1`` (with ``BACKEND=scalefree``) lifts those gates: the suite's
module is imported with ``BACKEND=gloo``, so every skip decorator decides as it does for
gloo, and then the module's ``BACKEND`` is set to ``"scalefree"``, so the test bodies and
``init_process_group`` run on scalefree. Nothing in torch's files is changed.
"""

from __future__ import annotations

import os
import sys

# Where the runner is started from, scalefree may be in a work tree (PYTHONPATH) or installed.
import scalefree.torch  # noqa: F401  (registers the "scalefree" backend)
from torch.testing._internal.common_distributed import DistTestCases

BACKEND = os.environ["BACKEND"]
AS_GLOO = os.environ.get("SCALEFREE_SUITE_AS_GLOO", "0") not in ("", "0")
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

if BACKEND == "scalefree" and AS_GLOO:
    distributed_test.BACKEND = "scalefree"

from torch.testing._internal.distributed.distributed_test import DistributedTest, TestDistBackend  # noqa: E402


class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()
        self._spawn_processes()


_suffix = BACKEND.upper() + ("_AS_GLOO" if AS_GLOO and BACKEND == "scalefree" else "")
TestDistBackendWithSpawn.__name__ = TestDistBackendWithSpawn.__qualname__ = f"TestDistBackendWithSpawn{_suffix}"
globals()[TestDistBackendWithSpawn.__name__] = TestDistBackendWithSpawn
del TestDistBackendWithSpawn
