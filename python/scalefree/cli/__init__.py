"""The ``scalefree`` command. Each subcommand lives in its own module, imported lazily
so that ``scalefree run`` starts fast."""

from __future__ import annotations

import argparse
import sys


# (command, module that registers it, package of that module, one line for `scalefree --help`)
_COMMANDS = (
    ("run", "run", ".", "start N ranks of a command on this host"),
    ("bench", "cli", "..bench", "benchmark scalefree against its peers (MPI, gloo, ...)"),
    ("ps", "ps", ".", "parameter-server training over zero-copy tensor slots"),
    ("sparse", "sparse", ".", "sparse allreduce tools (plan: cost model of layer degrees)"),
    ("graph", "graph", ".", "graph analytics on the sparse allreduce (pagerank, diameter, rmat)"),
    ("sgd", "sgd", ".", "mini-batch SGD (sparse logistic regression) on the sparse allreduce"),
    ("mf", "mf", ".", "matrix factorization by SGD (train, predict)"),
    ("ucx", "ucx", "..launch", "the UCX backend between hosts"),
    ("flash", "flash", ".", "out-of-core kernels on matrices kept on flash (svd, gemm)"),
)


def _build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The parser. Only the command named in ``argv`` is imported (every rank of a job
    parses its command line, and the others would import numpy and more for nothing); with
    no known command, all are, for the help."""
    import importlib

    from .. import __version__

    p = argparse.ArgumentParser(
        prog="scalefree",
        description="scalefree: one-sided transport, collectives and out-of-core kernels.",
    )
    p.add_argument("--version", action="version", version=f"scalefree {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    names = {c[0] for c in _COMMANDS}
    chosen = next((a for a in (argv or []) if not a.startswith("-")), None)
    for name, module, package, help_line in _COMMANDS:
        if chosen in names and chosen != name:
            sub.add_parser(name, help=help_line)
            continue
        importlib.import_module(f"{package}{module}" if package == "." else f"{package}.{module}",
                                __name__).add_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    from .common import run_guarded

    argv = sys.argv[1:] if argv is None else argv
    parser = _build_parser(argv)
    args = parser.parse_args(argv)
    # The command's name as the user typed it: "scalefree graph pagerank".
    words = [args.command] + [getattr(args, k) for k in sorted(vars(args)) if k.endswith("_command") and getattr(args, k)]
    return run_guarded("scalefree " + " ".join(words), args.func, args)


if __name__ == "__main__":
    sys.exit(main())
