#!/usr/bin/env python3
"""torch's own distributed test suite against the "scalefree" backend and against gloo, side by side.

    python3 scripts/conformance_torch.py [--world-sizes 2,3] [--runs gloo,scalefree,scalefree-as-gloo]
                                         [-k EXPR] [--out DIR] [--report]

Runs ``tests/torch/torch_dist_suite.py`` (the suite as torch's ``test_distributed_spawn.py`` runs
it: fresh spawned ranks per test) once per run and world size, through pytest, each run's
outcomes in ``DIR/<run>-<world size>.xml`` (JUnit XML). Then prints passed/failed/skipped per
run and every test that passes on gloo but not on scalefree. ``--report`` prints the table from
the XML files already in DIR without running anything.

Selection (the documented rule): every test of ``DistributedTest._DistTestBase`` whose name
contains none of ``cuda``, ``gpu``, ``nccl`` (tests of devices and backends this CPU backend is
not); tests the suite itself skips here (no accelerator, world size) count as skipped.

Runs: ``gloo`` (the peer); ``scalefree`` (declared a plugin with gloo's feature set: tests gated
on the name gloo skip); ``scalefree-as-gloo`` (every skip decorator decides as for gloo, the
bodies run on scalefree: the gated tests run against us). Exit status 1 when a test that gloo
passes fails on a scalefree run of the same world size.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SUITE = ROOT / "tests" / "torch" / "torch_dist_suite.py"
EXCLUDE = ("cuda", "gpu", "nccl")
RUNS = {"gloo": ("gloo", False), "scalefree": ("scalefree", False), "scalefree-as-gloo": ("scalefree", True)}


def selection_expr(extra: str | None) -> str:
    expr = " and ".join(f"not {w}" for w in EXCLUDE)
    return f"({expr}) and ({extra})" if extra else expr


def run_one(run: str, world_size: int, out: Path, k: str | None) -> Path:
    backend, as_gloo = RUNS[run]
    xml = out / f"{run}-{world_size}.xml"
    with tempfile.TemporaryDirectory(prefix="torchconf-") as tmp:
        os.mkdir(os.path.join(tmp, "barrier"))
        env = dict(os.environ, BACKEND=backend, WORLD_SIZE=str(world_size), TEMP_DIR=tmp,
                   SCALEFREE_SUITE_AS_GLOO="1" if as_gloo else "0", OMP_NUM_THREADS="1")
        # The scalefree this interpreter imports (installed, or a work tree's), not the source tree
        # as such: an installed wheel's tree has no built extension in python/.
        import scalefree

        here = str(Path(scalefree.__file__).resolve().parent.parent)
        env["PYTHONPATH"] = os.pathsep.join(p for p in [here, env.get("PYTHONPATH")] if p)
        for key in [key for key in env if key.startswith(("SCALEFREE_RANK", "SCALEFREE_WORLD", "SCALEFREE_JOB"))]:
            del env[key]
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(SUITE), "-k", selection_expr(k),
               f"--junitxml={xml}.part", "-o", "junit_family=xunit2"]
        t0 = time.monotonic()
        print(f"== {run}, {world_size} ranks: {' '.join(cmd[1:])}", flush=True)
        subprocess.run(cmd, cwd=ROOT, env=env, check=False)
        os.replace(f"{xml}.part", xml)
        print(f"== {run}, {world_size} ranks: {time.monotonic() - t0:.0f} s", flush=True)
    return xml


def outcomes(xml: Path) -> dict[str, tuple[str, str]]:
    """test name -> (passed|failed|skipped, message)."""
    res = {}
    for case in ET.parse(xml).getroot().iter("testcase"):
        name = case.get("name")
        state, msg = "passed", ""
        for child in case:
            if child.tag in ("failure", "error"):
                state, msg = "failed", (child.get("message") or "").splitlines()[0][:160] if child.get("message") else ""
                break
            if child.tag == "skipped":
                state, msg = "skipped", (child.get("message") or "")[:160]
        res[name] = (state, msg)
    return res


def report(out: Path, runs: list[str], world_sizes: list[int]) -> int:
    bad = 0
    for ws in world_sizes:
        got = {r: outcomes(out / f"{r}-{ws}.xml") for r in runs if (out / f"{r}-{ws}.xml").exists()}
        if not got:
            continue
        print(f"\n{ws} ranks")
        print(f"  {'run':<20} {'passed':>7} {'failed':>7} {'skipped':>8} {'total':>6}")
        for r, res in got.items():
            counts = {s: sum(1 for v in res.values() if v[0] == s) for s in ("passed", "failed", "skipped")}
            print(f"  {r:<20} {counts['passed']:>7} {counts['failed']:>7} {counts['skipped']:>8} {len(res):>6}")
        gloo = got.get("gloo", {})
        for r, res in got.items():
            if r == "gloo":
                continue
            for name, (state, msg) in sorted(res.items()):
                if state == "failed":
                    peer = gloo.get(name, ("not run", ""))[0]
                    if peer == "passed":
                        bad += 1
                    print(f"  {r}: FAILED {name} (gloo: {peer}): {msg}")
            if gloo:
                lost = [n for n, (s, _) in sorted(gloo.items()) if s == "passed" and res.get(n, ("",))[0] == "skipped"]
                for n in lost:
                    print(f"  {r}: skipped {n} (gloo passes it): {res[n][1]}")
    return 1 if bad else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--world-sizes", default="2,3", help="comma-separated world sizes (default 2,3)")
    ap.add_argument("--runs", default="gloo,scalefree,scalefree-as-gloo",
                    help="comma-separated runs among " + ", ".join(RUNS) + " (default all)")
    ap.add_argument("-k", default=None, help="a further pytest -k expression (default: the whole selection)")
    ap.add_argument("--out", default="bench-out/conformance-torch", help="directory of the JUnit XML files")
    ap.add_argument("--report", action="store_true", help="only print the table from the XML files in --out")
    a = ap.parse_args(argv)
    runs = [r for r in a.runs.split(",") if r]
    for r in runs:
        if r not in RUNS:
            print(f"conformance_torch: unknown run {r!r} (choose from {', '.join(RUNS)})", file=sys.stderr)
            return 2
    world_sizes = [int(w) for w in a.world_sizes.split(",") if w]
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    if not a.report:
        for ws in world_sizes:
            for r in runs:
                run_one(r, ws, out, a.k)
    return report(out, runs, world_sizes)


if __name__ == "__main__":
    sys.exit(main())
