"""The ``scalefree`` command. Each subcommand lives in its own module, imported lazily
so that ``scalefree run`` starts fast."""

from __future__ import annotations

import argparse
import sys


def _build_parser() -> argparse.ArgumentParser:
    from .. import __version__

    p = argparse.ArgumentParser(
        prog="scalefree",
        description="scalefree: one-sided transport, collectives and out-of-core kernels.",
    )
    p.add_argument("--version", action="version", version=f"scalefree {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    from ..launch import launcher

    launcher.add_parser(sub)

    from ..bench import cli as bench_cli

    bench_cli.add_parser(sub)

    from ..tensors import ps_train

    ps_train.add_parser(sub)

    from ..sparse import plan as sparse_plan

    sparse_plan.add_parser(sub)

    from . import graph

    graph.add_parser(sub)

    from . import sgd

    sgd.add_parser(sub)

    from . import mf

    mf.add_parser(sub)

    from ..launch import ucx

    ucx.add_parser(sub)

    from . import flash as flash_cli

    flash_cli.add_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    from .common import run_guarded

    argv = sys.argv[1:] if argv is None else argv
    parser = _build_parser()
    args = parser.parse_args(argv)
    # The command's name as the user typed it: "scalefree graph pagerank".
    words = [args.command] + [getattr(args, k) for k in sorted(vars(args)) if k.endswith("_command") and getattr(args, k)]
    return run_guarded("scalefree " + " ".join(words), args.func, args)


if __name__ == "__main__":
    sys.exit(main())
