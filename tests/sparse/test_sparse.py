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


@pytest.mark.parametrize("threshold", ["0", "1e9"])
def test_sparse_dense_segments_forced_on_and_off(threshold):
    """Every range dense from the first layer, or never dense: same results."""
    code = SWEEP.replace("eval(sys.argv[1])", repr([[2, 2]]))
    res = run_ranks(4, code, timeout=120, extra_env={"SCALEFREE_SPARSE_DENSE": threshold})
    assert "checked" in res[0].stdout


ERRORS = r"""
import numpy as np, scalefree
from scalefree.errors import InvalidArgumentError, MismatchError
g = scalefree.init(timeout=20)
me, n = g.rank, g.size
sa = g.sparse_allreduce(100)
# out-of-range index on rank 1 only: every rank raises, nobody hangs
bad = np.array([5, 100 if me == 1 else 7], np.int64)
try:
    sa.config(bad, np.arange(3))
    raise SystemExit("no error")
except InvalidArgumentError as e:
    assert ("outside [0, dim=100)" in str(e)) == (me == 1), str(e)
# negative index
try:
    sa.config(np.array([-1]), np.arange(3))
    raise SystemExit("no error")
except InvalidArgumentError as e:
    assert "outside" in str(e)
sa.config(np.arange(10), np.arange(10))
# mismatched dtype across ranks
try:
    sa.reduce(np.ones(10, np.float32 if me == 0 else np.float64))
    raise SystemExit("no error")
except MismatchError as e:
    assert "float32" in str(e) and "float64" in str(e), str(e)
# wrong length (caught before the native call, on one rank only: the others see it)
sa.reduce(np.ones(10, np.float32))
try:
    sa.reduce(np.ones(9 if me == 0 else 10, np.float32))
    raise SystemExit("no error")
except InvalidArgumentError as e:
    assert ("out_values holds 36 bytes" in str(e)) == (me == 0), str(e)
try:
    g.sparse_allreduce(10).config_reduce(np.arange(3), np.ones(2 if me == 1 else 3), np.arange(3))
    raise SystemExit("no error")
except InvalidArgumentError as e:
    pass
# dim / op mismatch
try:
    g.sparse_allreduce(100 + me).config(np.arange(3), np.arange(3))
    raise SystemExit("no error")
except MismatchError as e:
    assert "dim=100" in str(e)
try:
    g.sparse_allreduce(10, op="sum" if me else "max").config(np.arange(3), np.arange(3))
    raise SystemExit("no error")
except MismatchError as e:
    pass
# or on floats is refused
try:
    g.sparse_allreduce(10, op="or").config_reduce(np.arange(3), np.ones(3), np.arange(3))
    raise SystemExit("no error")
except InvalidArgumentError as e:
    assert "uint" in str(e)
# degrees that do not multiply to the group size
try:
    g.sparse_allreduce(10, degrees=[n + 1])
    raise SystemExit("no error")
except InvalidArgumentError as e:
    assert "multiply" in str(e)
# still usable afterwards, many reduces on one config
sa = g.sparse_allreduce(1000, degrees=[n])
idx = np.arange(me, 1000, n)
sa.config(idx, np.arange(1000))
for it in range(50):
    got = sa.reduce(np.full(len(idx), it, np.int64))
    assert (got == it).all()
print("ok")
"""


@pytest.mark.parametrize("n", [2, 3])
def test_sparse_errors_not_hangs(n):
    res = run_ranks(n, ERRORS, timeout=60)
    assert all("ok" in r.stdout for r in res)


