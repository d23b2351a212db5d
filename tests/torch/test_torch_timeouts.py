"""Deadlines with a stopped (SIGSTOP) rank: a collective ends at the process group's timeout
on every other rank (plain and DDP), and ``Work.wait(timeout)`` raises at its own deadline.

Margins are generous (the machine may be busy): the call must not end before its deadline
minus 5 %, and must end within the deadline plus 30 s (without deadlines it would hang for
``SCALEFREE_TIMEOUT``, 1800 s).
"""

import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from _launch import free_port, torch_env

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "timeout_script.py")
LATE_S = 30.0


def run_with_stopped_rank(n: int, mode: str, pg_timeout: float) -> list[dict]:
    port = free_port()
    procs = [subprocess.Popen([sys.executable, SCRIPT, mode, str(pg_timeout)], env=torch_env(r, n, port),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(n)]
    stopped = procs[-1]
    try:
        results = []
        for r, p in enumerate(procs[:-1]):
            try:
                out, err = p.communicate(timeout=pg_timeout + LATE_S + 120)
            except subprocess.TimeoutExpired:
                pytest.fail(f"rank {r} ({mode}) still running {pg_timeout + LATE_S + 120:.0f}s after the start")
            lines = [ln for ln in out.splitlines() if ln.startswith("{")]
            assert p.returncode == 0 and lines, f"rank {r} exited {p.returncode}:\n{out[-2000:]}\n{err[-4000:]}"
            results.append(json.loads(lines[-1]))
        return results
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGCONT)
                p.kill()
            p.wait()


def check(results, deadline: float, what: str):
    for res in results:
        assert res["error"], f"rank {res['rank']}: {what} returned instead of raising at the deadline"
        assert "Timed out" in res["error"] or "timed out" in res["error"], res
        assert res["seconds"] >= 0.95 * deadline - 0.6, f"rank {res['rank']}: raised early: {res}"
        assert res["seconds"] <= deadline + LATE_S, f"rank {res['rank']}: raised late: {res}"


def test_collective_ends_at_the_process_group_timeout():
    # 2 and 3 ranks, the two jobs at once (their 6 s waits overlap: the test takes one).
    with ThreadPoolExecutor(2) as pool:
        jobs = {n: pool.submit(run_with_stopped_rank, n, "collective", 6.0) for n in (2, 3)}
        for n, job in jobs.items():
            res = job.result()
            assert len(res) == n - 1, res
            check(res, 6.0, f"all_reduce on {n} ranks")


def test_work_wait_timeout_raises_at_its_deadline():
    # The group's timeout (120 s) is far off: only wait(timeout=2 s) can end the wait in time.
    t0 = time.monotonic()
    res = run_with_stopped_rank(2, "wait", 120.0)
    check(res, 2.0, "work.wait(timeout)")
    assert all(r["seconds"] < 60 for r in res), res
    assert time.monotonic() - t0 < 120, "the test outlived the group's timeout"


def test_ddp_step_ends_at_the_process_group_timeout():
    # 2 and 4 ranks, the two jobs at once (their 6 s waits overlap: the test takes one).
    with ThreadPoolExecutor(2) as pool:
        jobs = {n: pool.submit(run_with_stopped_rank, n, "ddp", 6.0) for n in (2, 4)}
        for n, job in jobs.items():
            res = job.result()
            assert len(res) == n - 1, res
            check(res, 6.0, f"a DDP step of {n} ranks")
