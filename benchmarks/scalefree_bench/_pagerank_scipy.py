"""The single-process scipy pipeline that ``scalefree bench pagerank --from-file`` holds the
end-to-end PageRank against, written as a good engineer would: the file read by the
fastest reader at hand (``np.load`` for ``.npz``; pandas' C parser, with pyarrow when
installed, for text), one CSR build with duplicates summed (then set to 1, as the graph
has each edge once), vertices without an edge left out by a marker pass (no sort), and the
power iteration of networkx's semantics to the same L1 tolerance.

    python -m scalefree_bench._pagerank_scipy EDGES --tol 1e-9 --top 10 --json OUT
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def read_edges(path: Path):
    import numpy as np

    if path.is_dir():
        got = [read_edges(p) for p in sorted(path.iterdir()) if p.is_file() and not p.name.startswith((".", "_"))]
        return np.concatenate([s for s, _ in got]), np.concatenate([d for _, d in got])
    if path.name.endswith(".npz"):
        with np.load(path) as z:
            return z["src"], z["dst"]
    import pandas as pd

    try:
        import pyarrow  # noqa: F401

        engine = "pyarrow"
    except ImportError:
        engine = "c"
    if engine == "pyarrow":
        # pyarrow's reader knows no comment character: skip the leading '#' lines by count.
        import gzip

        skip = 0
        with (gzip.open if path.name.endswith(".gz") else open)(path, "rb") as f:
            for line in f:
                if not line.startswith(b"#"):
                    break
                skip += 1
        df = pd.read_csv(path, sep="\t", header=None, names=["s", "d"], skiprows=skip, engine="pyarrow",
                         dtype="int64")
    else:
        df = pd.read_csv(path, sep=r"\s+", comment="#", header=None, names=["s", "d"], engine="c", dtype="int64")
    return df["s"].to_numpy(), df["d"].to_numpy()


def pagerank(src, dst, tol: float, damping: float = 0.85, max_iter: int = 200):
    import numpy as np
    import scipy.sparse as sp

    n = int(max(src.max(initial=-1), dst.max(initial=-1))) + 1
    a = sp.csr_matrix((np.ones(len(src), np.float64), (dst, src)), shape=(n, n))  # a[v, u]: edge u -> v
    del src, dst
    a.sum_duplicates()
    a.data[:] = 1.0
    outdeg = np.bincount(a.indices, minlength=n).astype(np.float64)
    has = (outdeg > 0) | (np.diff(a.indptr) > 0)
    nv = int(has.sum())
    inv = np.zeros(n)
    np.divide(1.0, outdeg, out=inv, where=outdeg > 0)
    dangling = has & (outdeg == 0)
    x = has / nv
    it = 0
    for it in range(1, max_iter + 1):
        y = a @ (x * inv)
        base = (1.0 - damping) / nv + damping * float(x[dangling].sum()) / nv
        new = np.where(has, base + damping * y, 0.0)
        delta = float(np.abs(new - x).sum())
        x = new
        if delta < tol:
            break
    return x, nv, int(a.nnz), it


def main(argv=None) -> int:
    import numpy as np

    t0 = time.perf_counter()
    p = argparse.ArgumentParser(prog="python -m scalefree_bench._pagerank_scipy")
    p.add_argument("edges", type=Path)
    p.add_argument("--tol", type=float, default=1e-9)
    p.add_argument("--top", type=int, default=10)
    p.add_argument("--json", type=Path, required=True)
    args = p.parse_args(argv)
    src, dst = read_edges(args.edges)
    load_s = time.perf_counter() - t0
    x, nv, edges, it = pagerank(src, dst, args.tol)
    best = np.lexsort((np.arange(len(x)), -x))[: args.top]
    from scalefree._rss import peak_rss_bytes

    rec = {"vertices": nv, "edges": edges, "ranks": 1, "iterations": it, "load_s": load_s,
           "end_to_end_s": time.perf_counter() - t0, "peak_rss_bytes": [peak_rss_bytes()],
           "top": [[int(v), float(x[v])] for v in best]}
    args.json.write_text(json.dumps(rec) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
