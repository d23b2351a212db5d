"""``scalefree bench sparse``: the sparse allreduce against what an MPI user would do.

Every rank contributes and requests the same ``--nnz`` distinct indices of ``[0, --dim)``
drawn from a Zipf law (seeded per rank), float32 values. Rows:

* ``scalefree/config``, ``scalefree/reduce``, ``scalefree/config_reduce`` — ours, with
  per-layer accounting (bytes, messages, largest packet, merge and wait time) of a reduce;
* ``mpi/dense`` — ``MPI_Allreduce`` of the full ``dim``-long vector (the allreduce alone);
* ``mpi/allgatherv`` — ``MPI_Allgatherv`` of (index, value) pairs, then a numpy merge
  (``np.unique`` + ``np.bincount``) and a lookup of the requested indices;
* ``mpi/indices-once`` — the indices allgathered once and the entries this rank requests
  picked out with their positions (reported as set-up); per call only ``MPI_Allgatherv`` of
  the values into a preallocated buffer and one pass summing the picked entries into place
  (a CSR product, or ``np.bincount`` without scipy; :class:`IndicesOnce`).

The time of a call is the slowest rank's; each figure the median over calls.

``--degrees sweep`` instead runs, per rank count, one job that configures every degree
list (all ordered factorizations) and ``auto``, then times config and reduce of each in
interleaved rounds; the table gives each one's ratio to the best hand-picked list and the
plan's predicted reduce time (``scalefree sparse plan``'s model with its default costs,
with the costs ``auto`` probed in that job, and fitted to the run) beside the measurement.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from . import common
from .common import human_time

BENCH = "sparse"
PEERS = ("mpi",)


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "sparse",
        help="sparse allreduce vs MPI dense allreduce, allgatherv+merge, indices-once",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        description=__doc__,
    )
    arg = common.argparse_type
    p.add_argument("-n", "--ranks", type=arg(lambda s: common.parse_int_list(s, "rank count")),
                   default="2,4", metavar="N[,N...]", help="rank counts to run")
    p.add_argument("--dim", type=arg(common.positive_int), default=10_000_000, help="index space")
    p.add_argument("--nnz", type=arg(common.positive_int), default=200_000,
                   help="distinct indices each rank contributes and requests")
    p.add_argument("--zipf", type=arg(common.positive_float), default=1.1, help="Zipf exponent")
    p.add_argument("--degrees", default="auto",
                   help="'auto', layer degrees like 2x2, or 'sweep': every degree list of each rank "
                        "count and auto, reduce and config only, interleaved, with the plan's predictions")
    p.add_argument("--rounds", type=arg(common.positive_int), default=4,
                   help="--degrees sweep: interleaved rounds over the candidates (each gets "
                        "--target-seconds / rounds per round)")
    p.add_argument("--vs", type=arg(lambda s: common.parse_choice_list(s, PEERS, "peer")),
                   default="mpi", metavar="PEER", help="peers ('none' for none)")
    p.add_argument("--hosts", type=arg(lambda s: common.parse_int_list(s, "host count")), default=None,
                   metavar="H[,H...]",
                   help="run across H simulated hosts (network namespaces on one bridge, see "
                        "scalefree.launch.simhosts; needs root) instead of one host, --per-host ranks on each, "
                        "the same hosts for every implementation; -n is then ignored")
    p.add_argument("--per-host", type=arg(common.positive_int), default=1, help="ranks per simulated host with --hosts")
    common.add_timing_args(p)
    common.add_output_args(p)
    p.set_defaults(func=run)
    return p


def zipf_indices(rank: int, dim: int, nnz: int, a: float) -> np.ndarray:
    """``nnz`` distinct indices of ``[0, dim)`` drawn from Zipf(a) (ids past dim wrap)."""
    rng = np.random.default_rng([7, rank])
    got = np.zeros(0, np.int64)
    while len(got) < nnz:
        draw = (rng.zipf(a, 2 * nnz) - 1) % dim
        got = np.unique(np.concatenate([got, draw]))
    return rng.permutation(got)[:nnz].astype(np.int64)


class IndicesOnce:
    """The "indices once" MPI scheme, as lean as numpy allows. ``config`` allgathers the
    indices once and keeps, of all ranks' entries, only those this rank requests (``sel``)
    with the position each lands in (``dest``); a reduce is then one ``Allgatherv`` of the
    values into a preallocated buffer and one pass summing the kept entries into place:
    ``np.bincount(dest, weights=values[sel])``, or, faster where scipy is installed, the
    same sum as a product with a CSR matrix of ones built at config (float32 throughout,
    no gather of ``values[sel]`` nor float64 round trip; ``kernel`` says which ran)."""

    def __init__(self, comm, MPI, counts, displs, sel, dest, n_in):
        self.comm, self.n_in = comm, n_in
        self.sel, self.dest = sel, dest
        self.all_val = np.empty(int(counts.sum()), np.float32)
        self.recv = [self.all_val, counts, displs, MPI.FLOAT]
        try:
            import scipy.sparse as sp
        except ImportError:
            self.matrix, self.kernel = None, "bincount"
        else:
            self.matrix = sp.csr_matrix((np.ones(len(sel), np.float32), (dest, sel)), shape=(n_in, len(self.all_val)))
            self.matrix.sum_duplicates()
            self.kernel = "csr"

    @classmethod
    def config(cls, comm, MPI, out_idx: np.ndarray, in_idx: np.ndarray) -> "IndicesOnce":
        counts = np.array(comm.allgather(len(out_idx)), np.int64)
        displs = np.concatenate([[0], np.cumsum(counts)[:-1]])
        all_idx = np.empty(int(counts.sum()), np.int64)
        comm.Allgatherv(out_idx, [all_idx, counts, displs, MPI.INT64_T])
        order = np.argsort(in_idx, kind="stable")
        wanted = in_idx[order]
        at = np.minimum(np.searchsorted(wanted, all_idx), max(len(wanted) - 1, 0))
        hit = wanted[at] == all_idx if len(wanted) else np.zeros(len(all_idx), bool)
        sel = np.flatnonzero(hit)
        # Requested indices hold one position each here; repeats take the first's value.
        first = order[at[sel]]
        return cls(comm, MPI, counts, displs, sel, first, len(in_idx))._repeats(in_idx, order)

    def _repeats(self, in_idx, order) -> "IndicesOnce":
        """Where ``in_idx`` repeats an index, the later positions copy the first one's."""
        wanted = in_idx[order]
        dup = np.flatnonzero(wanted[1:] == wanted[:-1]) + 1
        if len(dup):
            starts = np.maximum.accumulate(np.where(np.r_[True, wanted[1:] != wanted[:-1]], np.arange(len(wanted)), 0))
            self.copy_to, self.copy_from = order[dup], order[starts[dup]]
        else:
            self.copy_to = None
        return self

    def reduce(self, vals: np.ndarray) -> np.ndarray:
        self.comm.Allgatherv(vals, self.recv)
        if self.matrix is not None:
            out = self.matrix @ self.all_val
        else:
            out = np.bincount(self.dest, weights=self.all_val[self.sel], minlength=self.n_in).astype(np.float32)
        if self.copy_to is not None:
            out[self.copy_to] = out[self.copy_from]
        return out


