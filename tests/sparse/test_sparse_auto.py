"""degrees="auto": the cost model of ``scalefree.sparse.plan`` (choice, prediction, fit, the
cost override), the probe on real ranks, and auto's results against a dense reference;
``scalefree bench sparse --degrees sweep`` end to end (correctness only, no timing)."""

import json
import subprocess
import sys

import pytest

from ranks import run_ranks
from scalefree.sparse import plan as sparse_plan
from scalefree.sparse.plan import Costs, choose, factorizations, predict_time


def test_choose_single_layer_when_messages_are_free():
    # Shared memory: no per-message cost, so one layer moves the fewest bytes and rounds.
    c = Costs(fixed_s=1e-5, round_s=2e-5, msg_s=0.0, s_per_byte=1e-9)
    for n in (2, 4, 6, 8, 12):
        assert choose(n, 200_000, 10_000_000, 4, c)["degrees"] == [n]


def test_choose_several_layers_when_messages_are_dear():
    # A network with 50 µs per message and fast links: 63 messages per direct layer cost
    # more than two layers of 7 (the paper's Fig. 5-6 regime).
    c = Costs(round_s=0.0, msg_s=50e-6, s_per_byte=1 / 10e9)
    got = choose(64, 2_000, 10_000_000, 4, c)
    assert len(got["degrees"]) > 1 and got["degrees"] != [64]
    assert got["predicted_s"]["x".join(map(str, got["degrees"]))] == min(got["predicted_s"].values())
    assert set(got["predicted_s"]) == {"x".join(map(str, d)) for d in factorizations(64)}


def test_choose_one_rank_and_primes():
    c = Costs()
    assert choose(1, 10, 100, 4, c)["degrees"] == []
    assert choose(7, 10, 100, 4, c)["degrees"] == [7]
    assert sorted(choose(4, 0, 0, 8, c)["degrees"]) in ([4], [2, 2])  # an empty index space: no error


def test_predict_time_terms():
    c = Costs(fixed_s=1.0, round_s=10.0, msg_s=100.0, s_per_byte=0.0, s_per_key=0.5)
    # [4]: fixed + keys + 2 rounds + 2*3 messages
    assert predict_time([4], 8, 1000, 4, c) == pytest.approx(1 + 4 + 2 * 10 + 6 * 100)
    # [2, 2]: 4 rounds, 2*(1+1) messages
    assert predict_time([2, 2], 8, 1000, 4, c) == pytest.approx(1 + 4 + 4 * 10 + 4 * 100)


def test_fit_recovers_known_costs():
    truth = Costs(fixed_s=3e-4, round_s=5e-5, msg_s=2e-5, s_per_byte=1e-9)
    rows, ys = [], []
    for n in (2, 4, 6, 8, 12, 16):
        for d in factorizations(n):
            for nnz in (1_000, 50_000, 200_000):
                rows.append(sparse_plan.features(d, nnz, 10_000_000, 4))
                ys.append(predict_time(d, nnz, 10_000_000, 4, truth))
    got = sparse_plan.fit(rows, ys)
    for f in ("fixed_s", "round_s", "msg_s", "s_per_byte"):
        assert getattr(got, f) == pytest.approx(getattr(truth, f), rel=1e-6)


def test_costs_override_and_bad_value(monkeypatch):
    class G:
        size = 4

    monkeypatch.setenv("SCALEFREE_SPARSE_COSTS", "1,2,3,4,5")
    c = sparse_plan.probe(G())
    assert (c.fixed_s, c.round_s, c.msg_s) == pytest.approx((1e-6, 2e-6, 3e-6))
    assert c.s_per_byte == pytest.approx(1 / 4e9) and c.s_per_key == pytest.approx(5e-9)
    monkeypatch.setenv("SCALEFREE_SPARSE_COSTS", "1,2")
    with pytest.raises(ValueError, match="SCALEFREE_SPARSE_COSTS"):
        sparse_plan.probe(G())


AUTO = r"""
import numpy as np, scalefree, sys
g = scalefree.init(timeout=60)
me, n = g.rank, g.size
expect = eval(sys.argv[1])
for case, dim, nnz in [("zero_dim", 0, 0), ("zipf", 100_000, 3_000), ("empty", 50, 0), ("tiny", 7, 5)]:
    outs, vals = [], []
    for r in range(n):
        rng = np.random.default_rng([r, dim])
        o = np.minimum(rng.zipf(1.2, nnz) - 1, dim - 1).astype(np.int64) if nnz else np.zeros(0, np.int64)
        outs.append(o); vals.append(rng.random(len(o)))
    dense = np.zeros(dim)
    for r in range(n):
        np.add.at(dense, outs[r], vals[r])
    want_i = np.arange(dim, dtype=np.int64)[::3]
    sa = g.sparse_allreduce(dim)
    sa.config(outs[me], want_i)
    if n > 1:
        assert sa.plan is not None and sa.plan["degrees"] == sa.degrees, (sa.plan, sa.degrees)
        assert int(np.prod(sa.degrees)) == n
        if expect is not None:
            assert sa.degrees == expect, (sa.degrees, expect)
    for rep in range(3):
        np.testing.assert_allclose(sa.reduce(vals[me]), dense[want_i], rtol=1e-12, err_msg=case)
    got = g.sparse_allreduce(dim).config_reduce(outs[me], vals[me], want_i)
    np.testing.assert_allclose(got, dense[want_i], rtol=1e-12)
print("ok", sa.degrees)
"""


@pytest.mark.parametrize("n,env,expect", [
    (1, None, None),
    (4, None, None),  # probed: any valid degree list, results exact
    (6, None, None),
    # Per-message cost far above everything else: fewest messages (2x2 sends 2 per round, 4 sends 3).
    (4, "0,0,1000,1000", [2, 2]),
    # Per-round cost dominant: one layer.
    (6, "0,1000,0,1000", [6]),
])
def test_auto_degrees_match_dense_reference(n, env, expect):
    code = AUTO.replace("eval(sys.argv[1])", repr(expect))
    res = run_ranks(n, code, timeout=120, extra_env={"SCALEFREE_SPARSE_COSTS": env} if env else None)
    assert all("ok" in r.stdout for r in res)


def test_bench_sparse_sweep_smoke(tmp_path):
    out = tmp_path / "r.json"
    proc = subprocess.run([sys.executable, "-m", "scalefree.cli", "bench", "sparse", "--degrees", "sweep", "-n", "2,4",
                           "--dim", "20000", "--nnz", "500", "--min-calls", "2", "--target-seconds", "0.02",
                           "--rounds", "2", "--warmup", "1", "--json", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    recs = json.loads(out.read_text())
    for n, cands in ((2, {"auto", "2"}), (4, {"auto", "4", "2x2"})):
        mine = [r for r in recs if r["ranks"] == n]
        assert {r["candidate"] for r in mine} == cands
        assert {(r["candidate"], r["variant"]) for r in mine} == {(c, v) for c in cands for v in ("config", "reduce")}
        for r in mine:
            assert r["median_s"] > 0
            if r["variant"] == "reduce":
                assert r["predicted_s"] > 0 and r["probed_s"] > 0 and r["fitted_s"] >= 0
        auto_cfg = next(r for r in mine if r["candidate"] == "auto" and r["variant"] == "config")
        assert auto_cfg["probed_costs"] and set(auto_cfg["auto_predicted_s"]) == cands - {"auto"}
    assert "plan probed" in proc.stdout and "probed by auto at 4 ranks" in proc.stdout
