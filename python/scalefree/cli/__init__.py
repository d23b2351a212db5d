"""The ``scalefree`` command. Each subcommand lives in its own module, imported lazily
so that ``scalefree run`` starts fast. Installed packages add commands through the entry-point
group ``scalefree.cli`` (name: the command; value: its ``add_parser(subparsers)``): the
benchmark harness (``benchmarks/``) adds ``scalefree bench``."""

from __future__ import annotations

import argparse
import sys


# (command, module that registers it, package of that module, one line for `scalefree --help`)
_COMMANDS = (
    ("run", "run", ".", "start N ranks of a command on this host"),
    ("ps", "ps", ".", "parameter-server training over zero-copy tensor slots"),
    ("sparse", "sparse", ".", "sparse allreduce tools (plan: cost model of layer degrees)"),
    ("graph", "graph", ".", "graph analytics on the sparse allreduce (pagerank, diameter, rmat)"),
    ("sgd", "sgd", ".", "mini-batch SGD (sparse logistic regression) on the sparse allreduce"),
    ("mf", "mf", ".", "matrix factorization by SGD (train, predict)"),
    ("ucx", "ucx", "..launch", "the UCX backend between hosts"),
    ("flash", "flash", ".", "out-of-core kernels on matrices kept on flash (svd, gemm)"),
)

# Commands that installed packages may add (entry-point group ``scalefree.cli``): what each
# one is, and how to install it when it is not there.
PLUGINS = "scalefree.cli"
_OPTIONAL = (
    ("bench", "benchmark scalefree against its peers (MPI, gloo, ...)",
     "the benchmark harness is not installed: pip install ./benchmarks (from the scalefree repository)"),
)


def _plugin_commands() -> dict:
    """The commands installed packages add: name -> entry point."""
    from importlib.metadata import entry_points

    try:
        found = entry_points(group=PLUGINS)
    except TypeError:  # Python 3.9: a dict of groups
        found = entry_points().get(PLUGINS, ())
    return {e.name: e for e in found}


def _missing(hint: str):
    def run(args) -> int:
        from .common import fail

        fail(f"scalefree {args.command}", hint)

    return run


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
    plugins = _plugin_commands()
    optional = {name: (help_line, hint) for name, help_line, hint in _OPTIONAL}
    names = {c[0] for c in _COMMANDS} | set(plugins) | set(optional)
    chosen = next((a for a in (argv or []) if not a.startswith("-")), None)
    for name, module, package, help_line in _COMMANDS:
        if chosen in names and chosen != name:
            sub.add_parser(name, help=help_line)
            continue
        importlib.import_module(f"{package}{module}" if package == "." else f"{package}.{module}",
                                __name__).add_parser(sub)
    for name in sorted(set(plugins) | set(optional)):
        help_line, hint = optional.get(name, ("", ""))
        if name not in plugins:
            # Not installed: the command says how to install it (one line, exit 2), whatever follows.
            q = sub.add_parser(name, help=f"{help_line} (not installed)", add_help=False, prefix_chars="\0")
            q.add_argument("rest", nargs=argparse.REMAINDER)
            q.set_defaults(func=_missing(hint))
        elif chosen in names and chosen != name:
            sub.add_parser(name, help=help_line)
        else:
            plugins[name].load()(sub)
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
