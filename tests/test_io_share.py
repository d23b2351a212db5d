"""Partitioned readers (``_native.read_*_share``): the shares of P = 1..5 ranks together hold
every line of a real file exactly once (in file order for plain files; gzip files are shared
in chunks, so there the multiset is compared), and bad input raises a one-line error naming
the file (and the line where there is one)."""

import gzip
from collections import Counter

import numpy as np
import pytest

from scalefree import _native
from scalefree.errors import DataError


def _write(path, text, gz=False):
    data = text.encode() if isinstance(text, str) else text
    if gz:
        path.write_bytes(gzip.compress(data))
    else:
        path.write_bytes(data)
    return path


def _edge_text(rng, n):
    lines, want = [], []
    for _ in range(n):
        k = rng.integers(6)
        if k == 0:
            lines.append(rng.choice(["", "  ", "# comment 1 2", "\t% other"]))
            continue
        a, b = int(rng.integers(1 << 40)), int(rng.integers(1000))
        sep = str(rng.choice([" ", "\t", " \t "]))
        lines.append(f"{' ' * int(rng.integers(2))}{a}{sep}{b}")
        want.append((a, b))
    ends = [rng.choice(["\n", "\r\n"]) for _ in lines]
    if lines and rng.integers(2):
        ends[-1] = ""  # a final line without its newline
    return "".join(l + e for l, e in zip(lines, ends)), want


def _reference_edges(text):
    """A simple parse: the reference the shares must add up to."""
    out = []
    for line in text.split("\n"):
        s = line.rstrip("\r").strip(" \t")
        if s and s[0] not in "#%":
            a, b = s.split()
            out.append((int(a), int(b)))
    return out


def _pairs(src, dst):
    assert src.dtype == np.int64 and dst.dtype == np.int64 and len(src) == len(dst)
    return list(zip(src.tolist(), dst.tolist()))


@pytest.mark.parametrize("seed", range(8))
def test_edge_shares_add_up_to_the_file(tmp_path, seed):
    rng = np.random.default_rng(seed)
    text, want = _edge_text(rng, [0, 1, 3, 40, 200, 1000, 2, 500][seed] or 1)
    assert _reference_edges(text) == want
    plain = _write(tmp_path / "e.txt", text)
    gz = _write(tmp_path / "e.txt.gz", text, gz=True)
    for size in range(1, 6):
        got = []
        for rank in range(size):
            got += _pairs(*_native.read_edges_share(str(plain), rank, size))
        assert got == want
        got = []
        for rank in range(size):
            got += _pairs(*_native.read_edges_share(gz, rank, size, gzip_chunk_bytes=64))
        assert Counter(got) == Counter(want) and len(got) == len(want)


def test_edge_shares_match_loadtxt_and_offset(tmp_path):
    rng = np.random.default_rng(7)
    e = rng.integers(0, 1 << 30, size=(5000, 2))
    header = "% a header the caller skips\n1 2 3\n"
    p = _write(tmp_path / "g.txt", header + "".join(f"{a}\t{b}\n" for a, b in e))
    ref = np.loadtxt(p, dtype=np.int64, skiprows=2)
    for size in range(1, 6):
        parts = [_native.read_edges_share(p, r, size, offset=len(header)) for r in range(size)]
        assert np.array_equal(np.concatenate([s for s, _ in parts]), ref[:, 0])
        assert np.array_equal(np.concatenate([d for _, d in parts]), ref[:, 1])
    # Matrix Market bodies: 3 fields, the value not read; banner and size line skipped.
    m = _write(tmp_path / "m.mtx", "%%MatrixMarket matrix coordinate real general\n3 3 2\n1 2 0.5\n3 1 2\n")
    src, dst = _native.read_edges_share(m, 0, 1, max_fields=3)
    assert src.tolist() == [1, 3] and dst.tolist() == [2, 1]


def _svm_text(rng, n):
    lines, want = [], []
    for _ in range(n):
        if rng.integers(5) == 0:
            lines.append(rng.choice(["", "# only a comment", "   "]))
            continue
        y = float(rng.choice([-1, 1, 0, 2.5]))
        feats = [(int(rng.integers(1 << 20)), float(rng.integers(-100, 100)) / 4) for _ in range(rng.integers(5))]
        qid = f" qid:{rng.integers(9)}" if rng.integers(3) == 0 else ""
        lines.append(f"{y}{qid} " + " ".join(f"{i}:{v}" for i, v in feats) + (" # c 1:2" if rng.integers(2) else ""))
        want.append((y, feats))
    return "".join(l + "\n" for l in lines), want


