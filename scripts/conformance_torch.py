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
on the name gloo skip); ``scalefree-as-gloo`` (scalefree under gloo's name: the suite's skip
decorators and test bodies decide as for gloo, the groups it asks gloo for are scalefree's).
Each run also counts the process groups its ranks made, per backend torch really made
(``DIR/<run>-<world size>.groups.json``): a scalefree run that made no scalefree group, or
any gloo group, is reported as the wrong backend. Exit status 1 when a test that gloo passes
fails on a scalefree run of the same world size, or a run's groups show the wrong backend.
"""

from __future__ import annotations

import argparse
import json
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
        os.mkdir(os.path.join(tmp, "groups"))
        env = dict(os.environ, BACKEND=backend, WORLD_SIZE=str(world_size), TEMP_DIR=tmp,
                   SCALEFREE_SUITE_AS_GLOO="1" if as_gloo else "0", OMP_NUM_THREADS="1",
                   SCALEFREE_SUITE_GROUPS_DIR=os.path.join(tmp, "groups"))
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
        made = groups_made(tmp)
        with open(f"{xml}.part.groups", "w") as f:
            json.dump(made, f)
        os.replace(f"{xml}.part.groups", groups_file(xml))
        os.replace(f"{xml}.part", xml)
        print(f"== {run}, {world_size} ranks: {time.monotonic() - t0:.0f} s; process groups made: "
              f"{', '.join(f'{n} {b}' for b, n in sorted(made.items())) or 'none'}", flush=True)
    return xml


def groups_made(temp_dir: str) -> dict[str, int]:
    """backend -> process groups the suite's ranks made on it (a file each in
    SCALEFREE_SUITE_GROUPS_DIR, named after the backend torch really made, whatever name the
    suite asked for)."""
    d = Path(temp_dir) / "groups"
    names = [p.name.split(".", 1)[0] for p in d.iterdir()] if d.is_dir() else []
    return {b: names.count(b) for b in sorted(set(names))}


def groups_file(xml: Path) -> Path:
    return xml.with_suffix(".groups.json")


def check_backend(run: str, made: dict[str, int]) -> str | None:
    """Why the groups made do not show the run's backend running (None if they do): a scalefree
    run must make scalefree groups and no gloo ones, gloo the reverse."""
    backend = RUNS[run][0]
    other = "gloo" if backend == "scalefree" else "scalefree"
    if not made.get(backend):
        return f"no {backend} process group was made"
    if made.get(other):
        return f"{made[other]} {other} process group(s) were made"
    return None


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
        for r in got:
            gf = groups_file(out / f"{r}-{ws}.xml")
            if gf.exists():
                made = json.loads(gf.read_text())
                why = check_backend(r, made)
                print(f"  {r}: process groups made: {', '.join(f'{n} {b}' for b, n in made.items()) or 'none'}"
                      + (f" -- WRONG BACKEND: {why}" if why else ""))
                bad += why is not None
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