# ---------------------------------------------------------------------------------------
# Rank side


def _timed(args, rank, size, op, barrier, allmax, gather_max):
    tp = common.time_point(op, barrier, allmax, rank=rank, straggler=common.StragglerSchedule(0, 0, size),
                           min_calls=args.min_calls, target_seconds=args.target_seconds,
                           max_calls=args.max_calls, warmup_calls=args.warmup)
    times = gather_max(np.asarray(tp.times_s))
    return common.Stats.of(times)


def worker(argv: list[str]) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--impl", required=True)
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--dim", type=int, required=True)
    p.add_argument("--nnz", type=int, required=True)
    p.add_argument("--zipf", type=float, required=True)
    p.add_argument("--degrees", default="auto")
    p.add_argument("--min-calls", type=int, default=5)
    p.add_argument("--max-calls", type=int, default=100_000)
    p.add_argument("--target-seconds", type=float, default=0.5)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--rounds", type=int, default=4)
    args = p.parse_args(argv)
    recs = []
    if args.impl == "scalefree-sweep":
        recs, rank = _sweep_worker(args)
    elif args.impl == "scalefree":
        import scalefree

        g = scalefree.init()
        rank, size = g.rank, g.size
        idx = zipf_indices(rank, args.dim, args.nnz, args.zipf)
        vals = np.random.default_rng(rank).random(len(idx)).astype(np.float32)
        degrees = "auto" if args.degrees == "auto" else [int(x) for x in args.degrees.split("x")]

        def allmax(x):
            return float(g.allreduce(np.array([x]), op="max")[0])

        def gather_max(t):
            return g.allreduce(t.copy(), op="max")

        sa = g.sparse_allreduce(args.dim, degrees=degrees)
        common_f = dict(bench=BENCH, impl="scalefree", ranks=size, nbytes=len(idx) * 4, dtype="float32", gbps=0.0)
        st = _timed(args, rank, size, lambda: sa.config(idx, idx), g.barrier, allmax, gather_max)
        recs.append(common.make_record(variant="config", stats=st, **common_f, degrees="x".join(map(str, sa.degrees))))
        st = _timed(args, rank, size, lambda: sa.reduce(vals), g.barrier, allmax, gather_max)
        layers = sa.stats()
        recs.append(common.make_record(variant="reduce", stats=st, **common_f, degrees="x".join(map(str, sa.degrees)),
                                       layers=layers))
        sa2 = g.sparse_allreduce(args.dim, degrees=degrees)
        st = _timed(args, rank, size, lambda: sa2.config_reduce(idx, vals, idx), g.barrier, allmax, gather_max)
        recs.append(common.make_record(variant="config_reduce", stats=st, **common_f,
                                       degrees="x".join(map(str, sa2.degrees))))
        # Correctness check against the dense reference (outside timing).
        got = sa.reduce(vals)
        dense = np.zeros(args.dim, np.float64)
        for r in range(size):
            ii = zipf_indices(r, args.dim, args.nnz, args.zipf)
            np.add.at(dense, ii, np.random.default_rng(r).random(len(ii)).astype(np.float32))
        if not np.allclose(got, dense[idx], rtol=1e-5, atol=1e-5):
            raise SystemExit("scalefree sparse allreduce disagrees with the dense reference")
    else:
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
        rank, size = comm.Get_rank(), comm.Get_size()
        idx = zipf_indices(rank, args.dim, args.nnz, args.zipf)
        vals = np.random.default_rng(rank).random(len(idx)).astype(np.float32)

        def allmax(x):
            return comm.allreduce(x, op=MPI.MAX)

        def gather_max(t):
            out = np.empty_like(t)
            comm.Allreduce(t, out, op=MPI.MAX)
            return out

        common_f = dict(bench=BENCH, impl="mpi", ranks=size, nbytes=len(idx) * 4, dtype="float32", gbps=0.0)
        dense = np.zeros(args.dim, np.float32)
        dense[idx] = vals

        def dense_call():
            comm.Allreduce(MPI.IN_PLACE, dense, op=MPI.SUM)

        st = _timed(args, rank, size, dense_call, comm.Barrier, allmax, gather_max)
        recs.append(common.make_record(variant="dense", stats=st, **common_f))
        counts = np.array(comm.allgather(len(idx)), np.int64)
        displs = np.concatenate([[0], np.cumsum(counts)[:-1]])
        total = int(counts.sum())
        all_idx = np.empty(total, np.int64)
        all_val = np.empty(total, np.float32)

        def allgatherv_merge():
            comm.Allgatherv(idx, [all_idx, counts, displs, MPI.INT64_T])
            comm.Allgatherv(vals, [all_val, counts, displs, MPI.FLOAT])
            u, inv = np.unique(all_idx, return_inverse=True)
            s = np.bincount(inv, weights=all_val, minlength=len(u))
            pos = np.searchsorted(u, idx)
            return s[pos].astype(np.float32)

        st = _timed(args, rank, size, allgatherv_merge, comm.Barrier, allmax, gather_max)
        recs.append(common.make_record(variant="allgatherv", stats=st, **common_f))
        t0 = time.perf_counter()
        plan = IndicesOnce.config(comm, MPI, idx, idx)
        setup_s = comm.allreduce(time.perf_counter() - t0, op=MPI.MAX)
        got = plan.reduce(vals)
        if not np.allclose(got, allgatherv_merge(), rtol=1e-5, atol=1e-5):
            raise SystemExit("mpi indices-once disagrees with allgatherv + merge")

        st = _timed(args, rank, size, lambda: plan.reduce(vals), comm.Barrier, allmax, gather_max)
        recs.append(common.make_record(variant="indices-once", stats=st, **common_f, config_s=setup_s,
                                       kernel=plan.kernel))
    if rank == 0:
        args.out.write_text(json.dumps(recs))
    return 0


