"""`scalefree bench ssp` / `ssp-mf`: options and the table from per-rank documents (no ranks); the
ideal loop from the straggler schedule and from the delays the ranks actually slept (a late
wake-up of `time.sleep` is the machine's, not the collective's)."""

import argparse

import pytest

from scalefree_bench import common, ssp
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


def test_the_ideal_gates_a_call_on_every_rank_s_call_slack_earlier():
    d = [[1.0, 0.0, 0.0], [0.0, 0.0, 1.0]]
    # Slack 1: rank 1's third call waits for rank 0's second (done at 1), then sleeps 1.
    assert ssp.ideal_of_delays(d, 1) == 2.0
    # A slack past the calls: each rank's own delays only (the bound).
    assert ssp.ideal_of_delays(d, 8) == 1.0


def test_the_schedule_s_ideal_is_the_ideal_of_its_delays():
    sched = common.StragglerSchedule(20.0, 3, 4)
    d = [sched.delays_s(r, 50) for r in range(4)]
    for slack in (1, 4, 255):
        assert ssp.ideal_wall_s(20.0, 3, 4, 50, slack) == pytest.approx(ssp.ideal_of_delays(d, slack))


def _rows_slept(oversleep: float):
    sched = common.StragglerSchedule(20.0, 0, 2)
    rows = []
    for r in range(2):
        delays = sched.delays_s(r, 10)
        rows.append({"variant": "hypercube", "slack": 2, "delay_ms": 20.0, "wall_s": 0.2, "times_s": [0.001] * 10,
                     "slept_s": [x + oversleep if x else 0.0 for x in delays], "my_delay_s": sum(delays),
                     "bound_s": 0.1, "wait_s": [0.0] * 10, "age_diff": [0.0] * 10})
    return rows


def test_a_record_carries_the_ideal_of_the_delays_slept():
    args = argparse.Namespace(calls=10, seed=0)
    exact = ssp._record("scalefree", 2, 1 << 20, args, _rows_slept(0.0))
    late = ssp._record("scalefree", 2, 1 << 20, args, _rows_slept(0.002))
    assert exact["ideal_slept_s"] == pytest.approx(exact["ideal_s"]) and exact["oversleep_s"] == pytest.approx(0.0)
    assert late["ideal_slept_s"] > late["ideal_s"] and late["oversleep_s"] > 0.0
    table = ssp.render_table([late])
    assert "ideal slept" in table and "wall vs slept" in table
    assert f"{late['wall_s'] / late['ideal_slept_s']:.2f}x" in table


def test_records_of_workers_that_did_not_time_their_sleeps_have_no_slept_ideal():
    rows = _rows_slept(0.0)
    for r in rows:
        del r["slept_s"]
    rec = ssp._record("scalefree", 2, 1 << 20, argparse.Namespace(calls=10, seed=0), rows)
    assert "ideal_slept_s" not in rec
    assert "wall vs slept" in ssp.render_table([rec])


def test_ssp_sparse_hosts_must_divide_the_ranks(capsys):
    from scalefree_bench import ssp_sparse

    args = _parser().parse_args(["bench", "ssp-sparse", "--hosts", "3", "-n", "4"])
    assert args.hosts == 3 and args.func is ssp_sparse.run
    assert ssp_sparse.run(args) == 2
    assert "--hosts 3 does not divide 4 ranks" in capsys.readouterr().err
