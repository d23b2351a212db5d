"""Extreme multi-label scoring (scalefree.flash.xml) against a plain per-point reference of
omikuji's beam search, and against omikuji itself when it is installed."""

import os
import subprocess
import sys

import numpy as np
import pytest
import scipy.sparse as sp

from scalefree import flash
from scalefree.flash import xml

# ---------------------------------------------------------------- a reference scorer


def _log_prob(s, loss):
    s = np.float32(s)
    if loss == "log":
        return -np.log1p(np.exp(-s, dtype=np.float32), dtype=np.float32)
    return -np.float32(max(np.float32(0), np.float32(1) - s)) ** 2


def _scores(node, x_idx, x_val):
    w = node["weights"]
    w = w.toarray() if sp.issparse(w) else np.asarray(w)
    return (x_val[:, None].astype(np.float32) * w[x_idx].astype(np.float32)).sum(axis=0, dtype=np.float32)


def reference_predict(trees, loss, n_features, row_idx, row_val, beam, k):
    """omikuji's Model::predict, point by point, written plainly."""
    val = np.asarray(row_val, np.float32)
    norm = np.sqrt(np.sum(val * val, dtype=np.float32))
    if norm > 0:
        val = val / norm
    idx = np.append(np.asarray(row_idx, np.int64), n_features)
    val = np.append(val, np.float32(1))
    total = {}
    for root in trees:
        curr = [(root, np.float32(0))]
        while any("children" in n for n, _ in curr):
            nxt = []
            for node, score in curr:
                if "children" in node:
                    s = _scores(node, idx, val)
                    for child, sj in zip(node["children"], s):
                        nxt.append((child, np.float32(_log_prob(sj, loss) + score)))
                else:
                    nxt.append((node, score))
            nxt.sort(key=lambda t: -t[1])
            curr = nxt[:beam]
        for leaf, score in curr:
            s = _scores(leaf, idx, val)
            pairs = sorted(((lab, float(np.exp(_log_prob(sj, loss) + score))) for lab, sj in zip(leaf["labels"], s)),
                           key=lambda t: -t[1])[:beam]
            for lab, p in pairs:
                total[int(lab)] = total.get(int(lab), 0.0) + p
    ranked = sorted(((lab, p / len(trees)) for lab, p in total.items()), key=lambda t: (-t[1], t[0]))
    return ranked[:k]


# ---------------------------------------------------------------- random models


def random_tree(rng, n_features, labels, max_children=3, leaf_size=4, depth=0, dense_every=3, nnz=6):
    """A random, unbalanced tree over ``labels``; weights sparse or dense. Scores stay below 1
    (no saturated squared hinge) and every output has its own bias, so that no two candidates
    tie: a tie may be broken either way by a beam selection, and then the beams differ."""
    counter = [0]
    a = 0.9 / (np.sqrt(nnz) + 1)

    def weights(n_out):
        counter[0] += 1
        if counter[0] % dense_every == 0:
            return rng.uniform(-a, a, (n_features + 1, n_out)).astype(np.float32)
        m = sp.random(n_features + 1, n_out, density=0.3, random_state=rng, dtype=np.float32,
                      data_rvs=lambda n: rng.uniform(-a, a, n)).tolil()
        m[n_features, :] = rng.uniform(-a, a, n_out)
        return m.tocsr()

    def build(labels, depth):
        if len(labels) <= leaf_size or depth >= 4 or (depth > 0 and rng.random() < 0.25):
            return {"weights": weights(len(labels)), "labels": list(labels)}
        n_child = int(rng.integers(2, max_children + 1))
        parts = np.array_split(labels, n_child)
        return {"weights": weights(len(parts)), "children": [build(p, depth + 1) for p in parts]}

    return build(np.asarray(labels), depth)


