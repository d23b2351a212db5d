"""`scalefree bench topics`: the planted-corpus rows end to end, and the UMass coherence."""

import json
import subprocess
import sys

import numpy as np
import scipy.sparse as sp

from scalefree_bench.topics import umass


def test_umass_matches_its_definition():
    rng = np.random.default_rng(0)
    a = sp.csr_matrix(rng.poisson(0.4, size=(60, 12)).astype(float))
    top = np.array([[3, 1, 7], [0, 11, 5]])
    d = (a.toarray() > 0)
    want = []
    for words in top:
        s = 0.0
        for m in range(1, len(words)):
            for l in range(m):
                co = np.sum(d[:, words[m]] & d[:, words[l]])
                s += np.log((co + 1) / max(d[:, words[l]].sum(), 1))
        want.append(s)
    assert np.isclose(umass(top, a), np.mean(want))


def test_bench_topics_planted_end_to_end(tmp_path):
    out = tmp_path / "t.json"
    p = subprocess.run([sys.executable, "-m", "scalefree.cli", "bench", "topics", "--skip-kos", "--planted",
                        "1500,300,4", "--dir", str(tmp_path), "--json", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    recs = json.loads(out.read_text())
    assert [r["variant"] for r in recs] == ["flash-0.25", "memory"]
    for r in recs:
        assert r["bench"] == "topics" and r["median_s"] > 0 and r["recovery_l1_mean"] < 0.5
    assert recs[0]["on_flash"] and recs[0]["peak_resident_bytes"] <= recs[0]["budget_bytes"]
    assert "time_vs_memory" in recs[0] and "recovery L1" in p.stdout


def test_bench_topics_command_rows_report_the_commands_peak_rss(tmp_path):
    """--as-command: the flash row is the command in a child process, with its own peak RSS, and
    a row for the fixed overhead (a warmed process holding no data), which the command's row
    adds to its budget; the memory row stays."""
    out = tmp_path / "t.json"
    p = subprocess.run([sys.executable, "-m", "scalefree.cli", "bench", "topics", "--skip-kos", "--planted",
                        "1500,300,4", "--budget", "256K", "--as-command", "--dir", str(tmp_path), "--json", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    recs = json.loads(out.read_text())
    assert [r["variant"] for r in recs] == ["overhead (warmed, no data)", "command-flash-256K", "memory"]
    for r in recs[:2]:
        assert r["command_peak_rss_bytes"] > 10 << 20 and r["budget_bytes"] in (0, 256 << 10)
    assert recs[1]["allowed_rss_bytes"] == (256 << 10) + recs[0]["command_peak_rss_bytes"]
    assert recs[1]["within_budget"] == (recs[1]["command_peak_rss_bytes"] <= recs[1]["allowed_rss_bytes"])
    assert recs[1]["recovery_l1_mean"] < 0.5 and "time_vs_memory" in recs[1] and "(cmd)" in p.stdout

