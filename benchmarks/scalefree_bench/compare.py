"""``--compare``: a bench run against the last recorded result in ``docs/results/`` (the
performance guard; ``docs/benchmarks/method.md`` says when to run it).

Every record of the run is matched to the recorded records of the same point: the same
*identity* (bench, impl, variant, ranks, hosts, bytes, dtype and every other setting a record
carries: its string, boolean and integer fields but the measured counts, and the settings
among its floats, e.g. ``delay_ms``). For each *headline figure* the record has
(:data:`FIGURES`: ``median_s``, ``wall_s``, ``updates_per_s``, ...) the change is
``now / recorded - 1``; it counts as moved when it exceeds the **noise**: the larger of the
stated threshold (``--noise``, default 10 %) and the spread of the repeats of that point
(``(max - min) / median`` of the recorded records with that identity, the rounds of one file,
and of this run's). Moved the wrong way (slower, less throughput, higher error) is
**worse**; the command then exits 1 once its own work is done.

The baseline is ``--compare FILE``, or with ``--compare`` alone the newest file under
``docs/results/`` (by its last git commit, else its modification time) holding records of
this bench that match some point of the run.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from statistics import median
from typing import Callable, Iterable, Sequence

from .common import argparse_type, format_table, non_negative_float, progress

#: Headline figures and their good direction: -1 lower is better (times, errors), +1 higher.
FIGURES: dict[str, int] = {
    "median_s": -1,
    "wall_s": -1,
    "per_iteration_s": -1,
    "seconds_to_target": -1,
    "time_to_target_s": -1,
    "load_s": -1,
    "test_rmse": -1,
    "final_rmse": -1,
    "updates_per_s": +1,
    "steps_per_s": +1,
    "samples_per_s": +1,
    "points_per_s": +1,
    "iters_per_s": +1,
    "gflops": +1,
    "wall_over_ideal_slept": -1,
}

#: Figures derived from two of a record's fields (numerator, denominator): the SSP loop over
#: its ideal with the delays the ranks actually slept, which a busy machine's late wake-ups
#: do not move (``bench ssp``).
DERIVED: dict[str, tuple[str, str]] = {"wall_over_ideal_slept": ("wall_s", "ideal_slept_s")}

#: Float fields that are settings of a point, not measurements.
SETTING_FLOATS = frozenset({"delay_ms", "straggler_ms", "lam", "eta", "lr", "tol", "tolerance", "sample",
                            "target_rmse", "rmse_target", "budget_fraction"})

#: Integer fields that are measured (counts that vary from run to run), not settings.
MEASURED_INTS = frozenset({"n", "round", "repeats", "runs", "iters_to_target", "survivors", "generated",
                           "copied_first", "copied_later", "traced_sites", "scalefree_iterations_to_libmf_rmse"})
_MEASURED_INT_PARTS = ("rss", "peak", "_read", "written", "resident")

DEFAULT_NOISE = 0.10


def identity(rec: dict) -> tuple:
    """The settings that name a record's point (see the module doc)."""
    out = []
    for k in sorted(rec):
        v = rec[k]
        if k in FIGURES:
            continue
        if isinstance(v, bool) or v is None or isinstance(v, str):
            out.append((k, v))
        elif isinstance(v, int):
            if k not in MEASURED_INTS and not any(p in k for p in _MEASURED_INT_PARTS):
                out.append((k, v))
        elif isinstance(v, float) and k in SETTING_FLOATS:
            out.append((k, v))
    return tuple(out)


def _label(key: tuple, skip: Sequence[str] = ("bench", "dtype")) -> str:
    return " ".join(f"{k}={v}" for k, v in key if k not in skip and v not in ("", None))


def _figures(rec: dict) -> dict[str, float]:
    out = {}
    for name in FIGURES:
        v = rec.get(name)
        if name in DERIVED:
            num, den = (rec.get(k) for k in DERIVED[name])
            v = num / den if isinstance(num, (int, float)) and isinstance(den, (int, float)) and den > 0 else None
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0:
            out[name] = float(v)
    return out


def _spread(values: Sequence[float]) -> float:
    """``(max - min) / median`` of repeats of one figure (0 for a single value)."""
    if len(values) < 2:
        return 0.0
    m = median(values)
    return (max(values) - min(values)) / m if m > 0 else 0.0


