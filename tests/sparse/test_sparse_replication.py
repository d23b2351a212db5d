"""Sparse allreduce with replication=r: r replicas of size/r logical nodes give the dense
reference's answer, keep giving it after a replica is killed mid-PageRank, and raise (not
hang) once every replica of a logical node is gone; ``scalefree run --allow-rank-failure``."""

import subprocess
import sys

import pytest

from ranks import TESTS_DIR, collect, spawn_ranks, run_ranks
from test_sparse import WIDE_DATA

REDUCE = r"""
import numpy as np, scalefree, sys
g = scalefree.init(timeout=60)
R = int(sys.argv[1])
M = g.size // R
me = g.rank % M
checked = 0
for dt in ["float32", "float64", "int64"]:
    for width in (1, 3):
        for case in ["random", "empty_node"]:
            dim = 1 + (checked * 71) % 500
            outs, vals, ins = [], [], []
            for node in range(M):  # replicas of a node pass the same data
                rng = np.random.default_rng([checked, node])
                o = rng.integers(0, dim, int(rng.integers(0, 2 * dim))).astype(np.int64)
                if case == "empty_node" and node == M - 1:
                    o = o[:0]
                i = rng.integers(0, dim, int(rng.integers(0, dim))).astype(np.int64)
                shape = (len(o),) if width == 1 else (len(o), width)
                outs.append(o); vals.append(rng.integers(0, 100, shape).astype(dt)); ins.append(i)
            dense = np.zeros((dim,) + vals[0].shape[1:], dt)
            for node in range(M):
                np.add.at(dense, outs[node], vals[node])
            sa = g.sparse_allreduce(dim, replication=R)
            sa.config(outs[me], ins[me])
            for rep in range(3):
                np.testing.assert_array_equal(sa.reduce(vals[me]), dense[ins[me]], err_msg=f"{dt} w{width} {case}")
            got = g.sparse_allreduce(dim, replication=R).config_reduce(outs[me], vals[me], ins[me])
            np.testing.assert_array_equal(got, dense[ins[me]])
            checked += 1
print("checked", checked, "logical", M, "degrees", sa.degrees)
"""


@pytest.mark.parametrize("n,r", [(2, 2), (4, 2), (6, 2), (6, 3)])
def test_replicated_matches_dense_reference(n, r):
    res = collect(spawn_ranks(n, REDUCE, args=[str(r)]), 120)
    for x in res:
        assert x.returncode == 0, x.stderr[-3000:]
    assert f"logical {n // r}" in res[0].stdout


PAGERANK = f"TESTS_DIR = {TESTS_DIR!r}\n" + r"""
import os, signal, sys, numpy as np, scalefree
from scalefree.graph.io import logical_rank
from scalefree.graph.pagerank import SparsePageRank
from scalefree.graph.io import partition_edges
from scalefree.graph.rmat import rmat_edges
g = scalefree.init(timeout=60)
R, kill = 2, [int(x) for x in sys.argv[1].split(",")]
me, M = logical_rank(g, R)
src, dst, ids = rmat_edges(11, 30000, seed=3)
n = len(ids)
s, d = partition_edges(src, dst, me, M)
pr = SparsePageRank(g, s, d, n, replication=R)
ITERS = 30
for it in range(ITERS):
    if g.rank in kill and it == 5:
        os.kill(os.getpid(), signal.SIGKILL)
    pr.step()
sys.path.insert(0, TESTS_DIR)
from ranks import pagerank_reference
r = pagerank_reference(src, dst, n, ITERS)
err = np.abs(pr.scores - r[pr.owned]).max()
assert err < 1e-12, err
print("ok", g.rank, err)
"""


@pytest.mark.parametrize("killed", [0, 3])
def test_pagerank_survives_a_killed_replica(killed):
    """r = 2 on 4 ranks (2 logical nodes); one rank is SIGKILLed at iteration 5 of 30: every
    survivor finishes with the dense reference's scores for its vertices."""
    res = collect(spawn_ranks(4, PAGERANK, args=[str(killed)]), 120)
    for x in res:
        if x.rank == killed:
            assert x.returncode == -9
        else:
            assert x.returncode == 0, x.stderr[-3000:]
            assert f"ok {x.rank}" in x.stdout


def test_every_replica_of_a_node_dead_raises():
    """Both replicas of logical node 1 die: the others raise PeerLostError, they do not hang."""
    code = PAGERANK.replace("pr.step()", "\n    try:\n        pr.step()\n    except scalefree.errors.PeerLostError as e:\n"
                            "        print('lost', g.rank, e); sys.exit(3)")
    res = collect(spawn_ranks(4, code, args=["1,3"]), 120)
    for x in res:
        if x.rank in (1, 3):
            assert x.returncode == -9
        else:
            assert x.returncode == 3 and f"lost {x.rank}" in x.stdout, x.stderr[-3000:]


