"""One rank of ``scalefree bench ddp``, started by torchrun: a plain DDP training loop whose
backend (and optional comm hook) is the only thing that changes between implementations.

Loads its share of the inputs from the .npy file the bench wrote (load time reported), runs
``--warmup`` untimed and ``--steps`` timed steps (forward, backward with DDP's bucketed
allreduce, SGD step), optionally sleeping a seeded-random straggler delay before each step,
and writes ``rank{R}.json`` to ``--out-dir``: per-step seconds, losses, peak RSS.

``--model embedding``: an ``nn.Embedding(ROWS, DIM)`` and a linear head regressing a target
per looked-up row; each step's batch is a set of distinct row ids from the file (the data
file holds ids, the labels file targets). Hook ``none`` keeps the table dense (DDP's dense
gradient allreduce); hook ``sparse`` makes it ``sparse=True``: on gloo DDP's own sparse
allreduce, on scalefree :func:`scalefree.torch.hooks.sparse_hook`. Every gradient exchange
is timed per step (first bucket handed to the hook to the last bucket's result, through a
wrapper around the hook: torch's ``allreduce_hook``, DDP's default, when there is none).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--backend", required=True)
    p.add_argument("--hook", default="none",
                   help="none, bf16, ssp:SLACK; floor:compute (no DDP), floor:nocomm (DDP, a hook exchanging nothing)")
    p.add_argument("--data", type=Path, required=True, help="inputs .npy (steps*ranks*batch rows)")
    p.add_argument("--labels", type=Path, required=True)
    p.add_argument("--widths", required=True, help="layer widths, e.g. 4096,4096,4096,4096,10")
    p.add_argument("--batch", type=int, required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--warmup", type=int, required=True)
    p.add_argument("--delay-ms", type=float, default=0.0, help="straggler: one random rank sleeps U(0, MS) per step")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--bucket-mb", type=float, default=25.0)
    p.add_argument("--lr", type=float, default=0.01, help="SGD learning rate")
    p.add_argument("--heldout", type=int, default=0, help="held-out rows after the training rows (0: 4 batches)")
    p.add_argument("--out-dir", type=Path, required=True)
    p.add_argument("--model", choices=("mlp", "embedding"), default="mlp")
    p.add_argument("--wrap", choices=("ddp", "fsdp"), default="ddp",
                   help="fsdp: FSDP2's fully_shard on every Linear and the model (MLP only)")
    p.add_argument("--emb-rows", type=int, default=10_000_000)
    p.add_argument("--emb-dim", type=int, default=64)
    args = p.parse_args(argv)

    import numpy as np
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    from scalefree._rss import peak_rss_bytes
    from .common import StragglerSchedule

    torch.set_num_threads(1)
    if args.backend == "scalefree":
        import scalefree.torch  # noqa: F401
    t0 = time.perf_counter()
    dist.init_process_group(args.backend)
    init_s = time.perf_counter() - t0
    rank, size = dist.get_rank(), dist.get_world_size()

    t0 = time.perf_counter()
    x_all = np.load(args.data, mmap_mode="r")
    y_all = np.load(args.labels, mmap_mode="r")
    total = args.warmup + args.steps
    rows = slice(rank * total * args.batch, (rank + 1) * total * args.batch)
    x_mine = torch.from_numpy(np.ascontiguousarray(x_all[rows]))
    y_mine = torch.from_numpy(np.ascontiguousarray(y_all[rows]).astype(np.float32 if args.model == "embedding"
                                                                          else np.int64))
    load_s = time.perf_counter() - t0

    torch.manual_seed(args.seed)
    exchange = None
    if args.model == "embedding":
        sparse = args.hook == "sparse"
        model = nn.Sequential(nn.Embedding(args.emb_rows, args.emb_dim, sparse=sparse), nn.Linear(args.emb_dim, 1))
        # The dense peer at its best: gradients are views of DDP's buckets (no copy into them).
        ddp = DDP(model, bucket_cap_mb=args.bucket_mb, gradient_as_bucket_view=not sparse)
        exchange = _ExchangeTimer()
        hook_state = None
        if args.backend == "scalefree" and sparse:
            from scalefree.torch import hooks

            hook_state = hooks.sparse()
            exchange.wrap(ddp, hook_state, hooks.sparse_hook)
        else:
            from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

            exchange.wrap(ddp, None, allreduce_hook)
    else:
        widths = [int(w) for w in args.widths.split(",")]
        layers = []
        for a, b in zip(widths[:-1], widths[1:]):
            layers += [nn.Linear(a, b), nn.ReLU()]
        model = nn.Sequential(*layers[:-1])
        if args.wrap == "fsdp":
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.fsdp import fully_shard

            mesh = init_device_mesh("cpu", (size,))
            for m in model:
                if isinstance(m, nn.Linear):
                    fully_shard(m, mesh=mesh)
            ddp = fully_shard(model, mesh=mesh)
        elif args.hook == "floor:compute":
            ddp = model  # no DDP: each rank's own gradients (the compute-only floor)
        else:
            ddp = DDP(model, bucket_cap_mb=args.bucket_mb)
        hook_state = None
        if args.hook == "floor:nocomm":
            ddp.register_comm_hook(None, _no_exchange)
        elif args.hook != "none" and not args.hook.startswith("floor:"):
            from scalefree.torch import hooks

            hook_state = hooks.register(ddp, args.hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr)
    sched = StragglerSchedule(args.delay_ms, args.seed, size) if args.delay_ms > 0 else None
    times, losses = [], []
    dist.barrier()
    for step in range(total):
        if step == args.warmup:
            dist.barrier()
            wall0 = time.perf_counter()
        t = time.perf_counter()
        if sched is not None:
            who, seconds = sched.straggler(step)
            if who == rank:
                time.sleep(seconds)
        xb = x_mine[step * args.batch:(step + 1) * args.batch]
        yb = y_mine[step * args.batch:(step + 1) * args.batch]
        opt.zero_grad(set_to_none=False)
        loss = _loss(nn, ddp, xb, yb, args.model)
        loss.backward()
        opt.step()
        if step >= args.warmup:
            times.append(time.perf_counter() - t)
            losses.append(loss.item())
            if exchange is not None:
                exchange.end_step()
        elif exchange is not None:
            exchange.reset()
    wall_s = time.perf_counter() - wall0
    finish_s = 0.0
    if hook_state is not None and hasattr(hook_state, "finish"):
        t0 = time.perf_counter()
        hook_state.finish()  # collective: deliver the contributions still in flight
        if args.hook.startswith("ssp:"):
            opt.step()  # the remainder finish() left in the gradients (every rank then on the same weights)
        finish_s = time.perf_counter() - t0
    # Loss on held-out rows (after every rank's training rows).
    held = slice(size * total * args.batch, size * total * args.batch + (args.heldout or 4 * args.batch))
    with torch.no_grad():
        xh = torch.from_numpy(np.ascontiguousarray(x_all[held]))
        yh = torch.from_numpy(np.ascontiguousarray(y_all[held]).astype(y_mine.numpy().dtype))
        heldout = float(_loss(nn, ddp if args.wrap == "fsdp" else model, xh, yh, args.model)) if len(xh) else float("nan")
    dist.barrier()
    dist.destroy_process_group()
    doc = {"rank": rank, "size": size, "backend": args.backend, "hook": args.hook, "init_s": init_s,
           "load_s": load_s, "finish_s": finish_s, "times_s": times, "losses": losses, "wall_s": wall_s, "heldout_loss": heldout,
           "peak_rss_bytes": peak_rss_bytes(), "params": sum(p.numel() for p in model.parameters()),  # global sizes (DTensor too)
           "exchange_s": exchange.per_step if exchange is not None else []}
    (args.out_dir / f"rank{rank}.json").write_text(json.dumps(doc))
    return 0


def _no_exchange(state, bucket):
    """A DDP comm hook that exchanges nothing: the bucket back as it is (DDP still copies the
    gradients into its buckets and out again: the floor of any backend's step)."""
    import torch

    fut = torch.futures.Future()
    fut.set_result(bucket.buffer())
    return fut


def _loss(nn, model, xb, yb, kind: str):
    if kind == "embedding":  # xb: row ids, yb: a target per id
        return nn.functional.mse_loss(model(xb.reshape(-1)).reshape(-1), yb.reshape(-1))
    return nn.functional.cross_entropy(model(xb), yb)


class _ExchangeTimer:
    """Wraps a DDP comm hook and keeps, per step, the wall time from the first bucket handed
    to the hook to the last bucket's result."""

    def __init__(self):
        import threading

        self._lock = threading.Lock()
        self._start = self._end = None
        self.per_step: list[float] = []

    def wrap(self, ddp, state, hook) -> None:
        def timed(st, bucket):
            t0 = time.perf_counter()
            with self._lock:
                if self._start is None:
                    self._start = t0
            fut = hook(st, bucket)

            def done(f):
                t1 = time.perf_counter()
                with self._lock:
                    self._end = t1 if self._end is None else max(self._end, t1)
                return f.value()

            return fut.then(done)

        ddp.register_comm_hook(state, timed)

    def end_step(self) -> None:
        with self._lock:
            if self._start is not None and self._end is not None:
                self.per_step.append(self._end - self._start)
            self._start = self._end = None

    def reset(self) -> None:
        with self._lock:
            self._start = self._end = None


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
