"""``scalefree graph``: PageRank (``pagerank``), HADI diameter (``diameter``), R-MAT
graphs (``rmat``) and format conversion (``convert``).

    scalefree graph pagerank EDGES -n 4 --top 20
    scalefree graph diameter EDGES -n 4
    scalefree graph rmat g.npz --scale 22 --edges 64M
    scalefree graph convert g.txt g.csv.gz

EDGES is an edge list (SNAP: ``#`` comments; blanks, commas or semicolons between the ids,
detected; an optional header line; ``.gz`` allowed), Matrix Market ``.mtx[.gz]``, ``.npy``
(edges x 2), ``.npz`` (``src`` and ``dst``, or a scipy sparse matrix), Parquet or Arrow IPC /
Feather (``--columns src,dst``), a directory of part files as Spark, Dask or Hive write them
(``_SUCCESS``, ``.crc`` skipped) or a glob. Every rank reads only its share of it (see
:func:`scalefree.graph.io.read_edge_share`); ids stay as written.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

import numpy as np

from .._atomic import atomic_path, write_json
from .._units import parse_positive_bytes
from .common import (add_checkpoint, add_columns, add_quiet, add_ranks, add_slack, add_text_dialect, check_checkpoint, checkpoints,
                     count, fail, number, relaunch, show_progress, stopped_line)

EDGES_HELP = ("edge file: edge list (SNAP, CSV; .gz allowed), Matrix Market .mtx[.gz], .npy, .npz, "
              "Parquet, Arrow IPC / Feather, a directory of part files or a glob")


def _check_input(prog: str, path: str) -> None:
    """The input exists (a file, a directory or a glob that matches) before ranks start."""
    from ..graph.io import edge_parts

    try:
        if edge_parts(path) is None and not Path(path).is_file():
            fail(prog, f"{path}: no such file or directory")
    except (FileNotFoundError, ValueError) as e:
        fail(prog, str(e))


# --- pagerank ------------------------------------------------------------------------------


def _input_fingerprint(path) -> str:
    """The edge input's fingerprint for a checkpoint: path, size and mtime of its files."""
    from ..checkpoint import files_fingerprint
    from ..graph.io import edge_parts

    return files_fingerprint(edge_parts(path) or [path])


def _parse_fail(text: str | None) -> tuple[int, int] | None:
    if not text:
        return None
    try:
        r, it = (int(x) for x in text.split(":"))
    except ValueError:
        fail("scalefree graph pagerank", f"--fail-rank expects RANK:ITERATION, got {text!r}")
    return r, it


