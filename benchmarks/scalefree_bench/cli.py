"""``scalefree bench``: one sub-subcommand per bench module.

A bench is a sibling module of this one that defines ``add_parser(subparsers)``, registering
its own subcommand with ``func=``; add its module name to ``BENCH_MODULES``.
"""

from __future__ import annotations

import argparse
import importlib

from . import compare

# Module names under scalefree_bench, in the order `scalefree bench --help` lists them.
BENCH_MODULES = ("allreduce", "ucx", "onesided", "sites", "ssp", "ssp_mf", "ssp_sparse", "tensors", "ps", "flash_gemm", "flash_kernels", "svd", "sparse",
                 "pagerank", "pagerank_flash", "pagerank_replicated", "pagerank_resume", "hadi", "mf", "rendezvous", "ddp", "torch_trace", "topics", "load", "xml")


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "bench",
        help="benchmark scalefree against its peers (MPI, gloo, ...)",
        description="Benchmarks of scalefree against its peers, run in one invocation on the "
        "same inputs. Progress goes to stderr, the table to stdout; --json writes flat "
        "records, --plot draws them. Run timed benchmarks one at a time: "
        "`flock /tmp/bench.lock scalefree bench ...`.",
    )
    bench_sub = p.add_subparsers(dest="bench", metavar="BENCH")
    bench_sub.required = True
    for name in BENCH_MODULES:
        importlib.import_module(f"{__package__}.{name}").add_parser(bench_sub)
    # The performance guard: every bench that writes records can compare them with the last
    # recorded ones (`--compare`, see compare.py).
    for bench in bench_sub.choices.values():
        if any(a.dest == "json" for a in bench._actions):
            compare.add_args(bench)
    return p
