"""The sparse allreduce with slack (bounded staleness), real rank processes, seeded random
delays: every result, key by key, holds one contribution per contributing rank, none more
than ``slack`` reductions older than the caller's own (which is the current one), nothing
lost or counted twice; ``flush()`` is exact, and reduces go on after it. Contributions are
tagged: rank r at call t puts the code of t in bit field r of column 0 and a 1 in bit field
r of column 1 (a contribution lost or counted twice shows there)."""

import pytest

from ranks import collect, run_ranks, spawn_ranks

CHECK = r"""
import sys, time
import numpy as np, scalefree
g = scalefree.init(timeout=60)
me, n = g.rank, g.size
rep = int(sys.argv[1])
m = n // rep
lme = me % m
BITS = {"float64": 10, "float32": 4, "int64": 12, "int32": 6}
checked = 0
for dt, slack in [("float64", 3), ("int64", 2), ("float32", 3), ("int32", 0)]:
    bits = BITS[dt]
    mask = (1 << bits) - 1
    code = lambda t: 1 + t % mask
    dim = 600
    outs = [np.random.default_rng([7, r]).choice(dim, 150, replace=False).astype(np.int64) for r in range(m)]
    sets = [set(o.tolist()) for o in outs]
    ins = np.concatenate([np.random.default_rng([8, lme]).integers(0, dim, 120), outs[lme][:40]]).astype(np.int64)
    sa = g.sparse_allreduce(dim, slack=slack, replication=rep, hash=dt != "int64")
    sa.config(outs[lme], ins)
    rng = np.random.default_rng([9, me])
    calls = 20
    for t in range(1, calls + 1):
        if rng.random() < 0.3:
            time.sleep(rng.random() * 0.002)
        v = np.zeros((len(outs[lme]), 2), dt)
        v[:, 0] = code(t) << (bits * lme)
        v[:, 1] = 1 << (bits * lme)
        got = sa.reduce(v)
        assert sa.last.clock == t and sa.last.age_diff <= slack and sa.last.wait_seconds >= 0, sa.last
        exact = None
        if t in (calls // 2, calls):
            exact = sa.flush()
        for res, lo, hi in [(got, max(1, t - slack), calls if rep > 1 else t + slack + 1)] + (
                [(exact, t, t)] if exact is not None else []):
            res = res.astype(np.int64)
            for i, x in enumerate(ins.tolist()):
                for r in range(m):
                    f = (int(res[i, 0]) >> (bits * r)) & mask
                    k = (int(res[i, 1]) >> (bits * r)) & mask
                    if x not in sets[r]:
                        assert f == 0 and k == 0, (dt, t, x, r, f, k)
                        continue
                    assert k == 1, f"{dt} call {t} index {x}: rank {r} counted {k} times"
                    if r == lme:
                        assert f == code(t), f"{dt} call {t} index {x}: own contribution {f} is not current"
                    else:
                        assert any(code(u) == f for u in range(lo, hi + 1)), (dt, t, x, r, f, lo, hi)
            checked += 1
    st = sa.ssp_stats()
    assert len(st["clock"]) == calls and (st["age_diff"] <= slack).all()
print("checked", checked)
"""


@pytest.mark.parametrize("n,rep", [(1, 1), (3, 1), (5, 1), (4, 2)])
def test_sparse_slack_results_are_bounded_stale_and_flush_exact(n, rep):
    res = collect(spawn_ranks(n, CHECK, args=[str(rep)]), 120)
    for r in res:
        assert r.returncode == 0, f"rank {r.rank} exited {r.returncode}:\n{r.stderr[-4000:]}"
    assert "checked" in res[0].stdout


ERRORS = r"""
import numpy as np, scalefree
from scalefree.errors import InvalidArgumentError
g = scalefree.init(timeout=20)
sa = g.sparse_allreduce(50)
sa.config(np.arange(5), np.arange(5))
for bad in [lambda: sa.reduce(np.ones(5), slack=2), lambda: sa.flush()]:
    try:
        bad()
        raise SystemExit("no error")
    except InvalidArgumentError as e:
        assert "slack" in str(e), str(e)
try:
    g.sparse_allreduce(50, slack=-1)
    raise SystemExit("no error")
except InvalidArgumentError as e:
    assert "slack" in str(e)
sa = g.sparse_allreduce(50, slack=1)
sa.config(np.arange(5), np.arange(5))
try:
    sa.flush()
    raise SystemExit("no error")
except InvalidArgumentError as e:
    assert "no reduce with slack" in str(e), str(e)
sa.reduce(np.ones(5))
try:
    sa.reduce(np.ones(5, np.float32))  # the first reduce fixed float64 (the same on every rank)
    raise SystemExit("no error")
except InvalidArgumentError as e:
    assert "float64" in str(e), str(e)
np.testing.assert_array_equal(sa.flush(), np.full(5, float(g.size)))
print("ok")
"""


def test_sparse_slack_bad_input():
    res = run_ranks(2, ERRORS, timeout=60)
    assert "ok" in res[0].stdout
