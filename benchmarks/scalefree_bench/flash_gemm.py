"""``scalefree bench flash-gemm``: out-of-core gemm under a memory budget against in-memory
numpy (OpenBLAS) on the same matrices, in one process.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE \\
        scalefree bench flash-gemm --n 2048,4096 --budget-fraction 0.25 --json OUT

Setup (random matrices, copying A and B to flash, ``--warmup`` calls of each) stays outside
the timed calls. The flash rows multiply their blocks with numpy's own OpenBLAS by default
(``--flash-blas auto``); ``--flash-blas auto,faer`` adds a row with faer's kernel. Reported per size: median/min/max seconds of each, GFLOP/s, the ratio
numpy/flash (> 1: flash is faster), the flash run's peak resident bytes against its budget,
and numpy's BLAS (threadpoolctl).
"""

from __future__ import annotations

import argparse
import functools
import os
import tempfile
import time
from pathlib import Path

import numpy as np

from scalefree._units import parse_bytes
from . import common

BENCH = "flash-gemm"


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(BENCH, help="out-of-core gemm under a memory budget vs in-memory numpy",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=common.argparse_type(lambda s: common.parse_int_list(s, "size")),
                   default="2048,4096", metavar="N[,N...]", help="square matrix sizes")
    p.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    p.add_argument("--budget-fraction", type=common.argparse_type(common.positive_float), default=0.25,
                   help="flash memory budget as a fraction of the bytes of A, B and C")
    p.add_argument("--budget", default=None, metavar="SIZE",
                   help="flash memory budget as a size (e.g. 1G); overrides --budget-fraction")
    p.add_argument("--flash-blas", default="auto", metavar="WHICH[,WHICH]",
                   help="dense block multiply of the flash rows: auto (numpy's OpenBLAS), faer, or a "
                        "library path; a comma list gives one flash row each (default auto)")
    p.add_argument("--warmup", type=common.argparse_type(lambda s: common.parse_int_list(s, "warm-up calls", 0)[0]),
                   default=1, help="untimed calls of each implementation before the timed ones (default 1)")
    p.add_argument("--threads", type=common.argparse_type(common.positive_int), default=common.usable_cores(),
                   help="compute threads of the flash runtime")
    p.add_argument("--repeat", type=common.argparse_type(common.positive_int), default=3,
                   help="timed calls of each implementation per size")
    p.add_argument("--dir", default=None, help="scratch directory for flash files (default: SCALEFREE_FLASH_DIR or temp)")
    common.add_cold_arg(p)
    common.add_output_args(p)
    p.set_defaults(func=run)
    return p


