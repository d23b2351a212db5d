"""``scalefree ps train``: data-parallel training of a fully connected net with the parameter
server of :mod:`scalefree.tensors.ps` (1 server + N-1 workers), on synthetic data (throughput) or
scikit-learn's ``load_digits`` (a real accuracy curve). ``--transport local`` runs the same
model in one process on the same global batches (the baseline and the loss reference).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from .._rss import peak_rss_bytes
from .._units import human_bytes
from .common import count, number


def fcn_sizes(n_in: int, n_out: int, hidden=(2048, 2048, 2048)) -> list[int]:
    return [n_in, *hidden, n_out]


def init_params(sizes, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    p = {}
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        p[f"W{i}"] = (rng.standard_normal((a, b)) * np.sqrt(2.0 / a)).astype(np.float32)
        p[f"b{i}"] = np.zeros(b, np.float32)
    return p


def loss_and_grads(p: dict, x: np.ndarray, y: np.ndarray, n_layers: int, out: dict | None = None, on_grad=None):
    """Mean softmax cross-entropy and its gradients (written into ``out`` if given);
    ``on_grad(name, array)`` is called for each gradient as soon as it is final and the
    layer's weights are no longer needed (last layer first)."""
    acts = [x]
    h = x
    for i in range(n_layers):
        z = h @ p[f"W{i}"] + p[f"b{i}"]
        h = np.maximum(z, 0) if i < n_layers - 1 else z
        acts.append(h)
    z = acts[-1]
    z = z - z.max(axis=1, keepdims=True)
    e = np.exp(z)
    prob = e / e.sum(axis=1, keepdims=True)
    b = x.shape[0]
    loss = float(-np.log(prob[np.arange(b), y] + 1e-12).mean())
    d = prob
    d[np.arange(b), y] -= 1
    d /= b
    g = out if out is not None else {}
    for i in range(n_layers - 1, -1, -1):
        gW = acts[i].T @ d
        gb = d.sum(axis=0)
        if f"W{i}" in g:
            g[f"W{i}"][...] = gW
            g[f"b{i}"][...] = gb
        else:
            g[f"W{i}"], g[f"b{i}"] = gW, gb
        if i:
            d = (d @ p[f"W{i}"].T) * (acts[i] > 0)
        if on_grad:
            on_grad(f"W{i}", g[f"W{i}"])
            on_grad(f"b{i}", g[f"b{i}"])
    return loss, g


def accuracy(p: dict, x, y, n_layers: int) -> float:
    h = x
    for i in range(n_layers):
        h = h @ p[f"W{i}"] + p[f"b{i}"]
        if i < n_layers - 1:
            h = np.maximum(h, 0)
    return float((h.argmax(axis=1) == y).mean())


def load_data(kind: str, seed: int, n_in: int = 1024, n_out: int = 10, n: int = 16384):
    """(x_train, y_train, x_test, y_test, n_in, n_out)."""
    rng = np.random.default_rng(seed)
    if kind == "digits":
        try:
            from sklearn.datasets import load_digits
        except ImportError:
            raise SystemExit("--data digits needs scikit-learn (pip install scikit-learn)") from None
        d = load_digits()
        x = (d.data / 16.0).astype(np.float32)
        y = d.target.astype(np.int64)
        perm = rng.permutation(len(y))
        x, y = x[perm], y[perm]
        k = int(len(y) * 0.8)
        return x[:k], y[:k], x[k:], y[k:], x.shape[1], 10
    teacher = rng.standard_normal((n_in, n_out)).astype(np.float32)
    x = rng.standard_normal((n, n_in)).astype(np.float32)
    y = (x @ teacher).argmax(axis=1)
    k = n - 1024
    return x[:k], y[:k], x[k:], y[k:], n_in, n_out


