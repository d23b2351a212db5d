"""``scalefree bench ddp``: PyTorch DistributedDataParallel with the ``"scalefree"`` backend
against gloo, in one run, on the same script, model, data and ranks (started by torchrun).

The default is the issue's model: a 50M-parameter MLP 4096 -> 4096 -> 4096 -> 4096 -> 10,
batch 16 per rank, 2 ranks with one thread each, DDP's default 25 MB buckets, SGD. The data
(a learnable synthetic classification set, plus held-out rows) is written to a .npy file
first; every rank loads its share from it (load time in the JSON). The table shows the
median ms per timed step (slowest rank per step), steps per second, the mean training loss
of the timed steps, the held-out loss after training, peak RSS per rank, and the ratio
gloo / this row (> 1: faster than gloo).

``--hook`` adds rows with DDP communication hooks on the scalefree backend
(:mod:`scalefree.torch.hooks`): ``bf16`` (bfloat16 on the wire) and ``ssp:SLACK``
(bounded-staleness averaging). ``--delay MS`` makes one seeded-random rank sleep
uniform(0, MS) ms before each step (the same schedule for every row), and adds a
``scalefree`` sync row as the baseline of the hooks.

``--wrap fsdp`` shards the MLP with FSDP2 (``fully_shard`` on every Linear and on the
model, a 1-D DeviceMesh over the ranks) instead of DDP.

``--model embedding`` trains an ``nn.Embedding(--emb-rows, --emb-dim)`` (default 10M x 64)
with a linear head; each rank's step looks up ``--touched`` of the rows (distinct ids,
default 1 %). Rows ``none`` keep the table dense (DDP's dense allreduce of the whole
gradient); ``--hook sparse`` adds rows with ``sparse=True``: gloo with DDP's own sparse
allreduce and scalefree with :func:`scalefree.torch.hooks.sparse_hook`. The table adds the
gradient exchange per step (median; first bucket handed to the comm hook to the last
bucket's result) and its ratio to gloo's dense exchange.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

from . import common
from .common import progress

BENCH = "ddp"


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("ddp", help="torch DDP step time: the scalefree backend vs gloo",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter, description=__doc__)
    arg = common.argparse_type
    p.add_argument("-n", "--ranks", type=arg(lambda s: common.parse_int_list(s, "rank count")), default="2",
                   metavar="N[,N...]")
    p.add_argument("--widths", default="4096,4096,4096,4096,10", help="MLP layer widths")
    p.add_argument("--batch", type=arg(common.positive_int), default=16, help="rows per rank per step")
    p.add_argument("--steps", type=arg(common.positive_int), default=20, help="timed steps")
    p.add_argument("--warmup", type=arg(common.positive_int), default=3, help="untimed steps first")
    p.add_argument("--backends", type=arg(lambda s: common.parse_choice_list(s, ("gloo", "scalefree"), "backend")),
                   default="gloo,scalefree", metavar="B[,B...]")
    p.add_argument("--hook", type=arg(lambda s: [h for h in s.split(",") if h]), default="",
                   metavar="H[,H...]", help="extra scalefree rows with comm hooks: bf16, ssp:SLACK")
    p.add_argument("--delay", type=arg(common.non_negative_float), default=0.0, metavar="MS",
                   help="straggler: one seeded-random rank sleeps uniform(0, MS) ms before each step")
    p.add_argument("--floor", action="store_true",
                   help="instead of the backends, the floor rows without communication: compute only (no DDP) "
                        "and DDP with a comm hook that exchanges nothing (DDP's copies into and out of its buckets)")
    p.add_argument("--bucket-mb", type=arg(common.positive_float), default=25.0, help="DDP bucket_cap_mb")
    p.add_argument("--lr", type=arg(common.positive_float), default=0.01, help="SGD learning rate")
    p.add_argument("--heldout", type=arg(common.positive_int), default=None,
                   help="MLP: held-out rows for the loss after training (default: 4 batches)")
    p.add_argument("--wrap", choices=("ddp", "fsdp"), default="ddp",
                   help="fsdp: FSDP2 (fully_shard on every Linear and the model) instead of DDP; MLP only")
    p.add_argument("--model", choices=("mlp", "embedding"), default="mlp",
                   help="the MLP of --widths, or an embedding table (--emb-rows x --emb-dim)")
    p.add_argument("--emb-rows", type=arg(common.positive_int), default=10_000_000)
    p.add_argument("--emb-dim", type=arg(common.positive_int), default=64)
    p.add_argument("--touched", type=arg(common.positive_float), default=0.01,
                   help="embedding: fraction of the rows each rank looks up per step")
    p.add_argument("--seed", type=common.argparse_type(common.non_negative_int), default=0)
    p.add_argument("--timeout", type=arg(common.positive_float), default=900.0)
    common.add_output_args(p)
    p.set_defaults(func=run)
    return p


def _write_data(tmp: Path, n: int, args) -> tuple[Path, Path]:
    import numpy as np

    if args.model == "embedding":
        return _write_ids(tmp, n, args)

    widths = [int(w) for w in args.widths.split(",")]
    rows = n * (args.warmup + args.steps) * args.batch + _heldout(args)  # + held-out rows
    rng = np.random.default_rng(args.seed)
    x = rng.standard_normal((rows, widths[0]), dtype=np.float32)
    teacher = rng.standard_normal((widths[0], widths[-1]), dtype=np.float32)
    y = np.argmax(x @ teacher, axis=1).astype(np.int32)
    xp, yp = tmp / "x.npy", tmp / "y.npy"
    np.save(xp, x)
    np.save(yp, y)
    return xp, yp


def _heldout(args) -> int:
    if args.model != "mlp":
        return 4 * args.batch
    return getattr(args, "heldout", None) or 4 * args.batch


def _write_ids(tmp: Path, n: int, args) -> tuple[Path, Path]:
    """Embedding data: one row of ``touched * emb_rows`` distinct ids per rank and step (plus
    4 held-out rows), and a target per id (a fixed random function of the id)."""
    import numpy as np

    k = max(1, int(round(args.touched * args.emb_rows)))
    if k > args.emb_rows:
        raise ValueError(f"--touched {args.touched} looks up more than the {args.emb_rows} rows")
    steps = n * (args.warmup + args.steps) + 4
    rng = np.random.default_rng(args.seed)
    ids = np.empty((steps, k), np.int64)
    for s in range(steps):
        ids[s] = rng.choice(args.emb_rows, k, replace=False)
    y = (np.sin(ids * 0.001) + 0.1 * (ids % 7)).astype(np.float32)
    xp, yp = tmp / "ids.npy", tmp / "y.npy"
    np.save(xp, ids)
    np.save(yp, y)
    return xp, yp


def run(args) -> int:
    try:
        import torch  # noqa: F401
    except ImportError:
        progress("bench ddp: torch is not installed (pip install torch)")
        return 2
    configs = [(b, "none") for b in args.backends]
    if args.floor:
        if args.model != "mlp" or args.wrap != "ddp" or args.hook:
            progress("bench ddp: --floor takes the MLP under DDP and no --hook")
            return 2
        configs = [("gloo", "floor:compute"), ("gloo", "floor:nocomm")]
    if args.wrap == "fsdp" and (args.model != "mlp" or args.hook):
        progress("bench ddp: --wrap fsdp takes the MLP and no --hook")
        return 2
    if args.model == "embedding":
        args.batch = 1  # one row of ids per step
        for h in args.hook:
            if h != "sparse":
                progress(f"bench ddp: --model embedding takes --hook sparse only, got {h!r}")
                return 2
            configs += [(b, "sparse") for b in args.backends]
    for h in args.hook if args.model == "mlp" else []:
        if h != "bf16" and not h.startswith("ssp:"):
            progress(f"bench ddp: unknown hook {h!r} (bf16, ssp:SLACK; sparse with --model embedding)")
            return 2
        configs.append(("scalefree", h))
    model = (f"embedding {args.emb_rows} x {args.emb_dim}, touched {args.touched:g}/rank/step"
             if args.model == "embedding" else f"widths {args.widths}")
    progress(f"ddp: {model}, batch {args.batch}/rank, ranks {args.ranks}, {args.steps} timed steps, "
             f"delay {args.delay:g} ms, rows {configs}, {common.usable_cores()} cores")
    records, failures = [], []
    for n in args.ranks:
        with tempfile.TemporaryDirectory(prefix="scalefree-bench-ddp-") as tmp:
            xp, yp = _write_data(Path(tmp), n, args)
            for backend, hook in configs:
                out = Path(tmp) / f"{backend}-{hook.replace(':', '_')}"
                out.mkdir()
                argv = ["--backend", backend, "--hook", hook, "--data", str(xp), "--labels", str(yp),
                        "--widths", args.widths, "--batch", str(args.batch), "--steps", str(args.steps),
                        "--warmup", str(args.warmup), "--delay-ms", str(args.delay), "--seed", str(args.seed),
                        "--bucket-mb", str(args.bucket_mb), "--lr", str(args.lr), "--heldout", str(_heldout(args)), "--out-dir", str(out), "--model", args.model,
                        "--emb-rows", str(args.emb_rows), "--emb-dim", str(args.emb_dim), "--wrap", args.wrap]
                cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", str(n),
                       "--master-addr", "127.0.0.1", "--master-port", str(common.free_port()),
                       "-m", "scalefree_bench._worker_ddp", *argv]
                label = backend if hook == "none" else f"{backend}+{hook}"
                progress(f"ddp: {label} on {n} ranks")
                res = common.run_job(cmd, timeout_s=args.timeout, env_extra={"OMP_NUM_THREADS": "1"})
                docs = [json.loads((out / f"rank{r}.json").read_text()) for r in range(n)
                        if (out / f"rank{r}.json").exists()]
                if not res.ok or len(docs) != n:
                    failures.append(f"{label} on {n} ranks: {res.describe()}")
                    continue
                records.append(_record(backend, hook, n, args, docs))
    _add_ratios(records)
    print(render_table(records))
    sys.stdout.flush()
    if args.json:
        common.write_json(args.json, records)
        progress(f"ddp: wrote {len(records)} records to {args.json}")
    for f in failures:
        progress(f"ddp: FAILED {f}")
    return 1 if failures else 0


def _record(backend: str, hook: str, n: int, args, docs: list[dict]) -> dict:
    per_step = [max(ts) for ts in zip(*(d["times_s"] for d in docs))]
    wall = max(d["wall_s"] for d in docs)
    losses = [statistics.mean(ls) for ls in zip(*(d["losses"] for d in docs))]
    return common.make_record(
        bench=BENCH, impl=backend, variant=hook, ranks=n, nbytes=4 * docs[0]["params"], dtype="float32",
        stats=common.Stats.of(per_step), gbps=0.0, widths=args.widths, batch=args.batch,
        steps=args.steps, steps_per_s=args.steps / wall, wall_s=wall, delay_ms=float(args.delay),
        mean_loss=statistics.mean(losses), last_loss=losses[-1],
        heldout_loss=statistics.mean(d["heldout_loss"] for d in docs),
        init_s=max(d["init_s"] for d in docs), load_s=max(d["load_s"] for d in docs), lr=getattr(args, "lr", 0.01), heldout_rows=_heldout(args),
        finish_s=max(d.get("finish_s", 0.0) for d in docs),
        peak_rss_bytes=max(d["peak_rss_bytes"] for d in docs), params=docs[0]["params"], model=args.model,
        wrap=args.wrap,
        **_exchange(docs, args))


def _exchange(docs: list[dict], args) -> dict:
    """The embedding rows' gradient exchange per step (slowest rank per step)."""
    if args.model != "embedding":
        return {}
    per_step = [max(ts) for ts in zip(*(d["exchange_s"] for d in docs))]
    return {"exchange_median_s": statistics.median(per_step), "exchange_s": per_step,
            "emb_rows": args.emb_rows, "emb_dim": args.emb_dim, "touched": args.touched}


