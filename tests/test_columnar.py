"""Parquet and Arrow IPC input (scalefree-columnar) and tables passed to the Python API
(scalefree._tables): every row read exactly once, in order, over 1..5 ranks, by row groups /
record batches balanced by rows across the parts of a directory; every integer width and
compression pyarrow writes; bad input one line naming the file (exit 2 from the CLI)."""

import subprocess
import sys

import numpy as np
import pytest

from scalefree import _columnar, _native
from scalefree._tables import ID, NUMBER, is_table, table_columns
from scalefree.errors import DataError, InvalidArgumentError

pa = pytest.importorskip("pyarrow", reason="pyarrow writes the Parquet / Arrow test files")
pq = pytest.importorskip("pyarrow.parquet")
feather = pytest.importorskip("pyarrow.feather")

ID_TYPES = ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"]


def edges(m, seed=0, hi=100):
    rng = np.random.default_rng(seed)
    return rng.integers(0, hi, m), rng.integers(0, hi, m)


def write(path, table, row_group, fmt="parquet", compression="snappy"):
    if fmt == "parquet":
        pq.write_table(table, path, row_group_size=row_group, compression=compression)
    else:
        feather.write_feather(table, path, chunksize=row_group, compression=compression)


def shares(paths, p, table="edges", columns=None):
    return [_columnar.read_share([str(x) for x in paths], r, p, table, columns) for r in range(p)]


def joined(got, k):
    return np.concatenate([g[k] for g in got])


@pytest.mark.parametrize("fmt,compression", [("parquet", "snappy"), ("parquet", "zstd"), ("parquet", "gzip"),
                                             ("parquet", "none"), ("arrow", "lz4"), ("arrow", "zstd"),
                                             ("arrow", "uncompressed")])
