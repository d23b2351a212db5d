"""scipy's own svds tests against ``flash.svds``.

The tests are scipy's file ``scipy/sparse/linalg/_eigen/tests/test_svds.py`` as the installed
scipy wheel ships it, imported and not modified: its classes are subclassed here and the name
``svds`` in its module is replaced by ours for the duration of each test. Two views:

- ``TestScipy*``: scipy's classes as they are. Each passes ``solver=<its name>``, and a few of
  the LOBPCG and PROPACK tests encode that solver's own conventions, which ``flash.svds``
  does not take (its contract is ARPACK's under every name); they are marked ``xfail``
  (strict) below with the reason, so a change in either direction shows.
- ``TestArpackAs*``: scipy's ARPACK class with every call's solver name replaced by
  ``"lobpcg"`` / ``"propack"``: every test that passes with ``solver="arpack"`` passes under
  each name.

CI runs the ARPACK class under the three names and the solver-name check (``Test_SVDS_once``);
``SCALEFREE_CONFORMANCE=full`` (what ``scripts/conformance`` sets) adds scipy's LOBPCG and
PROPACK classes. ``scripts/conformance_scipy.py`` prints the counts beside scipy's own.
"""

import functools
import os

import pytest

suite = pytest.importorskip("scipy.sparse.linalg._eigen.tests.test_svds")

from scalefree import flash  # noqa: E402

FULL = os.environ.get("SCALEFREE_CONFORMANCE", "") == "full"

# (class name, test function name, predicate on the parameter id) -> why flash.svds differs.
_PROPACK_COMPLETE = "PROPACK computes complete SVDs (k = min(A.shape)); the ARPACK contract is k < min(A.shape)"
_DIVERGENCES = [
    ("TestScipyPropack", "test_svds_input_validation_k_1", lambda p: p == "3", _PROPACK_COMPLETE),
    ("TestScipyPropack", "test_svd_simple", lambda p: _complete_svd_case(p), _PROPACK_COMPLETE),
    ("TestScipyPropack", "test_svds_input_validation_v0_1", lambda p: p == "5-True",
     "PROPACK's v0 is a left vector (shape (M,)); ARPACK's has shape (min(A.shape),)"),
    ("TestScipyPropack", "test_svd_linop", lambda p: True,
     "PROPACK's v0 is a left vector (shape (M,)); ARPACK's has shape (min(A.shape),)"),
    ("TestScipyPropack", "test_svd_maxiter", lambda p: True,
     "PROPACK's maxiter is its basis size; ARPACK's (ours) counts restarts, and a 9 x 9 matrix fits one basis"),
    ("TestScipyLobpcg", "test_svd_maxiter", lambda p: True,
     "LOBPCG warns 'Exited at iteration' and returns; under the ARPACK contract a 9 x 9 matrix fits one basis "
     "(and too few restarts raise ArpackNoConvergence)"),
]


def _complete_svd_case(param_id: str) -> bool:
    """test_svd_simple's ids end in ``-k-A0`` / ``-k-A1``: A0 is 4 x 3 (complete at k=3),
    A1 4 x 4 (complete at k=4)."""
    *_, k, a = param_id.split("-")
    return (a, k) in (("A0", "3"), ("A1", "4"))


def _with_solver(name):
    @functools.wraps(flash.svds)
    def svds(*args, **kwargs):
        kwargs["solver"] = name
        return flash.svds(*args, **kwargs)

    return svds


@pytest.fixture(autouse=True)
def _ours(request, monkeypatch):
    solver = getattr(request.cls, "solver_name", None)
    monkeypatch.setattr(suite, "svds", flash.svds if solver is None else _with_solver(solver))
    node = request.node
    param = node.callspec.id if hasattr(node, "callspec") else ""
    for cls, func, matches, why in _DIVERGENCES:
        if request.cls.__name__ == cls and node.originalname == func and matches(param):
            request.applymarker(pytest.mark.xfail(strict=True, reason=why))


class TestScipyOnce(suite.Test_SVDS_once):
    pass


class TestScipyArpack(suite.Test_SVDS_ARPACK):
    pass


class TestArpackAsLobpcg(suite.Test_SVDS_ARPACK):
    solver_name = "lobpcg"


class TestArpackAsPropack(suite.Test_SVDS_ARPACK):
    solver_name = "propack"


if FULL:
    class TestScipyLobpcg(suite.Test_SVDS_LOBPCG):
        pass

    class TestScipyPropack(suite.Test_SVDS_PROPACK):
        pass