def random_points(rng, n, n_features, nnz=6):
    rows = []
    for _ in range(n):
        m = int(rng.integers(0, nnz + 1))
        idx = np.sort(rng.choice(n_features, size=m, replace=False))
        rows.append((idx, rng.random(m).astype(np.float32) + 0.1))
    indptr = np.concatenate([[0], np.cumsum([len(r[0]) for r in rows])])
    x = sp.csr_matrix((np.concatenate([r[1] for r in rows]) if rows else np.zeros(0, np.float32),
                       np.concatenate([r[0] for r in rows]) if rows else np.zeros(0, int), indptr),
                      shape=(n, n_features), dtype=np.float32)
    return x


def assert_same_topk(got_labels, got_scores, ref, rtol=2e-5):
    """Same labels at the same ranks, except where the reference's scores tie."""
    ref_labels = [lab for lab, _ in ref]
    ref_scores = np.array([p for _, p in ref], np.float64)
    n = len(ref)
    assert np.all(got_labels[n:] == -1)
    np.testing.assert_allclose(got_scores[:n], ref_scores, rtol=rtol, atol=1e-7)
    for j in range(n):
        if got_labels[j] != ref_labels[j]:
            # a tie (within float32 rounding) may be broken either way
            assert any(abs(ref_scores[j] - ref_scores[i]) <= 1e-5 * ref_scores[j]
                       for i in range(n) if ref_labels[i] == got_labels[j]), (got_labels, ref)


@pytest.fixture(scope="module")
def rt():
    return flash.Runtime(memory_budget="64M", threads=2)


@pytest.mark.parametrize("loss", ["hinge", "log"])
@pytest.mark.parametrize("n_points,beam,k,batch_points", [(1, 1, 1, 1), (7, 3, 5, 3), (120, 10, 5, 32), (61, 2, 7, 1000)])
def test_matches_reference(tmp_path, rt, loss, n_points, beam, k, batch_points):
    rng = np.random.default_rng(n_points * 31 + beam)
    n_features = 23
    trees = [random_tree(rng, n_features, np.arange(40)), random_tree(rng, n_features, rng.permutation(40))]
    path = tmp_path / "m.sfxml"
    info = xml.write_model(path, trees, n_features, loss=loss)
    assert info.n_trees == 2 and info.n_features == n_features and info.n_labels == 40
    x = random_points(rng, n_points, n_features)
    # small chunks: levels split over several tasks
    p = xml.predict(path, x, k=k, beam=beam, runtime=rt, batch_points=batch_points, max_chunk_bytes=300)
    assert p.labels.shape == (n_points, k) and p.metrics is None
    for i in range(n_points):
        row = x.getrow(i)
        ref = reference_predict(trees, loss, n_features, row.indices, row.data, beam, k)
        assert_same_topk(p.labels[i], p.scores[i], ref)


def test_single_leaf_tree_and_empty_rows(tmp_path, rt):
    n_features = 5
    w = np.arange(6 * 3, dtype=np.float32).reshape(6, 3) / 10
    path = xml.write_model(tmp_path / "leaf.sfxml", [{"weights": w, "labels": [7, 3, 9]}], n_features).path
    x = sp.csr_matrix(np.array([[0, 0, 0, 0, 0], [1, 0, 2, 0, 0]], np.float32))
    p = xml.predict(path, x, k=5, beam=10, runtime=rt)
    for i in range(2):
        row = x.getrow(i)
        ref = reference_predict([{"weights": w, "labels": [7, 3, 9]}], "hinge", n_features, row.indices, row.data, 10, 5)
        assert_same_topk(p.labels[i], p.scores[i], ref)
    assert (p.labels[:, 3:] == -1).all() and np.isnan(p.scores[:, 3:]).all()


def _xc_file(path, x, labels):
    with open(path, "w") as f:
        f.write(f"{x.shape[0]} {x.shape[1]} 40\n")
        for i in range(x.shape[0]):
            row = x.getrow(i)
            f.write(",".join(map(str, labels[i])) + " " + " ".join(f"{j}:{v:.9g}" for j, v in zip(row.indices, row.data)) + "\n")


