"""Sparse allreduce equals a dense numpy reference for every op x dtype, index-set shape,
world size 1-6 (incl. primes) and several degree configurations, with real rank processes."""

import pytest

from ranks import run_ranks

SWEEP = r"""
import numpy as np, scalefree, sys
g = scalefree.init(timeout=60)
me, n = g.rank, g.size
DEGREES = eval(sys.argv[1])
OPS = {"sum": np.add, "max": np.maximum, "min": np.minimum, "or": np.bitwise_or}
IDENT = {"sum": lambda dt: 0, "or": lambda dt: 0,
         "max": lambda dt: -np.inf if np.dtype(dt).kind == "f" else np.iinfo(dt).min,
         "min": lambda dt: np.inf if np.dtype(dt).kind == "f" else np.iinfo(dt).max}
CASES = ["random", "empty", "dup", "distinct", "one_empty"]

def indices(kind, rank, dim, rng):
    if kind == "empty":
        return np.zeros(0, np.int64)
    if kind == "one_empty" and rank == n - 1:
        return np.zeros(0, np.int64)
    if kind == "dup":
        return np.full(int(rng.integers(1, 50)), int(rng.integers(0, dim)), np.int64)
    if kind == "distinct":
        return rng.permutation(dim)[: int(rng.integers(0, dim))].astype(np.int64)
    # Zipf-like with duplicates
    m = int(rng.integers(0, 3 * dim))
    return np.minimum(rng.zipf(1.3, m) - 1, dim - 1).astype(np.int64)

checked = 0
for degrees in DEGREES:
    for op, f in OPS.items():
        dtypes = ["uint32", "uint64"] if op == "or" else ["float32", "float64", "int32", "int64"]
        for dt in dtypes:
            for case in CASES:
                for width in (1, 3):
                    dim = 1 + (checked * 37) % 400
                    seed = [checked, 99]
                    outs, vals, ins = [], [], []
                    for r in range(n):
                        rng = np.random.default_rng(seed + [r])
                        o = indices(case, r, dim, rng)
                        shape = (len(o),) if width == 1 else (len(o), width)
                        v = rng.integers(0, 1000, shape).astype(dt)
                        i = rng.integers(0, dim, int(rng.integers(0, 2 * dim))).astype(np.int64)
                        outs.append(o); vals.append(v); ins.append(i)
                    dense = np.full((dim,) + vals[0].shape[1:], IDENT[op](dt), dtype=dt)
                    for r in range(n):
                        if op == "sum":
                            np.add.at(dense, outs[r], vals[r])
                        else:
                            f.at(dense, outs[r], vals[r])
                    want = dense[ins[me]]
                    sa = g.sparse_allreduce(dim, op=op, degrees=degrees)
                    sa.config(outs[me], ins[me])
                    for rep in range(2):
                        got = sa.reduce(vals[me])
                        np.testing.assert_array_equal(got, want, err_msg=f"{degrees} {op} {dt} {case} w{width}")
                    got2 = g.sparse_allreduce(dim, op=op, degrees=degrees).config_reduce(outs[me], vals[me], ins[me])
                    np.testing.assert_array_equal(got2, want, err_msg=f"config_reduce {degrees} {op} {dt} {case}")
                    checked += 1
print("checked", checked)
"""

CONFIGS = {
    1: ["auto", [1]],
    2: ["auto", [2]],
    3: [[3]],
    4: [[4], [2, 2]],
    5: [[5]],
    6: [[2, 3], [3, 2], [6]],
}


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 6])
def test_sparse_matches_dense_reference(n):
    code = SWEEP.replace("eval(sys.argv[1])", repr(CONFIGS[n]))
    res = run_ranks(n, code, timeout=120)
    assert "checked" in res[0].stdout
