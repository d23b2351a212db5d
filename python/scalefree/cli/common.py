"""What every ``scalefree`` command shares: one error path, one way to start its ranks, and
the argument types that bound values before anything runs.

Errors: a command's failure is one line, ``scalefree CMD: error: MESSAGE``, on stderr, with
exit code 2 for bad arguments and bad input (a reader names the file and line) and 1 for
failures at run time. In a multi-rank job the first rank that fails prints it; ranks that
fail only because that peer left (:class:`~scalefree.PeerLostError`) stay quiet, and the
launcher stops them.
"""

from __future__ import annotations

import argparse
import os
import sys

EXIT_FAILURE = 1
EXIT_USAGE = 2

# Set by relaunch() for the ranks it starts: they print their own errors, and a peer's loss
# after another rank's error is not news.
_REPORTS = "SCALEFREE_CLI_RANKS"

# (rank, size) variables of every launcher scalefree.init() honours.
_LAUNCHERS = (("SCALEFREE_RANK", "SCALEFREE_WORLD_SIZE"), ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
              ("PMI_RANK", "PMI_SIZE"), ("SLURM_PROCID", "SLURM_NTASKS"), ("RANK", "WORLD_SIZE"))


def inside_job() -> bool:
    """True when a launcher (scalefree run, mpirun, mpiexec, srun, torchrun) started this
    process as one rank of a job."""
    return any(os.environ.get(r) is not None and os.environ.get(s) is not None for r, s in _LAUNCHERS)


def relaunch(args, run, ranks: int, *, allow_rank_failure: bool = False, prefix: bool = False) -> int:
    """Runs ``run(args)`` as this command's rank: with ``ranks`` > 1 outside a job, starts
    ``ranks`` ranks on this host, each running this same command line (output untagged
    unless ``prefix``: commands print from one rank); inside a job, or with one rank, runs
    here."""
    if ranks > 1 and not inside_job():
        from ..launch.launcher import launch

        import tempfile

        cmd = [sys.executable, "-m", "scalefree.cli", *sys.argv[1:]]
        env = dict(os.environ)
        # The ranks' claim to report an error: a nameless file this process holds open for the
        # job's whole life (nothing is left behind even after a crash), reached through /proc.
        with tempfile.TemporaryFile() as claim:
            env[_REPORTS] = f"/proc/{os.getpid()}/fd/{claim.fileno()}"
            return launch(cmd, ranks, prefix=prefix, env=env, allow_rank_failure=allow_rank_failure,
                          quiet_exits=(EXIT_FAILURE, EXIT_USAGE))
    return run(args)


def error_code(e: BaseException) -> int | None:
    """The exit code of a failure: 2 for bad input and arguments, 1 at run time, None for a
    peer lost after another rank already reported (stay quiet)."""
    from ..errors import DataError, InvalidArgumentError, MismatchError, PeerLostError

    if isinstance(e, PeerLostError) and os.environ.get(_REPORTS):
        return None
    if isinstance(e, (DataError, InvalidArgumentError, FileNotFoundError, IsADirectoryError, NotADirectoryError,
                      PermissionError, UnicodeDecodeError)) and not isinstance(e, MismatchError):
        return EXIT_USAGE
    return EXIT_FAILURE


def message(e: BaseException) -> str:
    """One line for an exception: ours name the file and line themselves; the OS's name the
    path."""
    if isinstance(e, OSError) and e.filename is not None and not isinstance(e, ConnectionError):
        what = {FileNotFoundError: "no such file or directory", IsADirectoryError: "is a directory",
                NotADirectoryError: "not a directory", PermissionError: "permission denied"}.get(type(e))
        return f"{e.filename}: {what or e.strerror or e}"
    text = str(e).strip() or type(e).__name__
    return " ".join(text.split("\n")[0].split()) if "\n" in text else text


