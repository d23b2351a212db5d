"""Simulated hosts on one machine, for tests and benchmarks across hosts.

Each host is a network namespace joined to the others by a veth pair and a bridge (the
bridge lives in a namespace of its own, so nothing touches the machine's network), with a
private subnet and no route out of it. Commands run in a host under their own IPC and UTS
namespaces (``unshare --ipc --uts``) and host name: otherwise UCX would see one machine and
talk through shared memory, and a multi-host test would pass falsely.

    with SimHosts(2) as hosts:
        procs = [hosts.popen(i, ["python", "-c", "..."]) for i in range(2)]

The hosts share a job secret, as a cluster's hosts share a home directory: a file readable
by its owner only, named to every command by ``SCALEFREE_JOB_TOKEN_FILE`` unless the command's
environment names a secret itself (``SimHosts(n, secret=False)``: none).

Everything is removed on exit, also when the body raises; namespaces left by a run that was
killed are removed by the next run (their names carry the owner's pid). Needs root (or
CAP_SYS_ADMIN + CAP_NET_ADMIN) and ``ip``/``unshare``; :func:`available` says why not.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time

_PREFIX = "sfsim"
# The first port :meth:`SimHosts.port` hands out: below the ephemeral range, above the
# well-known and registered ports most services use.
_FIRST_PORT = 20000


def _run(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(list(args), capture_output=True, text=True, check=check, timeout=30)


def available() -> str | None:
    """None when simulated hosts can be made here, else why not."""
    for tool in ("ip", "unshare"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed"
    name = f"{_PREFIX}{os.getpid()}probe"
    r = _run("ip", "netns", "add", name, check=False)
    if r.returncode != 0:
        return f"cannot create network namespaces: {r.stderr.strip()}"
    try:
        r = _run("ip", "netns", "exec", name, "unshare", "--ipc", "--uts", "true", check=False)
        if r.returncode != 0:
            return f"cannot create IPC/UTS namespaces: {r.stderr.strip()}"
        r = _run("ip", "-n", name, "link", "add", "b0", "type", "bridge", check=False)
        if r.returncode != 0:
            return f"cannot create a bridge: {r.stderr.strip()}"
    finally:
        _run("ip", "netns", "del", name, check=False)
    return None


def remove_stale() -> None:
    """Deletes namespaces of earlier runs whose owning process is gone."""
    out = _run("ip", "netns", "list", check=False).stdout
    for line in out.splitlines():
        name = line.split()[0] if line.split() else ""
        m = re.match(rf"{_PREFIX}(\d+)", name)
        if m and not os.path.exists(f"/proc/{m.group(1)}"):
            _run("ip", "netns", "del", name, check=False)


class SimHosts:
    """``n`` simulated hosts with addresses ``10.77.S.1 .. 10.77.S.n``."""

    def __init__(self, n: int, *, mtu: int | None = None, secret: bool = True):
        if n < 1:
            raise ValueError("at least one host")
        self.n = n
        self.mtu = mtu
        self.secret = secret
        self.token_file: str | None = None  # made on enter when ``secret``
        self.tag = f"{_PREFIX}{os.getpid()}x{int(time.time() * 1000) % 100000}"
        self.subnet = 20 + (os.getpid() + int(time.time())) % 200
        self.hub = f"{self.tag}hub"
        self._procs: list[subprocess.Popen] = []
        self._made: list[str] = []
        self._next_port: int | None = None
        self._port_end = 0

    def name(self, i: int) -> str:
        return f"{self.tag}h{i}"

    def ip(self, i: int) -> str:
        return f"10.77.{self.subnet}.{i + 1}"

    def __enter__(self) -> "SimHosts":
        remove_stale()
        if self.secret:
            import secrets
            import tempfile

            folder = tempfile.mkdtemp(prefix="scalefree-simhosts-")  # mode 700
            self.token_file = os.path.join(folder, "token")
            fd = os.open(self.token_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_hex(16) + "\n")
        try:
            _run("ip", "netns", "add", self.hub)
            self._made.append(self.hub)
            _run("ip", "-n", self.hub, "link", "add", "br0", "type", "bridge")
            _run("ip", "-n", self.hub, "link", "set", "br0", "up")
            for i in range(self.n):
                ns = self.name(i)
                _run("ip", "netns", "add", ns)
                self._made.append(ns)
                _run("ip", "link", "add", "eth0", "netns", ns, "type", "veth", "peer", "name", f"p{i}", "netns", self.hub)
                _run("ip", "-n", self.hub, "link", "set", f"p{i}", "master", "br0")
                if self.mtu:
                    _run("ip", "-n", self.hub, "link", "set", f"p{i}", "mtu", str(self.mtu))
                    _run("ip", "-n", ns, "link", "set", "eth0", "mtu", str(self.mtu))
                _run("ip", "-n", self.hub, "link", "set", f"p{i}", "up")
                _run("ip", "-n", ns, "addr", "add", f"{self.ip(i)}/24", "dev", "eth0")
                _run("ip", "-n", ns, "link", "set", "eth0", "up")
                _run("ip", "-n", ns, "link", "set", "lo", "up")
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def command(self, i: int, argv: list[str]) -> list[str]:
        """``argv`` wrapped to run on host ``i`` (own network, IPC and UTS namespaces)."""
        secret = ""
        if self.token_file:
            secret = f'[ -n "$SCALEFREE_JOB_TOKEN$SCALEFREE_JOB_TOKEN_FILE" ] || export SCALEFREE_JOB_TOKEN_FILE={self.token_file}; '
        return ["ip", "netns", "exec", self.name(i), "unshare", "--ipc", "--uts", "--",
                "sh", "-c", f'{secret}hostname {self.name(i)} && exec "$@"', "sh", *argv]

    def port(self) -> int:
        """A TCP port for a server on these hosts (a job's ``--master-port``, a peer's store)
        that nothing else takes, a new one per call. A port found free on this machine
        (bind port 0, close, pass the number on) is no such port here: the hosts have network
        stacks of their own, and every socket a job opens with port 0 (its lanes' and UCX's
        listeners, its connections) draws from the same ephemeral range, so one of them can hold
        the number before the server binds it. These ports lie below that range (read in host
        0's namespace), where the kernel hands out nothing by itself, and the hosts are private
        to this object: only a server given the number binds it."""
        if self._next_port is None:
            low = int(_run("ip", "netns", "exec", self.name(0), "cat",
                           "/proc/sys/net/ipv4/ip_local_port_range").stdout.split()[0])
            if low <= _FIRST_PORT:
                raise RuntimeError(f"host 0's ephemeral ports start at {low}: no port below them to hand out")
            self._next_port, self._port_end = _FIRST_PORT, low
        if self._next_port >= self._port_end:
            raise RuntimeError(f"simulated hosts {self.tag}: every port in [{_FIRST_PORT}, {self._port_end}) handed out")
        self._next_port += 1
        return self._next_port - 1

    def popen(self, i: int, argv: list[str], **kw) -> subprocess.Popen:
        """Starts ``argv`` on host ``i`` in a process group of its own (killed on close)."""
        kw.setdefault("start_new_session", True)
        p = subprocess.Popen(self.command(i, argv), **kw)
        self._procs.append(p)
        return p

    def link(self, i: int, up: bool) -> None:
        """Cuts host ``i`` off the network (or reconnects it)."""
        _run("ip", "-n", self.name(i), "link", "set", "eth0", "up" if up else "down")

    def close(self) -> None:
        for p in self._procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        self._procs.clear()
        for ns in reversed(self._made):
            _run("ip", "netns", "del", ns, check=False)
        self._made.clear()
        if self.token_file:
            shutil.rmtree(os.path.dirname(self.token_file), ignore_errors=True)
            self.token_file = None


def leftovers() -> list[str]:
    """Namespaces of simulated hosts that still exist (for tests of cleanup)."""
    out = _run("ip", "netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.startswith(_PREFIX)]