def test_text_input_out_file_and_metrics(tmp_path, rt):
    rng = np.random.default_rng(5)
    n_features = 30
    trees = [random_tree(rng, n_features, np.arange(40))]
    model = xml.write_model(tmp_path / "m.sfxml", trees, n_features).path
    x = random_points(rng, 50, n_features)
    x.data = np.round(x.data, 3)
    truth = [sorted(rng.choice(40, size=int(rng.integers(0, 4)), replace=False).tolist()) for _ in range(50)]
    data = tmp_path / "test.txt"
    _xc_file(data, x, truth)
    out = tmp_path / "pred.txt"
    p = xml.predict(model, data, k=5, beam=4, runtime=rt, batch_points=7, out=out)
    q = xml.predict(model, x, k=5, beam=4, runtime=rt)
    np.testing.assert_array_equal(p.labels, q.labels)
    lines = out.read_text().splitlines()
    assert len(lines) == 50
    for i, line in enumerate(lines):
        got = [int(t.split(":")[0]) for t in line.split()]
        assert got == [int(v) for v in p.labels[i] if v >= 0]
    # precision@k and nDCG@k by hand
    for kk in (1, 3, 5):
        prec = np.mean([len(set(p.labels[i, :kk]) & set(truth[i])) / kk for i in range(50)])
        assert p.metrics[f"precision@{kk}"] == pytest.approx(prec)
        nd = []
        for i in range(50):
            dcg = sum(1 / np.log2(r + 2) for r in range(kk) if p.labels[i, r] in truth[i])
            idcg = sum(1 / np.log2(r + 2) for r in range(min(kk, len(truth[i]))))
            nd.append(dcg / idcg if idcg > 0 else 0.0)
        assert p.metrics[f"ndcg@{kk}"] == pytest.approx(np.mean(nd))
    # svmlight lines without the header, and .npz input, give the same
    body = tmp_path / "test.svm"
    body.write_text("".join(data.read_text().splitlines(keepends=True)[1:]))
    np.testing.assert_array_equal(xml.predict(model, body, runtime=rt, beam=4).labels, p.labels)
    sp.save_npz(tmp_path / "x.npz", x)
    np.testing.assert_array_equal(xml.predict(model, tmp_path / "x.npz", runtime=rt, beam=4).labels, p.labels)
    # a stream: no arrays kept
    s = xml.predict(model, data, beam=4, runtime=rt, batch_points=3, collect=False, out=tmp_path / "p2.txt")
    assert s.labels.shape == (0, 5) and (tmp_path / "p2.txt").read_text() == out.read_text()