def _rows(labels, indptr, indices, values):
    assert labels.dtype == np.float64 and indptr.dtype == np.int64 and values.dtype == np.float64
    assert len(indptr) == len(labels) + 1 and indptr[0] == 0
    return [(float(labels[r]), list(zip(indices[indptr[r]:indptr[r + 1]].tolist(), values[indptr[r]:indptr[r + 1]].tolist())))
            for r in range(len(labels))]


@pytest.mark.parametrize("gz", [False, True])
def test_svmlight_shares_add_up_to_the_file(tmp_path, gz):
    text, want = _svm_text(np.random.default_rng(3), 300)
    p = _write(tmp_path / ("s.svm.gz" if gz else "s.svm"), text, gz=gz)
    for size in range(1, 6):
        got = []
        for rank in range(size):
            got += _rows(*_native.read_svmlight_share(p, rank, size, 2**31, gzip_chunk_bytes=100))
        if gz:
            assert sorted(map(repr, got)) == sorted(map(repr, want))
        else:
            assert got == want


@pytest.mark.parametrize("style", ["ws", "csv", "dat"])
def test_rating_shares_add_up_to_the_file(tmp_path, style):
    rng = np.random.default_rng(5)
    u, i, r = rng.integers(0, 1 << 40, 400), rng.integers(0, 5000, 400), rng.integers(1, 11, 400) / 2
    fmt = {"ws": "{} {}\t{} 881250949", "csv": "{},{},{},1", "dat": "{}::{}::{}::978300760"}[style]
    head = "userId,movieId,rating,timestamp\n" if style == "csv" else "# ratings\n"
    p = _write(tmp_path / "r.txt", head + "".join(fmt.format(*t) + "\n" for t in zip(u, i, r)))
    for size in range(1, 6):
        parts = [_native.read_ratings_share(p, rank, size) for rank in range(size)]
        assert all(a.dtype == np.int64 and b.dtype == np.int64 and c.dtype == np.float32 for a, b, c in parts)
        assert np.array_equal(np.concatenate([a for a, _, _ in parts]), u)
        assert np.array_equal(np.concatenate([b for _, b, _ in parts]), i)
        assert np.array_equal(np.concatenate([c for _, _, c in parts]), r.astype(np.float32))


def _one_line_error(excinfo, path, line=None):
    msg = str(excinfo.value)
    assert "\n" not in msg, msg
    where = f"{path}:{line}:" if line is not None else f"{path}"
    assert where in msg, msg
    return msg


def test_missing_file(tmp_path):
    p = tmp_path / "nope.txt"
    for call in (lambda: _native.read_edges_share(p, 0, 1), lambda: _native.read_svmlight_share(p, 0, 1, 10),
                 lambda: _native.read_ratings_share(p, 1, 2)):
        with pytest.raises(FileNotFoundError) as e:
            call()
        _one_line_error(e, p)


@pytest.mark.parametrize("gz", [False, True])
def test_data_errors_name_file_and_line(tmp_path, gz):
    body = "".join(f"{k} {k + 1}\n" for k in range(2000))
    name = "x.txt.gz" if gz else "x.txt"
    cases = [
        # (text, reader, line or None, words in the message)
        ("", "edges", None, "no edges (empty file)"),
        ("# only a header\n% and a comment\n", "edges", None, "no edges (empty file)"),
        ("userId,movieId,rating\n", "ratings", None, "no ratings (empty file)"),
        (body + "5", "edges", 2001, "expected 2 fields (from to), found 1: '5'"),
        (body + "7 8 9\n" + body, "edges", 2001, "found 3"),
        (body + "1 4611686018427387904\n", "edges", 2001, "too large"),
        (body + "1 -3\n", "edges", 2001, "negative vertex id '-3'"),
        (body + "1 abc\n", "edges", 2001, "'abc' is not an integer vertex id"),
        ("1 2 3.5\n" * 1000 + "4 5 nan\n", "ratings", 1001, "not finite"),
        ("1 1:2\n" * 1000 + "1 3:inf\n", "svmlight", 1001, "not finite"),
        ("1 1:2\n" * 1000 + "1 1099511627776:1\n", "svmlight", 1001, "larger than the bound 2147483648"),
    ]
    for text, reader, line, words in cases:
        p = _write(tmp_path / name, text, gz=gz)
        for size in (1, 3):
            raised = 0
            for rank in range(size):
                call = {"edges": lambda: _native.read_edges_share(p, rank, size, gzip_chunk_bytes=4096),
                        "ratings": lambda: _native.read_ratings_share(p, rank, size, gzip_chunk_bytes=4096),
                        "svmlight": lambda: _native.read_svmlight_share(p, rank, size, 2**31, gzip_chunk_bytes=4096)}[reader]
                try:
                    call()
                except DataError as exc:
                    assert isinstance(exc, ValueError)
                    msg = str(exc)
                    assert "\n" not in msg and words in msg, msg
                    assert msg.startswith(f"{p}:{line}: " if line else f"{p}: "), msg
                    raised += 1
            # a bad line fails the rank that owns it; an empty file fails every rank
            assert raised == (1 if line else size), (text[-30:], size)