def batches(n_train: int, global_batch: int, steps: int, seed: int):
    """The same global batch indices for every run (wrapping around epochs)."""
    rng = np.random.default_rng(seed + 7)
    order = np.concatenate([rng.permutation(n_train) for _ in range(steps * global_batch // n_train + 2)])
    return [order[t * global_batch:(t + 1) * global_batch] for t in range(steps)]


def train(args) -> dict:
    xtr, ytr, xte, yte, n_in, n_out = load_data(args.data, args.seed)
    sizes = fcn_sizes(n_in, n_out, hidden=tuple(args.hidden))
    L = len(sizes) - 1
    params = init_params(sizes, args.seed)
    workers = max(1, args.ranks - 1)
    gb = args.batch * workers
    plan = batches(len(ytr), gb, args.steps, args.seed)
    hist = []
    if args.transport == "local":
        t0 = time.perf_counter()
        g = {k: np.empty_like(v) for k, v in params.items()}
        for t, idx in enumerate(plan):
            loss, _ = loss_and_grads(params, xtr[idx], ytr[idx], L, g)
            for k in params:
                params[k] -= args.lr * g[k]
            hist.append((time.perf_counter() - t0, t + 1, loss, 0.0))
        return {"role": "local", "history": hist, "seconds": time.perf_counter() - t0,
                "accuracy": accuracy(params, xte, yte, L), "samples": args.steps * gb}
    import scalefree
    from scalefree.tensors.ps import ParameterServer

    group = scalefree.init()
    transport = None
    if args.transport in PEER_TRANSPORTS:
        transport = peer_transport(args.transport)
    # Backpropagation yields W_i, b_i for the last layer first.
    order = [k for i in range(L - 1, -1, -1) for k in (f"W{i}", f"b{i}")]
    ps = ParameterServer(group, params, lr=args.lr, order=order,
                         transport=transport(group, params, order) if transport else None,
                         mode="slots" if args.transport == "slots" else "auto",
                         trace=None if args.trace is None else args.trace == "on")
    group.barrier()
    t0 = time.perf_counter()
    if ps.is_server:
        ps.serve(args.steps)
        secs = time.perf_counter() - t0
        # The final weights, for the accuracy (the server has them all with one server).
        return {"role": "server", "seconds": secs, "peak_rss_bytes": peak_rss_bytes(),
                "accuracy": accuracy({k: np.array(v) for k, v in ps.params.items()}, xte, yte, L), "stats": ps.stats()}
    me = group.rank - 1
    grads = None
    comm = 0.0
    for t, idx in enumerate(plan):
        part = idx[me * args.batch:(me + 1) * args.batch]
        c0 = time.perf_counter()
        w = ps.pull()
        c1 = time.perf_counter()
        # Mapped: computed in the buffers the server reads. Otherwise where numpy puts
        # them: the parameter server stages what is not in registered memory (tracing the
        # allocation sites, so that from the next step on they are born there).
        grads = ps.grad_buffers() or None
        pushing = [0.0]

        def send(name, arr):
            s0 = time.perf_counter()
            ps.push_one(name, arr)
            pushing[0] += time.perf_counter() - s0

        loss, _ = loss_and_grads(w, xtr[part], ytr[part], L, grads, on_grad=send)
        c3 = time.perf_counter()
        comm += (c1 - c0) + pushing[0]
        hist.append((c3 - t0, t + 1, loss, (c1 - c0) + pushing[0]))
    w = ps.pull()  # the weights after the last step
    secs = time.perf_counter() - t0
    stats = ps.stats()
    return {"role": "worker", "peak_rss_bytes": peak_rss_bytes(), "history": hist, "seconds": secs, "comm_seconds": comm,
            "samples": args.steps * args.batch, "stats": stats, "trace": ps.trace,
            "bytes_copied_per_step": stats.get("bytes_copied", 0) / args.steps}


# Transports over the benchmark peers (torch.distributed gloo, gRPC): the benchmark harness
# (``benchmarks/``) provides them through the entry-point group ``scalefree.ps_transports``.
PEER_TRANSPORTS = ("gloo", "grpc", "grpc-stream")
_PEER_GROUP = "scalefree.ps_transports"


def peer_transport(name: str):
    """The transport class the harness registers as ``name``; without the harness, the error
    says how to install it."""
    from importlib.metadata import entry_points

    from scalefree.errors import InvalidArgumentError

    try:
        found = entry_points(group=_PEER_GROUP)
    except TypeError:  # Python 3.9: a dict of groups
        found = entry_points().get(_PEER_GROUP, ())
    for e in found:
        if e.name == name:
            return e.load()
    raise InvalidArgumentError(f"--transport {name} needs the benchmark harness: pip install ./benchmarks "
                               "(from the scalefree repository)")


def add_parser(sub):
    p = sub.add_parser("ps", help="parameter-server training over zero-copy tensor slots")
    s = p.add_subparsers(dest="ps_command", metavar="COMMAND")
    s.required = True
    t = s.add_parser("train", help="train a fully connected net with 1 server and N-1 workers",
                     formatter_class=argparse.ArgumentDefaultsHelpFormatter, description=__doc__)
    _args(t)
    t.set_defaults(func=cli_train)
    return p


def _args(p):
    p.add_argument("--model", choices=("fcn",), default="fcn")
    p.add_argument("-n", "--ranks", type=count(1), default=3, help="1 server + N-1 workers")
    p.add_argument("--data", choices=("synthetic", "digits"), default="synthetic")
    p.add_argument("--steps", type=count(1), default=100)
    p.add_argument("--batch", type=count(1), default=32, help="per worker")
    p.add_argument("--lr", type=number(0, low_open=True), default=0.05)
    p.add_argument("--hidden", type=count(1), nargs="+", default=[2048, 2048, 2048])
    p.add_argument("--transport", choices=("mapped", "slots", "gloo", "grpc", "grpc-stream", "local"), default="mapped",
                   help="mapped: no copies (shared memory); slots: static slots; local: one process; "
                   "gloo (torch.distributed), grpc, grpc-stream: the benchmark harness's peers (pip install ./benchmarks)")
    p.add_argument("--trace", choices=("on", "off"), default=None,
                   help="allocation-site tracing of the gradients pushed over slots (default: SCALEFREE_TRACE, on)")
    p.add_argument("--seed", type=count(0), default=0)
    p.add_argument("--out", help="write each rank's result to OUT.rank<r>.json")
    p.add_argument("--plot", help="PNG of loss vs time (rank 1's view)")


def cli_train(args) -> int:
    """Launches the ranks (unless already inside a job) and reports."""
    if args.transport in PEER_TRANSPORTS:
        peer_transport(args.transport)  # installed? (before any rank starts)
    if args.transport == "local" or os.environ.get("SCALEFREE_RANK") is not None:
        return _rank_main(args)
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory(prefix="scalefree-ps-") as tmp:
        out = str(Path(tmp) / "res")
        argv = [sys.executable, "-m", "scalefree.cli.ps", "--ranks", str(args.ranks), "--data", args.data,
                "--steps", str(args.steps), "--batch", str(args.batch), "--lr", repr(args.lr),
                "--transport", args.transport, "--seed", str(args.seed), "--out", out,
                *(["--trace", args.trace] if args.trace else []),
                "--hidden", *[str(h) for h in args.hidden]]
        # One BLAS thread per rank: the ranks share the cores.
        env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
        rc = subprocess.call([sys.executable, "-m", "scalefree.cli", "run", "-n", str(args.ranks), "--", *argv], env=env)
        if rc:
            return rc
        res = [json.loads(Path(f"{out}.rank{r}.json").read_text()) for r in range(args.ranks)]
    report(res, args)
    return 0


def report(res: list[dict], args) -> None:
    server, workers = res[0], res[1:]
    samples = sum(w["samples"] for w in workers)
    secs = max(w["seconds"] for w in workers)
    comm = [w["comm_seconds"] / w["seconds"] for w in workers]
    h = workers[0]["history"]
    print(f"ps train ({args.transport}): {args.steps} steps x {len(workers)} workers x batch {args.batch} in "
          f"{secs:.2f} s: {samples / secs:.0f} samples/s, {args.steps / secs:.1f} steps/s per worker, "
          f"communication {100 * max(comm):.0f} % of a worker's step; loss {h[0][2]:.3f} -> {h[-1][2]:.3f}; "
          f"test accuracy {server['accuracy']:.3f}; copied {human_bytes(round(max(w['bytes_copied_per_step'] for w in workers)))} "
          f"per step per worker (tracing {'on' if workers[0]['trace'] else 'off'})")
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 4))
        ax.plot([x[0] for x in h], [x[2] for x in h])
        ax.set_xlabel("seconds")
        ax.set_ylabel("training loss (worker 1's batches)")
        ax.set_title(f"parameter server, {len(workers)} workers ({args.data})")
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(args.plot, dpi=120)


def _rank_main(args) -> int:
    res = train(args)
    rank = int(os.environ.get("SCALEFREE_RANK", "0")) if args.transport != "local" else 0
    if args.out:
        from .._atomic import atomic_path

        with atomic_path(f"{args.out}.rank{rank}.json") as tmp:
            tmp.write_text(json.dumps(res))
    if args.transport == "local" and not args.out:
        h = res["history"]
        print(f"local: {args.steps} steps x batch {args.batch * max(1, args.ranks - 1)} in {res['seconds']:.2f} s: "
              f"{res['samples'] / res['seconds']:.0f} samples/s; loss {h[0][2]:.3f} -> {h[-1][2]:.3f}; "
              f"test accuracy {res['accuracy']:.3f}")
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    _args(p)
    return _rank_main(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
