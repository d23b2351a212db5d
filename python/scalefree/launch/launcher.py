"""The launcher behind ``scalefree run`` (its command line: :mod:`scalefree.cli.run`): starts
N ranks of a command on this host with their ``SCALEFREE_*`` environment, pumps their output
with a ``[rank]`` prefix, supervises them (a failed rank stops the others after a grace
period; signals to the launcher stop every rank; every rank dies with the launcher) and
returns the job's exit code. :func:`launch` is the entry point; :func:`job_secret` and
:func:`multi_host_job` decide the secret of a job across hosts (``docs/security.md``)."""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

from .._cores import usable_cores

#: Rank variables of other launchers; they must not leak into our ranks.
FOREIGN_RANK_VARIABLES = (
    "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_SIZE", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS",
    "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_STEP_NUM_TASKS",
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
)

DEFAULT_MASTER_PORT = 29517  # the transport's default too
EXIT_TIMEOUT = 124
EXIT_CANNOT_EXECUTE = 126
EXIT_NOT_FOUND = 127
TERM_TO_KILL_SECONDS = 2.0
DEFAULT_GRACE_SECONDS = 5.0

_STOPPING_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_POLL_SECONDS = 0.01
_DRAIN_SECONDS = 5.0  # output of a process that escaped its group is not waited for longer
_READ_BYTES = 1 << 16
_PR_SET_PDEATHSIG = 1


def new_job() -> tuple[str, str]:
    """A fresh job id and secret token."""
    return "sf-" + secrets.token_hex(6), secrets.token_hex(16)


@dataclass(frozen=True)
class Nodes:
    """Where this launcher's ranks sit in a job over several hosts (torchrun-style): host
    ``node_rank`` of ``nnodes``, each running ``nproc_per_node`` ranks, meeting at
    ``master_addr:master_port`` (rank 0's host)."""

    nnodes: int = 1
    node_rank: int = 0
    master_addr: str | None = None
    master_port: int | None = None
    #: Ranks of every host when hosts hold different numbers (``--nproc-per-node 1,2,3``);
    #: None when each holds ``nproc_per_node``.
    layout: tuple[int, ...] | None = None

    def global_rank(self, local: int, per_node: int) -> int:
        if self.layout is not None:
            return sum(self.layout[:self.node_rank]) + local
        return self.node_rank * per_node + local

    def world_size(self, per_node: int) -> int:
        return sum(self.layout) if self.layout is not None else self.nnodes * per_node


#: Why a job across hosts cannot start without a secret (the transport says the same).
NO_SECRET = ("a job across hosts needs a secret shared by its hosts, so that nobody else can join it: "
             "set SCALEFREE_JOB_TOKEN on every host to the value host 0 printed (or to your own "
             "`openssl rand -hex 16`), or pass --token-file PATH (a file only you can read, e.g. in your "
             "home on a shared file system); on a closed network, --insecure-no-token (see docs/security.md)")


def read_token_file(path) -> str:
    """The first line of a token file, refused (``PermissionError``/``ValueError``) when its
    group or others may read or write it, when another user owns it, or when it is empty."""
    import stat

    path = os.fspath(path)
    st = os.stat(path)
    if st.st_mode & 0o077:
        raise PermissionError(f"token file {path} has mode {stat.S_IMODE(st.st_mode):o}: others may read it; "
                              f"`chmod 600 {path}`")
    if st.st_uid != os.getuid():
        raise PermissionError(f"token file {path} belongs to another user")
    with open(path, encoding="utf-8") as f:
        token = f.readline().strip()
    if not token:
        raise _bad(f"token file {path} is empty")
    return token


def _bad(message: str) -> ValueError:
    """A bad argument: ``scalefree run`` reports it in one line with exit code 2."""
    from ..errors import InvalidArgumentError

    return InvalidArgumentError(message)


def job_secret(token_file=None, env=None) -> str | None:
    """The job's shared secret: ``token_file``, else ``SCALEFREE_JOB_TOKEN``, else the file
    named by ``SCALEFREE_JOB_TOKEN_FILE``; None when none is given."""
    env = os.environ if env is None else env
    if token_file:
        return read_token_file(token_file)
    if env.get("SCALEFREE_JOB_TOKEN"):
        return env["SCALEFREE_JOB_TOKEN"]
    if env.get("SCALEFREE_JOB_TOKEN_FILE"):
        return read_token_file(env["SCALEFREE_JOB_TOKEN_FILE"])
    return None


