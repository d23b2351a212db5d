"""Bad input to every command that reads a file: one line on stderr naming the file (and the
line, where there is one), exit code 2, no traceback — also when several ranks read it."""

import gzip
import subprocess
import sys

import pytest

# What each reader calls a header line, a truncated line, a NaN and an id past its bound.
FORMATS = {
    "edges": {"good": "1 2\n2 3\n3 1\n", "header": "# from to\n", "truncated": "1 2\n3", "nan": "1 2\n3 nan\n",
              "huge": "1 2\n3 99999999999999999999999\n"},
    "svm": {"good": "1 1:1\n0 2:1\n1 3:1\n", "header": "# label features\n", "truncated": "1 1:1\n0 2",
            "nan": "1 1:1\n0 2:nan\n", "huge": "1 1:1\n0 1099511627776:1\n"},
    "docword": {"good": "3\n4\n3\n1 1 2\n2 3 1\n3 4 5\n", "header": "3\n4\n3\n", "truncated": "3\n4\n3\n1 1 2\n2 3",
                "nan": "3\n4\n3\n1 1 2\n2 3 nan\n3 4 5\n", "huge": "3\n4\n3\n1 1 2\n2 99999999999999 1\n3 4 5\n"},
    "mtx": {"good": "%%MatrixMarket matrix coordinate real general\n3 4 2\n1 1 2\n3 4 5\n",
            "header": "%%MatrixMarket matrix coordinate real general\n", "truncated": "%%MatrixMarket matrix coordinate real general\n3 4 2\n1 1 2\n3",
            "nan": "%%MatrixMarket matrix coordinate real general\n3 4 2\n1 1 nan\n3 4 5\n",
            "huge": "%%MatrixMarket matrix coordinate real general\n3 4 2\n1 1 2\n3 99999999999999 5\n"},
    "ratings": {"good": "1,2,3.5\n2,3,4\n3,1,2\n", "header": "user,item,rating\n", "truncated": "1,2,3.5\n2,3\n",
                "nan": "1,2,3.5\n2,3,nan\n", "huge": "1,2,3.5\n2,99999999999999999999999,4\n"},
}

# One command per reader (graph diameter shares graph pagerank's, mf's local mode its
# one-process reader, covered by tests/mf), several ranks each.
COMMANDS = [
    ("graph pagerank", "edges", ["-n", "3"]),
    ("sgd logreg", "svm", ["-n", "2"]),
    ("mf train", "ratings", ["--mode", "rima", "-n", "2"]),
    ("flash svd", "docword", ["-k", "1"]),
    ("flash svd", "mtx", ["-k", "1"]),
]
# How a format is recognised by its file name (the flash readers go by the name).
NAMES = {"docword": ("docword.", ".txt"), "mtx": ("", ".mtx")}

CASES = ["missing", "empty", "header", "truncated", "garbage", "nan", "huge", "corrupt-gz"]


def make(tmp_path, fmt, case):
    prefix, suffix = NAMES.get(fmt, ("", ".txt"))
    p = tmp_path / f"{prefix}{case}{suffix}{'.gz' if case == 'corrupt-gz' else ''}"
    if case == "missing":
        return p
    if case == "empty":
        p.write_bytes(b"")
    elif case == "garbage":
        p.write_bytes(bytes(range(256)) * 4)
    elif case == "corrupt-gz":
        data = bytearray(gzip.compress(FORMATS[fmt]["good"].encode() * 200))
        data[len(data) // 2] ^= 0xFF
        p.write_bytes(bytes(data))
    else:
        p.write_text(FORMATS[fmt][case])
    return p


@pytest.mark.parametrize("command,fmt,extra", COMMANDS, ids=[f"{c} {f} {' '.join(e)}" for c, f, e in COMMANDS])
def test_bad_input_is_one_line_and_exit_2(tmp_path, command, fmt, extra):
    bad = []
    for case in CASES:
        f = make(tmp_path, fmt, case)
        p = subprocess.run([sys.executable, "-m", "scalefree.cli", *command.split(), str(f), *extra],
                           capture_output=True, text=True, timeout=120)
        lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
        ok = (p.returncode == 2 and len(lines) == 1 and lines[0].startswith(f"scalefree {command}: error: ")
              and f.name in lines[0] and "Traceback" not in p.stderr)
        if not ok:
            bad.append(f"{case}: exit {p.returncode}, stderr {p.stderr[-500:]!r}")
    assert not bad, "\n".join(bad)


def test_bad_arguments_are_refused_before_ranks_start(tmp_path):
    f = tmp_path / "g.txt"
    f.write_text(FORMATS["edges"]["good"])
    for args in (["graph", "pagerank", str(f), "-n", "0"], ["graph", "pagerank", str(f), "--damping", "1.5"],
                 ["graph", "pagerank", str(f), "--tol", "nan"], ["sgd", "logreg", str(f), "--test-fraction", "1"],
                 ["graph", "rmat", str(tmp_path / "r.txt"), "--edges", "-5"]):
        p = subprocess.run([sys.executable, "-m", "scalefree.cli", *args], capture_output=True, text=True, timeout=60)
        assert p.returncode == 2 and "error:" in p.stderr and "Traceback" not in p.stderr, (args, p.stderr)


def test_version():
    p = subprocess.run([sys.executable, "-m", "scalefree.cli", "--version"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and p.stdout.startswith("scalefree ")


def test_only_the_first_failing_rank_reports_even_after_it_exited():
    """The claim outlives the rank that made it: a rank failing later stays quiet."""
    import os
    import subprocess
    import sys
    import tempfile

    code = "from scalefree.cli.common import _first_to_report as f; print(f())"
    with tempfile.TemporaryFile() as claim:
        env = dict(os.environ, SCALEFREE_CLI_RANKS=f"/proc/{os.getpid()}/fd/{claim.fileno()}")
        said = [subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                               check=True).stdout.strip() for _ in range(3)]
    assert said == ["True", "False", "False"]