def run(args) -> int:
    from scalefree import flash

    blas = common.numpy_blas("flash-gemm")
    common.progress(f"flash-gemm: numpy BLAS: {blas}")
    dtype = np.dtype(args.dtype)
    records = []
    cache = common.PageCache(args.cold, BENCH)
    with tempfile.TemporaryDirectory(prefix="scalefree-flash-bench-", dir=args.dir) as tmp:
        for n in args.n:
            data_bytes = 3 * n * n * dtype.itemsize
            budget = parse_bytes(args.budget, "--budget") if args.budget else max(1 << 20, int(data_bytes * args.budget_fraction))
            rng = np.random.default_rng(n)
            a = rng.standard_normal((n, n), dtype=dtype)
            b = rng.standard_normal((n, n), dtype=dtype)
            flops = 2.0 * n * n * n
            # numpy, in memory
            c = np.zeros((n, n), dtype)  # touched, so no call pays the first-touch page faults
            for _ in range(args.warmup):
                np.matmul(a, b, out=c)
            rss: dict = {}
            times = [common.timed_call(lambda: np.matmul(a, b, out=c), cache, rss)[0] for _ in range(args.repeat)]
            st = common.Stats.of(times)
            records.append(common.make_record(bench=BENCH, impl="numpy", variant="in-memory", ranks=1, nbytes=data_bytes,
                                              dtype=args.dtype, stats=st, gbps=0.0, n_rows=n, gflops=flops / st.median_s / 1e9,
                                              blas=blas, page_cache=cache.state, **rss))
            common.progress(f"  numpy n={n}: median {common.human_time(st.median_s)}")
            # flash, under the budget
            for which in args.flash_blas.split(","):
                rt = flash.Runtime(memory_budget=budget, threads=args.threads, dir=tmp, blas=which)
                t0 = time.perf_counter()
                A, B = flash.Matrix.from_numpy(a, rt), flash.Matrix.from_numpy(b, rt)
                C = flash.Matrix.zeros((n, n), dtype, runtime=rt)
                setup_s = time.perf_counter() - t0
                stats: dict = {}
                for _ in range(args.warmup):
                    flash.gemm(A, B, C, runtime=rt)
                times, peak, idle, rss = [], 0, [], {}
                for _ in range(args.repeat):
                    times.append(common.timed_call(functools.partial(flash.gemm, A, B, C, runtime=rt, stats=stats), cache, rss)[0])
                    peak = max(peak, stats["peak_resident_bytes"])
                    idle.append(stats["compute_idle_seconds"])
                got = C.to_numpy()
                err = float(np.abs(got - c).max() / max(1e-30, float(np.abs(c).max())))
                del got
                if err > (1e-3 if dtype == np.float32 else 1e-9):
                    raise SystemExit(f"flash-gemm: n={n}: result differs from numpy (relative error {err:.2e})")
                st = common.Stats.of(times)
                variant = "flash" if which == "auto" else f"flash-{os.path.basename(which)}"
                records.append(common.make_record(bench=BENCH, impl="scalefree", variant=variant, ranks=1, nbytes=data_bytes,
                                                  dtype=args.dtype, stats=st, gbps=0.0, n_rows=n,
                                                  gflops=flops / st.median_s / 1e9, budget_bytes=budget,
                                                  peak_resident_bytes=peak, setup_s=setup_s, max_rel_err=err,
                                                  block_blas=rt.blas or "faer", compute_idle_s=float(np.median(idle)),
                                                  bytes_read=stats["bytes_read"], bytes_written=stats["bytes_written"],
                                                  page_cache=cache.state, **rss))
                common.progress(f"  flash ({rt.blas or 'faer'}) n={n}: median {common.human_time(st.median_s)}, "
                                f"peak {peak >> 20} MiB of {budget >> 20} MiB, compute idle {np.median(idle):.3f} s")
                del rt, A, B, C
    # peak: the flash kernels' resident bytes; peak RSS: the whole process's (numpy's A, B and
    # C included); +call: what the call added to the RSS it started from.
    headers = ["n", "impl", "variant", "median", "min", "max", "GFLOP/s", "budget", "peak", "peak RSS", "+call",
               "vs numpy"]
    rows = []
    numpy_s = {r["n_rows"]: r["median_s"] for r in records if r["impl"] == "numpy"}
    for r in records:
        flash_row = r["impl"] == "scalefree"
        rows.append([str(r["n_rows"]), r["impl"], r["variant"], common.human_time(r["median_s"]), common.human_time(r["min_s"]),
                     common.human_time(r["max_s"]), f"{r['gflops']:.1f}",
                     common.human_bytes(r["budget_bytes"]) if flash_row else "",
                     common.human_bytes(r["peak_resident_bytes"]) if flash_row else "",
                     *common.rss_cells(r),
                     f"{common.ratio(numpy_s[r['n_rows']], r['median_s']):.2f}x" if flash_row else ""])
    print(f"# page cache: {cache.state}" + (f" ({cache.drops} drops)" if cache.enabled else ""))
    print(common.format_table(headers, rows, left_columns=3))
    if args.json:
        common.write_json(Path(args.json), records)
    if args.plot:
        _plot(records, Path(args.plot))
    return 0


def _plot(records: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for key in sorted({(r["impl"], r["variant"]) for r in records}):
        label = "numpy in memory" if key[0] == "numpy" else f"scalefree {key[1]} (budget)"
        pts = sorted((r["n_rows"], r["gflops"]) for r in records if (r["impl"], r["variant"]) == key)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("n (square matrices)")
    ax.set_ylabel("GFLOP/s")
    ax.set_title("gemm: flash under a memory budget vs in-memory numpy")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
