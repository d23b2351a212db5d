"""Runs a Python snippet as N real rank processes (without the launcher, so the library
is tested on its own) and collects their exit codes and output."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass


@dataclass
class RankResult:
    rank: int
    returncode: int
    stdout: str
    stderr: str


def rank_env(rank: int, size: int, job_id: str, token: str, extra: dict | None = None) -> dict:
    from scalefree.launch.launcher import rank_environment

    env = rank_environment(rank, size, job_id, token)
    env.update(extra or {})
    return env


def spawn_ranks(n: int, code: str, extra_env: dict | None = None, args: list[str] | None = None):
    job_id = "test-" + secrets.token_hex(6)
    token = secrets.token_hex(8)
    code = textwrap.dedent(code)
    procs = []
    for r in range(n):
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", code] + list(args or []),
                env=rank_env(r, n, job_id, token, extra_env),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    return procs


def collect(procs, timeout: float = 120.0) -> list[RankResult]:
    deadline = time.monotonic() + timeout
    out = []
    for r, p in enumerate(procs):
        try:
            o, e = p.communicate(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            o, e = p.communicate()
            raise AssertionError(f"rank {r} hung past {timeout}s; stderr:\n{e}")
        out.append(RankResult(r, p.returncode, o, e))
    return out


def run_ranks(n: int, code: str, timeout: float = 120.0, extra_env: dict | None = None, check: bool = True):
    res = collect(spawn_ranks(n, code, extra_env), timeout)
    if check:
        for r in res:
            assert r.returncode == 0, f"rank {r.rank} exited {r.returncode}:\n{r.stderr[-4000:]}"
    return res


def parked_in_wait(pid: int) -> bool:
    """Whether the main thread of ``pid`` sleeps in a wait of the library: ``futex`` with
    FUTEX_WAIT on a shared word (Python's locks use private futexes) or ``poll``/``ppoll``
    (a wait that reads the TCP lanes). Unknown (True) when ``/proc/PID/syscall`` is closed."""
    try:
        with open(f"/proc/{pid}/syscall") as f:
            fields = f.read().split()
    except PermissionError:
        return True
    except OSError:
        return False
    if not fields or fields[0] in ("running", "-1"):
        return False
    number = int(fields[0])
    if number == 202:  # futex
        return int(fields[2], 16) & ~256 == 0  # FUTEX_WAIT (maybe with CLOCK_REALTIME), shared
    return number in (7, 271)  # poll, ppoll


def pagerank_reference(src, dst, n: int, iters: int):
    """Dense PageRank (damping 0.85, dangling mass spread evenly) after `iters` steps from the
    uniform vector: the reference the distributed PageRank tests compare against."""
    import numpy as np

    outdeg = np.bincount(src, minlength=n).astype(float)
    inv = np.where(outdeg > 0, 1 / np.maximum(outdeg, 1), 0)
    r = np.full(n, 1 / n)
    for _ in range(iters):
        y = np.bincount(dst, weights=r[src] * inv[src], minlength=n)
        r = 0.15 / n + 0.85 * (y + r[outdeg == 0].sum() / n)
    return r


TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