def insecure_token(nodes: Nodes) -> str:
    """The token of a job run with ``--insecure-no-token``: what anybody can compute from
    the master address (only for closed networks)."""
    where = f"{nodes.master_addr}:{nodes.master_port}"
    return "insecure:" + hashlib.sha256(f"{where}:{os.getuid()}".encode()).hexdigest()[:32]


def multi_host_job(nodes: Nodes, secret: str | None = None) -> tuple[str, str | None]:
    """Job id and token of a job with a master address. The id is the same on every host
    (``SCALEFREE_JOB_ID``, else derived from the master address) and is no secret. The
    token is ``secret`` (see :func:`job_secret`); a job on one host makes a fresh one; a job
    across hosts without one gets None (the caller decides: refuse, or make one on host 0)."""
    where = f"{nodes.master_addr}:{nodes.master_port}"
    job_id = os.environ.get("SCALEFREE_JOB_ID") or "sf-" + hashlib.sha256(where.encode()).hexdigest()[:12]
    if secret:
        return job_id, secret
    if nodes.nnodes == 1:
        return job_id, secrets.token_hex(16)
    return job_id, None


# The thread-pool sizes of numpy's BLAS, OpenMP code (torch) and MKL.
THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def rank_environment(rank: int, size: int, job_id: str, token: str, base: dict | None = None, *,
                     local_rank: int | None = None, local_size: int | None = None, nodes: Nodes | None = None) -> dict:
    """The environment of one rank: ``base`` (default ``os.environ``) without other
    launchers' rank variables, plus the ``SCALEFREE_*`` ones, and with several ranks on this
    host and no thread-pool size set, each rank's share of the cores as its pool size
    (:data:`THREAD_VARIABLES`)."""
    env = dict(os.environ if base is None else base)
    for name in FOREIGN_RANK_VARIABLES:
        env.pop(name, None)
    env.update(
        SCALEFREE_RANK=str(rank),
        SCALEFREE_WORLD_SIZE=str(size),
        SCALEFREE_LOCAL_RANK=str(rank if local_rank is None else local_rank),
        SCALEFREE_LOCAL_SIZE=str(size if local_size is None else local_size),
        SCALEFREE_JOB_ID=job_id,
        SCALEFREE_JOB_TOKEN=token,
    )
    local = size if local_size is None else local_size
    if local > 1 and not any(env.get(name) for name in THREAD_VARIABLES):
        # Ranks sharing a host share its cores: each rank's BLAS/OpenMP pool gets its share
        # (torchrun sets OMP_NUM_THREADS=1 likewise), so idle pool threads of N ranks do not
        # spin on the cores the ranks compute on. A value the user set is kept.
        share = str(max(1, usable_cores() // local))
        env.update({name: share for name in THREAD_VARIABLES})
    if nodes is not None and nodes.master_addr:
        env["SCALEFREE_MASTER_ADDR"] = nodes.master_addr
        env["SCALEFREE_MASTER_PORT"] = str(nodes.master_port or DEFAULT_MASTER_PORT)
    return env


# ---------------------------------------------------------------------------------------
# Output

_output_lock = threading.Lock()  # one writer at a time, across both of our streams


def _write(sink, data: bytes) -> None:
    with _output_lock:
        try:
            sink.write(data)
            sink.flush()
        except (OSError, ValueError):
            pass  # our own stream is gone (e.g. a closed pipe): keep draining the rank anyway


def say(message: str) -> None:
    """A launcher message on stderr, never inside a rank's line."""
    _write(_binary(sys.stderr), f"scalefree run: {message}\n".encode())


class _TextSink:
    """Writes bytes to a text stream that has no binary buffer (e.g. in a notebook)."""

    def __init__(self, stream):
        self.stream = stream

    def write(self, data: bytes) -> None:
        self.stream.write(data.decode(errors="replace"))

    def flush(self) -> None:
        self.stream.flush()


def _binary(stream):
    buffer = getattr(stream, "buffer", None)
    return buffer if buffer is not None else _TextSink(stream)


def _pump(source, sink, prefix: bytes) -> None:
    """Copies a rank's stream to ``sink`` whole lines at a time, each line prefixed.

    A line ends at ``\\n`` or at a lone ``\\r`` (progress bars), so no other output lands
    inside it. A last line without an end is written at EOF, with a newline when prefixed.
    """
    tail = b""
    with source:
        while chunk := source.read1(_READ_BYTES):
            lines = (tail + chunk).splitlines(keepends=True)
            # The last piece may be incomplete, or a "\r" whose "\n" is in the next chunk.
            tail = b"" if lines[-1].endswith(b"\n") else lines.pop()
            if lines:
                _write(sink, b"".join(prefix + line for line in lines))
    if tail:
        _write(sink, prefix + tail + (b"\n" if prefix else b""))


def _start_pump(source, sink, prefix: bytes) -> threading.Thread:
    t = threading.Thread(target=_pump, args=(source, sink, prefix), name="scalefree-run-output", daemon=True)
    t.start()
    return t


def _join(threads: list[threading.Thread], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))


# ---------------------------------------------------------------------------------------
# Processes


def _die_with_launcher():
    """A ``preexec_fn`` that has the kernel SIGKILL the child when the launcher dies
    (Linux ``PR_SET_PDEATHSIG``); None where prctl does not exist. Everything is resolved
    here in the parent, so the forked child only makes the call."""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    launcher_pid = os.getpid()
    kill = int(signal.SIGKILL)

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, kill, 0, 0, 0)
        if os.getppid() != launcher_pid:  # the launcher died before prctl took effect
            os._exit(1)

    return preexec


