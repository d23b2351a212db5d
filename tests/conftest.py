import sys
from pathlib import Path

# Test modules share code (scripts, sweeps, helpers) by importing each other by name: the
# tests directory and every area under it are on the path, so `from test_sparse import ...`
# works whether or not pytest collected tests/sparse in the same run.
_HERE = Path(__file__).parent
for _d in [_HERE, *sorted(p for p in _HERE.iterdir() if p.is_dir() and not p.name.startswith((".", "_")))]:
    if str(_d) not in sys.path:
        sys.path.insert(0, str(_d))
