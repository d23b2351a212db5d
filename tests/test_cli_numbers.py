"""Numeric options: every one is bounded when the command line is read (a bad value is one
line naming the option, exit 2, before anything runs), and every count takes the K/M/G
suffixes of the one parser (scalefree._units)."""

import argparse
import subprocess
import sys

import pytest

from scalefree.cli import _build_parser


def _actions(parser, path=()):
    for a in parser._actions:
        if isinstance(a, argparse._SubParsersAction):
            for name, sub in a.choices.items():
                yield from _actions(sub, path + (name,))
        else:
            yield path, a


def test_no_option_is_a_bare_int_or_float():
    """``type=int`` lets -5 through to the library (`can't convert negative int to unsigned`,
    exit 1); ``type=float`` lets nan and inf through. (An int among ``choices`` is bounded.)"""
    parser = _build_parser([])  # every command, for the help
    bare = [f"scalefree {' '.join(path)} {'/'.join(a.option_strings) or a.dest}"
            for path, a in _actions(parser) if a.type in (int, float) and not a.choices]
    assert not bare, f"numeric options without bounds: {bare}"


@pytest.mark.parametrize("argv, option", [
    (["mf", "train", "r.txt", "-k", "-5"], "-k"),
    (["mf", "train", "r.txt", "--iterations", "0"], "--iterations"),
    (["mf", "train", "r.txt", "--eta", "nan"], "--eta"),
    (["mf", "train", "r.txt", "--test-fraction", "1.5"], "--test-fraction"),
    (["ps", "train", "--steps", "-1"], "--steps"),
    (["ps", "train", "--lr", "0"], "--lr"),
    (["sparse", "plan", "--ranks", "x"], "--ranks"),
    (["graph", "rmat", "g.npz", "--edges", "-5"], "--edges"),
    (["run", "--master-port", "70000", "--", "true"], "--master-port"),
])
def test_a_bad_number_names_its_option(tmp_path, argv, option):
    p = subprocess.run([sys.executable, "-m", "scalefree.cli", *argv], cwd=tmp_path, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 2, p.stderr
    last = p.stderr.strip().splitlines()[-1]
    assert f"argument {option}" in last or option in last, p.stderr
    assert "Traceback" not in p.stderr


@pytest.mark.parametrize("argv, dest, value", [
    (["graph", "rmat", "g.npz", "--edges", "32K"], "edges", 32 << 10),
    (["sparse", "plan", "--ranks", "4", "--nnz", "1M", "--dim", "1G"], "nnz", 1 << 20),
    (["mf", "train", "r.txt", "--iterations", "1K"], "iterations", 1 << 10),
])
def test_counts_take_the_suffixes(argv, dest, value):
    args = _build_parser(argv).parse_args(argv)
    assert getattr(args, dest) == value
