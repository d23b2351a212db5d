"""The harness's counts go through the one parser of sizes and counts (K, M, G suffixes), as the
library's commands do: `bench svd --nnz 47M` is 47 MiB of entries, not a refusal."""

import argparse

import pytest

from scalefree_bench import cli as bench_cli
from scalefree_bench import common


def _parse(*argv):
    p = argparse.ArgumentParser(prog="scalefree")
    bench_cli.add_parser(p.add_subparsers(dest="command"))
    return p.parse_args(["bench", *argv])


@pytest.mark.parametrize("argv, dest, value", [
    (["svd", "--nnz", "47M"], "nnz", 47 << 20),
    (["flash-kernels", "--sparse-nnz", "47M"], "sparse_nnz", 47 << 20),
    (["mf", "--ratings", "2M", "--users", "100K"], "ratings", 2 << 20),
    (["allreduce", "--max-calls", "1K"], "max_calls", 1024),
])
def test_counts_take_suffixes(argv, dest, value):
    assert getattr(_parse(*argv), dest) == value


@pytest.mark.parametrize("text, minimum, ok", [("0", 1, False), ("-1", -1, True), ("-2", -1, False), ("1.5K", 1, True),
                                                ("x", 0, False), ("", 0, False)])
def test_int_at_least(text, minimum, ok):
    parse = common.int_at_least(minimum)
    if ok:
        assert parse(text) >= minimum
    else:
        with pytest.raises(ValueError, match="bad value"):
            parse(text)


def test_a_bad_count_names_its_option(capsys):
    with pytest.raises(SystemExit) as e:
        _parse("svd", "--nnz", "-5")
    assert e.value.code == 2
    assert "argument --nnz" in capsys.readouterr().err.strip().splitlines()[-1]
