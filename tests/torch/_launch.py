"""Starts N real rank processes with torch's env:// variables (what torchrun sets)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading

_given: set[int] = set()
_given_lock = threading.Lock()


def free_port() -> int:
    """A port free on 127.0.0.1 now, never one this process was given before: jobs started
    together (each binds its port only once its rank 0 runs) do not get the same one."""
    with _given_lock:
        while True:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            if port not in _given:
                _given.add(port)
                return port


def torch_env(rank: int, size: int, port: int, extra: dict | None = None) -> dict:
    env = dict(os.environ)
    for k in list(env):  # no launcher variables from an outer job
        if k.startswith(("SCALEFREE_", "OMPI_", "PMI_", "SLURM_")):
            del env[k]
    env.update(RANK=str(rank), WORLD_SIZE=str(size), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(size),
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1",
               PYTHONFAULTHANDLER="1")  # a rank stopped with SIGABRT prints every thread's stack
    env.update(extra or {})
    return env


def run_torch_ranks(n: int, argv: list[str], timeout: float = 120.0, extra: dict | None = None,
                    check: bool = True) -> list[subprocess.CompletedProcess]:
    port = free_port()
    procs = [subprocess.Popen([sys.executable] + argv, env=torch_env(r, n, port, extra), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for r in range(n)]
    out = []
    for r, p in enumerate(procs):
        try:
            o, e = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            stacks = []
            for k, q in enumerate(procs):
                if q.poll() is None:
                    q.send_signal(signal.SIGABRT)  # faulthandler: where every thread is
                    try:
                        stacks.append(f"rank {k}:\n{q.communicate(timeout=20)[1][-6000:]}")
                    except subprocess.TimeoutExpired:
                        q.kill()
                        q.communicate()
            raise AssertionError(f"rank {r} hung past {timeout}s; the ranks still running:\n" + "\n".join(stacks))
        out.append(subprocess.CompletedProcess(p.args, p.returncode, o, e))
    if check and any(c.returncode != 0 for c in out):
        # Every rank's story: the first to fail is often not rank 0, whose error only says a
        # peer is gone.
        raise AssertionError("\n".join(f"rank {r} exited {c.returncode}:\n{c.stderr[-3000:]}"
                                        for r, c in enumerate(out)))
    return out
