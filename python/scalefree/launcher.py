"""``scalefree run``: start N ranks of a command on this host (like torchrun).

    scalefree run -n 4 [--timeout S] [--grace S] [--no-prefix] -- python train.py args

Each rank gets ``SCALEFREE_RANK``, ``SCALEFREE_WORLD_SIZE``, ``SCALEFREE_LOCAL_RANK``,
``SCALEFREE_LOCAL_SIZE``, ``SCALEFREE_JOB_ID`` and ``SCALEFREE_JOB_TOKEN``; its output lines
are prefixed with ``[rank]``. The exit code is that of the first rank to fail (128+N for a
signal). When one rank fails the others get ``--grace`` seconds to notice (the library makes
them raise ``PeerLostError`` within about a second), then SIGTERM, then SIGKILL. Every rank
runs in its own process group and dies with the launcher, so nothing is left behind.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import secrets
import signal
import subprocess
import sys
import threading
import time

# Variables of other launchers that must not leak into our ranks.
_FOREIGN = (
    "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_SIZE", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS",
    "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "RANK", "WORLD_SIZE", "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
)


def _die_with_parent() -> None:
    """In the child: SIGKILL when the launcher dies (prctl PR_SET_PDEATHSIG)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)
    except Exception:
        pass


def rank_environment(rank: int, size: int, job_id: str, token: str, base: dict | None = None) -> dict:
    env = dict(os.environ if base is None else base)
    for k in _FOREIGN:
        env.pop(k, None)
    env.update(
        SCALEFREE_RANK=str(rank),
        SCALEFREE_WORLD_SIZE=str(size),
        SCALEFREE_LOCAL_RANK=str(rank),
        SCALEFREE_LOCAL_SIZE=str(size),
        SCALEFREE_JOB_ID=job_id,
        SCALEFREE_JOB_TOKEN=token,
    )
    return env


class _Output:
    """Copies a rank's stream to ours line by line, prefixed, without splitting lines."""

    lock = threading.Lock()

    def __init__(self, stream, sink, prefix: bytes):
        self.thread = threading.Thread(target=self._pump, args=(stream, sink, prefix), daemon=True)
        self.thread.start()

    @classmethod
    def _pump(cls, stream, sink, prefix: bytes) -> None:
        for line in iter(stream.readline, b""):
            with cls.lock:
                sink.write(prefix + line if line.endswith(b"\n") else prefix + line + b"\n")
                sink.flush()
        stream.close()


def _describe(code: int) -> str:
    if code > 128 and code - 128 < signal.NSIG:
        try:
            return f"code {code} ({signal.Signals(code - 128).name})"
        except ValueError:
            pass
    return f"code {code}"


def _exit_code(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def launch(cmd: list[str], nprocs: int, *, timeout: float | None = None, grace: float = 5.0,
           prefix: bool = True, env: dict | None = None) -> int:
    """Runs `cmd` as `nprocs` ranks and returns the job's exit code."""
    if nprocs < 1:
        raise ValueError(f"-n must be at least 1, got {nprocs}")
    if not cmd:
        raise ValueError("no command to run")
    job_id = "sf-" + secrets.token_hex(6)
    token = secrets.token_hex(16)
    procs: list[subprocess.Popen] = []
    pumps: list[_Output] = []
    out, err = sys.stdout.buffer, sys.stderr.buffer

    def say(msg: str) -> None:
        with _Output.lock:
            err.write(f"scalefree run: {msg}\n".encode())
            err.flush()

    def signal_all(sig: int) -> None:
        for p in procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, sig)
                except (ProcessLookupError, PermissionError):
                    pass

    def stop_all(wait_first: float) -> None:
        deadline = time.monotonic() + wait_first
        while time.monotonic() < deadline and any(p.poll() is None for p in procs):
            time.sleep(0.02)
        signal_all(signal.SIGTERM)
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline and any(p.poll() is None for p in procs):
            time.sleep(0.02)
        signal_all(signal.SIGKILL)
        for p in procs:
            p.wait()

    received: list[int] = []
    old_handlers = {}

    def on_signal(signum, _frame):
        received.append(signum)

    if threading.current_thread() is threading.main_thread():
        for s in (signal.SIGINT, signal.SIGTERM):
            old_handlers[s] = signal.signal(s, on_signal)
    try:
        for r in range(nprocs):
            try:
                p = subprocess.Popen(
                    cmd,
                    env=rank_environment(r, nprocs, job_id, token, env),
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    start_new_session=True,
                    preexec_fn=_die_with_parent,
                )
            except (FileNotFoundError, PermissionError) as e:
                say(f"cannot run {cmd[0]!r}: {e.strerror}")
                stop_all(0)
                return 127 if isinstance(e, FileNotFoundError) else 126
            procs.append(p)
            tag = f"[{r}] ".encode() if prefix else b""
            pumps.append(_Output(p.stdout, out, tag))
            pumps.append(_Output(p.stderr, err, tag))

        start = time.monotonic()
        code = 0
        while True:
            if received:
                sig = received[0]
                say(f"received {signal.Signals(sig).name}; stopping all ranks")
                signal_all(signal.SIGTERM)
                stop_all(2.0)
                code = 128 + sig
                break
            failed = [(r, p) for r, p in enumerate(procs) if p.poll() not in (None, 0)]
            if failed:
                r, p = failed[0]
                code = _exit_code(p.returncode)
                others = [q for q in procs if q.poll() is None]
                say(f"rank {r} exited with {_describe(code)}" + ("; stopping the other ranks" if others else ""))
                stop_all(grace)
                break
            if all(p.poll() == 0 for p in procs):
                break
            if timeout is not None and time.monotonic() - start > timeout:
                say(f"timeout after {timeout:g} s; stopping all ranks")
                stop_all(0)
                code = 124
                break
            time.sleep(0.01)
        for t in pumps:
            t.thread.join(timeout=5)
        return code
    finally:
        for s, h in old_handlers.items():
            signal.signal(s, h)
        if any(p.poll() is None for p in procs):
            stop_all(0)


def _parser(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("-n", "--nprocs", type=int, required=True, help="number of ranks to start")
    p.add_argument("--timeout", type=float, default=None,
                   help="wall-clock limit for the whole job in seconds; exit 124 when reached (default: none)")
    p.add_argument("--grace", type=float, default=5.0,
                   help="seconds the other ranks get to exit by themselves after one fails (default: 5)")
    p.add_argument("--no-prefix", action="store_true", help="do not prefix output lines with [rank]")
    p.add_argument("cmd", nargs=argparse.REMAINDER, help="the command (after --)")
    return p


def _run(args) -> int:
    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if args.nprocs < 1:
        print(f"scalefree run: -n must be at least 1, got {args.nprocs}", file=sys.stderr)
        return 2
    if not cmd:
        print("scalefree run: no command given (scalefree run -n N -- CMD ...)", file=sys.stderr)
        return 2
    return launch(cmd, args.nprocs, timeout=args.timeout, grace=args.grace, prefix=not args.no_prefix)


def add_parser(sub) -> None:
    p = _parser(sub.add_parser("run", help="start N ranks of a command on this host",
                               description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter))
    p.set_defaults(func=_run)


def main(argv: list[str] | None = None) -> int:
    p = _parser(argparse.ArgumentParser(prog="scalefree run", description=__doc__,
                                        formatter_class=argparse.RawDescriptionHelpFormatter))
    return _run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
