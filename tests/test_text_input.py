"""Input as users hold it, for every text reader (edges, ratings, svmlight): delimiters
(tab, space, comma, semicolon) detected or given, an optional header line, part
directories as Spark/Dask/Hive write them (markers skipped, a header per part, plain and
gzip parts mixed), gzip files of several members split by members. For P = 1..5 the
shares of all ranks hold every record once; bad input is one line naming the file and
line, exit 2 from the CLI."""

import gzip
import subprocess
import sys

import numpy as np
import pytest

from scalefree import _native
from scalefree.errors import DataError

SEPS = {"tab": "\t", "space": " ", "comma": ",", "semicolon": ";"}


def _edges(n, seed):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 1 << 40, n), rng.integers(0, 1000, n)


def _text(cols, sep, header=None):
    lines = [sep.join(header)] if header else []
    lines += [sep.join(str(x) for x in row) for row in zip(*cols)]
    return "".join(line + "\n" for line in lines)


def _multi_member(data: bytes, members: int) -> bytes:
    """``data`` as ``members`` gzip members cut at arbitrary bytes (not line ends)."""
    cuts = [len(data) * k // members for k in range(members + 1)]
    return b"".join(gzip.compress(data[cuts[k]:cuts[k + 1]]) for k in range(members))


def _write_parts(d, cols, sep, header, nparts, kinds, seed):
    """A Spark-style part directory: ``nparts`` consecutive runs of the rows, each part plain,
    one gzip stream or several members (``kinds`` cycled), markers beside them."""
    d.mkdir()
    n = len(cols[0])
    rng = np.random.default_rng(seed)
    cuts = np.sort(rng.integers(0, n + 1, max(0, nparts - 1)))
    bounds = [0, *cuts.tolist(), n]
    for k in range(nparts):
        body = _text([c[bounds[k]:bounds[k + 1]] for c in cols], sep, header).encode()
        kind = kinds[k % len(kinds)]
        name = f"part-{k:05d}-c0ffee.csv"
        if kind == "plain":
            (d / name).write_bytes(body)
        elif kind == "gz":
            (d / f"{name}.gz").write_bytes(gzip.compress(body))
        else:
            (d / f"{name}.gz").write_bytes(_multi_member(body, 5))
        (d / f".{name}.crc").write_bytes(b"\x00crc")
    (d / "_SUCCESS").write_bytes(b"")
    return d


def _edge_shares(path, size, **kw):
    got = []
    for r in range(size):
        s, d = _native.read_edges_share(str(path), r, size, **kw)
        got += list(zip(s.tolist(), d.tolist()))
    return got


@pytest.mark.parametrize("sep", list(SEPS))
@pytest.mark.parametrize("header", [None, ("src", "dst")])
def test_edge_delimiters_and_header_every_rank_count(tmp_path, sep, header):
    src, dst = _edges(301, 1)
    f = tmp_path / "e.csv"
    f.write_text(_text([src, dst], SEPS[sep], header))
    want = list(zip(src.tolist(), dst.tolist()))
    for size in range(1, 6):
        assert _edge_shares(f, size) == want, size
        assert _edge_shares(f, size, delimiter=sep) == want, size
        assert _edge_shares(f, size, header="yes" if header else "no") == want, size


@pytest.mark.parametrize("nparts", [1, 3, 8])
@pytest.mark.parametrize("kinds", [("plain",), ("plain", "gz", "members"), ("members",)])
def test_part_directory_every_rank_count(tmp_path, nparts, kinds):
    src, dst = _edges(997, nparts)
    d = _write_parts(tmp_path / "parts", [src, dst], ",", ("src", "dst"), nparts, kinds, seed=nparts)
    want = sorted(zip(src.tolist(), dst.tolist()))
    for size in range(1, 6):
        assert sorted(_edge_shares(d, size)) == want, size
    assert _native.resolve_parts(str(d)) == sorted(str(p) for p in d.iterdir() if p.name.startswith("part-")
                                                     and not p.name.endswith(".crc"))


def test_few_parts_spread_over_more_ranks(tmp_path):
    """One or three plain parts and four ranks: every rank gets about a quarter."""
    src, dst = _edges(4000, 5)
    for nparts in (1, 3):
        d = _write_parts(tmp_path / f"p{nparts}", [src, dst], "\t", None, nparts, ("plain",), seed=9)
        for r in range(4):
            s, _ = _native.read_edges_share(str(d), r, 4)
            assert abs(len(s) - 1000) < 60, (nparts, r, len(s))


def test_members_split_not_repeated(tmp_path):
    """A gzip file of many members: each rank's share is about 1/P of the lines (it
    decompresses only its members), in file order when concatenated."""
    src, dst = _edges(20000, 6)
    data = _text([src, dst], "\t").encode()
    f = tmp_path / "m.txt.gz"
    f.write_bytes(_multi_member(data, 64))
    want = list(zip(src.tolist(), dst.tolist()))
    for size in range(1, 6):
        got = []
        for r in range(size):
            s, d = _native.read_edges_share(str(f), r, size)
            assert abs(len(s) - 20000 / size) < 20000 / 16, (size, r, len(s))
            got += list(zip(s.tolist(), d.tolist()))
        assert got == want


def test_empty_directory_and_header_only_parts(tmp_path):
    d = tmp_path / "empty"
    d.mkdir()
    (d / "_SUCCESS").write_bytes(b"")
    with pytest.raises(DataError, match="the directory holds no part files"):
        _native.read_edges_share(str(d), 0, 1)
    h = tmp_path / "hdr"
    h.mkdir()
    (h / "part-00000.csv").write_text("src,dst\n")
    (h / "part-00001.csv").write_text("src,dst\n1,2\n")
    (h / "part-00002.csv").write_text("")
    for size in range(1, 4):
        assert _edge_shares(h, size) == [(1, 2)]
    (h / "part-00001.csv").write_text("src,dst\n")
    for size in range(1, 4):
        for r in range(size):
            with pytest.raises(DataError, match=r"part-00000.csv: no edges \(empty file\)$"):
                _native.read_edges_share(str(h), r, size)


def test_one_line_errors_name_the_part_and_line(tmp_path):
    d = tmp_path / "d"
    d.mkdir()
    (d / "part-00000.csv").write_text("src,dst\n1,2\n")
    (d / "part-00001.csv.gz").write_bytes(gzip.compress(b"src,dst\n3,4\n"))
    (d / "part-00002.csv").write_text("# c\nsrc;dst\n5;6\n")
    for size in range(1, 5):
        for r in range(size):
            with pytest.raises(DataError) as e:
                _native.read_edges_share(str(d), r, size)
            msg = str(e.value)
            assert msg == (f"{d}/part-00002.csv:2: the part starts with 'src;dst', not the header 'src,dst' of "
                           f"{d}/part-00000.csv")
    f = tmp_path / "amb.txt"
    f.write_text("1,2;3\n")
    with pytest.raises(DataError, match=r"amb.txt:1: ambiguous delimiter: '1,2;3' holds both ',' and ';'"):
        _native.read_edges_share(str(f), 0, 1)
    f.write_text("1,2\n3,4,5\n")
    with pytest.raises(DataError, match=r"amb.txt:2: expected 2 fields \(from to\), found 3: '3,4,5'"):
        _native.read_edges_share(str(f), 0, 1)


@pytest.mark.parametrize("sep", ["\t", " ", ",", ";", "::"])
def test_ratings_delimiters_headers_and_parts(tmp_path, sep):
    rng = np.random.default_rng(3)
    n = 500
    u, i, r = rng.integers(0, 10**6, n), rng.integers(0, 5000, n), rng.integers(1, 11, n) / 2
    header = ("user", "item", "rating") if sep != "::" else None
    d = _write_parts(tmp_path / "r", [u, i, r], sep, header, 3, ("plain", "members", "gz"), seed=1)
    want = sorted(zip(u.tolist(), i.tolist(), r.astype(np.float32).tolist()))
    for size in range(1, 6):
        got = []
        for k in range(size):
            a, b, c = _native.read_ratings_share(str(d), k, size)
            got += list(zip(a.tolist(), b.tolist(), c.tolist()))
        assert sorted(got) == want, size


def test_svmlight_header_and_parts(tmp_path):
    d = tmp_path / "s"
    d.mkdir()
    rows = [f"{1 if k % 3 else -1} {k % 7 + 1}:{k / 4} {k % 11 + 9}:1" for k in range(200)]
    for p, (lo, hi) in enumerate([(0, 50), (50, 51), (51, 200)]):
        body = "label features\n" + "".join(x + "\n" for x in rows[lo:hi])
        (d / f"part-{p:05d}").write_bytes(gzip.compress(body.encode()) if p == 1 else body.encode())
    (d / "_SUCCESS").write_bytes(b"")
    for size in range(1, 6):
        labels = []
        for k in range(size):
            y, _, _, _ = _native.read_svmlight_share(str(d), k, size, 1 << 31)
            labels += y.tolist()
        assert sorted(labels) == sorted(float(x.split()[0]) for x in rows), size


def _cli(*args, timeout=180):
    return subprocess.run([sys.executable, "-m", "scalefree.cli", *args], capture_output=True, text=True,
                          timeout=timeout)


def _ranks(n, code, *args):
    """``code`` run by ``n`` ranks (``scalefree run``) with ``args`` as ``sys.argv[1:]``."""
    return subprocess.run([sys.executable, "-m", "scalefree.cli", "run", "-n", str(n), "--", sys.executable, "-c", code,
                           *map(str, args)], capture_output=True, text=True, timeout=180)


def test_cli_pagerank_same_top_from_csv_parts_gz_members_and_text(tmp_path):
    from scalefree.graph.rmat import write_rmat

    txt = tmp_path / "g.txt"
    write_rmat(txt, 10, 30000, seed=3, progress=False)
    parts = tmp_path / "parts"
    gzm = tmp_path / "g.txt.gz"
    p = _cli("graph", "convert", str(txt), str(parts), "--parts", "3", "--suffix", ".csv.gz")
    assert p.returncode == 0, p.stderr
    p = _cli("graph", "convert", str(txt), str(gzm), "--member-bytes", "20K")
    assert p.returncode == 0, p.stderr
    assert gzip.decompress(gzm.read_bytes()).count(b"\n") == 30000
    assert (parts / "_SUCCESS").exists() and gzip.decompress((parts / "part-00000.csv.gz").read_bytes()).startswith(
        b"src,dst\n")
    one = tmp_path / "one.txt.gz"  # a single gzip stream: rank 0 decompresses, the others parse
    one.write_bytes(gzip.compress(txt.read_bytes()))
    assert _native.TextStream(str(one)).is_single_stream() and not _native.TextStream(str(gzm)).is_single_stream()
    tops = []
    for f in (txt, parts, gzm, one):
        for n in (1, 3):
            p = _cli("graph", "pagerank", str(f), "-n", str(n), "--top", "5", "--tol", "1e-12")
            assert p.returncode == 0, p.stderr
            tops.append([ln.split()[-2] for ln in p.stdout.splitlines()[1:]])
    assert all(t == tops[0] for t in tops), tops


@pytest.mark.parametrize("n", [2, 3, 5])
def test_single_stream_handed_out_by_one_rank(tmp_path, n):
    """Every edge once over the ranks, and a bad line deep in the stream is reported with its
    line by the rank that parses it, exit 2."""
    src, dst = _edges(30000, n)
    text = "# comment\nsrc dst\n" + _text([src, dst], " ")
    f = tmp_path / "one.txt.gz"
    f.write_bytes(gzip.compress(text.encode()))
    code = ("import sys, numpy as np, scalefree\n"
            "from scalefree.graph.io import stream_share\n"
            "g = scalefree.init()\n"
            "s, d = stream_share(g, sys.argv[1], chunk_bytes=10000)\n"
            "np.save(sys.argv[2] + f'/{g.rank}.npy', np.stack([s, d]))\n")
    p = _ranks(n, code, f, tmp_path)
    assert p.returncode == 0, p.stderr
    got = np.concatenate([np.load(tmp_path / f"{r}.npy") for r in range(n)], axis=1)
    assert len(np.load(tmp_path / "0.npy")[0]) == 0  # the reader parses nothing
    assert sorted(zip(got[0].tolist(), got[1].tolist())) == sorted(zip(src.tolist(), dst.tolist()))
    lines = text.splitlines()
    lines[20001] = "7 x"
    f.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode()))
    p = _cli("graph", "pagerank", str(f), "-n", str(n))
    assert p.returncode == 2, p.stderr
    assert p.stderr.strip().splitlines() == [f"scalefree graph pagerank: error: {f}:20002: 'x' is not an integer "
                                             "vertex id"], p.stderr