def test_npz_and_flash_csr_are_streamed(tmp_path, rt):
    rng = np.random.default_rng(8)
    n_features = 30
    trees = [random_tree(rng, n_features, np.arange(40)), random_tree(rng, n_features, rng.permutation(40))]
    model = xml.write_model(tmp_path / "m.sfxml", trees, n_features).path
    x = random_points(rng, 53, n_features)
    ref = xml.predict(model, x, beam=4, runtime=rt)
    for name, m, compressed in [("c.npz", x, True), ("u.npz", x, False), ("csc.npz", x.tocsc(), True)]:
        sp.save_npz(tmp_path / name, m, compressed=compressed)
        p = xml.predict(model, tmp_path / name, beam=4, runtime=rt, batch_points=7)
        np.testing.assert_array_equal(p.labels, ref.labels)
        np.testing.assert_array_equal(p.scores, ref.scores)
    # read a batch at a time: 8 blocks of at most 7 rows, their indptr spanning their entries
    blocks = list(xml._npz_blocks(str(tmp_path / "u.npz"), 7, n_features))
    assert [len(b[0]) - 1 for b in blocks] == [7] * 7 + [4]
    assert all(len(i) == b[-1] - b[0] == len(v) for b, i, v in blocks)
    for dtype in (np.float32, np.float64):
        c = flash.Csr.from_scipy(x.astype(dtype), runtime=rt)
        p = xml.predict(model, c, beam=4, runtime=rt, batch_points=5)
        np.testing.assert_array_equal(p.labels, ref.labels)
        np.testing.assert_allclose(p.scores, ref.scores, rtol=1e-6)
    # a feature id past the model's: the file and row named
    wide = sp.csr_matrix((np.array([1, 2], np.float32), np.array([0, n_features]), np.array([0, 1, 2])),
                         shape=(2, n_features + 1))
    sp.save_npz(tmp_path / "wide.npz", wide)
    with pytest.raises(ValueError, match=r"wide\.npz: row 1: feature id 30"):
        xml.predict(model, tmp_path / "wide.npz", runtime=rt)
    _one_line_exit_2(_cli("predict", model, tmp_path / "wide.npz", "-q"), "wide.npz")
    sp.save_npz(tmp_path / "none.npz", sp.csr_matrix((0, n_features), dtype=np.float32))
    with pytest.raises(ValueError, match=r"none\.npz: no data points"):
        xml.predict(model, tmp_path / "none.npz", runtime=rt)
    with pytest.raises(ValueError, match="past the model"):
        xml.predict(model, flash.Csr.from_scipy(wide, runtime=rt), runtime=rt)


def test_budget_smaller_than_model(tmp_path):
    rng = np.random.default_rng(11)
    n_features = 400
    trees = [random_tree(rng, n_features, np.arange(300), max_children=4, leaf_size=10, dense_every=2, nnz=20)
             for _ in range(3)]
    model = xml.write_model(tmp_path / "m.sfxml", trees, n_features, loss="log")
    budget = model.level_bytes // 4
    assert budget >= model.largest_level_bytes // 4
    x = random_points(rng, 40, n_features, nnz=20)
    small = flash.Runtime(memory_budget=budget, threads=2)
    big = flash.Runtime(memory_budget="256M", threads=2)
    a = xml.predict(model.path, x, runtime=small, batch_points=8, max_chunk_bytes=budget // 4)
    b = xml.predict(model.path, x, runtime=big, batch_points=40)
    np.testing.assert_array_equal(a.labels, b.labels)
    np.testing.assert_allclose(a.scores, b.scores, rtol=1e-6)
    assert a.stats["run"]["peak_resident_bytes"] <= budget
    # the in-memory twin: the same answers, no reads while scoring
    c = xml.predict(model.path, x, runtime=small, batch_points=8, in_memory=True)
    np.testing.assert_array_equal(c.labels, a.labels)
    np.testing.assert_array_equal(c.scores, a.scores)
    assert c.stats["run"]["bytes_read"] == 0 and a.stats["run"]["bytes_read"] > 0
    assert 0 < c.stats["load_seconds"] <= c.stats["seconds"] and a.stats["load_seconds"] == 0
    for i in range(40):
        row = x.getrow(i)
        assert_same_topk(a.labels[i], a.scores[i], reference_predict(trees, "log", n_features, row.indices, row.data, 10, 5))


# ---------------------------------------------------------------- bad input


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "scalefree.cli", "flash", "xml", *map(str, args)],
                          capture_output=True, text=True, timeout=120)


def _one_line_exit_2(r, name):
    assert r.returncode == 2, (r.stdout, r.stderr)
    err = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(err) == 1 and name in err[0], r.stderr


