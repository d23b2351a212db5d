"""`scalefree bench xml` end to end on a tiny model (omikuji's Python binding trains it; the
rows against omikuji's CLI need it on PATH; skipped otherwise)."""

import json
import shutil
import subprocess
import sys

import pytest

pytest.importorskip("omikuji")  # the tests train with its Python binding


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
                        "--replicate-points", "50", "--repeat", "2", "--dir", str(tmp_path), "--json", str(out)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    recs = {rec["variant"]: rec for rec in json.loads(out.read_text())}
    assert set(recs) == {"test", "python", "memory", "memory-x3", "flash-0.25-x3"}
    assert recs["memory"]["agree_points"] == 200
    mem = recs["memory"]
    assert len(mem["speedup_vs_omikuji_test_runs"]) == 2 and recs["test"]["n"] == 2 == mem["n"]
    assert mem["topk_set_differs_points"] == sum(mem.get("set_difference_classes", {}).values())
    assert "other" not in mem.get("set_difference_classes", {})
    for k in (1, 3, 5):
        assert recs["memory"][f"p@{k}"] == pytest.approx(recs["test"][f"p@{k}"], abs=1e-9)
    assert recs["flash-0.25-x3"]["same_as_memory"] is True
    assert recs["flash-0.25-x3"]["peak_resident_bytes"] <= recs["flash-0.25-x3"]["budget_bytes"]


def test_bench_xml_ours_interleaved_and_stream(tmp_path):
    """Without omikuji's CLI: our rows only (``--skip-peers``), memory and flash alternating
    over ``--repeat`` pairs, and the stream rows (our CLI as a child on prefixes of a file)."""
    from scalefree.flash import xml

    spec = xml.XmlDataSpec(features=300, labels=80, seed=2)
    train = xml.generate_xml(tmp_path / "train.txt", 400, spec)
    test = xml.generate_xml(tmp_path / "test.txt", 60, spec, first_point=400)
    stream = xml.generate_xml(tmp_path / "stream.txt", 90, spec, first_point=460)
    xml.train(train, tmp_path / "m.sfxml", threads=1, model_dir=tmp_path / "omk", min_branch_size=20)
    out = tmp_path / "x.json"
    r = subprocess.run([sys.executable, "-m", "scalefree.cli", "bench", "xml", "--omikuji-model", str(tmp_path / "omk"),
                        "--test", test, "--skip-peers", "--threads", "1", "--replicate", "2", "--replicate-points", "30",
                        "--repeat", "2", "--batch", "16", "--stream", stream, "--stream-model", str(tmp_path / "m.sfxml"),
                        "--stream-points", "20,90", "--stream-memory", "16M", "--dir", str(tmp_path), "--json", str(out)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    recs = {rec["variant"]: rec for rec in json.loads(out.read_text())}
    assert set(recs) == {"memory", "memory-x2", "flash-0.25-x2", "imports", "stream-20", "stream-90"}
    ooc = recs["flash-0.25-x2"]
    assert len(ooc["speed_vs_memory_runs"]) == 2 and ooc["n"] == 2 and recs["memory-x2"]["n"] == 2
    assert ooc["same_as_memory"] is True and ooc["peak_resident_bytes"] <= ooc["budget_bytes"]
    assert ooc["compute_idle_s"] >= 0 and ooc["peak_rss_bytes"] >= ooc["rss_before_bytes"] > 0
    for n in (20, 90):
        s = recs[f"stream-{n}"]
        assert s["points"] == n and s["peak_rss_bytes"] >= recs["imports"]["peak_rss_bytes"] > 0
        assert 0 <= s["p@5"] <= s["p@1"] <= 1
    # the full stream scores the same points as the test rows' scorer would
    assert recs["stream-90"]["p@1"] == pytest.approx(xml.predict(tmp_path / "m.sfxml", stream).metrics["precision@1"])


def test_bench_xml_classifies_differences(tmp_path):
    """``_classify`` against omikuji's exact scores: a label past omikuji's k-th place with its
    exact score, or two labels swapped that omikuji scores apart, is ``other`` (a real
    discrepancy); a label omikuji's beam never reached, or scored otherwise, is ``beam``."""
    from scalefree.flash import xml
    from scalefree_bench.xml import _classify, _omikuji_model, _read_points

    spec = xml.XmlDataSpec(features=300, labels=80, seed=4)
    train = xml.generate_xml(tmp_path / "train.txt", 400, spec)
    test = xml.generate_xml(tmp_path / "test.txt", 4, spec, first_point=400)
    xml.train(train, tmp_path / "m.sfxml", threads=1, model_dir=tmp_path / "omk", min_branch_size=20)
    m = _omikuji_model(tmp_path / "omk")
    pts = _read_points(test, range(4))
    full = [sorted(m.predict(pts[i], beam_size=10, top_k=1 << 30), key=lambda t: -t[1]) for i in range(4)]
    assert all(len(f) > 6 and f[4][1] > f[5][1] * (1 + 1e-4) and f[0][1] > f[1][1] * (1 + 1e-4) for f in full)
    unreached = [next(lab for lab in range(80) if lab not in dict(f)) for f in full]
    rows = [full[0][:4] + [full[0][5]],                         # omikuji's 6th, its own score: other
            full[1][:4] + [(unreached[1], full[1][4][1])],      # a label its beam never reached: beam
            full[2][:4] + [(full[2][5][0], full[2][4][1] * 1.01)],  # scored 1 % otherwise: beam
            [full[3][1], full[3][0], *full[3][2:5]]]             # 1st and 2nd swapped: other
    labels = [[lab for lab, _ in r] for r in rows]
    scores = [[sc for _, sc in r] for r in rows]
    theirs = [[lab for lab, _ in f[:5]] for f in full]
    counts, examples = _classify(m, [0, 1, 2, 3], labels, scores, theirs, test, 10)
    assert counts == {"other": 2, "beam": 2} and examples == {"other": [0, 3], "beam": [1, 2]}
    # the same top 5 in the same order: no pair, the lowest class
    assert _classify(m, [0], theirs, [[sc for _, sc in f[:5]] for f in full], theirs, test, 10)[0] == {"tie": 1}
