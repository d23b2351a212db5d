#!/usr/bin/env python3
"""scipy's svds test suite against ``scalefree.flash.svds``, beside scipy's own run.

    python scripts/conformance_scipy.py [--json OUT]

Runs, in two pytest processes, (1) scipy's file ``scipy/sparse/linalg/_eigen/tests/test_svds.py``
from the installed wheel against scipy's svds, and (2) the same file against ours through
``tests/flash/test_svds_conformance.py`` (``SCALEFREE_CONFORMANCE=full``), and prints
passed / failed / skipped / xfailed per solver name. Rows ``arpack tests as <name>`` run
scipy's ARPACK class with the solver name replaced (the contract ``flash.svds`` keeps under
every name). Exit status 1 if any test of ours failed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OURS = ROOT / "tests" / "flash" / "test_svds_conformance.py"
SCIPY_MODULE = "scipy.sparse.linalg._eigen.tests.test_svds"

# (row, scipy's class, our class)
ROWS = [
    ("arpack", "Test_SVDS_ARPACK", "TestScipyArpack"),
    ("lobpcg", "Test_SVDS_LOBPCG", "TestScipyLobpcg"),
    ("propack", "Test_SVDS_PROPACK", "TestScipyPropack"),
    ("solver names (Test_SVDS_once)", "Test_SVDS_once", "TestScipyOnce"),
    ("arpack tests as lobpcg", "Test_SVDS_ARPACK", "TestArpackAsLobpcg"),
    ("arpack tests as propack", "Test_SVDS_ARPACK", "TestArpackAsPropack"),
]
OUTCOMES = ("passed", "failed", "skipped", "xfailed")


def run_pytest(args: list[str], env: dict, cwd: Path) -> dict[str, Counter]:
    """Outcome counts per test class of one pytest run (from its JUnit XML)."""
    with tempfile.TemporaryDirectory() as tmp:
        xml = Path(tmp) / "report.xml"
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={xml}", *args]
        subprocess.run(cmd, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if not xml.exists():
            raise SystemExit(f"conformance_scipy: pytest produced no report: {' '.join(cmd)}")
        counts: dict[str, Counter] = {}
        for case in ET.parse(xml).iter("testcase"):
            cls = case.get("classname", "").rsplit(".", 1)[-1]
            kinds = {child.tag: child for child in case}
            if "failure" in kinds or "error" in kinds:
                outcome = "failed"
            elif "skipped" in kinds:
                outcome = "xfailed" if kinds["skipped"].get("type") == "pytest.xfail" else "skipped"
            else:
                outcome = "passed"
            counts.setdefault(cls, Counter())[outcome] += 1
        return counts


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="also write the counts to this file")
    args = parser.parse_args(argv)
    import scipy

    env = dict(os.environ)
    import scalefree  # the one this interpreter imports (installed, or a work tree's)

    here = str(Path(scalefree.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (here, env.get("PYTHONPATH", "")) if p)
    theirs = run_pytest(["--pyargs", SCIPY_MODULE], env, Path(tempfile.gettempdir()))
    env["SCALEFREE_CONFORMANCE"] = "full"
    ours = run_pytest([str(OURS)], env, ROOT)

    def cell(c: Counter) -> str:
        return " ".join(f"{c[o]:4d}" for o in OUTCOMES)

    head = " ".join(f"{o[:4]:>4}" for o in OUTCOMES)
    print(f"scipy {scipy.__version__} svds suite ({SCIPY_MODULE})")
    print(f"{'solver name':32} | {'scipy svds':^19} | {'scalefree flash.svds':^19}")
    print(f"{'':32} | {head} | {head}")
    rows = []
    for row, their_cls, our_cls in ROWS:
        t, o = theirs.get(their_cls, Counter()), ours.get(our_cls, Counter())
        print(f"{row:32} | {cell(t)} | {cell(o)}")
        rows.append({"row": row, "scipy": {k: t[k] for k in OUTCOMES}, "scalefree": {k: o[k] for k in OUTCOMES}})
    failed = sum(c["failed"] for c in ours.values())
    if args.json:
        Path(args.json).write_text(json.dumps({"scipy": scipy.__version__, "rows": rows}, indent=2) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
