"""The torch backend's tests need torch: skipped where it is absent, except in CI (CI=true),
whose .ci/run installs it: there a missing torch is a failure, not a skip."""

import importlib.util
import os

import pytest

# (tests/ is on sys.path, so this folder alone would look like a namespace package "torch".)
_spec = importlib.util.find_spec("torch")
HAVE_TORCH = _spec is not None and _spec.origin not in (None, "namespace")


def pytest_collection_modifyitems(config, items):
    if HAVE_TORCH:
        return
    here = os.path.dirname(__file__)
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        raise pytest.UsageError("tests/torch: torch is not installed, but CI must run these tests "
                                "(.ci/run installs it with pip install '.[torch]')")
    skip = pytest.mark.skip(reason="torch is not installed (pip install '.[torch]')")
    for item in items:
        if str(item.fspath).startswith(here):
            item.add_marker(skip)
