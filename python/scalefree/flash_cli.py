"""``scalefree flash``: out-of-core kernels from the command line.

    scalefree flash svd docword.kos.txt.gz -k 100 --tol 1e-4 --memory 1G

``svd`` opens DATA with ``flash.load`` (``.npz``, ``.mtx[.gz]``, ``docword*.txt[.gz]``,
``.npy``), keeps it on flash, and prints the top-k singular values (largest first) with an
IO/compute summary (bytes read and written by the flash kernels, their GB/s, peak resident
bytes against the budget) on stderr; ``--out OUT.npz`` saves ``u``, ``s``, ``vt``.
"""

from __future__ import annotations

import argparse
import sys
import time


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("flash", help="out-of-core kernels on matrices kept on flash (svd)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    flash_sub = p.add_subparsers(dest="flash_command", metavar="COMMAND")
    flash_sub.required = True
    s = flash_sub.add_parser("svd", help="top-k singular values of a matrix file, the matrix staying on flash")
    s.add_argument("data", help="matrix file (.npz, .mtx[.gz], docword*.txt[.gz], .npy)")
    s.add_argument("-k", type=int, default=6, help="number of singular values (default 6)")
    s.add_argument("--tol", type=float, default=0.0, help="relative tolerance (default 0: machine precision)")
    s.add_argument("--memory", default=None,
                   help="memory budget of the flash kernels, e.g. 1G (default SCALEFREE_FLASH_MEMORY or 1G)")
    s.add_argument("--threads", type=int, default=None, help="compute threads (default SCALEFREE_FLASH_THREADS or cores)")
    s.add_argument("--dir", default=None, help="scratch directory (default SCALEFREE_FLASH_DIR or temp)")
    s.add_argument("--dtype", choices=("float32", "float64"), default=None, help="element type (default: the file's)")
    s.add_argument("--out", default=None, metavar="OUT.npz", help="save u, s, vt")
    s.set_defaults(func=_svd)
    return p


def _svd(args) -> int:
    import numpy as np

    from . import flash
    from .errors import ScalefreeError

    try:
        rt = flash.Runtime(memory_budget=args.memory, threads=args.threads, dir=args.dir)
        t0 = time.perf_counter()
        a = flash.load(args.data, rt, dtype=args.dtype)
        load_s = time.perf_counter() - t0
        print(f"flash svd: {args.data}: {a!r}, loaded in {load_s:.2f} s; budget {rt.memory_budget_bytes} bytes",
              file=sys.stderr)
        stats: dict = {}
        t0 = time.perf_counter()
        if args.out:
            u, s, vt = flash.svds(a, k=args.k, tol=args.tol, runtime=rt, stats=stats)
        else:
            s = flash.svds(a, k=args.k, tol=args.tol, runtime=rt, stats=stats, return_singular_vectors=False)
        solve_s = time.perf_counter() - t0
    except (ScalefreeError, ValueError, OSError) as e:
        print(f"scalefree flash svd: {e}", file=sys.stderr)
        return 2
    order = np.argsort(s)[::-1]
    for v in np.asarray(s)[order]:
        print(f"{v:.10g}")
    gbps = stats["bytes_read"] / stats["kernel_seconds"] / 1e9 if stats["kernel_seconds"] > 0 else 0.0
    print(f"flash svd: k={args.k} in {solve_s:.2f} s: {stats['operator_columns']} operator columns, "
          f"{stats['restarts']} restarts; flash kernels {stats['kernel_seconds']:.2f} s, read "
          f"{stats['bytes_read']} bytes ({gbps:.2f} GB/s), wrote {stats['bytes_written']} bytes, peak "
          f"{stats['peak_resident_bytes']} of {rt.memory_budget_bytes} bytes", file=sys.stderr)
    if args.out:
        np.savez(args.out, u=u[:, order], s=s[order], vt=vt[order])
    return 0