def test_cli_bad_input_is_one_line_exit_2(tmp_path):
    d = tmp_path / "d"
    d.mkdir()
    (d / "part-00000.csv").write_text("src,dst\n1,2\n")
    (d / "part-00001.csv").write_text("a,b\n3,4\n")
    p = _cli("graph", "pagerank", str(d), "-n", "2")
    assert p.returncode == 2
    err = p.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].endswith(f"{d}/part-00001.csv:1: the part starts with 'a,b', not the header "
                                             f"'src,dst' of {d}/part-00000.csv"), p.stderr
    f = tmp_path / "e.txt"
    f.write_text("1;2\n")
    p = _cli("graph", "pagerank", str(f), "--delimiter", "comma")
    assert p.returncode == 2 and p.stderr.strip().endswith("e.txt:1: expected 2 fields (from to), found 1: '1;2'"), \
        p.stderr
    f.write_text("1,2\n3,4\n")
    p = _cli("graph", "pagerank", str(f), "--top", "1")
    assert p.returncode == 0, p.stderr


def test_cli_mf_and_sgd_read_part_directories(tmp_path):
    rng = np.random.default_rng(0)
    n = 3000
    u, i = rng.integers(0, 100, n), rng.integers(0, 80, n)
    r = rng.integers(1, 6, n)
    d = _write_parts(tmp_path / "ratings", [u, i, r], ";", ("user", "item", "rating"), 3, ("plain", "members"), 2)
    for mode in (["--mode", "local"], ["--mode", "rima", "-n", "2"]):
        p = _cli("mf", "train", str(d), "-k", "4", "-i", "2", *mode)
        assert p.returncode == 0, p.stderr
        words = p.stdout.split()
        k = words.index("train")
        assert int(words[k - 1]) + int(words[k + 2]) == n, p.stdout
    s = tmp_path / "svm"
    s.mkdir()
    rows = "".join(f"{1 if k % 2 else -1} {k % 5 + 1}:1 {k % 7 + 6}:0.5\n" for k in range(400))
    (s / "part-00000").write_text("label features\n" + rows[: len(rows) // 2 - 3].rsplit("\n", 1)[0] + "\n")
    (s / "part-00001").write_text("label features\n" + rows[len(rows[: len(rows) // 2 - 3].rsplit("\n", 1)[0]) + 1:])
    (s / "_SUCCESS").write_text("")
    p = _cli("sgd", "logreg", str(s), "-n", "2", "--epochs", "1")
    assert p.returncode == 0, p.stderr


def test_truncated_gzip_is_one_line_exit_2(tmp_path):
    """A ``.gz`` cut mid-stream — one stream (read by rank 0 and handed out at 3 ranks, by
    every rank's share reader at 1) or several members — is one line naming the file, exit 2,
    for the graph, MF and sgd readers; no rank waits for a chunk that never comes."""
    src, dst = _edges(20000, 4)
    text = _text([src, dst], " ").encode()
    one = tmp_path / "one.txt.gz"
    one.write_bytes(gzip.compress(text)[: len(gzip.compress(text)) // 2])
    members = tmp_path / "members.txt.gz"
    whole = _multi_member(text, 6)
    members.write_bytes(whole[: len(whole) * 2 // 3])
    for f in (one, members):
        for n in ("1", "3"):
            p = _cli("graph", "pagerank", str(f), "-n", n, "-q")
            lines = [x for x in p.stderr.splitlines() if x.strip()]
            assert p.returncode == 2 and len(lines) == 1 and str(f) in lines[0] and "gzip" in lines[0], (f, n, p.stderr)
    rng = np.random.default_rng(1)
    ratings = _text([rng.integers(0, 50, 20000), rng.integers(0, 40, 20000), rng.integers(1, 6, 20000)], ",").encode()
    rf = tmp_path / "r.csv.gz"
    rf.write_bytes(gzip.compress(ratings)[:-5000])
    p = _cli("mf", "train", str(rf), "--mode", "rima", "-n", "3", "-k", "2", "-i", "1")
    lines = [x for x in p.stderr.splitlines() if x.strip()]
    assert p.returncode == 2 and len(lines) == 1 and str(rf) in lines[0], p.stderr
    rows = "".join(f"{1 if k % 2 else -1} {k % 5 + 1}:1\n" for k in range(20000)).encode()
    sf = tmp_path / "s.svm.gz"
    sf.write_bytes(gzip.compress(rows)[:-3000])
    p = _cli("sgd", "logreg", str(sf), "-n", "3", "--epochs", "1")
    lines = [x for x in p.stderr.splitlines() if x.strip()]
    assert p.returncode == 2 and len(lines) == 1 and str(sf) in lines[0], p.stderr


def test_mf_and_sgd_single_stream_read_once(tmp_path):
    """A rating file and an svmlight file in one gzip stream: at 3 ranks rank 0 decompresses
    and the others parse (every record once: the same counts as the plain file)."""
    rng = np.random.default_rng(5)
    n = 4000
    u, i, r = rng.integers(0, 90, n), rng.integers(0, 70, n), rng.integers(1, 6, n)
    plain = tmp_path / "r.csv"
    plain.write_text(_text([u, i, r], ",", ("user", "item", "rating")))
    one = tmp_path / "r.csv.gz"
    one.write_bytes(gzip.compress(plain.read_bytes()))
    assert _native.TextStream(str(one), "ratings").is_single_stream()
    counts = []
    for f in (plain, one):
        p = _cli("mf", "train", str(f), "--mode", "rima", "-n", "3", "-k", "3", "-i", "1")
        assert p.returncode == 0, p.stderr
        words = p.stdout.split()
        k = words.index("train")
        counts.append((int(words[k - 1]), int(words[k + 2])))
    assert counts[0] == counts[1] and sum(counts[0]) == n, counts
    rows = "".join(f"{1 if k % 3 else -1} {k % 11 + 1}:1 {k % 13 + 12}:0.5\n" for k in range(3000))
    (sp := tmp_path / "s.svm").write_text(rows)
    (sg := tmp_path / "s.svm.gz").write_bytes(gzip.compress(rows.encode()))
    code = "\n".join(["import sys, numpy as np, scalefree",
                      "from scalefree.sgd.logreg import load_rows",
                      "g = scalefree.init()",
                      "a, b = load_rows(g, sys.argv[1]), load_rows(g, sys.argv[2])",
                      "n = g.allreduce(np.array([a.labels.size, b.labels.size, a.indices.size, b.indices.size]))",
                      "assert n[0] == n[1] == 3000 and n[2] == n[3], n",
                      "assert a.dim == b.dim == 24, (a.dim, b.dim)"])
    p = _ranks(3, code, sp, sg)
    assert p.returncode == 0, p.stderr


def test_sorted_input_loads_without_the_exchange(tmp_path):
    """``graph convert --sort`` writes the distinct edges sorted; a job keeps every rank's run
    where it was read (``dedup_path`` sorted) and finds the same top vertices as from the
    unsorted text; an unsorted file takes the exchange."""
    import json

    src, dst = _edges(6000, 8)
    src = src % 500
    txt = tmp_path / "g.txt"
    txt.write_text(_text([np.concatenate([src, src[:50]]), np.concatenate([dst, dst[:50]])], " "))  # duplicates
    srt = tmp_path / "s.parquet"
    p = _cli("graph", "convert", str(txt), str(srt), "--sort", "--row-group", "700")
    assert p.returncode == 0, p.stderr
    srt_txt = tmp_path / "s.txt"
    assert _cli("graph", "convert", str(txt), str(srt_txt), "--sort").returncode == 0
    tops, paths = [], []
    for f in (txt, srt, srt_txt):
        for n in ("1", "3"):
            out = tmp_path / "rec.json"
            p = _cli("graph", "pagerank", str(f), "-n", n, "-q", "--top", "8", "--tol", "1e-12", "--json", str(out))
            assert p.returncode == 0, p.stderr
            rec = json.loads(out.read_text())
            tops.append([v for v, _ in rec["top"]])
            paths.append(rec["dedup_path"])
            assert rec["edges"] == len(set(zip(src.tolist(), dst.tolist()))), rec["edges"]
    assert all(t == tops[0] for t in tops), tops
    assert paths == ["exchange", "exchange", "sorted", "sorted", "sorted", "sorted"], paths


def test_flash_topics_reads_docword_as_exported(tmp_path):
    """``flash topics`` takes the counts as pipelines export them — ``doc,word,count`` CSV with
    a header, a part directory of TSV parts, a given delimiter — and finds what it finds in the
    UCI file; a bad count is one line naming the file and line, exit 2."""
    import json

    rng = np.random.default_rng(6)
    docs, words = 120, 40
    entries = sorted({(int(d), int(w)) for d, w in zip(rng.integers(1, docs + 1, 1500), rng.integers(1, words + 1, 1500))})
    counts = rng.integers(1, 9, len(entries))
    uci = tmp_path / "docword.t.txt"
    uci.write_text(f"{docs}\n{words}\n{len(entries)}\n" + "".join(f"{d} {w} {c}\n" for (d, w), c in zip(entries, counts)))
    csv = tmp_path / "docword.t.csv"
    csv.write_text("doc,word,count\n" + "".join(f"{d},{w},{c}\n" for (d, w), c in zip(entries, counts)))
    parts = tmp_path / "bow"
    parts.mkdir()
    half = len(entries) // 2
    for k, (lo, hi) in enumerate(((0, half), (half, len(entries)))):
        (parts / f"part-{k:05d}.tsv").write_text("".join(f"{d}\t{w}\t{c}\n" for (d, w), c in
                                                         zip(entries[lo:hi], counts[lo:hi])))
    (parts / "_SUCCESS").write_text("")
    semi = tmp_path / "docword.s.txt"
    semi.write_text("".join(f"{d};{w};{c}\n" for (d, w), c in zip(entries, counts)))
    tops = []
    for args in ((uci,), (csv,), (parts,), (semi, "--delimiter", "semicolon", "--header", "no")):
        out = tmp_path / "t.json"
        p = _cli("flash", "topics", str(args[0]), *args[1:], "-k", "3", "--memory", "64M", "-q", "--json", str(out))
        assert p.returncode == 0, (args, p.stderr)
        tops.append(json.loads(out.read_text())["top_words"])
    assert all(t == tops[0] for t in tops), tops
    bad = tmp_path / "docword.b.csv"
    bad.write_text("doc,word,count\n1,2,3\n1,3,x\n")
    other = tmp_path / "other"
    other.mkdir()
    (other / "part-00000.csv").write_text("doc,word,count\n1,2,3\n")
    (other / "part-00001.csv").write_text("d,w,n\n2,2,3\n")
    for path, want in ((bad, "line 3: cannot read the count from 'x'"),
                       (other, "part-00001.csv: line 1: the part starts with 'd,w,n', not the header")):
        p = _cli("flash", "topics", str(path), "-k", "2", "-q")
        lines = [x for x in p.stderr.splitlines() if x.strip()]
        assert p.returncode == 2 and len(lines) == 1 and want in lines[0], p.stderr