def _save_scores(directory, rank: int, owned, scores) -> None:
    """``DIR/scores.rank{rank}.npz`` (owned vertex ids, their scores), written atomically."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    with atomic_path(d / f"scores.rank{rank}.npz") as tmp:
        np.savez(tmp, owned=np.asarray(owned, np.int64), scores=np.asarray(scores, np.float64))


def _write_scores(path, ids, scores) -> None:
    """``id<TAB>score`` lines, sorted by id, written atomically."""
    order = np.argsort(ids, kind="stable")
    with atomic_path(Path(path)) as tmp, open(tmp, "w") as f:
        for i, s in zip(np.asarray(ids)[order].tolist(), np.asarray(scores)[order].tolist()):
            f.write(f"{i}\t{s:.12g}\n")


def _pagerank(args) -> int:
    import scalefree

    from .._rss import peak_rss_bytes
    from ..errors import DataError
    from ..graph.io import load_graph, logical_rank
    from ..graph.pagerank import SparsePageRank, gather_scores, iterate, top_scores

    g = scalefree.init()
    rep = args.replication
    if g.size % rep:
        fail("scalefree graph pagerank", f"--replication {rep} must divide the rank count {g.size}")
    fault = _parse_fail(args.fail_rank)
    progress = show_progress(args)
    t0 = time.perf_counter()
    stages: dict = {}
    s, d, n_ids, edges = load_graph(g, args.edges, rep, progress, args.delimiter, args.header, columns=args.columns,
                                    times=stages)
    if edges == 0:
        raise DataError(f"{args.edges}: the graph has no edges")
    load_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    if args.collective == "dense":
        return _pagerank_dense(args, g, s, d, n_ids, edges, t0, load_s)
    pr = SparsePageRank(g, s, d, n_ids, args.damping, "auto", args.dtype, rep, isolated=False, slack=args.slack,
                        check_every=args.check_every, memory_budget=args.memory_budget, flash_dir=args.flash_dir)
    del s, d
    me, m = logical_rank(g, rep)
    gather = None
    if rep > 1:
        # Replicated: the gather is configured now, while every rank is alive; after the
        # iterations it runs on whichever replicas survive. Every replica of logical node
        # 0 receives every id's score and prints the best.
        gather = g.sparse_allreduce(n_ids, replication=rep)
        gather.config(pr.owned, np.arange(n_ids, dtype=np.int64) if me == 0 else np.zeros(0, np.int64))
    setup_s = time.perf_counter() - t1

    def before(it):
        # Only in a job's first start: a job that `scalefree run --max-restarts` restarted
        # (SCALEFREE_RESTART_COUNT > 0) resumes past the fault instead of dying again.
        first_start = os.environ.get("SCALEFREE_RESTART_COUNT", "0") == "0"
        if fault and first_start and g.rank == fault[0] and it == fault[1]:
            os.kill(os.getpid(), signal.SIGKILL)  # fault injection (tests, demos)

    ck = checkpoints(g, args, {"input": _input_fingerprint(args.edges), "damping": args.damping,
                               "dtype": args.dtype}, "PageRank")
    t2 = time.perf_counter()
    it, per_it = iterate(pr, args.tol, args.max_iter, progress, before, ck, args.straggler, args.straggler_seed)
    iterate_s = time.perf_counter() - t2
    if ck is not None and ck.stopped:
        if g.rank == 0:
            stopped_line(ck)
        return 0
    if gather is not None:
        got = gather.reduce(pr.scores.astype(np.float64))
        best = None
        if me == 0:
            v = np.lexsort((np.arange(n_ids), -got))[: args.top]
            best = (v, got[v])
    else:
        best = top_scores(g, pr.owned, pr.scores, args.top)
    if args.save_scores:
        _save_scores(args.save_scores, g.rank, pr.owned, pr.scores)
    if args.output and rep == 1:  # collectives: every rank takes part, rank 0 writes
        everything = gather_scores(g, pr.owned, pr.scores, n_ids)
        mask = _vertices_mask(g, pr.owned, n_ids)
        if g.rank == 0:
            ids = np.flatnonzero(mask)
            _write_scores(args.output, ids, everything[ids])
    rss = g.allgather(np.array([peak_rss_bytes()], np.int64)).reshape(-1) if rep == 1 else None
    if rep == 1:
        stages["csr_bytes_per_rank"] = [int(x) for x in g.allgather(np.array([pr.csr.size_bytes], np.int64)).reshape(-1)]
    if args.memory_budget is not None and rep == 1:
        stages["flash"] = _flash_record(g, pr)
    saved = None
    if ck is not None:  # per rank: checkpoints written, their median seconds, the last one's bytes
        saved = g.allgather(np.array([len(ck.saved_s), np.median(ck.saved_s) if ck.saved_s else 0.0,
                                      ck.saved_bytes], np.float64))
    if best is not None:
        who = f" ({m} logical x {rep} replicas; this is replica {g.rank // m} of logical node 0)" if rep > 1 else ""
        _report(args, pr.n, edges, g.size, it, per_it, load_s, setup_s, iterate_s, t0, rss, best, who, saved, stages)
    return 0


def _flash_record(g, pr) -> dict:
    """Collective: per rank, the bytes of its CSR on flash and what its last iteration's
    stream did (bytes read, seconds, peak resident bytes of the runtime, row blocks)."""
    st = pr.csr.last_stats or {}
    mine = np.array([pr.csr.size_bytes, st.get("bytes_read", 0), st.get("seconds", 0.0),
                     st.get("peak_resident_bytes", 0), st.get("tasks", 0), st.get("compute_idle_seconds", 0.0),
                     float(bool(st.get("direct_io", False)))], np.float64)
    every = g.allgather(mine).reshape(g.size, -1)
    return {"memory_budget_bytes": int(pr.flash_runtime.memory_budget_bytes),
            "csr_bytes_per_rank": [int(x) for x in every[:, 0]],
            "last_iteration_bytes_read_per_rank": [int(x) for x in every[:, 1]],
            "last_iteration_stream_s_per_rank": [float(x) for x in every[:, 2]],
            "peak_resident_bytes_per_rank": [int(x) for x in every[:, 3]],
            "row_blocks_per_rank": [int(x) for x in every[:, 4]],
            "compute_idle_s_per_rank": [float(x) for x in every[:, 5]],
            "direct_io": bool(every[:, 6].all())}


def _vertices_mask(g, owned, n_ids) -> np.ndarray | None:
    """Collective: on rank 0, a mask of the ids some rank owns (the graph's vertices)."""
    sa = g.sparse_allreduce(n_ids, op="max")
    want = np.arange(n_ids, dtype=np.int64) if g.rank == 0 else np.zeros(0, np.int64)
    got = sa.config_reduce(np.asarray(owned, np.int64), np.ones(len(owned), np.uint32), want)
    return got > 0 if g.rank == 0 else None


def _report(args, n, edges, ranks, it, per_it, load_s, setup_s, iterate_s, t0, rss, best, who="", saved=None,
            stages: dict | None = None) -> None:
    print(f"{n} vertices, {edges} edges, {ranks} ranks{who}, {it} iterations, "
          f"{per_it * 1e3:.2f} ms/iteration (load {load_s:.2f} s, set-up {setup_s:.2f} s)", flush=True)
    for v, x in zip(*best):
        print(f"{v}\t{x:.10g}")
    if args.output:
        print(f"scores written to {args.output}", file=sys.stderr)
    if args.json:
        rec = {"vertices": int(n), "edges": int(edges), "ranks": ranks, "collective": args.collective,
               "slack": getattr(args, "slack", None), "straggler_ms": getattr(args, "straggler", 0.0),
               "iterations": it, "load_s": load_s, "setup_s": setup_s, "iterate_s": iterate_s,
               "per_iteration_s": per_it, "end_to_end_s": time.perf_counter() - t0,
               "peak_rss_bytes": None if rss is None else [int(x) for x in rss],
               "top": [[int(v), float(x)] for v, x in zip(*best)], **(stages or {})}
        if saved is not None:
            rec["checkpoints"] = {"written_per_rank": [int(x) for x in saved[:, 0]],
                                  "median_s_per_rank": [float(x) for x in saved[:, 1]],
                                  "bytes_per_rank": [int(x) for x in saved[:, 2]]}
        write_json(args.json, rec)


def _pagerank_dense(args, g, s, d, n_ids, edges, t0, load_s) -> int:
    """The baseline: every rank holds the whole score vector; one dense allreduce of it per
    iteration."""
    from .._rss import peak_rss_bytes
    from ..graph import pagerank_dense

    t1 = time.perf_counter()
    scores, n, it, per_it = pagerank_dense.pagerank(g, s, d, n_ids, args.damping, args.tol, args.max_iter,
                                                    show_progress(args), isolated=False)
    iterate_s = time.perf_counter() - t1
    rss = g.allgather(np.array([peak_rss_bytes()], np.int64)).reshape(-1)
    if g.rank == 0:
        v = np.lexsort((np.arange(n_ids), -scores))[: args.top]
        if args.output:
            ids = np.flatnonzero(scores > 0)
            _write_scores(args.output, ids, scores[ids])
        _report(args, n, edges, g.size, it, per_it, load_s, 0.0, iterate_s, t0, rss, (v, scores[v]))
    return 0


# --- diameter ------------------------------------------------------------------------------


def _diameter(args) -> int:
    import scalefree

    from ..errors import DataError
    from ..graph.hadi import effective_diameter, hadi
    from ..graph.io import load_graph

    g = scalefree.init()
    progress = show_progress(args)
    t0 = time.perf_counter()
    s, d, n_ids, edges = load_graph(g, args.edges, progress=progress, delimiter=args.delimiter, header=args.header,
                                    columns=args.columns)
    if edges == 0:
        raise DataError(f"{args.edges}: the graph has no edges")
    if args.undirected:
        s, d = np.concatenate([s, d]), np.concatenate([d, s])
        edges *= 2
    load_s = time.perf_counter() - t0
    ck = checkpoints(g, args, {"input": _input_fingerprint(args.edges), "method": args.method, "k": args.k,
                               "precision": args.precision, "fm_seed": args.fm_seed, "undirected": args.undirected,
                               "sample": args.sample}, "HADI")
    flash_stats: dict = {}
    pair = [s, d]  # hadi empties it: the edges' memory goes back once the hop's set-up has sent them
    del s, d
    nf, enc, per_hop = hadi(g, pair, None, n_ids, args.method, args.k, args.fm_seed, args.max_hops,
                            progress=progress, isolated=False, checkpoints=ck, precision=args.precision,
                            memory_budget=args.memory_budget, flash_dir=args.flash_dir, stats=flash_stats,
                            sample=args.sample)
    if ck is not None and ck.stopped:
        if g.rank == 0:
            stopped_line(ck, "hop")
        return 0
    from .._rss import peak_rss_bytes

    rss = g.allgather(np.array([peak_rss_bytes()], np.int64)).reshape(-1)
    if g.rank == 0:
        h, hi = effective_diameter(nf, args.fraction)
        what = {"exact": "exact", "fm": f"Flajolet-Martin, {enc.k} bitstrings",
                "hll": f"HyperLogLog, {enc.width} registers"
                       + (f" and {flash_stats['sample']} sampled targets" if flash_stats.get("sample") else "")}[enc.method]
        print(f"{int(round(nf[0]))} vertices, {edges} edges{' (both directions)' if args.undirected else ''}, "
              f"{g.size} ranks, {what}; {per_hop * 1e3:.2f} ms/hop (load {load_s:.2f} s)")
        print(f"effective diameter ({args.fraction:g}): {h} (interpolated {hi:.3f}); "
              f"diameter {'' if enc.method == 'exact' else 'estimate '}{len(nf) - 1}")
        print("hop\tN(h)")
        for i, v in enumerate(nf):
            print(f"{i}\t{int(round(v))}" if enc.method == "exact" or i == 0 else f"{i}\t{v:.6g}")
        if args.json:
            rec = {"vertices": int(round(nf[0])), "edges": int(edges), "ranks": g.size, "method": enc.method,
                   "effective_diameter": h, "effective_diameter_interpolated": hi, "neighbourhood": list(nf),
                   "load_s": load_s, "per_hop_s": per_hop, "peak_rss_bytes": [int(x) for x in rss]}
            if "sd_bound" in flash_stats:
                rec.update(precision=args.precision, sample=flash_stats["sample"], sd_bound=flash_stats["sd_bound"],
                           sample_only=flash_stats["sample_only"], rounds=flash_stats["rounds"])
            if args.memory_budget is not None:
                rec["flash"] = {"memory_budget": args.memory_budget,
                                **{k: flash_stats[k] for k in ("edge_bytes_on_flash", "last_hop") if k in flash_stats}}
            write_json(args.json, rec)
    return 0


# --- rmat ----------------------------------------------------------------------------------


def _rmat(args) -> int:
    from ..graph.rmat import write_rmat

    write_rmat(args.out, args.scale, args.edges, args.seed, progress=show_progress(args), parts=args.parts)
    return 0


# --- convert -------------------------------------------------------------------------------


def _convert(args) -> int:
    from ..graph.convert import convert

    _check_input("scalefree graph convert", args.input)
    t0 = time.perf_counter()
    n = convert(args.input, args.out, parts=args.parts, suffix=args.suffix, member_bytes=args.member_bytes,
                delimiter=args.delimiter, header=args.header, row_group=args.row_group, columns=args.columns,
                sort=args.sort)
    print(f"{n} edges written to {args.out} in {time.perf_counter() - t0:.1f} s")
    return 0


# --- parser --------------------------------------------------------------------------------


def _launch(run, check=None):
    def go(args) -> int:
        prog = f"scalefree graph {args.graph_command}"
        _check_input(prog, args.edges)
        if check is not None:
            check(prog, args)
        # Replicated jobs print from every replica of logical node 0: tag their lines.
        replicated = getattr(args, "replication", 1) > 1
        return relaunch(args, run, args.ranks, allow_rank_failure=replicated, prefix=replicated)

    return go


def _add_memory_budget(q, what: str, step: str) -> None:
    q.add_argument("--memory-budget", metavar="M", default=None,
                   help=f"out of core: each rank's {what} go to a scratch file on flash and every "
                        f"{step} streams them once in row blocks prefetched "
                        "within M bytes (e.g. 64M); the vertex state stays in memory; the same result bit for bit "
                        "(default: in memory)")
    q.add_argument("--flash-dir", metavar="DIR", default=None,
                   help="directory of the scratch files of --memory-budget, e.g. next to the input on the same SSD "
                        "(default SCALEFREE_FLASH_DIR or the system temp dir; unnamed files: nothing is left "
                        "behind, even after a crash)")


def _check_memory_budget(prog, args) -> None:
    if args.memory_budget is not None:
        try:
            parse_positive_bytes(args.memory_budget, "--memory-budget")
        except ValueError as e:
            fail(prog, str(e))
    if args.flash_dir is not None and not Path(args.flash_dir).is_dir():
        fail(prog, f"--flash-dir {args.flash_dir}: no such directory")


def _check_diameter(prog, args) -> None:
    check_checkpoint(prog, args)
    _check_memory_budget(prog, args)
    if args.memory_budget is not None and args.method not in ("auto", "hll"):
        fail(prog, "--memory-budget streams the HyperLogLog hop: use --method hll (or auto)")


def _check_pagerank(prog, args) -> None:
    if args.ranks % args.replication:
        fail(prog, f"--replication {args.replication} must divide the rank count {args.ranks}")
    if args.collective == "dense" and args.replication > 1:
        fail(prog, "--replication needs --collective sparse")
    _parse_fail(args.fail_rank)
    check_checkpoint(prog, args)
    if args.checkpoint and (args.collective == "dense" or args.replication > 1):
        fail(prog, "--checkpoint needs --collective sparse and no --replication")
    if args.collective == "dense" and (args.slack is not None or args.straggler):
        fail(prog, "--slack and --straggler need --collective sparse")
    if args.check_every is not None and args.slack is None:
        fail(prog, "--check-every needs --slack")
    _check_memory_budget(prog, args)
    if args.memory_budget is not None and args.collective == "dense":
        fail(prog, "--memory-budget needs --collective sparse")


def add_parser(sub) -> None:
    p = sub.add_parser("graph", help="graph analytics on the sparse allreduce (pagerank, diameter, rmat, convert)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    s = p.add_subparsers(dest="graph_command", metavar="COMMAND")
    s.required = True

    q = s.add_parser("pagerank", help="PageRank of an edge file",
                     formatter_class=argparse.ArgumentDefaultsHelpFormatter,
                     description="PageRank (networkx's semantics: dangling mass spread evenly) until the L1 "
                                 "change is below --tol. Every rank reads its share of the edges; duplicate edges "
                                 "count once. Prints the top vertices (ids as written in the file).")
    q.add_argument("edges", help=EDGES_HELP)
    add_columns(q, "edges")
    add_ranks(q)
    add_text_dialect(q)
    q.add_argument("--collective", choices=["sparse", "dense"], default="sparse",
                   help="sparse allreduce (each rank moves the vertices it touches) or the dense allreduce of "
                        "the whole score vector (the baseline)")
    q.add_argument("--top", type=count(0), default=20, help="vertices to print")
    q.add_argument("--damping", type=number(0, 1, low_open=True, high_open=True), default=0.85)
    q.add_argument("--tol", type=number(0), default=1e-10, help="stop when the L1 change is below this")
    q.add_argument("--max-iter", type=count(1), default=200)
    q.add_argument("--dtype", default="float64", choices=["float64", "float32"],
                   help="value type of the scores and messages (float32: half the memory traffic, ~1e-7 relative; "
                        "use --tol 1e-6 or looser)")
    q.add_argument("--replication", type=count(1), default=1,
                   help="run the ranks as ranks/R logical nodes with R replicas each: the job finishes with "
                        "correct scores while one replica of every node lives")
    _add_memory_budget(q, "CSR rows (its edges)", "iteration")
    q.add_argument("-o", "--output", metavar="FILE", help="write every vertex's score here (id<TAB>score, by id)")
    q.add_argument("--json", metavar="OUT", help="write times, peak RSS per rank and the top vertices here")
    q.add_argument("--save-scores", metavar="DIR",
                   help="every rank writes DIR/scores.rank{R}.npz (its owned vertex ids and their scores)")
    q.add_argument("--fail-rank", metavar="RANK:ITERATION",
                   help="fault injection: that rank SIGKILLs itself before that iteration (to try --replication "
                        "or --resume; under scalefree run --max-restarts only in the first start)")
    add_slack(q, "flow", "the L1 test runs on the exact (flushed) scores every --check-every iterations")
    q.add_argument("--check-every", type=count(1), default=None,
                   help="with --slack: iterations between exact checks (default: the slack)")
    q.add_argument("--straggler-seed", type=count(0), default=0, help="seed of the --straggler schedule")
    add_checkpoint(q)
    q.add_argument("--progress", action="store_true", help="print the L1 change per iteration (also when not a terminal)")
    add_quiet(q)
    q.set_defaults(func=_launch(_pagerank, _check_pagerank))

    from ..graph.hadi import EXACT_AUTO_MAX, HLL_PRECISION, HLL_PRECISION_MAX, HLL_SAMPLE

    q = s.add_parser("diameter", help="HADI effective diameter and neighbourhood function",
                     formatter_class=argparse.ArgumentDefaultsHelpFormatter,
                     description="The neighbourhood function N(h) and the effective diameter by HADI on the "
                                 "sparse allreduce (exact sets, HyperLogLog counters or Flajolet-Martin sketches).")
    q.add_argument("edges", help=EDGES_HELP)
    add_columns(q, "edges")
    add_ranks(q)
    add_text_dialect(q)
    q.add_argument("--method", choices=["auto", "exact", "hll", "fm"], default="auto",
                   help=f"set encoding (auto: exact up to {EXACT_AUTO_MAX} vertex ids, else hll)")
    q.add_argument("--precision", type=int, choices=range(4, HLL_PRECISION_MAX + 1), metavar="P", default=HLL_PRECISION,
                   help=f"HyperLogLog registers a vertex: 2^P, one byte each (P in 4..{HLL_PRECISION_MAX})")
    q.add_argument("--sample", type=count(0), default=None, metavar="S",
                   help=f"--method hll: vertices sampled as targets, one bit each a vertex beside the registers; N(h) "
                        f"combines the two estimates (exact when S >= the vertex count; 0: registers alone; default "
                        f"{HLL_SAMPLE})")
    q.add_argument("-k", type=count(1), default=32, help="Flajolet-Martin bitstrings per vertex")
    q.add_argument("--fraction", type=number(0, 1, low_open=True), default=0.9,
                   help="share of reachable pairs for the effective diameter")
    q.add_argument("--max-hops", type=count(1), default=256)
    q.add_argument("--undirected", action="store_true", help="follow edges both ways")
    _add_memory_budget(q, "edges (grouped by source; --method hll)", "hop")
    q.add_argument("--fm-seed", type=count(0), default=0, help="seed of the Flajolet-Martin hash")
    q.add_argument("--json", metavar="OUT", help="write the neighbourhood function and times here")
    q.add_argument("--progress", action="store_true", help="print N(h) per hop (also when not a terminal)")
    add_checkpoint(q, "hop")
    add_quiet(q)
    q.set_defaults(func=_launch(_diameter, _check_diameter))

    r = s.add_parser("rmat", help="write a seeded R-MAT power-law graph",
                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    r.add_argument("out", help="output: .npz (src, dst arrays), .gz (compressed edge list), a directory with "
                               "--parts, else a SNAP edge list")
    r.add_argument("--scale", type=count(1), default=16, help="2**scale vertex ids (at most 40)")
    r.add_argument("--edges", type=count(0), default="1M", help="edges to generate (K, M, G: binary multiples)")
    r.add_argument("--parts", type=count(0), default=0, help="write a directory of this many text parts")
    r.add_argument("--seed", type=count(0), default=0)
    r.add_argument("--progress", action="store_true", help="show progress (also when not a terminal)")
    add_quiet(r)
    r.set_defaults(func=_rmat)

    from ..graph.convert import DEFAULT_MEMBER_BYTES, DEFAULT_ROW_GROUP

    c = s.add_parser("convert", help="write an edge file in another format (by the output's name)",
                     formatter_class=argparse.ArgumentDefaultsHelpFormatter,
                     description="Reads every edge of INPUT in one process (duplicates and order kept) and writes "
                                 "them to OUT, the format chosen by its name: .npz (src, dst arrays), .gz (SNAP "
                                 "lines as gzip members of --member-bytes each, which the ranks of a job split), "
                                 ".csv (src,dst header and lines), .parquet (src, dst columns in row groups of "
                                 "--row-group rows, snappy), .arrow / .feather (Arrow IPC, record batches of "
                                 "--row-group rows, lz4), else a SNAP edge list; with --parts, OUT is a "
                                 "directory of parts part-00000SUFFIX ... and _SUCCESS, as Spark writes them.")
    c.add_argument("input", help=EDGES_HELP)
    c.add_argument("out", help="output file, or directory with --parts")
    c.add_argument("--parts", type=count(0), default=0, help="write a directory of this many parts")
    c.add_argument("--suffix", default=None, help="name ending of each part with --parts (.csv, .csv.gz, .txt, ...; "
                                                  "default .csv)")
    c.add_argument("--member-bytes", type=count(1), default=DEFAULT_MEMBER_BYTES,
                   help="text per gzip member of .gz output (K, M, G: binary multiples)")
    c.add_argument("--row-group", type=count(1), default=DEFAULT_ROW_GROUP,
                   help="rows per Parquet row group / Arrow record batch (the unit a rank reads)")
    c.add_argument("--sort", action="store_true",
                   help="write the distinct edges sorted by (src, dst), as a distinct().sort() export does: a job "
                        "then loads them without sending edges to their owners")
    add_text_dialect(c)
    add_columns(c, "edges")
    c.set_defaults(func=_convert)