def _exit_code(info) -> int:
    """A shell-style exit code from ``os.waitid``'s result: 128+k for signal k."""
    return info.si_status if info.si_code == os.CLD_EXITED else 128 + info.si_status


def _describe(code: int) -> str:
    with contextlib.suppress(ValueError):
        if code > 128:
            return f"code {code} ({signal.Signals(code - 128).name})"
    return f"code {code}"


class _Ranks:
    """The rank processes of one job, each the leader of its own process group.

    An exited rank is not reaped until :meth:`close`, so its pid, and the id of its
    process group, cannot be reused by an unrelated process before we are done signalling.
    """

    def __init__(self, cmd: list[str], nprocs: int, env: dict | None, job_id: str, token: str, nodes: Nodes | None = None):
        self.procs: list[subprocess.Popen] = []
        self._codes: dict[int, int] = {}
        preexec = _die_with_launcher()
        nodes = nodes or Nodes()
        self.first_rank = nodes.global_rank(0, nprocs)  # global rank of this host's first rank
        try:
            for local in range(nprocs):
                self.procs.append(subprocess.Popen(
                    cmd,
                    env=rank_environment(nodes.global_rank(local, nprocs), nodes.world_size(nprocs), job_id, token, env,
                                         local_rank=local, local_size=nprocs, nodes=nodes),
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    start_new_session=True,
                    preexec_fn=preexec,
                ))
        except BaseException:
            self.close()
            raise

    def exit_code(self, rank: int) -> int | None:
        """The rank's exit code, or None while it runs."""
        if rank not in self._codes:
            info = os.waitid(os.P_PID, self.procs[rank].pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            if info is None:
                return None
            self._codes[rank] = _exit_code(info)
        return self._codes[rank]

    def running(self) -> list[int]:
        return [r for r in range(len(self.procs)) if self.exit_code(r) is None]

    def signal_groups(self, sig: int, ranks: list[int]) -> None:
        for r in ranks:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.procs[r].pid, sig)

    def wait(self, seconds: float, interrupted: list[int] | None = None) -> None:
        """Waits up to ``seconds`` for every rank to exit (less if a signal arrives)."""
        deadline = time.monotonic() + seconds
        while self.running() and time.monotonic() < deadline and not interrupted:
            time.sleep(_POLL_SECONDS)

    def stop(self, grace_seconds: float, interrupted: list[int] | None = None) -> None:
        """Gives the ranks ``grace_seconds`` to exit, then SIGTERM, then SIGKILL."""
        self.wait(grace_seconds, interrupted)
        self.signal_groups(signal.SIGTERM, self.running())
        self.wait(TERM_TO_KILL_SECONDS)
        self.signal_groups(signal.SIGKILL, self.running())

    def interrupt(self, grace_seconds: float, received: list[int]) -> None:
        """Passes a Ctrl-C on: SIGINT to every rank's process group (Python raises
        ``KeyboardInterrupt``, which ends any wait of the library within a check interval), then
        :meth:`stop` after ``grace_seconds`` or at the next signal, whichever comes first."""
        self.signal_groups(signal.SIGINT, self.running())
        seen = len(received)
        deadline = time.monotonic() + grace_seconds
        while self.running() and time.monotonic() < deadline and len(received) == seen:
            time.sleep(_POLL_SECONDS)
        self.stop(0.0)

    def close(self) -> None:
        """Kills whatever is left in every rank's process group and reaps the ranks."""
        self.signal_groups(signal.SIGKILL, list(range(len(self.procs))))
        for p in self.procs:
            p.wait()