def test_replication_must_divide_the_group():
    code = r"""
import scalefree
from scalefree.errors import InvalidArgumentError
g = scalefree.init(timeout=30)
try:
    g.sparse_allreduce(10, replication=2)
except InvalidArgumentError as e:
    assert "divide" in str(e); print("raised")
"""
    assert "raised" in run_ranks(3, code)[0].stdout


LAUNCHED = r"""
import os, signal, sys, time
rank = int(os.environ["SCALEFREE_RANK"])
if rank == 1:
    os.kill(os.getpid(), signal.{how})
time.sleep(0.5)
print("finished", rank)
"""


@pytest.mark.parametrize("how,code", [("SIGKILL", 0), ("SIGTERM", 0)])
def test_run_allow_rank_failure_keeps_the_others(how, code):
    p = subprocess.run([sys.executable, "-m", "scalefree.cli", "run", "-n", "3", "--allow-rank-failure", "--timeout", "60",
                        "--", sys.executable, "-c", LAUNCHED.replace("{how}", how)],
                       capture_output=True, text=True, timeout=90)
    assert p.returncode == code, p.stderr
    assert "[0] finished 0" in p.stdout and "[2] finished 2" in p.stdout
    assert "keep running (--allow-rank-failure)" in p.stderr


def test_run_allow_rank_failure_error_exit_fails_the_job():
    script = "import os, sys; sys.exit(5 if os.environ['SCALEFREE_RANK'] == '2' else 0)"
    p = subprocess.run([sys.executable, "-m", "scalefree.cli", "run", "-n", "3", "--allow-rank-failure", "--",
                        sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert p.returncode == 5


def test_replicated_dtype_disagreement_raises_not_hangs():
    """Replicated reduces skip the group-wide check: a logical node that sends float32 where
    the other reads float64 is caught from the message length (or by the peer's death)."""
    code = r"""
import numpy as np, scalefree, sys
from scalefree.errors import MismatchError, PeerLostError
g = scalefree.init(timeout=30)
me = g.rank % 2
sa = g.sparse_allreduce(100, replication=2)
sa.config(np.arange(50, dtype=np.int64), np.arange(100, dtype=np.int64))
try:
    sa.reduce(np.ones(50, np.float64 if me == 0 else np.float32))
except (MismatchError, PeerLostError) as e:
    print("raised", type(e).__name__); sys.exit(0)
print("no error"); sys.exit(0)
"""
    res = collect(spawn_ranks(4, code), 120)
    assert all(x.returncode == 0 for x in res), [x.stderr[-500:] for x in res]
    assert any("raised MismatchError" in x.stdout for x in res)


def test_bench_pagerank_replicated_smoke(tmp_path):
    """The bench end to end on a tiny graph: both rows, the killed rank counted out, scores
    equal to scipy's (no timing asserted)."""
    import json

    out = tmp_path / "r.json"
    p = subprocess.run([sys.executable, "-m", "scalefree.cli", "bench", "pagerank-replicated", "--logical", "2",
                        "--replication", "2", "--kill-rank", "3", "--kill-at", "3", "--iters", "8", "--rmat-scale", "10",
                        "--rmat-edges", "8K", "--dtype", "float64", "--json", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    recs = {r["variant"]: r for r in json.loads(out.read_text())}
    assert set(recs) == {"unreplicated", "unreplicated 4", "r=2"}
    assert recs["unreplicated"]["survivors"] == 2 and recs["r=2"]["survivors"] == 3
    assert recs["unreplicated 4"]["survivors"] == 4 and recs["unreplicated 4"]["replication"] == 1
    assert all(r["cpu_s_per_iter"] > 0 and r["comm_s"] >= 0 for r in recs.values())
    assert all(r["max_abs_err"] < 1e-12 and r["median_s"] > 0 for r in recs.values())
    assert "vs unreplicated" in p.stdout


WIDE_REPLICATED = r"""
import numpy as np, scalefree
g = scalefree.init(timeout=60)
R = 2
M = g.size // R
me = g.rank % M  # replicas of a logical node pass the same data
nodes, extra = M, 300
""" + WIDE_DATA + r"""
sa = g.sparse_allreduce(dim, replication=R)
sa.config(ids(me), ins)
np.testing.assert_array_equal(sa.reduce(vals(me)), np.array([ref[int(i)] for i in ins]))
print("ok", flush=True)
"""


def test_replicated_ids_past_2_to_the_32():
    """Ids up to 2**40 - 1 through the replicated sparse allreduce (4 ranks, r = 2)."""
    res = collect(spawn_ranks(4, WIDE_REPLICATED), 120)
    for x in res:
        assert x.returncode == 0 and x.stdout.strip().endswith("ok"), x.stderr[-3000:]
