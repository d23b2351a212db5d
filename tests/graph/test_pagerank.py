"""The main job: PageRank of wiki-Vote over the sparse and the dense allreduce, against a
one-process reference."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

DATA = Path(__file__).resolve().parents[3] / "shared" / "data" / "wiki-vote" / "wiki-Vote.txt"


def reference(path, damping=0.85, tol=1e-10):
    from scalefree.graph.io import read_edge_list

    src, dst, ids = read_edge_list(path)
    n = ids.size
    outdeg = np.bincount(src, minlength=n)
    pr = np.full(n, 1.0 / n)
    for _ in range(200):
        contrib = np.where(outdeg[src] > 0, pr[src] / np.maximum(outdeg[src], 1), 0.0)
        flow = np.bincount(dst, weights=contrib, minlength=n)
        new = (1 - damping) / n + damping * (flow + pr[outdeg == 0].sum() / n)
        done = np.abs(new - pr).sum() < tol
        pr = new
        if done:
            break
    return ids, pr


@pytest.mark.skipif(not DATA.exists(), reason=f"{DATA} is absent (../shared/data not beside the project)")
@pytest.mark.parametrize("collective,n", [("dense", 1), ("dense", 3), ("sparse", 2)])
def test_pagerank_on_wiki_vote_matches_reference(collective, n, tmp_path):
    out = tmp_path / "scores.tsv"
    p = subprocess.run([sys.executable, "-m", "scalefree.cli", "graph", "pagerank", str(DATA), "-n", str(n),
                        "--collective", collective, "-o", str(out), "--top", "3"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines()[1].startswith("4037\t"), p.stdout
    got = np.loadtxt(out)
    ids, want = reference(DATA)
    np.testing.assert_array_equal(got[:, 0].astype(np.int64), ids)
    np.testing.assert_allclose(got[:, 1], want, rtol=1e-9, atol=1e-15)
    assert int(got[np.argmax(got[:, 1]), 0]) == 4037


def test_bad_edge_list_names_file_and_line(tmp_path):
    from scalefree.graph.io import EdgeListError, read_edge_list

    p = tmp_path / "g.txt"
    p.write_text("# comment\n1 2\n3 x\n")
    with pytest.raises(EdgeListError, match=r"g.txt:3: 'x' is not an integer"):
        read_edge_list(p)
    p.write_text("1 2\n3 4 5\n")
    with pytest.raises(EdgeListError, match=r"g.txt:2: expected 2 fields"):
        read_edge_list(p)
    with pytest.raises(FileNotFoundError):
        read_edge_list(tmp_path / "missing.txt")


@pytest.mark.skipif(not DATA.exists(), reason=f"{DATA} is absent (../shared/data not beside the project)")
def test_pagerank_with_slack_reaches_the_same_fixed_point(tmp_path):
    """Asynchronous PageRank (``--slack``, a seeded straggler so ranks drift apart) stops on
    the exact flushed scores: the same fixed point and the same top vertices."""
    out = tmp_path / "scores.tsv"
    p = subprocess.run([sys.executable, "-m", "scalefree.cli", "graph", "pagerank", str(DATA), "-n", "3",
                        "--slack", "3", "--straggler", "2", "-o", str(out), "--top", "10"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    got = np.loadtxt(out)
    ids, want = reference(DATA)
    np.testing.assert_array_equal(got[:, 0].astype(np.int64), ids)
    assert np.abs(got[:, 1] - want).sum() < 1e-8
    top = [int(line.split("\t")[0]) for line in p.stdout.splitlines()[1:11]]
    assert top == ids[np.lexsort((ids, -want))][:10].tolist()
