"""Running benchmark jobs across simulated hosts (:mod:`scalefree.launch.simhosts`): the same
hosts for every implementation, ``per_host`` ranks on each.

* scalefree and gloo: ``scalefree run --nnodes H --node-rank i ...`` on every host;
* MPI: ``mpiexec`` on host 0 with every host's address in ``--host`` and an
  ``plm_rsh_agent`` script that starts the remote daemons inside the right namespace;
  TCP between hosts (``btl tcp,self``) and ``mpi_yield_when_idle 1`` so that waiting ranks
  do not busy-poll two shared cores; and ``--bind-to none``: by default Open MPI binds each
  host's first rank to that host's core 0, and simulated hosts share one machine's cores, so
  every rank of the job was bound to the same physical core (measured: 2 hosts × 1 MiB
  allreduce 0.95 ms bound, 0.46 ms unbound; ``docs/benchmarks/collectives.md``). Real hosts each have
  their own core 0: unbound is the fair stand-in.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from . import common


def scalefree_cmds(sim, per_host, port: int, argv: list[str], *, encrypt: bool = False) -> list[list[str]]:
    """One ``scalefree run`` per host, all meeting at host 0 (``per_host``: ranks on every
    host, or a list of each host's; ``encrypt``: ``--encrypt``)."""
    per_node = ",".join(map(str, per_host)) if isinstance(per_host, (list, tuple)) else str(per_host)
    return [
        sim.command(i, [sys.executable, "-m", "scalefree.cli", "run", "--nnodes", str(sim.n), "--node-rank", str(i),
                        "--nproc-per-node", per_node, "--master-addr", sim.ip(0), "--master-port", str(port),
                        *(["--encrypt"] if encrypt else []), "--", *argv])
        for i in range(sim.n)
    ]


def rsh_agent(sim, folder: Path) -> Path:
    """A script Open MPI uses instead of ssh: ``agent HOST CMD`` runs CMD in HOST's namespaces."""
    lines = ["#!/bin/sh", 'host="$1"; shift', 'case "$host" in']
    lines += [f"  {sim.ip(i)}) ns={sim.name(i)} ;;" for i in range(sim.n)]
    lines += ['  *) echo "scalefree bench: unknown simulated host $host" >&2; exit 1 ;;', "esac",
              'exec ip netns exec "$ns" unshare --ipc --uts -- sh -c "hostname $ns; exec sh -c \\"\\$0\\"" "$*"']
    path = folder / "rsh-agent.sh"
    path.write_text("\n".join(lines) + "\n")
    path.chmod(0o755)
    return path


def mpi_cmd(sim, per_host, agent: Path, argv: list[str]) -> list[str]:
    """``mpiexec`` across the simulated hosts, ``per_host`` ranks on each (or a list of each host's)."""
    counts = list(per_host) if isinstance(per_host, (list, tuple)) else [per_host] * sim.n
    hosts = ",".join(f"{sim.ip(i)}:{k}" for i, k in enumerate(counts))
    cmd = [common.find_mpiexec(), "--host", hosts, "-n", str(sum(counts)),
           "--mca", "plm_rsh_agent", str(agent), "--mca", "btl", "tcp,self,vader" if max(counts) > 1 else "tcp,self",
           "--mca", "btl_tcp_if_include", "eth0", "--mca", "oob_tcp_if_include", "eth0",
           "--mca", "mpi_yield_when_idle", "1", "--bind-to", "none", "-x", "PATH"]
    if max(counts) > common.usable_cores():
        cmd.append("--oversubscribe")
    return sim.command(0, cmd + argv)


def run_all(cmds: list[list[str]], *, timeout_s: float, env_extra: dict | None = None) -> common.JobOutcome:
    """Runs one command per host at once (each in its own process group); the outcome is the
    first failure's, with the output tails of all."""
    env = dict(os.environ)
    env.update(env_extra or {})
    env["PYTHONUNBUFFERED"] = "1"
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="scalefree-hosts-") as tmp:
        logs = [open(Path(tmp) / f"host{i}.log", "w+") for i in range(len(cmds))]
        procs = [subprocess.Popen(c, env=env, stdin=subprocess.DEVNULL, stdout=logs[i], stderr=subprocess.STDOUT,
                                  start_new_session=True) for i, c in enumerate(cmds)]
        timed_out = False
        rc = 0
        for p in procs:
            left = max(0.1, timeout_s - (time.monotonic() - start))
            try:
                code = p.wait(timeout=left)
            except subprocess.TimeoutExpired:
                timed_out = True
                for q in procs:
                    common._kill_group(q)
                break
            if code and not rc:
                rc = code
        for p in procs:
            if p.poll() is None:
                common._kill_group(p)
        tail = []
        for i, f in enumerate(logs):
            f.seek(0)
            lines = f.read().splitlines()
            sys.stderr.write("".join(f"[host {i}] {line}\n" for line in lines[-200:]))
            tail += [f"[host {i}] {line}" for line in lines[-10:]]
            f.close()
    return common.JobOutcome(None if timed_out else rc, timed_out, tail, time.monotonic() - start)


def aggregate_tcp_gbps(sim, seconds: float = 2.0, buffer: int = 1 << 20) -> float:
    """Total TCP throughput with every host sending to the next at once (the floor a
    collective between these hosts cannot beat), in GB/s. Each host sends from, and receives
    into, a buffer of ``buffer`` bytes, 1 MiB at a time: a buffer larger than the caches costs
    the kernel's copies memory traffic, as a collective on that many bytes pays."""
    port = sim.port()
    buffer = max(buffer, 1 << 20)
    server = ("import socket,sys\ns=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
              f"s.bind(('0.0.0.0', {port})); s.listen(); c,_=s.accept(); n=0\n"
              f"B={buffer}\nb=bytearray(B); m=memoryview(b); o=0\n"
              "while True:\n    k=c.recv_into(m[o:o + (1 << 20)])\n    if not k: break\n"
              "    n+=k; o=(o + k) % (B - (1 << 20) + 1)\nprint(n)\n")
    client = ("import socket,sys,time\nc=socket.create_connection((sys.argv[1], %d))\nB=%d\n"
              "b=bytes(B); m=memoryview(b); o=0; t=time.monotonic()\n"
              "while time.monotonic()-t < %f:\n    c.sendall(m[o:o + (1 << 20)]); o=(o + (1 << 20)) %% B\n"
              "c.close()\n") % (port, buffer, seconds)
    servers = [subprocess.Popen(sim.command(i, [sys.executable, "-c", server]), stdout=subprocess.PIPE, text=True)
               for i in range(sim.n)]
    time.sleep(0.5)
    clients = [subprocess.Popen(sim.command(i, [sys.executable, "-c", client, sim.ip((i + 1) % sim.n)]))
               for i in range(sim.n)]
    t0 = time.monotonic()
    for c in clients:
        c.wait(timeout=seconds + 30)
    total = sum(int(s.communicate(timeout=30)[0].strip() or 0) for s in servers)
    return total / max(time.monotonic() - t0, seconds) / 1e9
