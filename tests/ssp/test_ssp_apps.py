"""The SSP applications and bench end to end, small: they run, converge to a sane RMSE, and
write flat JSON records."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

DATA = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "movielens-100k" / "u.data"
pytest.importorskip("scipy")
needs_data = pytest.mark.skipif(not DATA.exists(), reason="../shared/data/movielens-100k is not beside the project")


def _launch(n, model, *args, timeout=300):
    cmd = [sys.executable, "-m", "scalefree.cli", "run", "-n", str(n), "--", sys.executable, "-m", "scalefree_bench._worker_ssp_mf", model, *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


@needs_data
@pytest.mark.parametrize("slack", [0, 3])
def test_sgd_mf_converges_and_flush_agrees_with_slack_zero(tmp_path, slack):
    p = _launch(2, "sgd", str(DATA), "--slack", str(slack), "--iters", "40",
                "--straggler", "5", "--out", str(tmp_path / "h"))
    assert p.returncode == 0, p.stdout + p.stderr
    res = [json.loads((tmp_path / f"h.rank{r}.json").read_text()) for r in range(2)]
    for doc in res:
        errs = [h[2] for h in doc["history"]]
        assert errs[-1] < 0.96 and errs[-1] < errs[0] - 0.1, errs[::10]
        assert all(h[3] <= slack for h in doc["history"])
    # After the flush every rank holds the same exact model.
    assert res[0]["final_rmse"] == pytest.approx(res[1]["final_rmse"], abs=1e-6)


@needs_data
def test_bpmf_runs_on_a_consistent_variant_and_refuses_others(tmp_path):
    p = _launch(2, "bpmf", str(DATA), "--slack", "1", "--iters", "12")
    assert p.returncode == 0, p.stdout + p.stderr
    rmse = float(p.stdout.split("test RMSE")[1].split()[0])
    assert rmse < 1.0, p.stdout
    p = _launch(1, "bpmf", str(DATA), "--variant", "sharded_async", "--iters", "2")
    assert p.returncode != 0 and "consistent" in p.stderr


def test_bench_ssp_small_run_writes_records(tmp_path):
    out = tmp_path / "ssp.json"
    p = subprocess.run([sys.executable, "-m", "scalefree.cli", "bench", "ssp", "-n", "2", "--calls", "20",
                        "--size", "64K", "--slack", "0,4", "--variant", "sharded,hypercube", "--delay", "2",
                        "--vs", "dense", "--json", str(out), "--metrics", str(tmp_path / "m.jsonl")],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    recs = json.loads(out.read_text())
    assert {(r["variant"], r["slack"]) for r in recs} >= {("sharded", 0), ("sharded", 4), ("hypercube", 4)}
    for r in recs:
        assert all(not isinstance(v, (list, dict)) for v in r.values())
        assert r["bound_s"] > 0 and r["wall_s"] > 0
    lines = (tmp_path / "m.jsonl").read_text().splitlines()
    assert len(lines) == len(recs) * 2 * 20
