"""``scalefree bench load``: one row per (file, ranks) with the load time, the ratios and
the same top-10 from every format of one graph (a tiny graph: this checks the harness, not
the speed)."""

import gzip
import json
import subprocess
import sys


def test_bench_load_rows_per_file_and_rank_count(tmp_path):
    from scalefree.graph.rmat import write_rmat

    txt = tmp_path / "g.txt"
    write_rmat(txt, 9, 8000, seed=2, progress=False)
    one = tmp_path / "g.txt.gz"
    one.write_bytes(gzip.compress(txt.read_bytes()))
    members = tmp_path / "m.txt.gz"
    p = subprocess.run([sys.executable, "-m", "scalefree.cli", "graph", "convert", str(txt), str(members),
                        "--member-bytes", "8K"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    out = tmp_path / "load.json"
    p = subprocess.run([sys.executable, "-m", "scalefree.cli", "bench", "load", str(txt), str(one), str(members),
                        "-n", "1,2", "--json", str(out)], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    recs = json.loads(out.read_text())
    assert sorted((r["file"], r["ranks"]) for r in recs) == sorted((str(f), n) for f in (txt, one, members)
                                                                    for n in (1, 2))
    kinds = {r["file"]: r["format"] for r in recs}
    assert kinds == {str(txt): "text", str(one): "gz (one stream)", str(members): "gz (members)"}
    for r in recs:
        assert r["top_equal"] and r["load_s"] > 0 and len(r["peak_rss_bytes"]) == r["ranks"]
        assert r["edges"] == recs[0]["edges"]
        assert r["dedup_path"] == "exchange" and r["exchange_s"] >= 0 and r["sort_s"] > 0  # the stages timed
    assert "vs 1 rank" in p.stdout and "sort" in p.stdout
