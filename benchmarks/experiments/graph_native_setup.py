"""Times the native set-up kernels of ``scalefree graph pagerank`` against the numpy code
they replace, on one rank's share of a seeded R-MAT graph (default: 16M edges, ids < 2**22,
the share of rank 0 at 4 ranks of the 64M-edge scale-22 graph), single-threaded.

    flock /tmp/bench.lock env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE \\
        python benchmarks/experiments/graph_native_setup.py --scale 22 --edges 16M --ranks 4

Prints one line per step: numpy seconds, native seconds, speed-up (best of --repeat).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from scalefree import _native
from scalefree.graph.io import edge_owner
from scalefree.graph.rmat import rmat_blocks


CPU = []  # CPU seconds of the best-of runs, in call order


def best(fn, repeat):
    """(best wall seconds, result); the CPU seconds of that run go to CPU."""
    t = []
    out = None
    for _ in range(repeat):
        out = None
        t0, c0 = time.perf_counter(), time.process_time()
        out = fn()
        t.append((time.perf_counter() - t0, time.process_time() - c0))
    w, c = min(t)
    CPU.append(c)
    return w, out


def degree_keys(total, size):
    """Keys as vertex_keys hands them out: ids by falling degree, every size-th to one of
    the size key ranges. Returns (key uint32, order, nkeys)."""
    n = len(total)
    order = np.argsort(-total, kind="stable")
    width = -(-n // size)
    g = np.arange(n, dtype=np.uint32)
    key = np.empty(n, np.uint32)
    key[order] = (g % np.uint32(size)) * np.uint32(width) + g // np.uint32(size)
    return key, order, size * width


def numpy_partition(src, dst, size):
    pairs = np.empty((len(src), 2), np.uint32)
    pairs[:, 0] = src
    pairs[:, 1] = dst
    owner = edge_owner(pairs[:, 0], pairs[:, 1], size)
    order = np.argsort(owner, kind="stable")
    counts = np.bincount(owner, minlength=size)
    return pairs[order], counts


def numpy_dedup(got):
    key = got[:, 0].astype(np.uint64) << np.uint64(32) | got[:, 1].astype(np.uint64)
    key = np.unique(key)
    return (key >> np.uint64(32)).astype(np.uint32), (key & np.uint64(0xFFFFFFFF)).astype(np.uint32)


def numpy_dedup_sort(got):
    """The same with np.sort and a neighbour mask (np.unique of numpy 2.4 hashes instead)."""
    key = got[:, 0].astype(np.uint64) << np.uint64(32) | got[:, 1].astype(np.uint64)
    key.sort()
    keep = np.ones(len(key), np.bool_)
    np.not_equal(key[1:], key[:-1], out=keep[1:])
    key = key[keep]
    return (key >> np.uint64(32)).astype(np.uint32), (key & np.uint64(0xFFFFFFFF)).astype(np.uint32)


def numpy_degrees(src, dst, n):
    return np.concatenate([np.bincount(src, minlength=n), np.bincount(dst, minlength=n)]).astype(np.float64)


def numpy_local(src, dst, key, nkeys, own_lo_key, n_own):
    flow_key = nkeys
    sk, dk = key[src], key[dst]
    mark = np.zeros(nkeys + 1, np.bool_)
    mark[dk] = True
    mark[flow_key] = True
    out_keys = np.flatnonzero(mark)
    mark[:] = False
    mark[sk] = True
    mark[own_lo_key: own_lo_key + n_own] = True
    mark[flow_key] = True
    in_keys = np.flatnonzero(mark)
    slot = np.empty(nkeys + 1, np.uint32)
    slot[out_keys] = np.arange(len(out_keys), dtype=np.uint32)
    rows = slot[dk]
    slot[in_keys] = np.arange(len(in_keys), dtype=np.uint32)
    cols = slot[sk]
    del slot, sk, dk
    csr = _native.PageRankCsr(rows, cols, len(out_keys) - 1, len(in_keys), "float64")
    return csr, out_keys, in_keys


def count(text: str) -> int:
    text = text.upper()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    return int(text.rstrip("KMG")) * mult


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scale", type=int, default=22)
    p.add_argument("--edges", default="16M")
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeat", type=int, default=3)
    a = p.parse_args()
    n = 1 << a.scale
    parts = list(rmat_blocks(a.scale, count(a.edges), a.seed))  # int64, as the readers give them
    src = np.concatenate([q[0] for q in parts]).astype(np.int64)
    dst = np.concatenate([q[1] for q in parts]).astype(np.int64)
    del parts
    print(f"{len(src)} edges, ids < 2**{a.scale}, {a.ranks} owners, best of {a.repeat}")
    rows = []

    def row(name, t_np, t_nat):
        c_np, c_nat = CPU[-2], CPU[-1]
        rows.append((name, t_np, t_nat, c_np, c_nat))
        print(f"{name:38s} wall: numpy {t_np:7.3f} s native {t_nat:7.3f} s x{t_np / t_nat:5.1f}   "
              f"cpu: numpy {c_np:7.3f} s native {c_nat:7.3f} s x{c_np / c_nat:5.1f}", flush=True)

    t_np, (want, wc) = best(lambda: numpy_partition(src, dst, a.ranks), a.repeat)
    t_nat, (got, gc) = best(lambda: _native.owner_partition(src, dst, a.ranks), a.repeat)
    assert np.array_equal(got, want) and np.array_equal(gc, wc)
    row("owner partition (int64 in, u32 out)", t_np, t_nat)
    del want, got

    # What the owner receives: about a share of the edges, duplicates included.
    pairs = np.stack([src, dst], 1).astype(np.uint32)
    t_np, (ws, wd) = best(lambda: numpy_dedup(pairs), a.repeat)
    t_nat, (s, d) = best(lambda: _native.sort_dedup_pairs(pairs), a.repeat)
    assert np.array_equal(s, ws) and np.array_equal(d, wd)
    row("sort + dedup pairs (u32), np.unique", t_np, t_nat)
    t_np, (ws, wd) = best(lambda: numpy_dedup_sort(pairs), a.repeat)
    CPU.append(CPU.pop(-2))  # the native run's CPU seconds last again
    assert np.array_equal(s, ws) and np.array_equal(d, wd)
    row("sort + dedup pairs (u32), np.sort", t_np, t_nat)
    del pairs, ws, wd
    print(f"  {len(s)} distinct edges")

    t_np, want = best(lambda: numpy_degrees(s, d, n), a.repeat)
    t_nat, got = best(lambda: _native.degree_counts(s, d, n), a.repeat)
    assert np.array_equal(got, want)
    row("degree counts (vertex_keys bincounts)", t_np, t_nat)
    deg = got
    total = deg[:n] + deg[n:]
    t_np, want = best(lambda: np.argsort(-total, kind="stable"), a.repeat)
    t_nat, got = best(lambda: _native.degree_order(total), a.repeat)
    assert np.array_equal(got, want)
    row("degree order (vertex_keys argsort)", t_np, t_nat)
    key, order, nkeys = degree_keys(total, a.ranks)
    width = nkeys // a.ranks
    n_own = len(order[0::a.ranks])
    t_np, (csr0, ok0, ik0) = best(lambda: numpy_local(s, d, key, nkeys, 0, n_own), a.repeat)
    t_nat, (csr1, ok1, ik1) = best(lambda: _native.PageRankCsr.from_edges(s, d, key, nkeys, 0, n_own, "float64"),
                                   a.repeat)
    assert np.array_equal(ok0, ok1) and np.array_equal(ik0, ik1) and csr0.nnz == csr1.nnz
    y0, y1 = np.zeros(len(ok0)), np.zeros(len(ok0))
    g, inv = np.random.default_rng(0).random(len(ik0)), np.ones(len(ik0))
    csr0.step(g, inv, 0.1, 0.85, y0)
    csr1.step(g, inv, 0.1, 0.85, y1)
    assert np.array_equal(y0, y1)
    row("local slots + CSR (from_edges)", t_np, t_nat)
    _ = width
    rows = [r for r in rows if "np.unique" not in r[0]]  # totals against the faster numpy
    tn, tt, cn, ct = (sum(r[i] for r in rows) for i in (1, 2, 3, 4))
    print(f"{'total':38s} wall: numpy {tn:7.3f} s native {tt:7.3f} s x{tn / tt:5.1f}   "
          f"cpu: numpy {cn:7.3f} s native {ct:7.3f} s x{cn / ct:5.1f}")


if __name__ == "__main__":
    main()