@pytest.mark.parametrize("m,row_group", [(0, 10), (1, 10), (7, 3), (1000, 97), (40, 1000)])
def test_every_row_once_in_order(tmp_path, fmt, compression, m, row_group):
    s, d = edges(m, seed=m)
    path = tmp_path / f"g.{fmt}"
    write(path, pa.table({"src": s, "dst": d}), row_group, fmt, compression)
    groups = -(-m // row_group) if m else 0
    for p in range(1, 6):
        got = shares([path], p)
        np.testing.assert_array_equal(joined(got, 0), s)
        np.testing.assert_array_equal(joined(got, 1), d)
        # Whole row groups per rank (all but the last hold row_group rows).
        for g in got:
            assert len(g[0]) % row_group == 0 or g is got[max(i for i, x in enumerate(got) if len(x[0]))]
        # Row groups fewer than ranks: some ranks get nothing, none gets two while another has none.
        nonempty = sum(1 for g in got if len(g[0]))
        assert nonempty == min(p, groups)


@pytest.mark.parametrize("dtype", ID_TYPES)
@pytest.mark.parametrize("fmt", ["parquet", "arrow"])
def test_integer_widths(tmp_path, dtype, fmt):
    s, d = edges(50, hi=100)
    t = pa.table({"name": [str(i) for i in range(50)], "a": pa.array(s.astype(dtype)), "w": np.ones(50),
                  "b": pa.array(d.astype(dtype))})
    path = tmp_path / f"g.{fmt}"
    write(path, t, 16, fmt, "snappy" if fmt == "parquet" else "lz4")
    got = shares([path], 3)  # default: the first two integer columns
    np.testing.assert_array_equal(joined(got, 0), s)
    np.testing.assert_array_equal(joined(got, 1), d)
    assert got[0][0].dtype == np.int64


@pytest.mark.parametrize("fmt", ["parquet", "arrow"])
@pytest.mark.parametrize("rating_type", ["float32", "float64", "int8", "int64"])
def test_ratings(tmp_path, fmt, rating_type):
    rng = np.random.default_rng(1)
    u, i = rng.integers(0, 1 << 40, 300), rng.integers(0, 9, 300)
    r = rng.integers(1, 6, 300).astype(rating_type)
    t = pa.table({"ts": np.arange(300), "user": u, "item": i.astype("int32"), "note": ["x"] * 300, "rating": r})
    path = tmp_path / f"r.{fmt}"
    write(path, t, 64, fmt, "zstd")
    for columns in (["user", "item", "rating"], None):
        got = shares([path], 4, "ratings", columns)
        if columns is None:  # default: ts and user are the first integer columns, then item
            np.testing.assert_array_equal(joined(got, 0), np.arange(300))
            continue
        np.testing.assert_array_equal(joined(got, 0), u)
        np.testing.assert_array_equal(joined(got, 1), i)
        np.testing.assert_array_equal(joined(got, 2), r.astype(np.float32))
        assert got[0][2].dtype == np.float32


def test_part_directory_balanced_by_rows(tmp_path):
    d = tmp_path / "edges"
    d.mkdir()
    allsrc, alldst = [], []
    # Parts of unequal sizes, each several row groups; markers and checksums beside them.
    for k, m in enumerate([400, 0, 35, 1200, 90]):
        s, t = edges(m, seed=k)
        allsrc.append(s)
        alldst.append(t)
        pq.write_table(pa.table({"src": s, "dst": t}), d / f"part-{k:05d}-abc.snappy.parquet", row_group_size=50)
        (d / f".part-{k:05d}-abc.snappy.parquet.crc").write_bytes(b"crc")
    (d / "_SUCCESS").write_bytes(b"")
    parts = _columnar.columnar_parts(d)
    assert [p.rsplit("/", 1)[1][:10] for p in parts] == [f"part-{k:05d}" for k in range(5)]
    s, t = np.concatenate(allsrc), np.concatenate(alldst)
    for p in range(1, 6):
        got = shares(parts, p)
        np.testing.assert_array_equal(joined(got, 0), s)
        np.testing.assert_array_equal(joined(got, 1), t)
        sizes = [len(g[0]) for g in got]
        # Balanced by rows over all parts: within one row group of the even share.
        assert max(sizes) - min(sizes) <= 2 * 50 + 1, sizes


def test_graph_reader_dispatch(tmp_path):
    from scalefree.graph.io import read_edge_share

    s, d = edges(500, seed=3)
    path = tmp_path / "g.feather"
    write(path, pa.table({"a": s, "b": d}), 64, "arrow", "lz4")
    got = [read_edge_share(path, r, 3) for r in range(3)]
    np.testing.assert_array_equal(np.concatenate([g[0] for g in got]), s)
    got = [read_edge_share(path, r, 2, columns=["b", "a"]) for r in range(2)]
    np.testing.assert_array_equal(np.concatenate([g[0] for g in got]), d)


# --- bad input: one line naming the file ------------------------------------------------


def bad_inputs(tmp_path):
    s, d = edges(100)
    cases = {}
    p = tmp_path / "nulls.parquet"
    pq.write_table(pa.table({"src": pa.array([1, None, 3]), "dst": [1, 2, 3]}), p)
    cases["nulls"] = (p, None, "null")
    p = tmp_path / "nulls.arrow"
    feather.write_feather(pa.table({"src": pa.array([1, None, 3]), "dst": [1, 2, 3]}), p)
    cases["nulls_arrow"] = (p, None, "null")
    p = tmp_path / "strings.parquet"
    pq.write_table(pa.table({"src": ["1", "2"], "dst": [1, 2]}), p)
    cases["wrong_type"] = (p, ["src", "dst"], "expected an integer type")
    cases["float_ids"] = (tmp_path / "floats.parquet", ["src", "dst"], "expected an integer type")
    pq.write_table(pa.table({"src": [1.5, 2.0], "dst": [1, 2]}), cases["float_ids"][0])
    p = tmp_path / "g.parquet"
    pq.write_table(pa.table({"src": s, "dst": d}), p, row_group_size=10)
    cases["missing_column"] = (p, ["from", "dst"], "no column 'from'")
    cases["one_int_column"] = (strings := tmp_path / "one.parquet", None, "expected two integer id columns")
    pq.write_table(pa.table({"src": ["a"], "dst": [1]}), strings)
    raw = p.read_bytes()
    for name, cut in (("truncated", len(raw) // 2), ("truncated_tail", len(raw) - 3)):
        q = tmp_path / f"{name}.parquet"
        q.write_bytes(raw[:cut])
        cases[name] = (q, None, "not a readable Parquet file")
    q = tmp_path / "empty.parquet"
    q.write_bytes(b"")
    cases["empty_file"] = (q, None, "not a Parquet or Arrow IPC file")
    q = tmp_path / "trunc.arrow"
    feather.write_feather(pa.table({"src": s, "dst": d}), q)
    q.write_bytes(q.read_bytes()[:-20])
    cases["truncated_arrow"] = (q, None, "not a readable Arrow IPC file")
    q = tmp_path / "neg.parquet"
    pq.write_table(pa.table({"src": [1, -4], "dst": [1, 2]}), q)
    cases["negative"] = (q, None, "negative id -4")
    # A part directory whose second part has another schema, or is text.
    for name, other, want in (("other_schema", lambda f: pq.write_table(pa.table({"x": [1], "y": [2]}), f),
                               "no column 'src'"),
                              ("text_part", lambda f: f.write_text("1 2\n"), "not a Parquet file (no magic bytes)"),
                              ("arrow_part", lambda f: feather.write_feather(pa.table({"src": [1], "dst": [2]}), f),
                               "an Arrow IPC file, but the first part")):
        dd = tmp_path / name
        dd.mkdir()
        pq.write_table(pa.table({"src": s, "dst": d}), dd / "part-00000.parquet")
        other(dd / "part-00001.parquet")
        cases[name] = (dd, None, want)
    return cases


def test_bad_input_is_one_line_naming_the_file(tmp_path):
    for name, (path, columns, want) in bad_inputs(tmp_path).items():
        parts = _columnar.columnar_parts(path)
        assert parts is not None, name
        with pytest.raises(DataError) as e:
            for r in range(2):
                _columnar.read_share(parts, r, 2, "edges", columns)
        msg = str(e.value)
        assert "\n" not in msg and want in msg, (name, msg)
        bad_file = parts[-1] if path.is_dir() else str(path)
        assert msg.startswith(bad_file + ":"), (name, msg)


def cli(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "scalefree.cli", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout)


def test_cli_bad_input_exit_2(tmp_path):
    cases = bad_inputs(tmp_path)
    for name in ("nulls", "wrong_type", "missing_column", "truncated", "other_schema"):
        path, columns, want = cases[name]
        extra = ["--columns", ",".join(columns)] if columns else []
        r = cli("graph", "pagerank", path, "-n", "2", "-q", *extra)
        assert r.returncode == 2, (name, r.returncode, r.stderr)
        lines = [x for x in r.stderr.splitlines() if x.strip()]
        assert len(lines) == 1 and want in lines[0] and str(path) in lines[0], (name, r.stderr)
    r = cli("graph", "pagerank", cases["nulls"][0], "--columns", "a,b,c")
    assert r.returncode == 2 and "--columns" in r.stderr


def test_cli_pagerank_same_top_as_text(tmp_path):
    s, d = edges(3000, seed=5, hi=400)
    txt = tmp_path / "g.txt"
    txt.write_text("".join(f"{a} {b}\n" for a, b in zip(s.tolist(), d.tolist())))
    pqt = tmp_path / "g.parquet"
    pq.write_table(pa.table({"src": s.astype("int32"), "dst": d.astype("uint32")}), pqt, row_group_size=500)
    tops = []
    for path in (txt, pqt):
        r = cli("graph", "pagerank", path, "-n", "3", "-q", "--top", "10")
        assert r.returncode == 0, r.stderr
        tops.append([line.split("\t")[0] for line in r.stdout.splitlines() if "\t" in line])
    assert tops[0] == tops[1] and len(tops[0]) == 10


def triples(r):
    return tuple(np.frombuffer(b, dt) for b, dt in zip(r.triples(), (np.int64, np.int64, np.float32)))


def test_mf_reads_parquet(tmp_path):
    from scalefree.mf.model import load_ratings

    rng = np.random.default_rng(2)
    u, i, r = rng.integers(0, 30, 200), rng.integers(0, 20, 200), rng.random(200).astype(np.float32) * 5
    path = tmp_path / "r.parquet"
    pq.write_table(pa.table({"user": u.astype("uint16"), "item": i, "rating": r}), path, row_group_size=64)
    for got in (triples(load_ratings(str(path), cache=False)), triples(load_ratings((u, i, r)))):
        for a, b in zip(got, (u, i, r)):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("mode,ranks", [("rima", 2), ("dsgd-ps", 3), ("rima", 5)])
def test_mf_partitioned_same_as_text(tmp_path, mode, ranks):
    """The multi-rank set-up sorts what the ranks read, so Parquet row groups and text byte
    ranges give the same model: the same test RMSE, to the digit."""
    rng = np.random.default_rng(3)
    m = 2000
    u, i = rng.integers(0, 60, m), rng.integers(0, 40, m)
    r = rng.integers(1, 6, m).astype(np.float32)
    txt = tmp_path / "r.txt"
    txt.write_text("".join(f"{a} {b} {c:g}\n" for a, b, c in zip(u.tolist(), i.tolist(), r.tolist())))
    d = tmp_path / "parts"
    d.mkdir()
    for k, (lo, hi) in enumerate([(0, 700), (700, 720), (720, m)]):
        pq.write_table(pa.table({"ts": np.arange(lo, hi), "item": i[lo:hi], "rating": r[lo:hi], "user": u[lo:hi]}),
                       d / f"part-{k:05d}.parquet", row_group_size=150)
    (d / "_SUCCESS").write_bytes(b"")
    out = []
    for path, extra in ((txt, []), (d, ["--columns", "user,item,rating"])):
        res = cli("mf", "train", path, "--mode", mode, "-n", ranks, "-k", 4, "--iterations", 2, "-q", *extra)
        assert res.returncode == 0, res.stderr
        out.append([x for x in res.stdout.splitlines() if "test RMSE" in x][-1].split("test RMSE")[1])
    assert out[0] == out[1]


# --- tables passed to the Python API ----------------------------------------------------


def test_tables_zero_copy():
    pd = pytest.importorskip("pandas")
    s, d = edges(1000, seed=9)
    r = np.random.default_rng(0).random(1000)
    df = pd.DataFrame({"name": ["v"] * 1000, "src": s, "dst": d, "rating": r})
    assert is_table(df)
    got = table_columns(df, (ID, ID, NUMBER))
    for a, b in zip(got, (s, d, r)):
        np.testing.assert_array_equal(a, b)
    assert np.shares_memory(got[0], df["src"].to_numpy(copy=False))
    t = pa.table({"src": s, "dst": d})
    got = table_columns(t, (ID, ID))
    assert got[0].ctypes.data == t.column("src").chunks[0].buffers()[1].address  # a view of Arrow's buffer
    # A stream exporter (PyCapsule interface), as polars and others hand them over.
    class Exporter:
        def __arrow_c_stream__(self, requested_schema=None):
            return t.__arrow_c_stream__(requested_schema)

    got = table_columns(Exporter(), (ID, ID), ["dst", "src"])
    np.testing.assert_array_equal(got[0], d)
    np.testing.assert_array_equal(got[1], s)
    a2 = np.stack([s, d], 1)
    got = table_columns(a2, (ID, ID))
    assert np.shares_memory(got[0], a2)
    sp = pytest.importorskip("scipy.sparse")
    m = sp.coo_matrix((r, (s, d)), shape=(100, 100))
    got = table_columns(m, (ID, ID, NUMBER))
    np.testing.assert_array_equal(got[0], s)
    assert np.shares_memory(got[0], m.row)


def test_tables_polars():
    pl = pytest.importorskip("polars", reason="polars is not installed")
    s, d = edges(100)
    got = table_columns(pl.DataFrame({"src": s, "dst": d}), (ID, ID))
    np.testing.assert_array_equal(got[0], s)


def test_tables_bad():
    pd = pytest.importorskip("pandas")
    with pytest.raises(InvalidArgumentError, match="nulls"):
        table_columns(pd.DataFrame({"src": [1.0, None], "dst": [1, 2], "x": [1, 2]}), (ID, ID), ["dst", "x"]) and \
            table_columns(pa.table({"src": pa.array([1, None]), "dst": [1, 2]}), (ID, ID))
    with pytest.raises(InvalidArgumentError, match="nulls"):
        table_columns(pa.table({"src": pa.array([1, None]), "dst": [1, 2]}), (ID, ID))
    with pytest.raises(InvalidArgumentError, match="no column 'x'"):
        table_columns(pa.table({"src": [1], "dst": [1]}), (ID, ID), ["x", "dst"])
    with pytest.raises(InvalidArgumentError, match="integer"):
        table_columns(pd.DataFrame({"src": ["a"], "dst": [1]}), (ID, ID))


def test_mf_and_pagerank_take_tables():
    pd = pytest.importorskip("pandas")
    from scalefree.mf.model import load_ratings, split_ratings

    rng = np.random.default_rng(4)
    u, i, r = rng.integers(0, 30, 300), rng.integers(0, 20, 300), (rng.random(300) * 5).astype(np.float32)
    df = pd.DataFrame({"user": u, "item": i, "rating": r})
    assert len(load_ratings(df)) == 300
    tr, te = split_ratings(pa.table(df), 0.2, seed=1)
    tr2, te2 = split_ratings((u, i, r), 0.2, seed=1)
    assert (len(tr), len(te)) == (len(tr2), len(te2))


def test_mf_predict_and_fold_in_read_parquet(tmp_path, monkeypatch):
    """``mf predict`` and ``mf fold-in`` read Parquet as ``mf train`` does: the same
    predictions and the same grown model as from the text; pairs without a rating column;
    ``--columns`` by name; bad Parquet one line, exit 2."""
    import scalefree.mf.model as mf

    monkeypatch.setenv("SCALEFREE_CACHE_DIR", str(tmp_path / "cache"))
    rng = np.random.default_rng(3)
    u, i = rng.integers(0, 30, 400), rng.integers(0, 20, 400)
    v = rng.integers(1, 6, 400).astype(np.float32)
    model = tmp_path / "m.sfmf"
    mf.MatrixFactorization(k=3, iterations=3, threads=1).fit((u, i, v)).save(model)
    txt = tmp_path / "pairs.txt"
    txt.write_text("".join(f"{a} {b} {c:g}\n" for a, b, c in zip(u.tolist(), i.tolist(), v.tolist())))
    pqt = tmp_path / "pairs.parquet"
    pq.write_table(pa.table({"uid": u.astype("int32"), "iid": i, "stars": v}), pqt, row_group_size=100)
    bare = tmp_path / "bare.parquet"
    pq.write_table(pa.table({"user": u, "item": i}), bare, row_group_size=100)
    outs = []
    for args in ((txt,), (pqt,), (pqt, "--columns", "uid,iid,stars"), (bare,), (pqt, "--columns", "uid,iid")):
        r = cli("mf", "predict", model, *args)
        assert r.returncode == 0, (args, r.stderr)
        outs.append(r.stdout)
    assert outs[0] == outs[1] == outs[2] == outs[3] == outs[4] and outs[0].count("\n") == 400
    grown = []
    for args in ((txt,), (pqt, "--columns", "uid,iid,stars")):
        out = tmp_path / f"g{len(grown)}.sfmf"
        r = cli("mf", "fold-in", model, *args, "-o", out)
        assert r.returncode == 0, r.stderr
        grown.append(mf.MatrixFactorization.load(out).predict(u, i))
    np.testing.assert_array_equal(grown[0], grown[1])
    bad = tmp_path / "nulls.parquet"
    pq.write_table(pa.table({"user": pa.array([1, None]), "item": [1, 2], "rating": [1.0, 2.0]}), bad)
    for cmd in (("predict", model, bad), ("fold-in", model, bad, "-o", tmp_path / "x.sfmf"),
                ("train", bad, "-k", "2", "-i", "1")):
        r = cli("mf", *cmd)
        lines = [x for x in r.stderr.splitlines() if x.strip()]
        assert r.returncode == 2 and len(lines) == 1 and str(bad) in lines[0] and "null" in lines[0], (cmd, r.stderr)
    r = cli("mf", "predict", model, bare, "--columns", "user,nope")
    assert r.returncode == 2 and "no column 'nope'" in r.stderr, r.stderr