def load_records(path: Path) -> list[dict]:
    """The flat records of a results file (a JSON array of objects); anything else: none."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    if not isinstance(data, list):
        return []
    return [r for r in data if isinstance(r, dict)]


def _group(records: Iterable[dict]) -> dict[tuple, list[dict]]:
    out: dict[tuple, list[dict]] = {}
    for r in records:
        out.setdefault(identity(r), []).append(r)
    return out


def _recorded_at(path: Path) -> float:
    """When ``path`` was last recorded: its last git commit, else its modification time."""
    try:
        out = subprocess.run(["git", "log", "-1", "--format=%ct", "--", path.name], cwd=path.parent,
                             capture_output=True, text=True, timeout=30).stdout.strip()
        if out:
            return float(out)
    except (OSError, subprocess.SubprocessError, ValueError):
        pass
    return path.stat().st_mtime


def default_results_dir() -> Path:
    """``docs/results`` of the working directory, else of the repository this harness is in."""
    here = Path.cwd() / "docs" / "results"
    if here.is_dir():
        return here
    return Path(__file__).resolve().parents[2] / "docs" / "results"


def find_baseline(records: Sequence[dict], results: Path, exclude: Path | None = None) -> Path | None:
    """The newest file under ``results`` with records matching some point of ``records``
    (but ``exclude``: the file this run just wrote them to)."""
    keys = {identity(r) for r in records}
    benches = {r.get("bench") for r in records}
    found = []
    for path in sorted(results.rglob("*.json")):
        if exclude is not None and path.resolve() == exclude.resolve():
            continue
        recs = load_records(path)
        if not any(r.get("bench") in benches for r in recs):
            continue
        if any(identity(r) in keys for r in recs):
            found.append(path)
    if not found:
        return None
    return max(found, key=lambda p: (_recorded_at(p), str(p)))


@dataclass
class Change:
    """One headline figure of one point, recorded and now."""

    point: str
    figure: str
    recorded: float
    now: float
    noise: float
    direction: int

    @property
    def change(self) -> float:
        return self.now / self.recorded - 1.0

    @property
    def verdict(self) -> str:
        if abs(self.change) <= self.noise:
            return "within noise"
        return "worse" if self.change * self.direction < 0 else "better"


def compare(records: Sequence[dict], baseline: Sequence[dict], noise: float = DEFAULT_NOISE) -> tuple[list[Change], int]:
    """Every headline figure of ``records`` against ``baseline``; also how many points of the
    run the baseline does not have."""
    now, then = _group(records), _group(baseline)
    changes, unmatched = [], 0
    for key, recs in now.items():
        old = then.get(key)
        if not old:
            unmatched += 1
            continue
        for fig, direction in FIGURES.items():
            ours = [f[fig] for f in map(_figures, recs) if fig in f]
            theirs = [f[fig] for f in map(_figures, old) if fig in f]
            if not ours or not theirs:
                continue
            threshold = max(noise, _spread(theirs), _spread(ours))
            changes.append(Change(_label(key), fig, median(theirs), median(ours), threshold, direction))
    return changes, unmatched


def report(changes: Sequence[Change], unmatched: int, baseline: Path, out=None) -> None:
    """The comparison as a table: every figure, and which moved by more than the noise."""
    out = out or sys.stdout
    print(f"\ncompared with {baseline} (noise: the larger of the threshold and the repeats' spread):", file=out)
    rows = [[c.point, c.figure, f"{c.recorded:.4g}", f"{c.now:.4g}", f"{c.change * 100:+.1f} %",
             f"{c.noise * 100:.0f} %", c.verdict] for c in changes]
    print(format_table(["point", "figure", "recorded", "now", "change", "noise", "verdict"], rows, left_columns=2), file=out)
    moved = [c for c in changes if c.verdict != "within noise"]
    worse = [c for c in moved if c.verdict == "worse"]
    summary = f"{len(changes)} figures compared, {len(moved)} moved by more than the noise ({len(worse)} worse)"
    if unmatched:
        summary += f"; {unmatched} points of this run are not in the record"
    print(summary, file=out)


class _CompareAction(argparse.Action):
    """``--compare [FILE]``: records the baseline and guards the bench's ``func`` with the
    comparison (only then: without the option a bench runs as it always did)."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, values)
        func = getattr(namespace, "func", None)
        if func is not None and not getattr(func, "_compares", False):
            namespace.func = guarded(func)


def add_args(p) -> None:
    """``--compare [FILE]`` and ``--noise`` (every bench that writes ``--json`` records)."""
    p.add_argument("--compare", action=_CompareAction, nargs="?", const="", default=argparse.SUPPRESS,
                   type=argparse_type(_results_file), metavar="FILE",
                   help="compare the run with the last recorded result (FILE, or with no FILE the newest "
                   "matching file under docs/results/): which headline figure moved by more than the noise; "
                   "exit 1 if one got worse")
    p.add_argument("--noise", type=argparse_type(non_negative_float), default=DEFAULT_NOISE * 100, metavar="PCT",
                   help="with --compare: the smallest change counted as moved, in percent, where the "
                   "repeats spread less (default: %(default)s)")


def _results_file(text: str) -> str:
    """``--compare FILE``: an existing file (``""``: find the newest match)."""
    if text and not Path(text).is_file():
        raise ValueError(f"no such results file: {text}")
    return text


def guarded(func: Callable) -> Callable:
    """``func`` (a bench's ``run(args)``) followed by the comparison ``args.compare`` asks
    for: the records it wrote with ``--json`` (a temporary file when none was given) against
    the baseline."""

    def run(args) -> int:
        with tempfile.TemporaryDirectory(prefix="sf-compare-") as tmp:
            own = args.json
            if own is None:
                args.json = Path(tmp) / "records.json"
            rc = func(args)
            records = load_records(args.json) if args.json.exists() else []
            args.json = own
        return max(int(rc or 0), check(records, args.compare, args.noise / 100.0, written=own))

    run.__name__ = getattr(func, "__name__", "run")
    run.__wrapped__ = func
    run._compares = True
    return run


def check(records: Sequence[dict], compare_with: str, noise: float, out=None, written: Path | None = None) -> int:
    """Compares ``records`` with ``compare_with`` (a file, or ``""``: the newest match under
    docs/results other than ``written``, where the run wrote them); 1 if a figure got worse by
    more than the noise, else 0."""
    if not records:
        progress("--compare: the run wrote no records to compare")
        return 0
    if compare_with:
        baseline = Path(compare_with)
    else:
        results = default_results_dir()
        baseline = find_baseline(records, results, exclude=written) if results.is_dir() else None
        if baseline is None:
            progress(f"--compare: no recorded result under {results} matches a point of this run")
            return 0
    changes, unmatched = compare(records, load_records(baseline), noise)
    report(changes, unmatched, baseline, out)
    return 1 if any(c.verdict == "worse" for c in changes) else 0
