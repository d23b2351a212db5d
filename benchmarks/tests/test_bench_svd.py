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
    assert [r["variant"] for r in recs] == ["memory", "memory", "flash-0.5", "command", "cli-64K"]
    peer, cli = recs[-2], recs[-1]
    assert cli["command_peak_rss_bytes"] > 10 << 20 and cli["max_rel_err"] < 1e-3 and cli["operand"] == "flash"
    assert peer["impl"] == "scipy" and peer["command_peak_rss_bytes"] > 10 << 20 and peer["max_rel_err"] < 1e-3
    for r in (peer, cli):  # a command's time is from its file: load + solve
        assert abs(r["median_s"] - r["load_seconds"][0] - r["solve_seconds"][0]) < 1e-9
    assert cli["max_rel_diff_vs_scipy"] < 1e-3 and 0 <= cli["max_relative_residual"] < 1e-6


def test_bench_svd_commands_only_from_a_generated_file(tmp_path):
    """--commands-only: ARPACK's command and ours on the file the generator wrote, no reference."""
    out = tmp_path / "s.json"
    p = subprocess.run([sys.executable, "-m", "scalefree.cli", "bench", "svd", "--data", "random", "--rows", "2000",
                        "--cols", "300", "--nnz", "15000", "--distinct", "--k", "4", "--cli-budget", "1M",
                        "--commands-only", "--no-reference", "--repeat", "1", "--warmup", "0", "--dir", str(tmp_path),
                        "--json", str(out)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    recs = json.loads(out.read_text())
    assert [(r["impl"], r["variant"]) for r in recs] == [("scipy", "command"), ("scalefree", "cli-1M")]
    assert recs[0]["max_rel_err"] == 0 and recs[1]["max_rel_err"] < 1e-4  # against ARPACK's values
    assert "largest relative difference from ARPACK's values" in p.stdout
    p = subprocess.run([sys.executable, "-m", "scalefree.cli", "bench", "svd", "--data", "random", "--commands-only"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode != 0 and "--commands-only needs --cli-budget" in p.stderr
