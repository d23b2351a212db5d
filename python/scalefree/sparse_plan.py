"""``scalefree sparse plan``: a cost model of the sparse allreduce's butterfly.

For each candidate layer-degree list ``k1 x ... x kd`` (product = ranks) it predicts, per
layer, the keys a node holds, the packet size per peer, and the time of one reduce
(down and up), beside the allgather schemes and a dense allreduce. Model: each rank holds
``nnz`` distinct keys spread uniformly over ``[0, dim)`` by the index hash; after a layer
that has combined ``K`` ranks' data a node holds the union restricted to ``1/K`` of the
space, ``(dim/K) * (1 - (1 - nnz/dim)^K)`` keys (the paper's section IV); a layer of degree
``k`` costs ``(k - 1)`` messages of ``latency + packet / bandwidth`` each way. The union
formula assumes independent uniform index sets — power-law sets overlap more, so the model
overestimates the keys of lower layers (it is pessimistic for the butterfly).
"""

from __future__ import annotations

import argparse


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("sparse", help="sparse allreduce tools (plan: cost model of layer degrees)")
    s = p.add_subparsers(dest="sparse_command", metavar="COMMAND")
    s.required = True
    q = s.add_parser("plan", help="predicted packet sizes and times per degree configuration",
                     description=__doc__, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    q.add_argument("--ranks", type=int, required=True)
    q.add_argument("--nnz", type=float, required=True, help="distinct indices per rank")
    q.add_argument("--dim", type=float, required=True, help="index space")
    q.add_argument("--value-bytes", type=int, default=4, help="bytes per value (float32: 4)")
    q.add_argument("--latency-us", type=float, default=5.0, help="per-message latency")
    q.add_argument("--bandwidth-gbps", type=float, default=5.0, help="per-rank bandwidth, GB/s")
    q.add_argument("--top", type=int, default=12, help="configurations to print, best first")
    q.set_defaults(func=run)
    return p


def factorizations(n: int, largest: int | None = None) -> list[tuple[int, ...]]:
    """Every ordered list of degrees >= 2 whose product is n."""
    if n == 1:
        return [()]
    out = []
    for k in range(2, n + 1):
        if n % k == 0:
            for rest in factorizations(n // k):
                out.append((k,) + rest)
    return out


def predict(degrees, ranks, nnz, dim, vb, lat_s, bw):
    """Per layer (degree, keys before, packet bytes, seconds) and the total of one reduce."""
    layers, total = [], 0.0
    combined = 1
    keys = nnz
    for k in degrees:
        packet = keys / k * vb
        t = 2 * (k - 1) * (lat_s + packet / bw)
        layers.append((k, keys, packet, t))
        total += t
        combined *= k
        keys = dim / combined * (1 - (1 - min(nnz / dim, 1.0)) ** combined)
    return layers, total


def run(args) -> int:
    n, nnz, dim, vb = args.ranks, args.nnz, args.dim, args.value_bytes
    if n < 1 or nnz < 0 or dim < 1:
        raise SystemExit("scalefree sparse plan: --ranks >= 1, --nnz >= 0 and --dim >= 1 are required")
    lat, bw = args.latency_us * 1e-6, args.bandwidth_gbps * 1e9
    cands = sorted(((predict(d, n, nnz, dim, vb, lat, bw), d) for d in factorizations(n)), key=lambda x: x[0][1])
    print(f"ranks {n}, nnz {nnz:.0f}/rank, dim {dim:.0f}, {vb}-byte values, latency {args.latency_us} µs, "
          f"{args.bandwidth_gbps} GB/s")
    print(f"{'degrees':<16}{'reduce':>12}   per layer: degree keys->packet")
    for (layers, total), d in cands[: args.top]:
        desc = "  ".join(f"{k}:{keys:.3g}->{pk / 1024:.1f}KiB" for k, keys, pk, _ in layers)
        print(f"{'x'.join(map(str, d)) or '-':<16}{total * 1e3:>10.3f} ms   {desc}")
    ag = (n - 1) * (lat + nnz * (8 + vb) / bw)
    once = (n - 1) * (lat + nnz * vb / bw)
    dense = 2 * (n - 1) * (lat + dim / n * vb / bw)
    print(f"{'allgatherv':<16}{ag * 1e3:>10.3f} ms   (index, value) pairs from every rank, before the merge")
    print(f"{'indices-once':<16}{once * 1e3:>10.3f} ms   values from every rank, before the merge")
    print(f"{'dense':<16}{dense * 1e3:>10.3f} ms   ring allreduce of the dim-long vector")
    return 0
