"""`scalefree bench xml` end to end on a tiny model (needs omikuji's CLI on PATH and its
Python binding; skipped otherwise)."""

import json
import shutil
import subprocess
import sys

import pytest

pytest.importorskip("omikuji")


@pytest.mark.skipif(shutil.which("omikuji") is None, reason="omikuji's CLI is not installed (cargo install omikuji --features cli)")
def test_bench_xml_end_to_end(tmp_path):
    from scalefree.flash import xml

    spec = xml.XmlDataSpec(features=500, labels=120, seed=1)
    train = xml.generate_xml(tmp_path / "train.txt", 800, spec)
    test = xml.generate_xml(tmp_path / "test.txt", 200, spec, first_point=800)
    subprocess.run(["omikuji", "train", train, "--model_path", str(tmp_path / "omk"), "--n_threads", "1",
                    "--min_branch_size", "20"], check=True, capture_output=True)
    out = tmp_path / "x.json"
    r = subprocess.run([sys.executable, "-m", "scalefree.cli", "bench", "xml", "--omikuji-model", str(tmp_path / "omk"),
                        "--test", test, "--threads", "1", "--python-points", "20", "--replicate", "3",
                        "--replicate-points", "50", "--dir", str(tmp_path), "--json", str(out)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    recs = {rec["variant"]: rec for rec in json.loads(out.read_text())}
    assert set(recs) == {"test", "python", "memory", "memory-x3", "flash-0.25-x3"}
    assert recs["memory"]["agree_points"] == 200
    for k in (1, 3, 5):
        assert recs["memory"][f"p@{k}"] == pytest.approx(recs["test"][f"p@{k}"], abs=1e-9)
    assert recs["flash-0.25-x3"]["same_as_memory"] is True
    assert recs["flash-0.25-x3"]["peak_resident_bytes"] <= recs["flash-0.25-x3"]["budget_bytes"]
