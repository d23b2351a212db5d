"""``scalefree bench flash-kernels``: the out-of-core sort, csrcsc, csrmm and kmeans kernels
under a memory budget against their in-memory peers (numpy, scipy) on the same inputs, in
one process.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE \\
        scalefree bench flash-kernels --budget-fraction 0.25 --json OUT

Inputs: sort: ``--sort-n`` random float64 values (peer ``np.sort``); csrcsc and csrmm: the
kos docword matrix from ``../shared/data/kos`` if present, else a seeded random one of the
same shape and density (``--sparse random``: a seeded power-law matrix, by default 1M x 100K
with 47M entries drawn) (peers scipy ``A.T.tocsr()`` and ``A @ B`` with B of ``--csrmm-k``
columns); kmeans: ``--kmeans-n`` x ``--kmeans-d`` float32 points, k clusters, a fixed number
of Lloyd iterations (peer: as many iterations in numpy, distances by one matmul). The
budget is ``--budget-fraction`` of the kernel's input bytes. Setup (copies to flash) is
outside the timed calls; each result is checked against the peer's.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from . import common

BENCH = "flash-kernels"
KERNELS = ("sort", "csrcsc", "csrmm", "kmeans")


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(BENCH, help="out-of-core sort, csrcsc, csrmm, kmeans under a budget vs numpy/scipy",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kernels", type=common.argparse_type(lambda s: common.parse_choice_list(s, KERNELS, "kernel")),
                   default=",".join(KERNELS), metavar="K[,K...]", help=f"kernels to run ({', '.join(KERNELS)})")
    p.add_argument("--budget-fraction", type=common.argparse_type(common.positive_float), default=0.25,
                   help="flash memory budget as a fraction of the kernel's input bytes")
    p.add_argument("--sort-n", type=common.argparse_type(common.positive_int), default=20_000_000)
    p.add_argument("--sparse", choices=("kos", "random"), default="kos",
                   help="csrcsc/csrmm input: the kos docword matrix, or a seeded power-law matrix of "
                        "--sparse-rows x --sparse-cols with --sparse-nnz entries drawn (duplicates merged)")
    p.add_argument("--sparse-rows", type=common.argparse_type(common.positive_int), default=1_000_000)
    p.add_argument("--sparse-cols", type=common.argparse_type(common.positive_int), default=100_000)
    p.add_argument("--sparse-nnz", type=common.argparse_type(common.positive_int), default=47_000_000)
    p.add_argument("--sparse-distinct", action="store_true",
                   help="--sparse random: draw until --sparse-nnz distinct entries exist (else duplicates "
                        "are merged and fewer remain)")
    p.add_argument("--csrmm-k", type=common.argparse_type(common.positive_int), default=64)
    p.add_argument("--csrmm-dtype", choices=("float64", "float32"), default="float64",
                   help="dtype of A, B and C in the csrmm rows (both implementations)")
    p.add_argument("--budget", default=None, metavar="SIZE[,SIZE...]",
                   help="flash memory budgets as sizes (e.g. 1G,96M), overriding --budget-fraction; "
                        "csrmm gets one row per budget, the other kernels use the first")
    p.add_argument("--kmeans-n", type=common.argparse_type(common.positive_int), default=1_000_000)
    p.add_argument("--kmeans-d", type=common.argparse_type(common.positive_int), default=32)
    p.add_argument("--kmeans-k", type=common.argparse_type(common.positive_int), default=16)
    p.add_argument("--kmeans-iterations", type=common.argparse_type(common.positive_int), default=5)
    p.add_argument("--threads", type=common.argparse_type(common.positive_int), default=common.usable_cores())
    p.add_argument("--repeat", type=common.argparse_type(common.positive_int), default=3)
    p.add_argument("--dir", default=None, help="scratch directory for flash files")
    common.add_cold_arg(p)
    common.add_output_args(p)
    p.set_defaults(func=run)
    return p


def _time(fn, repeat, cache=None, rss=None):
    """Times ``repeat`` calls after a warm-up; ``rss`` (a dict, emptied first) receives the
    largest peak RSS of a timed call (:class:`common.PeakRss`)."""
    fn()  # warm-up
    if rss is not None:
        rss.clear()
    return common.Stats.of([common.timed_call(fn, cache, rss)[0] for _ in range(repeat)])


def _kos():
    import scipy.sparse as sp

    here = Path(__file__).resolve()
    for base in [Path.cwd(), *here.parents]:
        p = base.parent / "shared" / "data" / "kos" / "docword.kos.txt.gz"
        if p.exists():
            return str(p), None
    return None, sp.random(3430, 6906, density=353160 / (3430 * 6906), format="csr", random_state=0)


def _lloyd_numpy(x, centers, iterations):
    for _ in range(iterations):
        d = (centers ** 2).sum(1)[None, :] - 2.0 * (x @ centers.T)
        labels = d.argmin(1)
        k = len(centers)
        # per-dimension bincount: far faster than np.add.at
        sums = np.stack([np.bincount(labels, weights=x[:, j], minlength=k) for j in range(x.shape[1])], axis=1)
        counts = np.bincount(labels, minlength=k)
        nz = counts > 0
        centers = centers.copy()
        centers[nz] = (sums[nz] / counts[nz, None]).astype(centers.dtype)
    return centers, labels


def run(args) -> int:

    from scalefree._units import parse_bytes
    from scalefree import flash

    records = []
    cache = common.PageCache(args.cold, BENCH)
    budgets = [parse_bytes(b.strip(), "--budget") for b in args.budget.split(",") if b.strip()] if args.budget else []
    _timed = _time
    last_rss: dict = {}  # of the last timed row, added to its record

    def _time_cold(fn, repeat):  # noqa: F811 - every timed call of every row after a drop
        return _timed(fn, repeat, cache, last_rss)

    def record(kernel, impl, st, nbytes, **extra):
        records.append(common.make_record(bench=BENCH, impl=impl, variant=kernel, ranks=1, nbytes=nbytes,
                                          dtype=extra.pop("dtype", "float64"), stats=st, gbps=0.0,
                                          page_cache=cache.state, **extra, **last_rss))
        common.progress(f"  {kernel} {impl}: median {common.human_time(st.median_s)}")

    with tempfile.TemporaryDirectory(prefix="scalefree-flash-bench-", dir=args.dir) as tmp:
        def runtime(nbytes, budget=None):
            if budget is None:
                budget = budgets[0] if budgets else max(1 << 20, int(nbytes * args.budget_fraction))
            return flash.Runtime(memory_budget=budget, threads=args.threads, dir=tmp), budget

        if "sort" in args.kernels:
            x = np.random.default_rng(1).standard_normal(args.sort_n)
            rt, budget = runtime(x.nbytes)
            record("sort", "numpy", _time_cold(lambda: np.sort(x), args.repeat), x.nbytes)
            stats = {}
            out = {}
            st = _time_cold(lambda: out.__setitem__("y", flash.sort(x, runtime=rt, stats=stats)), args.repeat)
            if not np.array_equal(out["y"], np.sort(x)):
                raise SystemExit("flash-kernels: sort differs from numpy")
            record("sort", "scalefree", st, x.nbytes, budget_bytes=budget, peak_resident_bytes=stats["peak_resident_bytes"])
            del rt

        if "csrcsc" in args.kernels or "csrmm" in args.kernels:
            if args.sparse == "random":
                from .svd import _power_law

                path = None
                t = time.perf_counter()
                s = _power_law(args.sparse_rows, args.sparse_cols, args.sparse_nnz, distinct=args.sparse_distinct)
                common.progress(f"flash-kernels: generated in {common.human_time(time.perf_counter() - t)}")
                common.progress(f"flash-kernels: sparse input {s.shape[0]}x{s.shape[1]} power law, {s.nnz} entries")
            else:
                path, s = _kos()
            nnz_bytes = lambda m: m.nnz * 12 + (m.shape[0] + 1) * 8  # noqa: E731
            if path:
                common.progress(f"flash-kernels: sparse input {path}")
                s = flash.load(path, flash.Runtime(dir=tmp)).to_scipy()
            if "csrcsc" in args.kernels:
                rt, budget = runtime(nnz_bytes(s))
                A = flash.Csr.from_scipy(s, rt)
                record("csrcsc", "scipy", _time_cold(lambda: s.T.tocsr(), args.repeat), nnz_bytes(s), n_rows=s.shape[0])
                # the same peer starting from a file on disk, as ours does: A saved (untimed) as
                # an uncompressed .npz, loaded and transposed in each timed call
                import scipy.sparse as sps

                npz = Path(tmp) / "csrcsc-a.npz"
                sps.save_npz(npz, s, compressed=False)
                record("csrcsc", "scipy+load", _time_cold(lambda: sps.load_npz(npz).T.tocsr(), args.repeat),
                       nnz_bytes(s), n_rows=s.shape[0])
                stats, out = {}, {}
                st = _time_cold(lambda: out.__setitem__("t", flash.csrcsc(A, runtime=rt, stats=stats)), args.repeat)
                got, want = out["t"].to_scipy(), s.T.tocsr()
                want.sort_indices()
                if not (np.array_equal(got.indices, want.indices) and np.array_equal(got.data, want.data)):
                    raise SystemExit("flash-kernels: csrcsc differs from scipy")
                record("csrcsc", "scalefree", st, nnz_bytes(s), n_rows=s.shape[0], budget_bytes=budget,
                       peak_resident_bytes=stats["peak_resident_bytes"])
                del rt, A
            if "csrmm" in args.kernels:
                dt = np.dtype(args.csrmm_dtype)
                sm = s if dt == s.dtype else s.astype(dt)
                b = np.random.default_rng(2).standard_normal((s.shape[1], args.csrmm_k)).astype(dt)
                a_bytes = sm.nnz * (4 + dt.itemsize) + (s.shape[0] + 1) * 8
                shape = dict(n_rows=s.shape[0], n_cols=s.shape[1], nnz=int(s.nnz), k=args.csrmm_k, a_bytes=a_bytes,
                             dtype=args.csrmm_dtype)
                want = {}
                record("csrmm", "scipy", _time_cold(lambda: want.__setitem__("c", sm @ b), args.repeat), a_bytes, **shape)
                tol = 1e-10 if dt == np.float64 else 1e-4
                for budget in budgets or [None]:
                    rt2, budget2 = runtime(a_bytes + b.nbytes + s.shape[0] * args.csrmm_k * dt.itemsize, budget)
                    A2 = flash.Csr.from_scipy(sm, rt2)
                    stats, out = {}, {}
                    st = _time_cold(lambda: out.__setitem__("c", flash.csrmm(A2, b, runtime=rt2, stats=stats)), args.repeat)
                    err = float(np.abs(out["c"] - want["c"]).max() / max(1e-30, float(np.abs(want["c"]).max())))
                    if err > tol:
                        raise SystemExit(f"flash-kernels: csrmm differs from scipy (relative error {err:.2e})")
                    record("csrmm", "scalefree", st, a_bytes, budget_bytes=budget2,
                           peak_resident_bytes=stats["peak_resident_bytes"], max_rel_err=err,
                           bytes_read=stats.get("bytes_read", 0), **shape)
                    del rt2, A2, out
                del want

        if "kmeans" in args.kernels:
            n, d, k, it = args.kmeans_n, args.kmeans_d, args.kmeans_k, args.kmeans_iterations
            rng = np.random.default_rng(3)
            x = (rng.standard_normal((k, d)) * 5)[rng.integers(0, k, n)] + rng.standard_normal((n, d))
            x = x.astype(np.float32)
            rt, budget = runtime(x.nbytes)
            X = flash.Matrix.from_numpy(x, rt)
            c1 = flash.kmeans(X, k, max_iterations=1, tolerance=-1, seed=0, runtime=rt)[0]
            # Both time it + 1 Lloyd iterations (flash's first starts from the seed rows).
            record("kmeans", "numpy", _time_cold(lambda: _lloyd_numpy(x, c1, it + 1), args.repeat), x.nbytes, dtype="float32",
                   n_rows=n, iterations=it + 1)
            stats, out = {}, {}
            st = _time_cold(lambda: out.__setitem__("r", flash.kmeans(X, k, max_iterations=it + 1, tolerance=-1, seed=0,
                                                                 runtime=rt, stats=stats)), args.repeat)
            want_c, want_l = _lloyd_numpy(x, c1, it)
            agree = float((out["r"][1] == want_l).mean())
            if agree < 0.999:
                raise SystemExit(f"flash-kernels: kmeans labels agree with numpy on only {agree:.4f}")
            record("kmeans", "scalefree", st, x.nbytes, dtype="float32", n_rows=n, iterations=it + 1, budget_bytes=budget,
                   peak_resident_bytes=stats["peak_resident_bytes"], label_agreement=agree)
            del rt, X

    # peak: the flash kernels' resident bytes; peak RSS: the whole process's; +call: what a
    # call added to the RSS it started from.
    # vs peer: against the in-memory peer; vs peer+load: against the same peer timed from a
    # file on disk (csrcsc only)
    headers = ["kernel", "impl", "median", "min", "max", "budget", "peak", "peak RSS", "+call", "vs peer",
               "vs peer+load"]
    peer = {r["variant"]: r["median_s"] for r in records if r["impl"] in ("numpy", "scipy")}
    peer_load = {r["variant"]: r["median_s"] for r in records if r["impl"] == "scipy+load"}
    rows = []
    for r in records:
        ours = r["impl"] == "scalefree"
        rows.append([r["variant"], r["impl"], common.human_time(r["median_s"]), common.human_time(r["min_s"]),
                     common.human_time(r["max_s"]), common.human_bytes(r["budget_bytes"]) if ours else "",
                     common.human_bytes(r["peak_resident_bytes"]) if ours else "",
                     *common.rss_cells(r),
                     f"{common.ratio(peer[r['variant']], r['median_s']):.2f}x" if ours else "",
                     f"{common.ratio(peer_load[r['variant']], r['median_s']):.2f}x"
                     if ours and r["variant"] in peer_load else ""])
    print(f"# page cache: {cache.state}" + (f" ({cache.drops} drops)" if cache.enabled else ""))
    print(common.format_table(headers, rows, left_columns=2))
    if args.json:
        common.write_json(Path(args.json), records)
    return 0