def _first_to_report() -> bool:
    """In a job started by :func:`relaunch`, True for the first rank that fails: it marks the
    launcher's claim file under a lock, so a rank that fails after the first has exited still
    stays quiet (several ranks often meet the same bad input, an empty file). Elsewhere always
    True."""
    import fcntl

    path = os.environ.get(_REPORTS, "")
    if not path.startswith("/proc/"):
        return True
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError:
        return True
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX)
        first = os.pread(fd, 1, 0) == b""
        if first:
            os.pwrite(fd, b"1", 0)
        return first
    except OSError:
        return True
    finally:
        os.close(fd)  # also releases the lock


def run_guarded(prog: str, fn, args) -> int:
    """``fn(args)`` with the one error path: exceptions become one line and an exit code."""
    try:
        rc = fn(args)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # A reader closed the pipe (`| head`): stop quietly, and keep Python's exit-time
        # flush from raising again.
        try:
            sys.stdout = open(os.devnull, "w")
        except OSError:
            pass
        return 0
    except SystemExit:
        raise
    except Exception as e:  # noqa: BLE001 - the CLI's one error path
        code = error_code(e)
        if code is None:
            return EXIT_FAILURE
        if _first_to_report():
            print(f"{prog}: error: {message(e)}", file=sys.stderr, flush=True)
        if os.environ.get("SCALEFREE_TRACEBACK"):
            import traceback

            traceback.print_exc()
        return code
    return int(rc or 0)


def fail(prog: str, text: str, code: int = EXIT_USAGE):
    """Stops the command with one line (bad input or arguments: code 2)."""
    print(f"{prog}: error: {text}", file=sys.stderr, flush=True)
    raise SystemExit(code)


# Argument types: values are bounded when the command line is read, before ranks start.


def count(minimum: int = 1):
    """An int at least ``minimum``; K, M, G suffixes (binary) allowed."""

    def parse(text: str) -> int:
        from .._units import parse_bytes

        try:
            n = parse_bytes(text, "count")
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if n < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {text}")
        return n

    return parse


def number(low: float | None = None, high: float | None = None, *, low_open: bool = False, high_open: bool = False):
    """A finite float within bounds (open or closed at each end)."""

    def parse(text: str) -> float:
        try:
            x = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        ok = x == x and abs(x) != float("inf")
        if low is not None:
            ok = ok and (x > low if low_open else x >= low)
        if high is not None:
            ok = ok and (x < high if high_open else x <= high)
        if not ok:
            lo = "" if low is None else f"{'(' if low_open else '['}{low:g}"
            hi = "" if high is None else f"{high:g}{')' if high_open else ']'}"
            raise argparse.ArgumentTypeError(f"must be a finite number in {lo or '(-inf'}, {hi or 'inf)'}, got {text}")
        return x

    return parse