LARGE = r"""
import numpy as np, scalefree
g = scalefree.init(timeout=60)
me, n = g.rank, g.size
dim = 10_000_000
rng = np.random.default_rng(me)
out = np.minimum(rng.zipf(1.1, 200_000) - 1, dim - 1)
vals = rng.random((len(out), 2)).astype(np.float64)
ins = rng.integers(0, dim, 100_000)
sa = g.sparse_allreduce(dim, degrees=[2, 2] if n == 4 else "auto")
sa.config(out, ins)
got = sa.reduce(vals)
want = np.zeros((dim, 2))
for r in range(n):
    rr = np.random.default_rng(r)
    o = np.minimum(rr.zipf(1.1, 200_000) - 1, dim - 1)
    np.add.at(want, o, rr.random((len(o), 2)))
np.testing.assert_allclose(got, want[ins], rtol=1e-12)
st = sa.stats()
assert len(st) == len(sa.degrees) and all(s["bytes_sent"] > 0 for s in st)
print("ok")
"""


def test_sparse_large_zipf_four_ranks():
    res = run_ranks(4, LARGE, timeout=120)
    assert all("ok" in r.stdout for r in res)


def test_plan_cli_prints_every_factorization():
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "scalefree.cli", "sparse", "plan", "--ranks", "12", "--nnz", "1000",
                          "--dim", "100000", "--top", "100"], capture_output=True, text=True, check=True).stdout
    rows = [l.split()[0] for l in out.splitlines()[2:] if l and l[0].isdigit()]
    # ordered factorizations of 12: 12, 2x6, 6x2, 3x4, 4x3, 2x2x3, 2x3x2, 3x2x2
    assert sorted(rows) == sorted(["12", "2x6", "6x2", "3x4", "4x3", "2x2x3", "2x3x2", "3x2x2"])
    assert "indices-once" in out and "dense" in out


def test_bench_sparse_smoke(tmp_path):
    import json
    import subprocess
    import sys

    out = tmp_path / "r.json"
    subprocess.run([sys.executable, "-m", "scalefree.cli", "bench", "sparse", "-n", "2", "--dim", "20000",
                    "--nnz", "500", "--vs", "none", "--min-calls", "2", "--target-seconds", "0.01",
                    "--warmup", "1", "--json", str(out)], check=True, capture_output=True, text=True, timeout=120)
    recs = json.loads(out.read_text())
    assert {r["variant"] for r in recs} == {"config", "reduce", "config_reduce"}
    assert all(r["median_s"] > 0 for r in recs)


def test_bench_sparse_mpi_peers_smoke(tmp_path):
    """The MPI peers run and agree (each worker checks indices-once against allgatherv +
    merge and exits non-zero if they differ)."""
    import json
    import subprocess
    import sys

    pytest.importorskip("mpi4py")
    from scalefree_bench import common

    if common.find_mpiexec() is None:
        pytest.skip("no mpiexec")
    out = tmp_path / "r.json"
    subprocess.run([sys.executable, "-m", "scalefree.cli", "bench", "sparse", "-n", "3", "--dim", "20000",
                    "--nnz", "700", "--vs", "mpi", "--min-calls", "2", "--target-seconds", "0.01",
                    "--warmup", "1", "--json", str(out)], check=True, capture_output=True, text=True, timeout=300)
    recs = json.loads(out.read_text())
    assert {(r["impl"], r["variant"]) for r in recs} >= {("scalefree", "reduce"), ("mpi", "indices-once"),
                                                         ("mpi", "allgatherv"), ("mpi", "dense")}
    assert all(r["median_s"] > 0 for r in recs)


