"""Feature indices past 2**32 in svmlight files: the share reader keeps them as written at any
world size (a plain-Python parse is the reference); logistic regression, which keeps a dense
weight vector per rank, refuses them with one line naming the file and line instead of
allocating the dimension."""

import gzip
import subprocess
import sys

import numpy as np
import pytest

BIG = np.array([0, 1, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**32 + 1, 2**40 + 3, 2**53 + 1, 2**63 - 1], np.int64)


def svm_rows(seed=0, n=120):
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(n):
        k = int(rng.integers(0, 6))
        idx = sorted(set(int(x) for x in rng.choice(BIG, k)))
        rows.append((float(rng.choice([-1, 1])), [(j, float(rng.integers(-50, 50)) / 4) for j in idx]))
    return rows


def reference(text):
    """labels, indptr, indices, values of svmlight text by plain Python."""
    labels, indptr, indices, values = [], [0], [], []
    for line in text.splitlines():
        toks = line.split("#")[0].split()
        if not toks:
            continue
        labels.append(float(toks[0]))
        for t in toks[1:]:
            j, v = t.split(":")
            indices.append(int(j))
            values.append(float(v))
        indptr.append(len(indices))
    return labels, indptr, indices, values


@pytest.mark.parametrize("gz", [False, True])
def test_svmlight_shares_keep_indices_past_2_to_the_32(tmp_path, gz):
    from scalefree.sgd.logreg import read_svmlight_share

    text = "# wide\n" + "".join(f"{y:g} " + " ".join(f"{j}:{v:g}" for j, v in row) + "\n" for y, row in svm_rows())
    p = tmp_path / ("d.svm.gz" if gz else "d.svm")
    p.write_bytes(gzip.compress(text.encode()) if gz else text.encode())
    want = reference(text)
    for size in (1, 2, 3):
        parts = [read_svmlight_share(p, r, size, max_index=2**63 - 1) for r in range(size)]
        labels = np.concatenate([a for a, _, _, _ in parts])
        indices = np.concatenate([c for _, _, c, _ in parts])
        values = np.concatenate([d for _, _, _, d in parts])
        lengths = np.concatenate([np.diff(b) for _, b, _, _ in parts])
        assert indices.dtype == np.int64
        assert labels.tolist() == want[0] and indices.tolist() == want[2] and values.tolist() == want[3]
        assert np.concatenate([[0], np.cumsum(lengths)]).tolist() == want[1]


def test_logreg_refuses_a_feature_index_past_its_bound(tmp_path):
    from scalefree.sgd.logreg import MAX_FEATURES, SvmlightError, read_svmlight

    p = tmp_path / "d.svm"
    p.write_text(f"1 3:1\n-1 {2**32}:0.5\n")
    with pytest.raises(SvmlightError, match=r"d\.svm:2"):
        read_svmlight(p)
    assert MAX_FEATURES <= 2**31
    out = subprocess.run([sys.executable, "-m", "scalefree.cli", "sgd", "logreg", str(p), "-n", "2"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("scalefree sgd logreg: error:") and "d.svm:2" in lines[0], out.stderr
