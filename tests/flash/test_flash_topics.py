"""flash.topics (ISLE) on planted corpora, the corpus generator, and `scalefree flash topics`."""

import json
import subprocess
import sys

import numpy as np
import pytest
import scipy.sparse as sp

from scalefree import flash
from scalefree.errors import InvalidArgumentError


def run_cli(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "scalefree.cli", "flash", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """A small planted corpus: 3000 documents, 400 words, 5 topics, written as docword."""
    d = tmp_path_factory.mktemp("planted")
    truth = flash.planted_topics(400, 5, beta=0.05, seed=3)
    path = d / "docword.planted.txt"
    nnz = flash.write_corpus(path, truth, 3000, alpha=0.05, mean_length=80, seed=3, chunk=700)
    return path, truth, nnz


def test_corpus_file_is_a_docword_with_the_planted_counts(planted, tmp_path):
    path, truth, nnz = planted
    rt = flash.Runtime(dir=tmp_path)
    a = flash.load(path, rt).to_scipy()
    assert a.shape == (3000, 400) and a.nnz == nnz
    assert np.all(a.data >= 1) and np.all(a.data == np.round(a.data))
    lengths = np.asarray(a.sum(axis=1)).ravel()
    assert lengths.min() >= 1 and abs(lengths.mean() - 80) < 3
    # Word frequencies follow the mixture of the topics (topic weights average 1/k).
    freq = np.asarray(a.sum(axis=0)).ravel() / a.sum()
    assert np.abs(freq - truth.mean(axis=1)).sum() < 0.25


def test_recovery_error_matches_permutations():
    rng = np.random.default_rng(0)
    m = rng.dirichlet(np.ones(50), size=6).T
    perm = rng.permutation(6)
    mean, worst, matching = flash.recovery_error(m[:, perm] * 3.0, m)
    assert mean == pytest.approx(0.0, abs=1e-12) and worst == pytest.approx(0.0, abs=1e-12)
    assert np.array_equal(perm[matching], np.arange(6))
    with pytest.raises(InvalidArgumentError):
        flash.recovery_error(m[:, :5], m)


@pytest.mark.parametrize("budget_fraction,sample", [(None, 1.0), (0.25, 1.0), (0.25, 0.5)])
def test_topics_recover_planted_topics_within_budget(planted, tmp_path, budget_fraction, sample):
    path, truth, _ = planted
    big = flash.Runtime(dir=tmp_path)
    a = flash.load(path, big, dtype=np.float32)
    csr_bytes = a.nnz * 8 + (a.shape[0] + 1) * 8
    budget = "64M" if budget_fraction is None else int(csr_bytes * budget_fraction)
    rt = flash.Runtime(memory_budget=budget, dir=tmp_path)
    a = flash.load(path, rt, dtype=np.float32)
    model = flash.topics(a, 5, sample=sample, runtime=rt, seed=1)
    assert model.topic_word.shape == (400, 5)
    np.testing.assert_allclose(model.topic_word.sum(axis=0), 1.0, rtol=1e-9)
    assert model.labels.shape == (3000,) and set(np.unique(model.labels)) <= set(range(5))
    mean, worst, _ = flash.recovery_error(model.topic_word, truth)
    assert mean < 0.35 and worst < 0.6, (mean, worst)
    if budget_fraction is not None:
        assert model.stats["on_flash"]
        assert model.stats["lloyd_on_flash"] or sample < 1
        assert 0 < model.stats["peak_resident_bytes"] <= rt.memory_budget_bytes
        assert model.stats["row_block_bytes"] <= max(1 << 16, rt.memory_budget_bytes // 4)
    top = model.top_words(7)
    assert top.shape == (5, 7)
    assert np.all(np.diff(model.topic_word[top.T, np.arange(5)], axis=0) <= 0)


def test_topics_on_scipy_matches_flash(planted, tmp_path):
    path, truth, _ = planted
    rt = flash.Runtime(memory_budget="64M", dir=tmp_path)
    a = flash.load(path, rt, dtype=np.float64).to_scipy()
    model = flash.topics(sp.csr_matrix(a), 5, runtime=rt, seed=1)
    assert flash.recovery_error(model.topic_word, truth)[0] < 0.35


def test_topics_bad_arguments(tmp_path):
    rt = flash.Runtime(dir=tmp_path)
    a = sp.random(50, 30, density=0.2, random_state=0, format="csr") * 5
    with pytest.raises(InvalidArgumentError):
        flash.topics(a, 1, runtime=rt)
    with pytest.raises(InvalidArgumentError):
        flash.topics(a, 30, runtime=rt)
    with pytest.raises(InvalidArgumentError):
        flash.topics(a, 3, sample=0.0, runtime=rt)
    with pytest.raises(InvalidArgumentError):
        flash.topics(np.ones((5, 5)), 2, runtime=rt)


def test_cli_corpus_and_topics_json(tmp_path):
    out = tmp_path / "docword.small.txt"
    p = run_cli("corpus", "--docs", 1500, "--words", 300, "--topics", 4, "--beta", 0.05, "--length", 60, "-o", out,
                "--seed", 5)
    assert p.returncode == 0, p.stderr
    truth_path = tmp_path / "docword.small.topics.npy"
    assert out.exists() and truth_path.exists()
    js = tmp_path / "out.json"
    p = run_cli("topics", out, "-k", 4, "--memory", "64K", "--json", js, "--truth", truth_path, "--dir", tmp_path,
                "--top", 6, "--out", tmp_path / "model.npz")
    assert p.returncode == 0, p.stderr
    rec = json.loads(js.read_text())
    assert isinstance(rec["seconds"], float) and rec["seconds"] > 0
    assert len(rec["top_words"]) == 4 and all(len(t) == 6 for t in rec["top_words"])
    assert all(1 <= w <= 300 for t in rec["top_words"] for w in t)
    assert rec["recovery_l1_mean"] < 0.4
    assert "peak" in p.stderr and "read" in p.stderr and "recovery error" in p.stderr
    assert len(p.stdout.strip().splitlines()) == 4
    model = np.load(tmp_path / "model.npz")
    assert model["topic_word"].shape == (300, 4) and model["labels"].shape == (1500,)


def test_cli_topics_bad_input_is_one_line(tmp_path):
    bad = tmp_path / "docword.bad.txt"
    bad.write_text("3\n4\n2\n1 1 2\n2 x 1\n")
    p = run_cli("topics", bad, "-k", 2, "--dir", tmp_path)
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("scalefree flash topics: error:") and "docword.bad.txt" in lines[0]
    assert "line 5" in lines[0]
    p = run_cli("topics", tmp_path / "docword.missing.txt", "-k", 2)
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1
    small = tmp_path / "docword.small.txt"
    small.write_text("3\n4\n3\n1 1 2\n2 2 1\n3 3 1\n")
    p = run_cli("topics", small, "-k", 5, "--dir", tmp_path)
    assert p.returncode == 2 and p.stderr.strip().startswith("scalefree flash topics: error:")
    assert len(p.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("rows,block_bytes", [(0, 64), (1, 64), (37, 64), (37, 10_000), (200, 300)])
def test_row_blocks_of_a_flash_csr_match_scipy(tmp_path, rows, block_bytes):
    from scalefree.flash.state import CsrRows

    rng = np.random.default_rng(rows)
    s = sp.random(rows, 23, density=0.3, random_state=rng, format="lil", dtype=np.float32)
    s[rows // 2:rows // 2 + 3] = 0  # empty rows
    s = s.tocsr()
    s.eliminate_zeros()
    a = flash.Csr.from_scipy(s, flash.Runtime(dir=tmp_path))
    seen = []
    for lo, hi, block in CsrRows(a, block_bytes):
        assert block.shape == (hi - lo, 23)
        assert block.nnz * 8 <= block_bytes or hi - lo == 1
        seen.append(block)
    got = sp.vstack(seen, format="csr") if seen else sp.csr_matrix((0, 23))
    assert got.shape == s.shape and (got != s.astype(np.float64)).nnz == 0