UNHASHED = r"""
import numpy as np, scalefree
g = scalefree.init(timeout=60)
me, n = g.rank, g.size
checked = 0
for degrees in ["auto"] + ([[2, 2]] if n == 4 else []):
    for dt in ["float32", "float64", "int64"]:
        for width in (1, 3):
            for case in ["sorted", "unsorted", "empty", "mine_empty"]:
                dim = 1 + (checked * 53) % 700
                outs, vals, ins = [], [], []
                for r in range(n):
                    rng = np.random.default_rng([checked, r])
                    o = np.flatnonzero(rng.random(dim) < 0.4).astype(np.int64)
                    i = np.flatnonzero(rng.random(dim) < 0.5).astype(np.int64)
                    if case == "unsorted":
                        o, i = rng.permutation(o), np.concatenate([i, i[:3]])
                    if case == "empty" or (case == "mine_empty" and r == n - 1):
                        o = o[:0]
                    shape = (len(o),) if width == 1 else (len(o), width)
                    outs.append(o); vals.append(rng.integers(0, 1000, shape).astype(dt)); ins.append(i)
                dense = np.zeros((dim,) + vals[0].shape[1:], dt)
                for r in range(n):
                    np.add.at(dense, outs[r], vals[r])
                sa = g.sparse_allreduce(dim, degrees=degrees, hash=False)
                sa.config(outs[me], ins[me])
                out = np.empty((len(ins[me]),) + vals[me].shape[1:], dt)
                for rep in range(3):
                    got = sa.reduce(vals[me], out=out)
                    np.testing.assert_array_equal(got, dense[ins[me]], err_msg=f"{degrees} {dt} w{width} {case}")
                got2 = g.sparse_allreduce(dim, degrees=degrees, hash=False).config_reduce(outs[me], vals[me], ins[me])
                np.testing.assert_array_equal(got2, dense[ins[me]])
                checked += 1
print("checked", checked)
"""


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_sparse_unhashed_in_key_order(n):
    """hash=False: ascending distinct indices take the copy-free paths (values sent from the
    caller's buffer, result written into it); the same answers as the dense reference."""
    res = run_ranks(n, UNHASHED, timeout=120)
    assert "checked" in res[0].stdout


DIRECT = r"""
import numpy as np, scalefree
g = scalefree.init(timeout=60)
me, n = g.rank, g.size
checked = 0
# Sizes 0 / 1 / odd / large (the large values lie in the arena and are read in place, the
# small ones are copied into key order), hashed and not, 1-D and 2-D, and a result that
# overwrites the values (out=values).
for nnz in (0, 1, 777, 150_001):
    for hash_ in (True, False):
        for dt, width in (("float32", 1), ("float64", 1), ("int64", 2), ("uint32", 1)):
            dim = 3 * 150_001 + 7
            outs, vals, ins = [], [], []
            for r in range(n):
                rng = np.random.default_rng([nnz, r, 5])
                o = rng.permutation(dim)[:nnz].astype(np.int64) if r % 2 == 0 or nnz < 2 else np.sort(rng.choice(dim, nnz))
                shape = (len(o),) if width == 1 else (len(o), width)
                outs.append(o)
                vals.append(rng.integers(0, 1000, shape).astype(dt))
                ins.append(o.copy() if r % 3 == 0 else rng.integers(0, dim, nnz // 2 + 1))
            dense = np.zeros((dim,) + vals[0].shape[1:], dtype=dt)
            for r in range(n):
                np.add.at(dense, outs[r], vals[r])
            sa = g.sparse_allreduce(dim, hash=hash_)
            sa.config(outs[me], ins[me])
            for rep in range(3):
                v = vals[me] * (rep + 1)
                got = sa.reduce(v)
                np.testing.assert_array_equal(got, dense[ins[me]] * (rep + 1), err_msg=f"{nnz} {hash_} {dt} {width} rep {rep}")
                checked += 1
            if me % 3 == 0:
                # In place: the result written over the values peers read.
                v = vals[me].copy()
                got = sa.reduce(v, out=v)
            else:
                got = sa.reduce(vals[me])
            np.testing.assert_array_equal(got, dense[ins[me]], err_msg=f"in place {nnz} {hash_} {dt}")
print("checked", checked)
"""


@pytest.mark.parametrize("arena", ["1", "0"])
@pytest.mark.parametrize("n", [1, 2, 3, 4, 5])
def test_sparse_direct_reduce(n, arena):
    """The reduce after config of a one-layer butterfly (values pulled by saved maps, read
    in place from the arena or from a key-ordered copy) equals the numpy reference, repeated
    and with the result written over the values."""
    res = run_ranks(n, DIRECT, timeout=240, extra_env={"SCALEFREE_ARENA": arena})
    assert "checked" in res[0].stdout