def _parse_degrees(text: str):
    return "auto" if text == "auto" else [int(x) for x in text.split("x")]


def _sweep_worker(args) -> list[dict]:
    """Every candidate of ``--degrees`` (comma-separated: auto, 4, 2x2, ...) configured once,
    then ``--rounds`` interleaved rounds timing config and reduce of each candidate in turn,
    so that a slow spell of the machine hits every candidate alike. Every candidate's result
    is checked against the dense reference (outside timing)."""
    import scalefree

    g = scalefree.init()
    rank, size = g.rank, g.size
    idx = zipf_indices(rank, args.dim, args.nnz, args.zipf)
    vals = np.random.default_rng(rank).random(len(idx)).astype(np.float32)
    dense = np.zeros(args.dim, np.float64)
    for r in range(size):
        ii = zipf_indices(r, args.dim, args.nnz, args.zipf)
        np.add.at(dense, ii, np.random.default_rng(r).random(len(ii)).astype(np.float32))
    want = dense[idx]
    del dense

    def allmax(x):
        return float(g.allreduce(np.array([x]), op="max")[0])

    def gather_max(t):
        return g.allreduce(t.copy(), op="max")

    cands = args.degrees.split(",")
    sas = {}
    for c in cands:
        sa = g.sparse_allreduce(args.dim, degrees=_parse_degrees(c))
        sa.config(idx, idx)
        if not np.allclose(sa.reduce(vals), want, rtol=1e-5, atol=1e-5):
            raise SystemExit(f"scalefree sparse allreduce (degrees {c}) disagrees with the dense reference")
        sas[c] = sa
    times = {(c, v): [] for c in cands for v in ("config", "reduce")}
    layers = {}
    per_round = max(args.target_seconds / max(1, args.rounds), 0.05)
    for _ in range(args.rounds):
        for c in cands:
            sa = sas[c]
            for variant, op, calls in (("config", lambda: sa.config(idx, idx), max(2, args.min_calls // 2)),
                                       ("reduce", lambda: sa.reduce(vals), args.min_calls)):
                tp = common.time_point(op, g.barrier, allmax, rank=rank, straggler=common.StragglerSchedule(0, 0, size),
                                       min_calls=calls, target_seconds=per_round, max_calls=args.max_calls,
                                       warmup_calls=1)
                times[(c, variant)] += [float(t) for t in gather_max(np.asarray(tp.times_s))]
                if variant == "reduce":
                    layers[c] = sa.stats()
    recs = []
    for c in cands:
        for variant in ("config", "reduce"):
            recs.append(common.make_record(
                bench=BENCH, impl="scalefree", variant=variant, ranks=size, nbytes=len(idx) * 4, dtype="float32",
                stats=common.Stats.of(times[(c, variant)]), gbps=0.0, candidate=c,
                probed_costs=dataclasses.asdict(sas[c].plan["costs"]) if sas[c].plan and variant == "config" else None,
                auto_predicted_s=sas[c].plan["predicted_s"] if sas[c].plan and variant == "config" else None,
                degrees="x".join(map(str, sas[c].degrees)), layers=layers[c] if variant == "reduce" else []))
    return recs, rank


# ---------------------------------------------------------------------------------------
# Driver


def run(args) -> int:
    records: list[dict] = []
    failed: list[int] = []  # rank counts where scalefree's own run failed (a peer may be skipped)
    peers = [] if args.vs == ["none"] else list(args.vs)
    if args.degrees == "sweep":
        if args.hosts:
            raise SystemExit("scalefree bench sparse: --degrees sweep runs on one host; drop --hosts")
        return run_sweep(args)
    def one(n: int, sim=None) -> None:
        for impl in ["scalefree"] + peers:
            out = Path(tmp) / f"{impl}-{n}.json"
            out.unlink(missing_ok=True)
            argv = [sys.executable, "-m", "scalefree_bench.sparse", "--impl", impl, "--out", str(out),
                    "--dim", str(args.dim), "--nnz", str(args.nnz), "--zipf", repr(args.zipf),
                    "--degrees", args.degrees, "--min-calls", str(args.min_calls),
                    "--max-calls", str(args.max_calls), "--target-seconds", repr(args.target_seconds),
                    "--warmup", str(args.warmup)]
            if not common.run_ranks(impl, n, argv, timeout_s=args.timeout, label="sparse", sim=sim) or not out.exists():
                if impl == "scalefree":
                    failed.append(n)
                continue
            for r in json.loads(out.read_text()):
                r["hosts"] = sim.n if sim is not None else 1
                records.append(r)

    with tempfile.TemporaryDirectory() as tmp:
        if args.hosts:
            from scalefree.launch import simhosts

            why = simhosts.available()
            if why:
                raise SystemExit(f"scalefree bench sparse --hosts: simulated hosts are not possible here: {why}")
            for h in args.hosts:
                with simhosts.SimHosts(h) as sim:
                    one(h * args.per_host, sim)
        else:
            for n in args.ranks:
                one(n)
    print_table(records)
    if args.json:
        common.write_json(args.json, records)
    if args.plot:
        plot(records, args.plot)
    if failed:
        print(f"scalefree bench sparse: scalefree's own run failed at {', '.join(map(str, failed))} ranks (see above)",
              file=sys.stderr)
        return 1
    return 0


def run_sweep(args) -> int:
    """``--degrees sweep``: per rank count, one job timing every degree list and auto."""
    from scalefree.sparse import plan as sparse_plan

    records: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.ranks:
            cands = ["auto"] + ["x".join(map(str, d)) for d in sparse_plan.factorizations(n)]
            out = Path(tmp) / f"sweep-{n}.json"
            argv = [sys.executable, "-m", "scalefree_bench.sparse", "--impl", "scalefree-sweep", "--out", str(out),
                    "--dim", str(args.dim), "--nnz", str(args.nnz), "--zipf", repr(args.zipf),
                    "--degrees", ",".join(cands), "--min-calls", str(args.min_calls),
                    "--max-calls", str(args.max_calls), "--target-seconds", repr(args.target_seconds * len(cands)),
                    "--warmup", str(args.warmup), "--rounds", str(args.rounds)]
            if n > common.usable_cores():
                progress_note = f" (oversubscribed: {n} ranks on {common.usable_cores()} cores)"
            else:
                progress_note = ""
            common.progress(f"sparse sweep: {n} ranks, candidates {', '.join(cands)}{progress_note}")
            if not common.run_ranks("scalefree", n, argv, timeout_s=args.timeout, label="sparse sweep") or not out.exists():
                continue
            records += json.loads(out.read_text())
    if not records:
        return 1
    add_predictions(records, args.nnz, args.dim, 4)
    print_sweep(records)
    if args.json:
        common.write_json(args.json, records)
    return 0


def add_predictions(records: list[dict], nnz: int, dim: int, vb: int):
    """Adds to each reduce record the plan's prediction with its default costs
    (``predicted_s``), with the costs auto probed in the same job (``probed_s``), and with
    costs fitted to all these measurements (``fitted_s``); returns the fit."""
    from scalefree.sparse import plan as sparse_plan

    reduce = [r for r in records if r["variant"] == "reduce" and r["degrees"]]
    feats = [sparse_plan.features([int(x) for x in r["degrees"].split("x")], nnz, dim, vb) for r in reduce]
    default = sparse_plan.Costs()
    fitted = sparse_plan.fit(feats, [r["median_s"] for r in reduce]) if reduce else None
    for r, f in zip(reduce, feats):
        d = [int(x) for x in r["degrees"].split("x")]
        r["predicted_s"] = sparse_plan.predict_time(d, nnz, dim, vb, default)
        probed = next((x.get("probed_costs") for x in records if x["ranks"] == r["ranks"] and x.get("probed_costs")), None)
        if probed:
            r["probed_s"] = sparse_plan.predict_time(d, nnz, dim, vb, sparse_plan.Costs(**probed))
        r["fitted_s"] = sparse_plan.predict_time(d, nnz, dim, vb, fitted)
        r["fitted_costs"] = dataclasses.asdict(fitted)
    return fitted


def print_sweep(records: list[dict]) -> None:
    rows = []
    for n in sorted({r["ranks"] for r in records}):
        rs = [r for r in records if r["ranks"] == n]
        red = {r["candidate"]: r for r in rs if r["variant"] == "reduce"}
        cfg = {r["candidate"]: r for r in rs if r["variant"] == "config"}
        hand = [c for c in red if c != "auto"]
        best = min(hand, key=lambda c: red[c]["median_s"]) if hand else None
        best_cfg = min(hand, key=lambda c: cfg[c]["median_s"]) if hand else None
        for c in ["auto"] + sorted(hand, key=lambda c: red[c]["median_s"]):
            if c not in red:
                continue
            r, q = red[c], cfg.get(c)
            rows.append([str(n), c, r["degrees"], human_time(r["median_s"]), f"{r['n']}",
                         f"{r['median_s'] / red[best]['median_s']:.2f}x" if best else "",
                         human_time(q["median_s"]) if q else "",
                         f"{q['median_s'] / cfg[best_cfg]['median_s']:.2f}x" if q and best_cfg else "",
                         *[x for key in ("predicted_s", "probed_s", "fitted_s") for x in
                           ((human_time(r[key]), f"{r[key] / r['median_s']:.2f}") if key in r else ("", ""))]])
    print(common.format_table(["ranks", "candidate", "degrees", "reduce", "calls", "vs best", "config", "vs best",
                               "plan default", "/meas", "plan probed", "/meas", "plan fitted", "/meas"],
                              rows, left_columns=3))
    from scalefree.sparse import plan as sparse_plan

    def describe(c: dict) -> str:
        c = sparse_plan.Costs(**c)
        floor = common.human_bytes(int(c.floor_bytes)) if c.floor_bytes != float("inf") else "inf"
        gbps = f"{1e-9 / c.s_per_byte:.2f} GB/s" if c.s_per_byte > 0 else "inf"
        return (f"fixed {human_time(c.fixed_s)}, round {human_time(c.round_s)}, message {human_time(c.msg_s)}, "
                f"{gbps}, {c.s_per_key * 1e9:.1f} ns per caller index -> packet floor {floor}")

    for r in records:
        if r.get("probed_costs"):
            print(f"\nprobed by auto at {r['ranks']} ranks: {describe(r['probed_costs'])}")
    fit = next((r["fitted_costs"] for r in records if "fitted_costs" in r), None)
    if fit:
        print(f"fitted to every reduce above: {describe(fit)}")
    for r in records:
        if r.get("layers"):
            print(f"\n{r['ranks']} ranks, {r['candidate']} (degrees {r['degrees']}), rank 0's layers of a reduce:")
            print_layers(r["layers"])


def print_table(records: list[dict]) -> None:
    rows = []
    for h, n in sorted({(r.get("hosts", 1), r["ranks"]) for r in records}):
        rs = [r for r in records if r["ranks"] == n and r.get("hosts", 1) == h]
        ours = next((r for r in rs if r["impl"] == "scalefree" and r["variant"] == "reduce"), None)
        for r in rs:
            vs = f"{r['median_s'] / ours['median_s']:.2f}x" if ours and r["impl"] != "scalefree" else ""
            extra = r.get("degrees", "") or (f"setup {human_time(r['config_s'])}" if "config_s" in r else "")
            rows.append([str(h), str(n), r["impl"], r["variant"], human_time(r["median_s"]), human_time(r["min_s"]),
                         human_time(r["max_s"]), str(r["n"]), vs, extra])
    print(common.format_table(["hosts", "ranks", "impl", "variant", "median", "min", "max", "calls",
                               "peer/ours(reduce)", "degrees / set-up"], rows, left_columns=4))
    for r in records:
        if r.get("layers"):
            where = f" on {r['hosts']} hosts" if r.get("hosts", 1) > 1 else ""
            print(f"\nscalefree reduce at {r['ranks']} ranks{where}, rank 0's layers (degrees {r['degrees']}):")
            print_layers(r["layers"])


def print_layers(layers: list[dict]) -> None:
    """Rank 0's per-layer accounting of one reduce, as a table."""
    rows = [[str(i), str(s["degree"]), common.human_bytes(s["bytes_sent"]), str(s["messages"]),
             common.human_bytes(s["max_packet"]), human_time(s["merge_s"]), human_time(s["wait_s"]),
             str(s["out_keys"]), "dense" if s.get("dense") else "sparse"] for i, s in enumerate(layers)]
    print(common.format_table(["layer", "degree", "bytes sent", "msgs", "max packet", "merge",
                               "wait+read", "keys after", "segment"], rows))


def plot(records: list[dict], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise RuntimeError(f"--plot needs matplotlib ({e})") from e
    fig, ax = plt.subplots(figsize=(8, 5))
    series = sorted({(r["impl"], r["variant"]) for r in records})
    for i, (impl, var) in enumerate(series):
        rs = sorted((r for r in records if (r["impl"], r["variant"]) == (impl, var)), key=lambda r: r["ranks"])
        ax.plot([r["ranks"] for r in rs], [r["median_s"] for r in rs], marker="o", label=f"{impl} {var}", color=f"C{i}")
    ax.set_yscale("log")
    ax.set_xlabel("ranks")
    ax.set_ylabel("median time per call (s)")
    ax.legend(fontsize=8)
    ax.grid(True, alpha=0.3)
    fig.suptitle("sparse allreduce")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(worker(sys.argv[1:]))