def _cbor(obj) -> bytes:
    """CBOR (RFC 8949) of dicts, lists, tuples, str, int >= 0 and float (as float32): the
    subset serde gives omikuji's trees in, to write tree files by hand."""
    import struct

    def head(major, n):
        if n < 24:
            return bytes([major << 5 | n])
        for extra, fmt in ((24, ">B"), (25, ">H"), (26, ">I"), (27, ">Q")):
            if n < 1 << (8 * struct.calcsize(fmt)):
                return bytes([major << 5 | extra]) + struct.pack(fmt, n)

    if isinstance(obj, dict):
        return head(5, len(obj)) + b"".join(_cbor(k) + _cbor(v) for k, v in obj.items())
    if isinstance(obj, (list, tuple)):
        return head(4, len(obj)) + b"".join(_cbor(v) for v in obj)
    if isinstance(obj, str):
        return head(3, len(obj.encode())) + obj.encode()
    if isinstance(obj, (int, np.integer)):
        return head(0, int(obj))
    return b"\xfa" + struct.pack(">f", float(obj))


def _omikuji_tree_file(path, n_features):
    """A hand-written omikuji tree file (a branch with dense weights over a leaf with sparse
    weights and a leaf with dense ones) and the same tree as ``write_model`` takes it."""
    rng = np.random.default_rng(5)
    rows = n_features + 1
    w_root = rng.uniform(-0.4, 0.4, (rows, 2)).astype(np.float32)
    w_a = sp.random(rows, 3, density=0.5, random_state=rng, dtype=np.float32).tocsr()
    w_a.data -= 0.5
    w_b = rng.uniform(-0.4, 0.4, (rows, 2)).astype(np.float32)

    def dense(w):
        return {"Dense": {"v": 1, "dim": list(w.shape), "data": w.ravel().tolist()}}

    def lil(w):
        nz = np.flatnonzero(np.diff(w.indptr))
        return {"Sparse": {"outer_dim": rows, "inner_dim": w.shape[1], "indptr": [0, *np.cumsum(np.diff(w.indptr)[nz]).tolist()],
                           "outer_inds": nz.tolist(), "inner_inds": w.indices.tolist(), "data": w.data.tolist()}}

    tree = {"Branch": {"weights": dense(w_root), "children": [{"Leaf": {"weights": lil(w_a), "labels": [4, 0, 2]}},
                                                               {"Leaf": {"weights": dense(w_b), "labels": [1, 3]}}]}}
    path.write_bytes(_cbor(tree))
    return {"weights": w_root, "children": [{"weights": w_a, "labels": [4, 0, 2]}, {"weights": w_b, "labels": [1, 3]}]}