def test_binary_garbage(tmp_path):
    rng = np.random.default_rng(1)
    junk = bytes(rng.integers(0, 256, 5000, dtype=np.uint8)) + b"\0\0"
    for reader in ("edges", "ratings", "svmlight"):
        p = _write(tmp_path / f"{reader}.bin", b"1 2 3\n" + junk)
        raised = 0
        for rank in range(2):
            try:
                {"edges": lambda: _native.read_edges_share(p, rank, 2, max_fields=3),
                 "ratings": lambda: _native.read_ratings_share(p, rank, 2),
                 "svmlight": lambda: _native.read_svmlight_share(p, rank, 2, 2**31)}[reader]()
            except DataError as exc:
                msg = str(exc)
                assert "\n" not in msg and msg.startswith(f"{p}:"), msg
                raised += 1
        assert raised >= 1, reader


def test_corrupt_gzip(tmp_path):
    good = gzip.compress("".join(f"{k} {k}\n" for k in range(50000)).encode())
    for name, data in [("trunc.gz", good[: len(good) // 2]), ("crc.gz", good[:-8] + bytes([good[-8] ^ 1]) + good[-7:])]:
        p = _write(tmp_path / name, data)
        for rank in range(2):
            with pytest.raises(DataError) as e:
                _native.read_edges_share(p, rank, 2, gzip_chunk_bytes=4096)
            assert _one_line_error(e, p).startswith(f"{p}: corrupt gzip data (")


def test_bad_arguments(tmp_path):
    p = _write(tmp_path / "e.txt", "1 2\n")
    with pytest.raises(ValueError, match="rank 2 is not in 0..2"):
        _native.read_edges_share(p, 2, 2)
    with pytest.raises(ValueError, match="min_fields"):
        _native.read_edges_share(p, 0, 1, min_fields=3, max_fields=2)


def test_svmlight_matches_the_python_reader(tmp_path):
    """Differential: the syntax `scalefree.sgd.read_svmlight` accepts, read the same way."""
    sgd = pytest.importorskip("scalefree.sgd")
    text = ("+1 qid:3 1:0.5 7:-2 # comment 9:9\n\n# only a comment\n-1\t3:1e-3   12:+4.\r\n"
            "0 1_0:2_5 -0:.5 2:1E2\n2.5 qid:x 4:-7\n")
    text += "".join(f"{k % 3 - 1} {k}:{k / 8} {k + 1}:{-k}\n" for k in range(300))
    p = _write(tmp_path / "d.svm", text)
    ref = sgd.read_svmlight(p, zero_based=True)
    for size in range(1, 6):
        parts = [_native.read_svmlight_share(p, r, size, 2**31) for r in range(size)]
        labels = np.concatenate([l for l, _, _, _ in parts])
        assert np.array_equal((labels > 0).astype(np.float64), ref.labels)
        assert np.array_equal(np.concatenate([ix for _, _, ix, _ in parts]), ref.indices)
        assert np.array_equal(np.concatenate([v for _, _, _, v in parts]), ref.data)
        counts = np.concatenate([np.diff(ip) for _, ip, _, _ in parts])
        assert np.array_equal(counts, np.diff(ref.indptr))
