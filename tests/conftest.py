import sys
from pathlib import Path

import pytest

# Test modules share code (scripts, sweeps, helpers) by importing each other by name: the
# tests directory and every area under it are on the path, so `from test_sparse import ...`
# works whether or not pytest collected tests/sparse in the same run.
_HERE = Path(__file__).parent
for _d in [_HERE, *sorted(p for p in _HERE.iterdir() if p.is_dir() and not p.name.startswith((".", "_")))]:
    if str(_d) not in sys.path:
        sys.path.insert(0, str(_d))


@pytest.fixture(scope="module")
def can_simulate():
    """The simulated-hosts module (`scalefree.launch.simhosts`), or a skip saying why hosts
    cannot be simulated here (no namespaces, no `ip`/`unshare`, or no UCX)."""
    simhosts = pytest.importorskip("scalefree.launch.simhosts")
    why = simhosts.available()
    if why:
        pytest.skip(f"simulated hosts are not possible here: {why}")
    from scalefree.errors import UnsupportedError
    from scalefree.launch.ucx import info

    try:
        info()
    except UnsupportedError as e:
        pytest.skip(f"UCX is not installed here: {e}")
    return simhosts