@contextlib.contextmanager
def _catch_stopping_signals(received: list[int]):
    """Records SIGINT/SIGTERM/SIGHUP in ``received`` instead of dying (main thread only).
    A signal this process was started with ignored stays ignored: ``nohup`` ignores SIGHUP,
    and a shell without job control ignores SIGINT in a background job, so that a Ctrl-C
    meant for the foreground does not stop it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, lambda signum, _frame: received.append(signum))
                for s in _STOPPING_SIGNALS if signal.getsignal(s) is not signal.SIG_IGN}
    try:
        yield
    finally:
        for s, handler in previous.items():
            if handler is not None:
                signal.signal(s, handler)


@dataclass(frozen=True)
class _Ended:
    """How one start of the job ended: its exit code, and whether a rank failed (what a
    restart is for) rather than the job being stopped (signal, timeout) or succeeding."""

    code: int
    rank_failed: bool = False


def _supervise(ranks: _Ranks, timeout: float | None, grace: float, received: list[int],
               allow_rank_failure: bool = False, quiet_exits: tuple = (), restarts_left: int = 0,
               deadline: float | None = None) -> _Ended:
    """Waits for the job to end and stops it as needed (at ``deadline``, a ``time.monotonic()``
    value, default ``timeout`` seconds from now)."""
    if deadline is None and timeout is not None:
        deadline = time.monotonic() + timeout
    reported: set[int] = set()
    while True:
        if received:
            sig = signal.Signals(received[0])
            say(f"received {sig.name}; stopping all ranks")
            if sig == signal.SIGINT:
                ranks.interrupt(grace, received)
            else:
                ranks.stop(0.0)
            return _Ended(128 + sig)
        codes = [ranks.exit_code(r) for r in range(len(ranks.procs))]
        if allow_rank_failure:
            for rank, code in enumerate(codes):
                if code and rank not in reported:
                    reported.add(rank)
                    say(f"rank {ranks.first_rank + rank} exited with {_describe(code)}; "
                         "the others keep running (--allow-rank-failure)")
            if all(code is not None for code in codes):
                # Ranks that died by a signal are the tolerated failures; a rank that exited
                # with an error code by itself fails the job, and so does losing every rank.
                own = [c for c in codes if c and c <= 128]
                code = own[0] if own else (0 if any(c == 0 for c in codes) else next(c for c in codes if c))
                return _Ended(code, rank_failed=code != 0)
            codes = [0 if c else c for c in codes]
        for rank, code in enumerate(codes):
            if code:  # the first failure seen; ties within one poll go to the lowest rank
                others = ranks.running()
                if code not in quiet_exits or restarts_left:
                    then = ("; stopping the other ranks" if others else "") + ("; restarting the job" if restarts_left else "")
                    say(f"rank {ranks.first_rank + rank} exited with {_describe(code)}{then}")
                ranks.stop(grace, received)
                return _Ended(code, rank_failed=True)
        if all(code == 0 for code in codes) and not allow_rank_failure:
            return _Ended(0)
        if deadline is not None and time.monotonic() >= deadline:
            say(f"timeout after {timeout:g} s; stopping all ranks")
            ranks.stop(0.0)
            return _Ended(EXIT_TIMEOUT)
        time.sleep(_POLL_SECONDS)


def launch(cmd: list[str], nprocs: int, *, timeout: float | None = None, grace: float = DEFAULT_GRACE_SECONDS,
           prefix: bool = True, env: dict | None = None, nodes: Nodes | None = None,
           allow_rank_failure: bool = False, quiet_exits: tuple = (), token: str | None = None,
           max_restarts: int = 0, encrypt: bool = False) -> int:
    """Runs ``cmd`` as ``nprocs`` ranks on this host and returns the job's exit code.

    ``nodes`` places them in a job over several hosts: run the same command on every host
    with its own ``node_rank``; ranks meet at ``master_addr`` (rank 0's host) over TCP and
    talk over UCX between hosts, shared memory within one.

    ``timeout`` (seconds, default none) limits the whole job; ``grace`` (seconds) is how
    long the other ranks may take to exit by themselves after one fails; ``prefix`` tags
    each output line with ``[rank] ``; ``allow_rank_failure`` keeps the other ranks running
    when one dies (for replicated collectives), the job then ending when all have exited,
    with code 0 if some rank succeeded and every failed rank died by a signal; ``env`` replaces ``os.environ`` as the base of each
    rank's environment; exit codes in ``quiet_exits`` are not announced (the rank reported
    its own failure). ``token`` is the secret every host of a job across hosts shares
    (default: :func:`job_secret`; a job across hosts without one is refused with ``ValueError``). Output goes to ``sys.stdout``/``sys.stderr`` as it arrives. A
    command that cannot be started gives 127 (not found) or 126, with a message.

    ``max_restarts`` (default 0): when a rank fails, the others are stopped and every rank is
    started again, up to this many times, each start with a new rendezvous (a new job id and,
    on one host, a new secret) and ``SCALEFREE_RESTART_COUNT`` (0, 1, ...) and
    ``SCALEFREE_MAX_RESTARTS`` in its environment (torchrun's ``TORCHELASTIC_RESTART_COUNT``);
    a command with ``--resume`` continues from its last checkpoint. Across hosts every host's
    launcher restarts its own ranks (its ranks fail when a peer host's rank dies) and the
    ``k``-th restart of every host meets at the job id suffixed ``-rk``. A signal or the
    ``timeout`` (which counts for all starts together) is no reason to restart. The exit code
    is that of the last start.

    ``encrypt``: the ranks get ``SCALEFREE_ENCRYPT=1``: every connection between hosts (the
    rendezvous, the TCP lanes) is sealed with AES-256-GCM, and traffic between hosts goes
    over the sealed lanes only (``docs/security.md``). Every host's launcher must say it.
    """
    cmd = [os.fspath(c) for c in cmd]
    if nprocs < 1:
        raise ValueError(f"nprocs must be at least 1, got {nprocs}")
    if not cmd:
        raise ValueError("no command to run")
    if timeout is not None and timeout <= 0:
        raise ValueError(f"timeout must be positive, got {timeout}")
    if grace < 0:
        raise ValueError(f"grace must not be negative, got {grace}")
    if max_restarts < 0:
        raise ValueError(f"max_restarts must not be negative, got {max_restarts}")
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    nodes = nodes or Nodes()
    if nodes.nnodes > 1 and not nodes.master_addr:
        raise ValueError("a job over several hosts needs master_addr (rank 0's host)")
    if not 0 <= nodes.node_rank < nodes.nnodes:
        raise ValueError(f"node_rank must be in [0, {nodes.nnodes}), got {nodes.node_rank}")
    if nodes.master_addr:
        first_job_id, token = multi_host_job(nodes, token or job_secret(env=env))
        if token is None:
            raise _bad(NO_SECRET)
    deadline = None if timeout is None else time.monotonic() + timeout
    received: list[int] = []
    with _catch_stopping_signals(received):
        for restart in range(max_restarts + 1):
            if nodes.master_addr:
                # Every host's launcher counts the same restarts: the k-th meets at "-rk".
                job_id = first_job_id if restart == 0 else f"{first_job_id}-r{restart}"
            else:
                job_id, token = new_job()
            start_env = dict(os.environ if env is None else env)
            start_env.update(SCALEFREE_RESTART_COUNT=str(restart), SCALEFREE_MAX_RESTARTS=str(max_restarts))
            if encrypt:
                start_env["SCALEFREE_ENCRYPT"] = "1"
            ended = _start_and_supervise(cmd, nprocs, start_env, job_id, token, nodes, prefix, timeout, deadline, grace,
                                         received, allow_rank_failure, quiet_exits, max_restarts - restart)
            if not ended.rank_failed or received:
                return ended.code
            if restart < max_restarts:
                say(f"restart {restart + 1} of {max_restarts} (--max-restarts): starting every rank again")
        if max_restarts:
            say(f"no restarts left: the job failed in all {max_restarts + 1} starts (--max-restarts {max_restarts})")
        return ended.code


def _start_and_supervise(cmd, nprocs, env, job_id, token, nodes, prefix, timeout, deadline, grace, received,
                         allow_rank_failure, quiet_exits, restarts_left) -> _Ended:
    """One start of the job: its ranks, their output, their supervision, their end."""
    try:
        ranks = _Ranks(cmd, nprocs, env, job_id, token, nodes)
    except OSError as e:
        say(f"cannot run {cmd[0]!r}: {e.strerror or e}")
        return _Ended(EXIT_NOT_FOUND if isinstance(e, FileNotFoundError) else EXIT_CANNOT_EXECUTE)
    tag = (lambda r: f"[{nodes.global_rank(r, nprocs)}] ".encode()) if prefix else (lambda r: b"")
    out, err = _binary(sys.stdout), _binary(sys.stderr)
    pumps = []
    for r, p in enumerate(ranks.procs):
        pumps += [_start_pump(p.stdout, out, tag(r)), _start_pump(p.stderr, err, tag(r))]
    try:
        return _supervise(ranks, timeout, grace, received, allow_rank_failure, quiet_exits, restarts_left, deadline)
    finally:
        ranks.close()
        _join(pumps, _DRAIN_SECONDS)
