"""``scalefree bench pagerank-replicated``: PageRank on the sparse allreduce with
replication r, one rank SIGKILLed mid-run, against the unreplicated run on the logical
node count (issue 8: r = 2 on 8 ranks with one killed vs 4 ranks).

The driver builds a seeded R-MAT graph once; each job runs ``scalefree run
--allow-rank-failure`` with every rank timing its own ``step()`` calls (no barrier: after a
rank dies only the replicated collectives work). Rows: ``unreplicated`` (M ranks) and
``r=R, rank K killed`` (M·R ranks, rank K SIGKILLs itself at iteration ``--kill-at``).
``median/iter`` is the largest of the surviving ranks' median step times; ``after kill``
is the same over the iterations after the kill only. ``err`` is the L∞ difference of the
survivors' scores from scipy's after the same number of iterations.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from . import common
from .common import human_time, progress

BENCH = "pagerank-replicated"


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("pagerank-replicated", help="PageRank with replication and a killed rank vs unreplicated",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter, description=__doc__)
    arg = common.argparse_type
    p.add_argument("--logical", type=arg(common.positive_int), default=4, help="logical nodes M")
    p.add_argument("--replication", type=arg(common.positive_int), default=2, help="replicas per logical node")
    p.add_argument("--kill-rank", type=arg(common.int_at_least(-1)), default=5, help="rank that SIGKILLs itself (-1: none)")
    p.add_argument("--kill-at", type=arg(common.positive_int), default=10, help="iteration at which it does")
    p.add_argument("--hosts", type=arg(common.non_negative_int), default=0,
                   help="run every job across this many simulated hosts (network namespaces, UCX and TCP lanes "
                        "between them; the ranks split evenly); 0: one host, shared memory")
    p.add_argument("--kill-host", type=arg(common.int_at_least(-1)), default=-1,
                   help="with --hosts: every rank of this simulated host SIGKILLs itself at --kill-at "
                        "(instead of --kill-rank)")
    p.add_argument("--iters", type=arg(common.positive_int), default=30)
    p.add_argument("--rmat-scale", type=arg(common.positive_int), default=20)
    p.add_argument("--rmat-edges", type=arg(common.parse_size), default="8M")
    p.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    p.add_argument("--timeout", type=arg(common.positive_float), default=900)
    p.add_argument("--pin", action="store_true",
                   help="one core per replica, as if each replica set had its own machine: rank p runs on "
                        "core p // M only (the unreplicated M-rank run on one core)")
    p.add_argument("--variants", type=arg(lambda x: common.parse_choice_list(
                       x, ("unreplicated", "unreplicated-wide", "replicated", "replicated-kill"), "variant")),
                   default="unreplicated,unreplicated-wide,replicated-kill",
                   help="jobs: unreplicated (M ranks), unreplicated-wide (M*R ranks, no replication), "
                        "replicated (M*R ranks, r=R, no kill), replicated-kill (one rank killed)")
    common.add_output_args(p)
    p.set_defaults(func=run)
    return p


def worker(argv: list[str]) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--edges", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--replication", type=int, required=True)
    p.add_argument("--kill-rank", required=True, help="ranks that kill themselves, comma-separated")
    p.add_argument("--kill-at", type=int, required=True)
    p.add_argument("--iters", type=int, required=True)
    p.add_argument("--dtype", required=True)
    p.add_argument("--pin-logical", type=int, default=0)
    a = p.parse_args(argv)
    if a.pin_logical:
        # One "machine" per replica: rank p runs on core (p // M) of the cores it may use,
        # so replica 0 of every node shares core 0, replica 1 core 1, ... (set before init,
        # so the wait policy sees the cores it really has).
        cores = sorted(os.sched_getaffinity(0))
        me_rank = int(os.environ["SCALEFREE_RANK"])
        os.sched_setaffinity(0, {cores[(me_rank // a.pin_logical) % len(cores)]})
    import scalefree
    from scalefree.graph.io import logical_rank
    from scalefree.graph.pagerank import SparsePageRank
    from scalefree.graph.io import partition_edges

    g = scalefree.init()
    z = np.load(a.edges)
    n = int(z["n"])
    me, m = logical_rank(g, a.replication)
    src, dst = partition_edges(z["src"], z["dst"], me, m)
    pr = SparsePageRank(g, src, dst, n, replication=a.replication, dtype=a.dtype)
    kill = {int(x) for x in a.kill_rank.split(",") if x and int(x) >= 0}
    g.barrier()  # the last group-wide call: everyone is alive until here
    times, comm, cpu = [], [], []
    for it in range(a.iters):
        if g.rank in kill and it == a.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        c0 = time.process_time()
        t0 = time.perf_counter()
        pr.step()
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
        comm.append(pr.last_comm_s)
    out = a.out / f"rank{g.rank}.npz"
    tmp = a.out / f".rank{g.rank}.tmp.npz"
    np.savez(tmp, times=np.array(times), comm=np.array(comm), cpu=np.array(cpu), owned=pr.owned,
             scores=pr.scores.astype(np.float64))
    os.replace(tmp, out)
    return 0


def _job(args, edges: Path, out: Path, ranks: int, r: int, kill: list[int]) -> dict | None:
    out.mkdir()
    argv = [sys.executable, "-m", "scalefree_bench.pagerank_replicated",
            "--edges", str(edges), "--out", str(out), "--replication", str(r), "--kill-rank", ",".join(map(str, kill)),
            "--kill-at", str(args.kill_at), "--iters", str(args.iters), "--dtype", args.dtype,
            "--pin-logical", str(args.logical if args.pin else 0)]
    if args.hosts:
        from scalefree.launch import simhosts

        from . import hosts

        with simhosts.SimHosts(args.hosts) as sim:
            cmds = hosts.scalefree_cmds(sim, ranks // args.hosts, sim.port(), argv)
            at = [c.index("--nproc-per-node") + 2 for c in cmds]  # among `scalefree run`'s options
            cmds = [c[:i] + ["--allow-rank-failure", "--timeout", str(args.timeout)] + c[i:] for c, i in zip(cmds, at)]
            outcome = hosts.run_all(cmds, timeout_s=args.timeout + 30)
        # The launcher of a killed host fails; the job is good when every other rank wrote.
        rc = 0 if outcome.returncode is not None and len(list(out.glob("rank*.npz"))) == ranks - len(kill) else 1
    else:
        rc = subprocess.call([sys.executable, "-m", "scalefree.cli", "run", "-n", str(ranks), "--allow-rank-failure",
                              "--timeout", str(args.timeout), "--", *argv])
    files = sorted(out.glob("rank*.npz"))
    if rc != 0 or not files:
        progress(f"pagerank-replicated: job on {ranks} ranks failed (exit {rc})")
        return None
    return {int(f.stem[4:]): dict(np.load(f)) for f in files}


def run(args) -> int:
    from scalefree.graph.rmat import rmat_edges

    from .pagerank import ScipyPageRank

    m, r = args.logical, args.replication
    if args.hosts < 0 or (args.hosts and (m * r) % args.hosts):
        print(f"scalefree bench pagerank-replicated: --hosts {args.hosts} does not divide {m * r} ranks", file=sys.stderr)
        return 2
    if args.kill_host >= 0:
        if not 0 <= args.kill_host < args.hosts:
            print("scalefree bench pagerank-replicated: --kill-host needs --hosts above it", file=sys.stderr)
            return 2
        per = m * r // args.hosts
        killed = list(range(args.kill_host * per, (args.kill_host + 1) * per))
    else:
        killed = [args.kill_rank] if args.kill_rank >= 0 else []
    where = f", across {args.hosts} simulated hosts" if args.hosts else ""
    records, failed = [], []
    with tempfile.TemporaryDirectory() as tmp:
        progress(f"pagerank-replicated: R-MAT scale {args.rmat_scale}, {args.rmat_edges} edges")
        src, dst, ids = rmat_edges(args.rmat_scale, args.rmat_edges)
        n = len(ids)
        edges = Path(tmp) / "g.npz"
        np.savez(edges, src=src, dst=dst, n=n)
        ref = ScipyPageRank(src, dst, n)
        for _ in range(args.iters):
            ref.step()
        ref_max = float(np.abs(ref.scores).max())
        graph = f"rmat-s{args.rmat_scale}-e{args.rmat_edges}"
        del src, dst
        jobs = {"unreplicated": (m, 1, [], "unreplicated"),
                "unreplicated-wide": (m * r, 1, [], f"unreplicated {m * r}"),
                "replicated": (m * r, r, [], f"r={r} no kill"),
                "replicated-kill": (m * r, r, killed, f"r={r}")}
        for job in args.variants:
            ranks, rr, kill, variant = jobs[job]
            said = f", ranks {kill} killed at iteration {args.kill_at}" if kill else ""
            progress(f"pagerank-replicated: {variant} on {ranks} ranks{where}{said}")
            res = _job(args, edges, Path(tmp) / job, ranks, rr, kill)
            if res is None:
                failed.append(variant)
                continue
            med = max(float(np.median(v["times"])) for v in res.values())
            after = max(float(np.median(v["times"][args.kill_at:])) for v in res.values()) if kill else med
            tail = slice(args.kill_at, None) if kill else slice(None)
            # Per survivor, medians over the iterations counted in "after kill": its time in
            # the collectives, and the CPU time of the whole job per iteration (every
            # survivor's CPU seconds summed: the work the machine's cores had to do).
            comm = max(float(np.median(v["comm"][tail])) for v in res.values())
            cpu_sum = float(sum(np.median(v["cpu"][tail]) for v in res.values()))
            err = max(float(np.abs(v["scores"] - ref.scores[v["owned"]]).max()) for v in res.values())
            st = common.Stats.of(np.max([v["times"] for v in res.values()], axis=0))
            records.append(common.make_record(bench=BENCH, impl="scalefree", variant=variant, ranks=ranks, nbytes=8 * n,
                                              dtype=args.dtype, stats=st, gbps=0.0, graph=graph, vertices=n,
                                              replication=rr, killed_rank=kill[0] if len(kill) == 1 else (kill or -1),
                                              killed_ranks=kill, hosts=args.hosts or 1, survivors=len(res),
                                              median_iter_s=med, after_kill_s=after, max_abs_err=err,
                                              comm_s=comm, cpu_s_per_iter=cpu_sum, cores=common.usable_cores()))
    base = next((x for x in records if x["replication"] == 1 and x["ranks"] == m), None)
    rows = []
    for x in records:
        rows.append([x["graph"], str(x["ranks"]), x["variant"], ",".join(map(str, x["killed_ranks"])) or "-",
                     str(x["survivors"]), human_time(x["median_iter_s"]), human_time(x["after_kill_s"]),
                     f"{x['after_kill_s'] / base['median_iter_s']:.2f}x" if base else "",
                     human_time(x["comm_s"]), human_time(x["after_kill_s"] - x["comm_s"]),
                     human_time(x["cpu_s_per_iter"]),
                     f"{x['cpu_s_per_iter'] / base['cpu_s_per_iter']:.2f}x" if base else "",
                     f"{x['max_abs_err']:.1e}"])
    print(common.format_table(["graph", "ranks", "variant", "killed", "survivors", "median/iter", "after kill",
                               "vs unreplicated", "comm", "rest", "cpu/iter (all)", "cpu vs unrepl.", "err"],
                              rows, left_columns=3))
    print(f"comm: the slowest survivor's median time in the collectives per iteration; rest = after kill - comm; "
          f"cpu/iter: CPU seconds per iteration summed over the survivors ({common.usable_cores()} cores here)")
    if args.json:
        common.write_json(args.json, records)
    tol = 1e-5 * ref_max if args.dtype == "float32" else 1e-9
    if failed:
        print(f"scalefree bench pagerank-replicated: no result from {', '.join(failed)} (its job failed; above)",
              file=sys.stderr)
        return 1
    return 0 if records and all(x["max_abs_err"] <= tol for x in records) else 1


if __name__ == "__main__":
    sys.exit(worker(sys.argv[1:]))