INDICES_ONCE = r"""
import numpy as np, sys
from mpi4py import MPI
from scalefree_bench.sparse import IndicesOnce
comm = MPI.COMM_WORLD
me, n = comm.Get_rank(), comm.Get_size()
for nnz in (0, 1, 5, 1001):
    dim = 3 * nnz + 2
    outs, vals, ins = [], [], []
    for r in range(n):
        rng = np.random.default_rng([nnz, r])
        outs.append(rng.permutation(dim)[:nnz].astype(np.int64))
        vals.append(rng.integers(0, 100, nnz).astype(np.float32))
        ins.append(rng.integers(0, dim, nnz + 3).astype(np.int64))   # repeats, misses
    dense = np.zeros(dim, np.float64)
    for r in range(n):
        np.add.at(dense, outs[r], vals[r])
    plan = IndicesOnce.config(comm, MPI, outs[me], ins[me])
    for kernel in ("csr", "bincount"):
        if kernel == "bincount":
            plan.matrix = None
        np.testing.assert_array_equal(plan.reduce(vals[me]), dense[ins[me]].astype(np.float32), err_msg=f"{nnz} {kernel}")
print("checked")
"""


@pytest.mark.parametrize("n", [1, 3])
def test_bench_indices_once_peer_matches_reference(n, tmp_path):
    """The bench's lean indices-once MPI peer (both kernels) against numpy, with repeated and
    unmatched requested indices."""
    import subprocess
    import sys

    pytest.importorskip("mpi4py")
    from scalefree_bench import common

    mpiexec = common.find_mpiexec()
    if mpiexec is None:
        pytest.skip("no mpiexec")
    script = tmp_path / "io.py"
    script.write_text(INDICES_ONCE)
    res = subprocess.run(common.mpiexec_cmd(mpiexec, n, [sys.executable, str(script)]), capture_output=True, text=True,
                         timeout=120, env={**__import__("os").environ, **common.mpi_env()})
    assert res.returncode == 0, res.stdout + res.stderr
    assert "checked" in res.stdout


# Ids past 2^32 (and one at the top of the space) for `nodes` data nodes, each its own draw of
# `extra` more (the same seeds everywhere); their values, the summed reference and the ids node
# `me` asks for. A rank script sets numpy as np, nodes, me and extra first.
WIDE_DATA = r"""
dim = 1 << 40
def ids(node):
    rng = np.random.default_rng([7, node])
    base = np.array([1 << 32, (1 << 33) + 5, (1 << 39) + 12345, dim - 1], np.int64)
    return np.concatenate([base, (1 << 32) + rng.integers(0, 1 << 36, extra)]).astype(np.int64)
def vals(node):
    return np.random.default_rng([8, node]).integers(0, 1000, len(ids(node))).astype(np.float64)
want_ids = np.unique(np.concatenate([ids(k) for k in range(nodes)]))
ref = {int(i): 0.0 for i in want_ids}
for k in range(nodes):
    for i, v in zip(ids(k), vals(k)):
        ref[int(i)] += v
ins = want_ids[(np.arange(len(want_ids)) + me) % 3 == 0]
"""

WIDE_IDS = r"""
import numpy as np, scalefree
g = scalefree.init(timeout=60)
me, n = g.rank, g.size
nodes, extra = n, 500
""" + WIDE_DATA + r"""
for degrees in ("auto", [n]):
    sa = g.sparse_allreduce(dim, op="sum", degrees=degrees)
    sa.config(ids(me), ins)
    got = sa.reduce(vals(me))
    np.testing.assert_array_equal(got, np.array([ref[int(i)] for i in ins]))
print("ok")
"""


@pytest.mark.parametrize("n", [1, 3])
def test_sparse_ids_past_2_to_the_32(n):
    res = run_ranks(n, WIDE_IDS, timeout=120)
    assert all(r.stdout.strip().endswith("ok") for r in res)
