"""`scalefree bench ssp` / `ssp-mf`: options and the table from per-rank documents (no ranks)."""

import argparse

from scalefree_bench import ssp
from scalefree_bench.cli import add_parser


def _parser():
    p = argparse.ArgumentParser()
    add_parser(p.add_subparsers())
    return p


def _rows(variant, wall, slack=8):
    return [{"variant": variant, "push_order": "cyclic", "slack": slack, "delay_ms": 20.0, "wall_s": wall + r / 100,
             "times_s": [0.01] * 5, "wait_s": [0.0] * 5, "age_diff": [1] * 5, "bound_s": 0.05} for r in range(4)]


def test_several_sizes_and_the_ring_variant_parse():
    args = _parser().parse_args(["bench", "ssp", "--size", "1M,16M", "--variant", "ring,auto,sharded", "-n", "4"])
    assert args.size == [1 << 20, 16 << 20] and args.variant == ["ring", "auto", "sharded"]


def test_rows_are_keyed_by_size_and_compared_with_the_ideal():
    class Args:
        seed, calls = 0, 5
    recs = [ssp._record("scalefree", 4, size, Args, _rows(v, wall)) for size in (1 << 20, 16 << 20)
            for v, wall in (("ring", 0.2), ("sharded", 0.3), ("dense", 0.4))]
    ring = [r for r in recs if r["variant"] == "ring"]
    assert [r["bytes"] for r in ring] == [1 << 20, 16 << 20]
    assert ring[0]["push_order"] == ""  # the ring has no push order
    assert abs(ring[0]["wall_s"] - 0.23) < 1e-12  # the slowest rank
    table = ssp.render_table(recs)
    assert "16 MiB" in table and "wall vs ideal" in table


def test_ssp_mf_takes_rima_options():
    args = _parser().parse_args(["bench", "ssp-mf", "--model", "rima", "--blocks", "4", "--target", "common",
                                 "--slack", "0,2"])
    assert args.model == "rima" and args.blocks == 4 and args.target == "common" and args.slack == [0, 2]
