"""`scalefree bench svd`: the rows that run the command `scalefree flash svd` in a child process."""

import json
import subprocess
import sys


def test_bench_svd_command_rows(tmp_path):
    out = tmp_path / "s.json"
    p = subprocess.run([sys.executable, "-m", "scalefree.cli", "bench", "svd", "--data", "random", "--rows", "3000",
                        "--cols", "400", "--nnz", "20000", "--k", "5", "--budget-fractions", "0.5", "--cli-budget",
                        "64K", "--repeat", "1", "--warmup", "0", "--dir", str(tmp_path), "--json", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    recs = json.loads(out.read_text())
    assert [r["variant"] for r in recs] == ["memory", "memory", "flash-0.5", "cli-64K"]
    cli = recs[-1]
    assert cli["command_peak_rss_bytes"] > 10 << 20 and cli["max_rel_err"] < 1e-3 and cli["operand"] == "flash"
