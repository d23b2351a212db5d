"""The ARPACK peer of ``scalefree bench svd --cli-budget``, run as a command like ours: a
fresh process loads the matrix file (``scipy.sparse.load_npz``) and calls
``scipy.sparse.linalg.svds(A, k, tol, return_singular_vectors=False)``; it writes a JSON
record with the same fields as ``scalefree flash svd --json`` (``load_seconds``, ``seconds``:
the solve, ``singular_values`` largest first, ``peak_rss_bytes``: this process's ``VmHWM``)."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("data", type=Path)
    p.add_argument("-k", type=int, required=True)
    p.add_argument("--tol", type=float, required=True)
    p.add_argument("--json", type=Path, required=True)
    args = p.parse_args(argv)

    import numpy as np
    import scipy.sparse as sp
    import scipy.sparse.linalg as sla

    from .common import status_bytes

    t0 = time.perf_counter()
    a = sp.load_npz(args.data).tocsr()
    load_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    s = sla.svds(a, k=args.k, tol=args.tol, return_singular_vectors=False, random_state=0)
    solve_s = time.perf_counter() - t0
    doc = {"data": str(args.data), "k": args.k, "singular_values": [float(v) for v in np.sort(s)[::-1]],
           "load_seconds": load_s, "seconds": solve_s, "peak_rss_bytes": status_bytes("VmHWM")}
    args.json.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