def port(text: str) -> int:
    """A TCP port, 1..65535."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from None
    if not 1 <= n <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port in 1..65535, got {text}")
    return n


def add_columns(p, table: str) -> None:
    """``--columns``: the columns of a Parquet / Arrow IPC input, by name (``src,dst`` for
    edges, ``user,item,rating`` for ratings); default the first integer (and numeric) ones."""
    example, default = {"edges": ("src,dst", "the first two integer columns"),
                        "ratings": ("user,item,rating", "the first two integer columns and the next numeric one"),
                        "pairs": ("user,item or user,item,rating",
                                  "the first two integer columns and the next numeric one, if any")}[table]

    def parse(text: str) -> list[str]:
        from .._columnar import parse_columns

        try:
            return parse_columns(text, table)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    p.add_argument("--columns", type=parse, default=None, metavar="NAMES",
                   help=f"Parquet / Arrow IPC input: the columns to read, by name (e.g. {example}); "
                        f"default: {default}")


def add_ranks(p, default: int = 1) -> None:
    """``-n/--ranks`` the same way in every command."""
    p.add_argument("-n", "--ranks", type=count(1), default=default,
                   help="ranks to start on this host (inside mpirun, srun or torchrun: theirs)")


DELIMITERS = ("tab", "space", "comma", "semicolon")


def add_text_dialect(p, delimiter: bool = True) -> None:
    """``--delimiter`` and ``--header`` of the text readers (detected by default)."""
    if delimiter:
        p.add_argument("--delimiter", choices=DELIMITERS, default=None,
                       help="field delimiter of text input (default: detected from the first line; tab and space "
                            "both mean runs of blanks)")
    p.add_argument("--header", choices=["auto", "yes", "no"], default="auto",
                   help="whether text input starts with a header line (in every part of a part directory); "
                        "auto: when its first field is not a number")


def add_slack(p, what: str, default_help: str) -> None:
    """``--slack S`` (bounded staleness on the sparse allreduce: other ranks' ``what`` up to S
    iterations old instead of waiting for a slow rank) and ``--straggler MS`` (benchmarks: one
    seeded-random rank, :class:`~scalefree.ssp.straggler.StragglerSchedule`, sleeps up to MS
    ms before each iteration)."""
    p.add_argument("--slack", type=count(0), default=None,
                   help=f"bounded staleness: an iteration may use other ranks' {what} up to this many iterations "
                        f"old instead of waiting for a slow rank; {default_help}")
    p.add_argument("--straggler", type=number(0), default=0.0, metavar="MS",
                   help="benchmarks: before each iteration one seeded-random rank sleeps up to MS ms")


def add_quiet(p) -> None:
    """``-q/--quiet``: no progress (shown by default when stderr is a terminal)."""
    p.add_argument("-q", "--quiet", action="store_true", help="no progress output")


def show_progress(args) -> bool:
    """Progress on stderr: asked for with --progress, else when stderr is a terminal and not
    --quiet."""
    if getattr(args, "progress", False):
        return True
    return not getattr(args, "quiet", False) and sys.stderr.isatty()


def add_checkpoint(p, step: str = "iteration") -> None:
    """``--checkpoint PATH --checkpoint-every N --resume --stop-after N`` the same way in every
    resumable command (``step``: what the loop counts, for the help)."""
    p.add_argument("--checkpoint", default=None, metavar="PATH",
                   help=f"write the state here atomically (one file per rank, PATH.rank{{R}}-of-{{N}}) every "
                        f"--checkpoint-every {step}s and at --stop-after")
    p.add_argument("--checkpoint-every", type=count(0), default=0, metavar="N",
                   help=f"with --checkpoint: every N {step}s (0: only at --stop-after)")
    p.add_argument("--resume", action="store_true",
                   help="continue from --checkpoint (refused when taken from other input or options); the result "
                        "is the uninterrupted run's")
    p.add_argument("--stop-after", type=count(1), default=None, metavar="N",
                   help=f"with --checkpoint: end after {step} N, with a checkpoint (a job in slices)")


def check_checkpoint(prog: str, args) -> None:
    """The checkpoint options agree (before ranks start)."""
    if (args.resume or args.checkpoint_every or args.stop_after is not None) and not args.checkpoint:
        fail(prog, "--resume, --checkpoint-every and --stop-after need --checkpoint PATH")


def checkpoints(group, args, expect: dict, kind: str, version: int = 1):
    """The :class:`~scalefree.checkpoint.Checkpoints` of a command's loop from its
    :func:`add_checkpoint` options (None without ``--checkpoint``)."""
    if not args.checkpoint:
        return None
    from ..checkpoint import Checkpoints

    return Checkpoints(group, args.checkpoint, every=args.checkpoint_every, stop_after=args.stop_after,
                       resume=args.resume, expect=expect, kind=kind, version=version)


def stopped_line(ck, step: str = "iteration") -> None:
    """The one line of a run that stopped at ``--stop-after`` (rank 0 prints it)."""
    print(f"stopped after {step} {ck.stop_after}; checkpoint {ck.path} (continue with --resume)", flush=True)