def test_bad_input_exit_2(tmp_path):
    rng = np.random.default_rng(2)
    trees = [random_tree(rng, 10, np.arange(12))]
    model = xml.write_model(tmp_path / "m.sfxml", trees, 10).path
    good = tmp_path / "ok.txt"
    good.write_text("2 10 12\n1 0:1 3:2\n2,3 9:1\n")
    assert _cli("predict", model, good, "--memory", "16M", "-q").returncode == 0
    # truncated model
    data = open(model, "rb").read()
    cut = tmp_path / "cut.sfxml"
    cut.write_bytes(data[: len(data) - 100])
    _one_line_exit_2(_cli("predict", cut, good, "-q"), "cut.sfxml")
    # feature id past the model's
    wide = tmp_path / "wide.txt"
    wide.write_text("1 0:1 10:2\n")
    r = _cli("predict", model, wide, "-q")
    _one_line_exit_2(r, "wide.txt")
    assert "wide.txt:1" in r.stderr
    # an empty data file
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    _one_line_exit_2(_cli("predict", model, empty, "-q"), "empty.txt")
    # a tree file from another version (or not omikuji's at all)
    odir = tmp_path / "omk"
    odir.mkdir()
    (odir / "settings.json").write_text('{"n_features": 10, "classifier_loss_type": "Hinge"}')
    (odir / "tree0.cbor").write_bytes(bytes([0xA1, 0x64]) + b"Twig" + bytes([0x80]))
    _one_line_exit_2(_cli("import", odir, "-o", tmp_path / "x.sfxml"), "tree0.cbor")
    assert not (tmp_path / "x.sfxml").exists()
    # The same errors through the API (the CLI's exit 2 for each class is shown above):
    # a tree file of this version imports (and scores as the same tree written from arrays) ...
    tree = _omikuji_tree_file(odir / "tree0.cbor", 10)
    xml.import_omikuji(odir, tmp_path / "x.sfxml")
    x = random_points(rng, 9, 10)
    np.testing.assert_array_equal(xml.predict(tmp_path / "x.sfxml", x, k=3, beam=2).labels,
                                  xml.predict(xml.write_model(tmp_path / "ref.sfxml", [tree], 10).path, x, k=3, beam=2).labels)
    # ... and cut short it does not
    whole = (odir / "tree0.cbor").read_bytes()
    (odir / "tree0.cbor").write_bytes(whole[: len(whole) // 2])
    with pytest.raises(OSError, match=r"tree0\.cbor"):
        xml.import_omikuji(odir, tmp_path / "y.sfxml")
    assert not (tmp_path / "y.sfxml").exists()
    # a model file of another format version
    other = bytearray(open(model, "rb").read())
    assert other[:8] == b"SFXMLmdl"
    other[8] += 1
    (tmp_path / "v2.sfxml").write_bytes(other)
    with pytest.raises(OSError, match=r"v2\.sfxml: model format version 2"):
        xml.predict(tmp_path / "v2.sfxml", good)
    # a header and no points
    (tmp_path / "none.txt").write_text("0 10 12\n")
    with pytest.raises(ValueError, match=r"none\.txt:1: the header declares no data points"):
        xml.predict(model, tmp_path / "none.txt")
    # not a model at all
    _one_line_exit_2(_cli("predict", good, good, "-q"), "ok.txt")


# ---------------------------------------------------------------- against omikuji


def test_generate_is_deterministic_and_power_law(tmp_path):
    spec = xml.XmlDataSpec(features=500, labels=200, seed=3)
    a = xml.generate_xml(tmp_path / "a.txt", 300, spec, chunk=64)
    b = xml.generate_xml(tmp_path / "b.txt", 300, spec, chunk=64)
    assert open(a).read() == open(b).read()
    x, labels = xml.read_xc(a)
    assert x.shape == (300, 500) and all(labels)
    freq = np.bincount(np.concatenate(labels), minlength=200)
    assert freq[:10].sum() > 3 * freq[100:110].sum()


omikuji = pytest.importorskip("omikuji") if os.environ.get("SCALEFREE_TEST_OMIKUJI", "auto") != "0" else None


@pytest.mark.parametrize("loss", ["hinge", "log"])
def test_same_as_omikuji(tmp_path, rt, loss):
    spec = xml.XmlDataSpec(features=800, labels=300, seed=7)
    train = xml.generate_xml(tmp_path / "train.txt", 1500, spec)
    test = xml.generate_xml(tmp_path / "test.txt", 300, spec, first_point=1500)
    odir = tmp_path / "omk"
    info = xml.train(train, tmp_path / "m.sfxml", loss=loss, threads=1, model_dir=odir, min_branch_size=20)
    assert info.loss == loss and info.n_trees == 3
    m = omikuji.Model.load(str(odir))
    x, truth = xml.read_xc(test)
    p = xml.predict(tmp_path / "m.sfxml", test, k=5, beam=10, runtime=rt, batch_points=64)
    hits = np.zeros(5)
    for i in range(x.shape[0]):
        row = x.getrow(i)
        ref = m.predict(list(zip(row.indices.tolist(), row.data.tolist())), beam_size=10, top_k=5)
        assert_same_topk(p.labels[i], p.scores[i], ref, rtol=1e-4)
        for j in range(5):
            hits[j:] += ref[j][0] in truth[i] if j < len(ref) else 0
    for kk in (1, 3, 5):
        assert p.metrics[f"precision@{kk}"] == pytest.approx(hits[kk - 1] / kk / x.shape[0], abs=1e-9)
