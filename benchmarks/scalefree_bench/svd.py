"""``scalefree bench svd``: ``flash.svds`` (block Krylov-Schur) against
``scipy.sparse.linalg.svds`` (ARPACK, in memory) on a real sparse matrix: top-k singular
values at a tolerance, time and accuracy, with the matrix on flash under budgets given as
fractions of its flash CSR bytes, and in memory.

    flock /tmp/bench.lock env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE \\
        scalefree bench svd --data kos --k 100 --tol 1e-4 --budget-fractions 1,0.25 --json OUT

``--data``: ``kos`` (``../shared/data/kos/docword.kos.txt.gz``, documents x words),
``wiki-vote`` (``../shared/data/wiki-vote/wiki-Vote.txt``, the voting graph's adjacency
matrix, node ids compacted), ``random`` (a seeded power-law matrix of ``--rows`` x
``--cols`` from ``--nnz`` draws, duplicates merged; with ``--distinct`` exactly ``--nnz``
distinct entries, the generator of ``flash-kernels --sparse-distinct``), or the path of any
file ``flash.load`` opens. Budgets: ``--budget-fractions`` of the matrix's flash CSR bytes
and/or ``--budget`` sizes (``1G``); a budget that holds the matrix reads it from flash once
and applies it in memory (column ``A``: ``loaded``), a smaller one streams it from flash at
every pass (``flash``). Rows:
``scipy`` (``svds(A, k, tol)``), ``scalefree/memory`` (``flash.svds`` on the scipy matrix,
in memory), ``scalefree/flash-<budget>`` (``flash.svds`` on a ``flash.Csr``: one pass of
``flash.csrtmm`` over A per block of ``A^T A X``). Accuracy: the largest relative
error of the k singular values against ``svds(A, k, tol=0)`` computed once, untimed.
Copying the matrix to flash is set-up, outside the timed calls. ``--cli-budget SIZE`` adds
rows run as commands from the matrix's file, each in a fresh process: ``scipy/command`` (load
with ``scipy.sparse.load_npz``, then ``svds``: :mod:`._worker_svds`) and ``scalefree/cli-SIZE``
(``scalefree flash svd FILE --memory SIZE``), timed load + solve, with each command's peak RSS
and CPU seconds; ``--commands-only`` runs only those (``--data random --distinct`` writes the
file a row block at a time, :func:`scalefree.flash.power_law.write_power_law`). The rows are timed
interleaved (one call of each per round, after one warm-up call each), so that load from
others on a shared machine falls on all of them alike.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from scalefree.flash.power_law import power_law_csr, write_power_law

from . import common

BENCH = "svd"


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(BENCH, help="flash.svds (block Krylov-Schur, matrix on flash) vs scipy svds",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default="kos", help="kos, wiki-vote, random or a matrix file (default: kos)")
    p.add_argument("--k", type=common.argparse_type(common.positive_int), default=100, help="singular values (default 100)")
    p.add_argument("--tol", type=common.argparse_type(float), default=1e-4, help="tolerance of both solvers (default 1e-4)")
    p.add_argument("--budget-fractions", default="1,0.25", metavar="F[,F...]",
                   type=common.argparse_type(_fractions),
                   help="flash memory budgets as fractions of the matrix's flash CSR bytes (default 1,0.25)")
    p.add_argument("--rows", type=common.argparse_type(common.positive_int), default=20000, help="--data random: rows")
    p.add_argument("--cols", type=common.argparse_type(common.positive_int), default=5000, help="--data random: columns")
    p.add_argument("--nnz", type=common.argparse_type(common.positive_int), default=200000,
                   help="--data random: entries drawn (duplicates merged; with --distinct: distinct entries)")
    p.add_argument("--distinct", action="store_true",
                   help="--data random: exactly --nnz distinct entries (the generator of flash-kernels "
                        "--sparse-distinct) instead of --nnz draws with duplicates merged")
    p.add_argument("--budget", default=None, metavar="SIZE[,SIZE...]",
                   help="flash memory budgets as sizes (e.g. 1G), one row each, after the --budget-fractions rows")
    p.add_argument("--cli-budget", default=None, metavar="SIZE[,SIZE...]",
                   help="also run the command `scalefree flash svd DATA -k K --tol T --memory SIZE` in a child "
                        "process per size and round (the matrix from the file; --data random/kos/wiki-vote are "
                        "written to an uncompressed .npz first), beside the same for ARPACK (row scipy/command: a "
                        "child that loads the file with scipy.sparse.load_npz and calls svds): time from the file "
                        "(load + solve) and each command's whole peak RSS")
    p.add_argument("--commands-only", action="store_true",
                   help="with --cli-budget: only the rows run as commands from the file (ARPACK's and ours), "
                        "not the in-process rows")
    p.add_argument("--no-reference", action="store_true",
                   help="skip the untimed reference svds(tol=0): max rel err is then against the values of the "
                        "ARPACK command (with --cli-budget) or the scipy row, at --tol")
    p.add_argument("--warmup", type=common.argparse_type(_non_negative_int), default=1,
                   help="untimed calls of each row before the timed ones (default 1)")
    p.add_argument("--threads", type=common.argparse_type(common.positive_int), default=common.usable_cores())
    p.add_argument("--repeat", type=common.argparse_type(common.positive_int), default=3, help="timed calls per row")
    p.add_argument("--dir", default=None, help="scratch directory for flash files")
    common.add_cold_arg(p)
    common.add_output_args(p)
    p.set_defaults(func=run)
    return p


def _non_negative_int(text: str) -> int:
    v = int(text)
    if v < 0:
        raise ValueError(f"expected an integer >= 0, got {text}")
    return v


def _fractions(text: str) -> list[float]:
    out = [common.positive_float(t) for t in text.split(",") if t.strip()]
    if not out:
        raise ValueError("give at least one budget fraction")
    return out


def _shared(*parts) -> Path | None:
    here = Path(__file__).resolve()
    for base in [Path.cwd(), *here.parents]:
        p = base.parent.joinpath("shared", "data", *parts)
        if p.exists():
            return p
    return None


def _power_law(rows, cols, nnz, seed=0, distinct=False):
    """A seeded power-law CSR matrix (row weights ``1/r^0.9``, column weights ``1/c^1.1``).
    ``distinct=False``: ``nnz`` entries drawn, duplicates merged (fewer stored entries).
    ``distinct=True``: exactly ``nnz`` distinct entries, :func:`scalefree.flash.power_law.power_law_csr`
    (the distinct positions of enough draws, a uniform ``nnz`` of them; values in [0.5, 1.5))."""
    import scipy.sparse as sp

    if not distinct:
        rng = np.random.default_rng(seed)
        pr = 1.0 / np.arange(1, rows + 1) ** 0.9
        pc = 1.0 / np.arange(1, cols + 1) ** 1.1
        prow, pcol = rng.permutation(rows), rng.permutation(cols)
        r = prow[rng.choice(rows, nnz, p=pr / pr.sum())]
        c = pcol[rng.choice(cols, nnz, p=pc / pc.sum())]
        a = sp.coo_matrix((rng.random(nnz) + 0.5, (r, c)), shape=(rows, cols)).tocsr()
        a.sum_duplicates()
        return a
    return power_law_csr(rows, cols, nnz, seed)


def _load(args, tmp):
    """(name, scipy csr float64, the matrix's file or None)."""
    import scipy.sparse as sp

    from scalefree import flash

    if args.data == "random":
        name = f"random {args.rows}x{args.cols} ({args.nnz} {'distinct' if args.distinct else 'drawn'})"
        if args.distinct:  # written to disk a row block at a time, then read as every row reads it
            path = Path(tmp) / "matrix.npz"
            t = time.perf_counter()
            write_power_law(path, args.rows, args.cols, args.nnz)
            common.progress(f"svd: generated {path} ({path.stat().st_size} bytes) in "
                            f"{common.human_time(time.perf_counter() - t)}")
            return name, sp.load_npz(path), path
        return name, _power_law(args.rows, args.cols, args.nnz), None
    if args.data == "wiki-vote":
        path = _shared("wiki-vote", "wiki-Vote.txt")
        if path is None:
            raise SystemExit("svd: ../shared/data/wiki-vote/wiki-Vote.txt not found")
        edges = np.loadtxt(path, comments="#", dtype=np.int64).reshape(-1, 2)
        ids, idx = np.unique(edges, return_inverse=True)
        idx = idx.reshape(-1, 2)
        n = len(ids)
        a = sp.coo_matrix((np.ones(len(idx)), (idx[:, 0], idx[:, 1])), shape=(n, n)).tocsr()
        a.sum_duplicates()
        return f"wiki-Vote {n}x{n}", a, None
    path = _shared("kos", "docword.kos.txt.gz") if args.data == "kos" else Path(args.data)
    if path is None or not path.exists():
        raise SystemExit(f"svd: {args.data if args.data != 'kos' else '../shared/data/kos/docword.kos.txt.gz'} not found")
    m = flash.load(path, flash.Runtime(dir=tmp), dtype=np.float64)
    a = m.to_scipy() if isinstance(m, flash.Csr) else sp.csr_matrix(m.to_numpy())
    return path.name, a, path


def _cli_svd(path, k, args, size, tmp, cache) -> dict:
    """One run of the command ``scalefree flash svd`` in a child process (``size`` None: the
    ARPACK peer, :mod:`._worker_svds`): its ``--json`` record (``load_seconds``, solve
    ``seconds``, ``peak_rss_bytes``: the command's own VmHWM, a fresh process's)."""
    import json
    import resource
    import subprocess
    import sys

    out = Path(tmp) / "cli-svd.json"
    if size is None:
        cmd = [sys.executable, "-m", "scalefree_bench._worker_svds", str(path), "-k", str(k), "--tol", str(args.tol),
               "--json", str(out)]
    else:
        cmd = [sys.executable, "-m", "scalefree.cli", "flash", "svd", str(path), "-k", str(k), "--tol", str(args.tol),
               "--memory", size, "--threads", str(args.threads), "--dir", str(tmp), "--quiet", "--json", str(out)]
    cache.drop()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    p = subprocess.run(cmd, capture_output=True, text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode != 0:
        raise SystemExit(f"svd: {' '.join(cmd)} failed ({p.returncode}): {p.stderr.strip()[-500:]}")
    # CPU seconds of the whole child (all its threads; start-up included): on a shared
    # machine a steadier figure than the wall clock, which others' load stretches.
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return dict(json.loads(out.read_text()), cpu_seconds=cpu)


def run(args) -> int:
    import scipy.sparse.linalg as sla

    from scalefree import flash

    if args.commands_only and not args.cli_budget:
        raise SystemExit("svd: --commands-only needs --cli-budget")
    blas = common.numpy_blas("svd")
    common.progress(f"svd: numpy BLAS: {blas}")
    records = []
    cache = common.PageCache(args.cold, BENCH)
    with tempfile.TemporaryDirectory(prefix="scalefree-svd-bench-", dir=args.dir) as tmp:
        name, a, path = _load(args, tmp)
        k = args.k
        if not 0 < k < min(a.shape):
            raise SystemExit(f"svd: --k must be below min(A.shape) = {min(a.shape)}")
        csr_bytes = a.nnz * 12 + (a.shape[0] + 1) * 8
        common.progress(f"svd: {name}, {a.nnz} non-zeros, {common.human_bytes(csr_bytes)} as flash CSR; "
                        f"k={k}, tol={args.tol:g}")
        exact = None
        if not args.no_reference:
            t = time.perf_counter()
            exact = np.sort(sla.svds(a, k=k, tol=0, return_singular_vectors=False, random_state=0))
            common.progress(f"  reference svds(tol=0): {common.human_time(time.perf_counter() - t)}")

        def err(s):
            return float(np.max(np.abs(np.sort(s) - exact) / np.maximum(exact, 1e-300 + 1e-12 * exact.max())))

        # (impl, variant, call, stats dict, extra fields); timed interleaved, one call of each
        # per round, so that load from others on a shared machine hits every row alike.
        rows = [("scipy", "memory", lambda: sla.svds(a, k=k, tol=args.tol, return_singular_vectors=False,
                                                     random_state=0), None, {})]
        mem_rt = flash.Runtime(threads=args.threads, dir=tmp, memory_budget=max(4 * csr_bytes, 1 << 20))
        info_mem: dict = {}
        rows.append(("scalefree", "memory", lambda: flash.svds(a, k=k, tol=args.tol, return_singular_vectors=False,
                                                               random_state=0, stats=info_mem, runtime=mem_rt),
                     info_mem, {}))
        keep = []
        budgets = [(f"flash-{frac:g}", max(1 << 20, int(csr_bytes * frac))) for frac in args.budget_fractions]
        if args.budget:
            from scalefree._units import parse_bytes
            budgets += [(f"flash-{b.strip()}", parse_bytes(b.strip(), "--budget"))
                        for b in args.budget.split(",") if b.strip()]
        if args.commands_only:
            rows, budgets = [], []
        for variant, budget in budgets:
            rt = flash.Runtime(memory_budget=budget, threads=args.threads, dir=tmp)
            A = flash.Csr.from_scipy(a, rt)
            keep.append((rt, A))
            info: dict = {}
            rows.append(("scalefree", variant,
                         lambda A=A, rt=rt, info=info: flash.svds(A, k=k, tol=args.tol, return_singular_vectors=False,
                                                                  random_state=0, stats=info, runtime=rt),
                         info, {"budget_bytes": budget}))
        cli = []
        if args.cli_budget:
            if path is None or path.suffix != ".npz":
                import scipy.sparse as sp

                path = Path(tmp) / "matrix.npz"
                sp.save_npz(path, a, compressed=False)
            # ARPACK's command first in each round, then ours (size None: the ARPACK peer).
            cli = [("command", None, path)] + [(f"cli-{size.strip()}", size.strip(), path)
                                               for size in args.cli_budget.split(",") if size.strip()]
        if exact is None and not cli:  # no reference: the scipy row's values at --tol
            exact = np.sort(rows[0][2]())
        outs = [None for _ in rows]
        for _ in range(args.warmup):
            outs = [fn() for _, _, fn, _, _ in rows]
        times = [[] for _ in rows]
        peaks = [0 for _ in rows]
        rss = [{} for _ in rows]
        cli_runs = [[] for _ in cli]
        for _ in range(args.repeat):
            for i, (_, _, fn, info, _) in enumerate(rows):
                seconds, outs[i] = common.timed_call(fn, cache, rss[i])
                times[i].append(seconds)
                if info:
                    peaks[i] = max(peaks[i], info.get("peak_resident_bytes", 0))
            for i, (_, size, path) in enumerate(cli):
                cli_runs[i].append(_cli_svd(path, k, args, size, tmp, cache))
        peer_values = (np.sort(np.asarray(cli_runs[0][-1]["singular_values"])) if cli else None)
        if exact is None:  # no reference: the ARPACK command's values at --tol
            exact = peer_values
        for i, (impl, variant, _, info, extra) in enumerate(rows):
            st, e = common.Stats.of(times[i]), err(outs[i])
            if info:
                extra = dict(extra, operator_columns=info["operator_columns"], restarts=info["restarts"],
                             operand="flash" if info.get("on_flash") else "loaded" if info.get("loaded") else "memory")
                if "budget_bytes" in extra:
                    extra["peak_resident_bytes"] = peaks[i]
            records.append(common.make_record(bench=BENCH, impl=impl, variant=variant, ranks=1, nbytes=csr_bytes,
                                              dtype="float64", stats=st, gbps=0.0, data=name, k=k, tol=args.tol,
                                              max_rel_err=e, blas=blas, page_cache=cache.state, **extra, **rss[i]))
            common.progress(f"  {impl} {variant}: median {common.human_time(st.median_s)}, max rel err {e:.1e}")
        for (variant, size, _), runs in zip(cli, cli_runs):
            # A command's time is from its file: load + solve (the interpreter's start-up excluded).
            st = common.Stats.of([r["load_seconds"] + r["seconds"] for r in runs])
            last = runs[-1]
            values = np.sort(np.asarray(last["singular_values"]))
            e = err(values)
            common_fields = dict(bench=BENCH, ranks=1, nbytes=csr_bytes, dtype="float64", stats=st, gbps=0.0, data=name,
                                 k=k, tol=args.tol, max_rel_err=e, blas=blas, page_cache=cache.state,
                                 command_peak_rss_bytes=max(r["peak_rss_bytes"] for r in runs),
                                 command_peak_rss_runs=[r["peak_rss_bytes"] for r in runs],
                                 load_seconds=[r["load_seconds"] for r in runs],
                                 solve_seconds=[r["seconds"] for r in runs],
                                 cpu_seconds=[r["cpu_seconds"] for r in runs])
            if size is None:
                records.append(common.make_record(impl="scipy", variant=variant, operand="memory", **common_fields))
                who = "scipy command (ARPACK)"
            else:
                records.append(common.make_record(
                    impl="scalefree", variant=variant, **common_fields,
                    budget_bytes=last["memory_budget_bytes"],
                    peak_resident_bytes=max(r["peak_resident_bytes"] for r in runs),
                    operator_columns=last["operator_columns"], restarts=last["restarts"],
                    max_relative_residual=last.get("max_relative_residual"),
                    max_rel_diff_vs_scipy=float(np.max(np.abs(values - peer_values) / peer_values)),
                    operand="flash" if last.get("on_flash") else "loaded" if last.get("loaded") else "memory",
                    basis_on_flash=last.get("basis_on_flash"), vectors_on_flash=last.get("vectors_on_flash")))
                who = f"scalefree {variant} (command)"
            common.progress(f"  {who}: median load + solve {common.human_time(st.median_s)}, CPU "
                            f"{common.human_time(float(np.median(records[-1]['cpu_seconds'])))}, peak RSS "
                            f"{common.human_bytes(records[-1]['command_peak_rss_bytes'])}, max rel err {e:.1e}")
        del keep

    # A: where the products read A from: "flash" (a flash kernel pass per block), "loaded" (a
    # flash matrix that fits the budget, read once and applied in memory), "memory".
    # peak: the flash kernels' resident bytes; peak RSS: the whole process's (the in-memory
    # matrix of the scipy rows included), +call: what the call added to the RSS it started from.
    # Rows run as commands ("(cmd)"): time = load from the file + solve, against scipy/command.
    headers = ["impl", "variant", "A", "median", "min", "max", "max rel err", "budget", "peak", "peak RSS", "+call",
               "vs scipy"]
    scipy_mem = next((r["median_s"] for r in records if r["impl"] == "scipy" and r["variant"] == "memory"), None)
    scipy_cmd = next((r["median_s"] for r in records if r["impl"] == "scipy" and r["variant"] == "command"), None)
    rows = []
    for r in records:
        ours = r["impl"] == "scalefree"
        peer = scipy_cmd if "command_peak_rss_bytes" in r else scipy_mem
        rows.append([r["impl"], r["variant"], r.get("operand", "memory"), common.human_time(r["median_s"]),
                     common.human_time(r["min_s"]), common.human_time(r["max_s"]), f"{r['max_rel_err']:.1e}",
                     common.human_bytes(r["budget_bytes"]) if "budget_bytes" in r else "",
                     common.human_bytes(r["peak_resident_bytes"]) if "peak_resident_bytes" in r else "",
                     *(common.rss_cells(r) if "command_peak_rss_bytes" not in r
                       else [common.human_bytes(r["command_peak_rss_bytes"]) + " (cmd)", ""]),
                     f"{common.ratio(peer, r['median_s']):.2f}x" if ours and peer else ""])
    print(f"# {records[0]['data']}: k={args.k}, tol={args.tol:g}; BLAS {blas}; page cache: {cache.state}"
          + (f" ({cache.drops} drops)" if cache.enabled else ""))
    print(common.format_table(headers, rows, left_columns=3))
    cpu = [f"{r['impl']}/{r['variant']} {common.human_time(float(np.median(r['cpu_seconds'])))}"
           for r in records if "cpu_seconds" in r]
    if cpu:
        print("# commands' CPU time (all threads, median): " + ", ".join(cpu))
    for r in records:
        if "max_rel_diff_vs_scipy" in r:
            print(f"# {r['variant']}: largest relative difference from ARPACK's values {r['max_rel_diff_vs_scipy']:.1e} "
                  f"(tol {args.tol:g}); largest relative residual of its eigenpairs of AᵀA "
                  f"{r['max_relative_residual'] if r['max_relative_residual'] is not None else float('nan'):.1e}")
    if args.json:
        common.write_json(Path(args.json), records)
    return 0