def _add_ratios(records: list[dict]) -> None:
    for r in records:
        same = [g for g in records if g["ranks"] == r["ranks"]]
        gloo = next((g for g in same if g["impl"] == "gloo" and g["variant"] == "none"), None)
        sync = next((g for g in same if g["impl"] == "scalefree" and g["variant"] == "none"), None)
        if gloo is not None:
            r["vs_gloo"] = common.ratio(gloo["median_s"], r["median_s"])
            r["steps_per_s_vs_gloo"] = r["steps_per_s"] / gloo["steps_per_s"]
        dense = next((g for g in same if g["impl"] == "gloo" and g["variant"] == "none"
                      and "exchange_median_s" in g), None)
        if dense is not None and "exchange_median_s" in r:
            r["exchange_vs_gloo_dense"] = common.ratio(dense["exchange_median_s"], r["exchange_median_s"])
        if sync is not None:
            r["steps_per_s_vs_sync"] = r["steps_per_s"] / sync["steps_per_s"]


def render_table(records: list[dict]) -> str:
    exch = any("exchange_median_s" in r for r in records)
    headers = ["ranks", "backend", "hook", "ms/step", "steps/s", "x gloo", "steps/s x gloo", "x sync"]
    headers += ["exchange ms", "exch x gloo dense"] if exch else []
    headers += ["mean loss", "held-out loss", "peak RSS/rank", "init s"]
    rows = []
    for r in records:
        row = [str(r["ranks"]), r["impl"], r["variant"], f"{r['median_s'] * 1e3:.1f}",
               f"{r['steps_per_s']:.2f}", f"{r['vs_gloo']:.2f}" if "vs_gloo" in r else "",
               f"{r['steps_per_s_vs_gloo']:.2f}" if "steps_per_s_vs_gloo" in r else "",
               f"{r['steps_per_s_vs_sync']:.2f}" if "steps_per_s_vs_sync" in r else ""]
        if exch:
            row += [f"{r['exchange_median_s'] * 1e3:.1f}" if "exchange_median_s" in r else "",
                    f"{r['exchange_vs_gloo_dense']:.2f}" if "exchange_vs_gloo_dense" in r else ""]
        row += [f"{r['mean_loss']:.4f}", f"{r['heldout_loss']:.4f}", common.human_bytes(r["peak_rss_bytes"]),
                f"{r['init_s']:.2f}"]
        rows.append(row)
    return common.format_table(headers, rows)
