"""The benchmark harness: parsing, statistics, records, merging of rank results, failure
handling, and one end-to-end `scalefree bench allreduce` against MPI. Behaviour only; speed
is what the benchmarks themselves measure."""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from scalefree_bench import allreduce, common
from scalefree_bench import cli as bench_cli

# --- sizes and units ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, nbytes",
    [("1K", 1024), ("1M", 1 << 20), ("64M", 64 << 20), ("256M", 256 << 20), ("1G", 1 << 30),
     ("4096", 4096), ("1k", 1024), ("1KiB", 1024), ("16mb", 16 << 20), (" 64K ", 65536)],
)
def test_parse_size(text, nbytes):
    assert common.parse_size(text) == nbytes


@pytest.mark.parametrize("text", ["", "abc", "1X", "-1", "0", "K", "1 K B", "0.0001K"])
def test_parse_size_rejects_bad_input(text):
    with pytest.raises(ValueError, match="bad size"):
        common.parse_size(text)


def test_parse_sizes_keeps_order_and_drops_duplicates():
    assert common.parse_sizes("1K,64K,1M,1K") == [1024, 65536, 1 << 20]
    with pytest.raises(ValueError, match="comma-separated"):
        common.parse_sizes("1K,,2K")


def test_parse_lists():
    assert common.parse_int_list("2,4", "rank count") == [2, 4]
    with pytest.raises(ValueError, match="at least 1"):
        common.parse_int_list("0", "rank count")
    assert common.parse_choice_list("mpi,gloo", ("mpi", "gloo"), "peer") == ["mpi", "gloo"]
    assert common.parse_choice_list("none", ("mpi",), "peer") == []
    with pytest.raises(ValueError, match="unknown peer 'nccl'"):
        common.parse_choice_list("mpi,nccl", ("mpi", "gloo"), "peer")


def _bench_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="scalefree")
    bench_cli.add_parser(p.add_subparsers(dest="command"))
    return p


def test_cli_parses_the_documented_command():
    args = _bench_parser().parse_args(
        "bench allreduce -n 2,4 --sizes 1K,64K,1M,16M,64M,256M --vs mpi,gloo --dtype float32 "
        "--algorithm auto,ring --straggler 2 --min-calls 5 --target-seconds 0.5 "
        "--json out.json --plot out.png".split()
    )
    assert args.func is allreduce.run
    assert args.ranks == [2, 4]
    assert args.sizes == [1024, 65536, 1 << 20, 16 << 20, 64 << 20, 256 << 20]
    assert args.vs == ["mpi", "gloo"]
    assert args.algorithm == ["auto", "ring"]
    assert args.straggler == 2.0 and args.json == Path("out.json")


def test_cli_reports_a_bad_size_clearly(capsys):
    with pytest.raises(SystemExit) as e:
        _bench_parser().parse_args(["bench", "allreduce", "--sizes", "1K,12Q"])
    assert e.value.code == 2
    assert "bad size '12Q'" in capsys.readouterr().err


def test_human_units():
    assert common.human_bytes(1024) == "1 KiB"
    assert common.human_bytes(256 << 20) == "256 MiB"
    assert common.human_bytes(1536) == "1.5 KiB"
    assert common.human_bytes(100) == "100 B"
    assert common.human_time(12.34e-6) == "12.3 µs"
    assert common.human_time(0.0123) == "12.30 ms"
    assert common.human_time(2.5) == "2.500 s"


# --- statistics, records, ratios -----------------------------------------------------------


def test_stats():
    s = common.Stats.of([3.0, 1.0, 2.0])
    assert (s.median_s, s.min_s, s.max_s, s.n) == (2.0, 1.0, 3.0, 3)
    assert common.Stats.of([4.0, 1.0, 2.0, 3.0]).median_s == 2.5
    with pytest.raises(ValueError):
        common.Stats.of([])


def test_bus_bandwidth_matches_the_convention():
    # The BENCHMARKS.md example: 1 MiB over 2 ranks in 61 µs is 17.2 GB/s.
    assert common.allreduce_busbw_gbps(1 << 20, 2, 61e-6) == pytest.approx(17.19, abs=0.01)
    # 4 ranks carry 2*(4-1)/4 = 1.5 times the bytes.
    assert common.allreduce_busbw_gbps(1_000_000, 4, 1e-3) == pytest.approx(1.5)
    assert common.copy_gbps(2_000_000, 1e-3) == pytest.approx(2.0)


def test_record_shape():
    rec = common.make_record(
        bench="allreduce", impl="scalefree", variant="ring", ranks=2, nbytes=1 << 20,
        dtype="float32", stats=common.Stats(6.1e-5, 5.5e-5, 1.2e-4, 400), gbps=17.19,
        straggler_ms=0.0, first_call_s=1e-3,
    )
    core = ["bench", "impl", "variant", "ranks", "hosts", "bytes", "dtype",
            "median_s", "min_s", "max_s", "n", "gbps"]
    assert list(rec)[: len(core)] == core
    assert rec["hosts"] == 1 and rec["straggler_ms"] == 0.0
    assert json.loads(json.dumps(rec)) == rec
    for k in ("ranks", "hosts", "bytes", "n"):
        assert type(rec[k]) is int
    for k in ("median_s", "min_s", "max_s", "gbps"):
        assert type(rec[k]) is float


def _rec(impl, median_s, variant="", ranks=2, nbytes=1024):
    return common.make_record(bench="allreduce", impl=impl, variant=variant, ranks=ranks,
                              nbytes=nbytes, dtype="float32",
                              stats=common.Stats(median_s, median_s, median_s, 5), gbps=1.0)


def test_ratios_are_peer_time_over_ours():
    assert common.ratio(2.0, 1.0) == 2.0
    records = [
        _rec("scalefree", 1.0), _rec("mpi", 2.0, "openmpi"), _rec("mpi", 3.0, "mpich"),
        _rec("gloo", 0.5), _rec("scalefree", 1.0, ranks=4), _rec("memcpy", 0.1, ranks=1),
    ]
    ratios = common.peer_ratios(records, ["mpi", "gloo"], match=("ranks", "bytes"))
    assert ratios[0] == {"mpi": 2.0, "gloo": 0.5}  # fastest mpi variant
    assert ratios[1] == {} and ratios[3] == {}  # peer rows have none
    assert ratios[4] == {}  # no peer ran on 4 ranks
    table = allreduce.render_table(records, ["mpi", "gloo"])
    assert "vs mpi" in table and "2.00x" in table and "0.50x" in table


def test_share_of_the_tcp_floor_across_hosts():
    def rec(impl, hosts, nbytes, median_s, gbps):
        return common.make_record(bench="allreduce", impl=impl, variant="", ranks=hosts, hosts=hosts, nbytes=nbytes,
                                  dtype="float32", stats=common.Stats(median_s, median_s, median_s, 5), gbps=gbps)
    # 2 hosts: 4 GB/s together from 1 MiB buffers, 2 per host. A 1 MB allreduce sends 1 MB per
    # host: 0.5 ms is the floor. From 64 MiB buffers 2 GB/s together; smaller sizes take the 1 MiB floor.
    mib = 1 << 20
    records = [rec("tcp_aggregate", 2, mib, 0.0, 4.0), rec("tcp_aggregate", 2, 64 * mib, 0.0, 2.0),
               rec("scalefree", 2, 10**6, 1e-3, allreduce.busbw_gbps("allreduce", 10**6, 2, 1e-3)),
               rec("mpi", 2, 10**6, 0.5e-3, allreduce.busbw_gbps("allreduce", 10**6, 2, 0.5e-3)),
               rec("scalefree", 4, 10**6, 1e-3, 1.5),  # no floor measured for 4 hosts
               rec("scalefree", 2, 64 * mib, 0.1, 0.5)]
    allreduce.add_floor_share(records)
    assert records[2]["of_floor"] == pytest.approx(0.5)
    assert records[3]["of_floor"] == pytest.approx(1.0)
    assert records[5]["of_floor"] == pytest.approx(0.5)
    assert "of_floor" not in records[0] and "of_floor" not in records[4]
    table = allreduce.render_table(records, ["mpi"])
    assert "of TCP floor" in table and "50%" in table and "100%" in table
    # Runs on one host have no such column.
    assert "of TCP floor" not in allreduce.render_table([_rec("scalefree", 1.0)], ["mpi"])


def test_encryption_cost_compares_each_encrypted_run_with_its_unencrypted_twin():
    def rec(variant, nbytes, median_s, rounds=None):
        r = common.make_record(bench="allreduce", impl="scalefree", variant=variant, ranks=4, hosts=2, nbytes=nbytes,
                               dtype="float32", stats=common.Stats(median_s, median_s, median_s, 5), gbps=1.0)
        if rounds:
            r["round_medians_s"] = rounds
        return r
    mib = 1 << 20
    records = [rec("auto", mib, 1e-3), rec("auto+encrypt", mib, 2e-3),
               rec("auto", 64 * mib, 0.08, [0.08, 0.1]), rec("auto+encrypt", 64 * mib, 0.1, [0.1, 0.1]),
               rec("ring+encrypt", 64 * mib, 0.1)]  # no unencrypted twin: no ratio
    lines = allreduce.encryption_cost(records)
    assert records[1]["vs_unencrypted"] == pytest.approx(0.5)
    assert records[3]["vs_unencrypted"] == pytest.approx(0.8)
    assert records[3]["round_vs_unencrypted"] == pytest.approx([0.8, 1.0])
    assert "vs_unencrypted" not in records[4] and "vs_unencrypted" not in records[0]
    assert len(lines) == 2 and "0.80x the unencrypted speed (rounds: 0.80x, 1.00x)" in lines[1], lines


def test_the_bench_runs_encrypted_hosts_with_scalefree_run_encrypt():
    from scalefree_bench import hosts as across

    class Sim:
        n = 2

        def ip(self, i):
            return f"10.0.0.{i + 1}"

        def command(self, i, argv):
            return argv

    plain, sealed = (across.scalefree_cmds(Sim(), 2, 1234, ["prog"], encrypt=e) for e in (False, True))
    assert all("--encrypt" not in c for c in plain)
    assert all(c[c.index("--") - 1] == "--encrypt" and c[-1] == "prog" for c in sealed)


def test_uneven_hosts_and_wire_reach_the_commands_and_the_notes(tmp_path):
    from scalefree_bench import hosts as across

    args = _bench_parser().parse_args("bench allreduce --hosts-layout 1,2,3 --wire exact,bf16 --sizes 16M".split())
    assert args.hosts_layout == [1, 2, 3] and args.wire == ["exact", "bf16"]

    class Sim:
        n = 3

        def ip(self, i):
            return f"10.0.0.{i + 1}"

        def command(self, i, argv):
            return argv

    cmds = across.scalefree_cmds(Sim(), (1, 2, 3), 1234, ["prog"])
    assert all(c[c.index("--nproc-per-node") + 1] == "1,2,3" for c in cmds)
    mpi = across.mpi_cmd(Sim(), (1, 2, 3), tmp_path / "agent", ["prog"])
    assert mpi[mpi.index("--host") + 1] == "10.0.0.1:1,10.0.0.2:2,10.0.0.3:3" and mpi[mpi.index("-n") + 1] == "6"

    def rec(variant, median_s, **extra):
        r = common.make_record(bench="allreduce", impl="scalefree", variant=variant, ranks=2, hosts=2,
                               nbytes=64 << 20, dtype="float32", stats=common.Stats(median_s, median_s, median_s, 5),
                               gbps=1.0)
        r.update(extra)
        return r
    records = [rec("auto", 0.06, algorithm_used="direct"),
               rec("auto+bf16", 0.03, algorithm_used="direct", rel_err_max=1e-3, rel_err_bound=7.9e-3)]
    lines = allreduce.wire_gain(records)
    assert records[1]["vs_exact"] == pytest.approx(2.0)
    assert len(lines) == 1 and "2.00x the exact allreduce" in lines[0] and "bound 7.90e-03" in lines[0], lines
    assert "used" in allreduce.render_table(records, [])


# --- the timed loop --------------------------------------------------------------------------


def test_straggler_schedule_is_shared_and_bounded():
    a = common.StragglerSchedule(5.0, seed=7, world_size=4)
    b = common.StragglerSchedule(5.0, seed=7, world_size=4)
    assert [a.straggler(i) for i in range(50)] == [b.straggler(i) for i in range(50)]
    per_rank = [a.delays_s(r, 50) for r in range(4)]
    for i in range(50):
        delays = [per_rank[r][i] for r in range(4)]
        assert sum(d > 0 for d in delays) <= 1
        assert 0.0 <= max(delays) <= 5e-3
    assert len({a.straggler(i)[0] for i in range(50)}) > 1  # not always the same rank
    assert common.StragglerSchedule(0.0, 7, 4).delays_s(0, 3) == [0.0, 0.0, 0.0]


def test_time_point_counts_calls_from_the_slowest_rank():
    calls = []
    barriers = []
    kwargs = dict(rank=0, straggler=common.StragglerSchedule(0.0, 0, 1), target_seconds=1.0,
                  warmup_calls=2, calibration_calls=3)
    # allmax claims some rank needs 0.5 s per call: the target allows only 2, min_calls wins.
    pt = common.time_point(lambda: calls.append(1), lambda: barriers.append(1), lambda x: 0.5,
                           min_calls=5, max_calls=1000, **kwargs)
    assert pt.calls == 5 and len(pt.times_s) == 5 and all(t >= 0 for t in pt.times_s)
    assert len(calls) == 2 + 3 + 5  # warm-up, calibration, timed
    assert len(barriers) >= 3 + 5  # one before each calibration and timed call
    # A fast op stops at max_calls.
    pt = common.time_point(lambda: None, lambda: None, lambda x: 1e-9, min_calls=5,
                           max_calls=40, **kwargs)
    assert pt.calls == 40
    assert common.calls_for(0.01, 5, 0.5, 100_000) == 50


def test_merge_takes_the_slowest_rank_per_call(tmp_path):
    p = lambda ts: common.TimedPoint(ts, 0.1, len(ts))  # noqa: E731
    w0 = common.RankResultsWriter(tmp_path, 0, 2, "mpi", "openmpi", init_s=0.5)
    w1 = common.RankResultsWriter(tmp_path, 1, 2, "mpi", "openmpi", init_s=0.7)
    w0.add_point(1024, p([1.0, 5.0, 2.0]))
    w1.add_point(1024, p([3.0, 1.0, 2.5]))
    w0.add_point(2048, p([1.0] * 4))  # rank 1 died before finishing 2 KiB
    m = common.merge_rank_results(tmp_path, 2)
    assert (m.impl, m.variant, m.meta["init_s"]) == ("mpi", "openmpi", 0.7)
    assert [pt.nbytes for pt in m.points] == [1024]
    assert m.points[0].times_s == [3.0, 5.0, 2.5]
    assert m.problems == []
    m = common.merge_rank_results(tmp_path, 3)
    assert m.points == [] and any("rank 2 wrote no results" in x for x in m.problems)


def test_merge_keeps_points_an_implementation_refused_apart(tmp_path):
    for r in range(2):
        w = common.RankResultsWriter(tmp_path, r, 2, "scalefree", "one_shot")
        w.add_point(1024, common.TimedPoint([1.0], 0.1, 1))
        w.skip_point(1 << 20, "InvalidArgumentError: too big for one_shot")
    m = common.merge_rank_results(tmp_path, 2)
    assert [pt.nbytes for pt in m.points] == [1024] and m.problems == []
    assert m.skipped == [(1 << 20, "InvalidArgumentError: too big for one_shot")]


# --- driver behaviour ------------------------------------------------------------------------


def test_run_job_times_out_and_reports_status():
    out = common.run_job([sys.executable, "-c", "print('hello'); import sys; sys.exit(3)"], timeout_s=30)
    assert out.returncode == 3 and not out.ok and "hello" in out.output_tail
    assert "status 3" in out.describe()
    out = common.run_job([sys.executable, "-c", "import time; time.sleep(60)"], timeout_s=0.5)
    assert out.timed_out and not out.ok and out.elapsed_s < 30


@pytest.mark.skipif(not os.access(common.GNU_TIME, os.X_OK), reason="no GNU time")
def test_child_peak_rss_is_the_childs_own():
    """A child's peak RSS is its own, not this process's high-water mark (which Linux copies
    into a child's ru_maxrss at exec): 64 MiB touched here, a child that touches 32 MiB."""
    held = bytearray(64 << 20)
    held[::4096] = b"x" * len(held[::4096])
    wall, rss, out, err = common.child_wall_rss(
        [sys.executable, "-c", "import sys; b = b'x' * (32 << 20); print('hi'); print('log', file=sys.stderr)"])
    assert 32 << 20 < rss < common.status_bytes("VmHWM") and wall > 0
    assert out == "hi\n" and err == "log\n"
    with pytest.raises(SystemExit, match="failed"):
        common.child_wall_rss([sys.executable, "-c", "import sys; sys.exit(3)"])


def test_a_failing_peer_is_reported_without_losing_other_rows(monkeypatch, tmp_path):
    boom = [sys.executable, "-c", "import sys; print('boom: no peers today'); sys.exit(3)"]
    monkeypatch.setattr(common, "find_mpiexec", lambda: "mpiexec")
    monkeypatch.setattr(common, "mpiexec_cmd", lambda mpiexec, n, argv: boom)
    args = _bench_parser().parse_args(["bench", "allreduce", "--sizes", "1K", "--timeout", "30"])
    failures: list[str] = []
    assert allreduce._run_ranks("mpi", 2, args, failures, []) == []
    assert len(failures) == 1
    assert "mpi on 2 ranks" in failures[0] and "status 3" in failures[0] and "boom" in failures[0]


def test_a_missing_peer_is_skipped_with_a_hint(monkeypatch, capsys):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "torch" else real_find_spec(name, *a))
    assert allreduce._peer_available("gloo") is False
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "skipping gloo" in err and "pip install ./benchmarks" in err


def test_plot_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    records = [_rec("scalefree", 1e-5, "auto", nbytes=s) for s in (1024, 65536)]
    records += [_rec("memcpy", 1e-6, ranks=1, nbytes=s) for s in (1024, 65536)]
    out = tmp_path / "p.png"
    common.plot_records(records, out, title="t", series=("impl", "variant", "ranks"))
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# --- end to end ------------------------------------------------------------------------------


def _native_importable() -> bool:
    try:
        import scalefree._native  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.mark.skipif(not _native_importable(), reason="scalefree._native is not built (maturin develop)")
@pytest.mark.skipif(importlib.util.find_spec("mpi4py") is None or common.find_mpiexec() is None,
                    reason="mpi4py or mpiexec missing (pip install ./benchmarks)")
def test_bench_allreduce_end_to_end(tmp_path):
    out = tmp_path / "out.json"
    cmd = [sys.executable, "-m", "scalefree.cli", "bench", "allreduce", "-n", "2",
           "--sizes", "1K,64K", "--vs", "mpi", "--min-calls", "5", "--target-seconds", "0.02",
           "--rounds", "2", "--json", str(out)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stderr[-3000:]
    records = json.loads(out.read_text())
    got = {(r["impl"], r["bytes"]) for r in records}
    assert got == {(impl, b) for impl in ("scalefree", "mpi", "memcpy") for b in (1024, 65536)}
    for r in records:
        assert r["bench"] == "allreduce" and r["dtype"] == "float32" and r["hosts"] == 1
        assert r["ranks"] == (1 if r["impl"] == "memcpy" else 2)
        assert 0 < r["min_s"] <= r["median_s"] <= r["max_s"] and r["n"] >= 5
        assert r["gbps"] > 0 and math.isfinite(r["gbps"])
        # Two interleaved rounds, pooled: both rounds' calls, each round's median kept.
        if r["impl"] != "memcpy":
            assert len(r["round_medians_s"]) == 2 and r["n"] >= 10
            assert all(r["min_s"] <= m <= r["max_s"] for m in r["round_medians_s"])
    assert {r["variant"] for r in records if r["impl"] == "mpi"} <= {"openmpi", "mpich"}
    assert {r["variant"] for r in records if r["impl"] == "scalefree"} == {"auto"}
    # The table goes to stdout (one row per record), progress to stderr.
    assert p.stdout.count("\n") >= len(records) + 2
    assert "vs mpi" in p.stdout and "allreduce:" in p.stderr


def test_rounds_pool_every_call_and_keep_each_rounds_median():
    from scalefree_bench.allreduce import _pool

    def rec(impl, times):
        r = common.make_record(bench="allreduce", impl=impl, variant="", ranks=2, nbytes=1024,
                               dtype="float32", stats=common.Stats.of(times), gbps=1.0)
        r["_times"] = times
        return r

    rounds = [[rec("scalefree", [1.0, 2.0, 3.0]), rec("mpi", [5.0])], [rec("scalefree", [10.0, 11.0]), rec("mpi", [7.0, 9.0])]]
    got = {r["impl"]: r for r in _pool(rounds)}
    assert set(got) == {"scalefree", "mpi"}
    sf = got["scalefree"]
    assert (sf["median_s"], sf["min_s"], sf["max_s"], sf["n"]) == (3.0, 1.0, 11.0, 5)
    assert sf["round_medians_s"] == [2.0, 10.5] and "_times" not in sf
    assert sf["gbps"] == common.allreduce_busbw_gbps(1024, 2, 3.0)
    assert got["mpi"]["median_s"] == 7.0 and got["mpi"]["round_medians_s"] == [5.0, 8.0]
    # One round: the record as measured, nothing added.
    one = _pool([[rec("mpi", [5.0, 6.0])]])
    assert len(one) == 1 and "round_medians_s" not in one[0] and one[0]["median_s"] == 5.5


@pytest.mark.skipif(not _native_importable(), reason="scalefree._native is not built (maturin develop)")
@pytest.mark.skipif(importlib.util.find_spec("mpi4py") is None or common.find_mpiexec() is None,
                    reason="mpi4py or mpiexec missing (pip install ./benchmarks)")
@pytest.mark.parametrize("op", ["allgather", "broadcast"])
def test_bench_other_collectives_end_to_end(tmp_path, op):
    # Every implementation checks its result after timing (a wrong gather or broadcast fails
    # the run); rows carry the op and its bus bandwidth.
    out = tmp_path / "out.json"
    cmd = [sys.executable, "-m", "scalefree.cli", "bench", "allreduce", "-n", "3", "--op", op,
           "--sizes", "4,1K,100K", "--vs", "mpi", "--min-calls", "5", "--target-seconds", "0.02",
           "--json", str(out)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stderr[-3000:]
    records = [r for r in json.loads(out.read_text()) if r["impl"] != "memcpy"]
    assert {(r["impl"], r["bytes"]) for r in records} == {(i, b) for i in ("scalefree", "mpi") for b in (4, 1024, 102400)}
    for r in records:
        assert r["op"] == op and r["ranks"] == 3
        per = r["bytes"] * (2 if op == "allgather" else 1) / r["median_s"] / 1e9
        assert r["gbps"] == pytest.approx(per)


def test_bench_rejects_an_unknown_op():
    p = subprocess.run([sys.executable, "-m", "scalefree.cli", "bench", "allreduce", "--op", "alltoall"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "alltoall" in p.stderr


@pytest.mark.skipif(not _native_importable(), reason="scalefree._native is not built (maturin develop)")
@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch missing (pip install ./benchmarks)")
def test_bench_allreduce_against_gloo_with_a_straggler(tmp_path):
    out = tmp_path / "out.json"
    cmd = [sys.executable, "-m", "scalefree.cli", "bench", "allreduce", "-n", "2", "--sizes", "4K",
           "--vs", "gloo", "--straggler", "0.2", "--min-calls", "5", "--target-seconds", "0.01",
           "--json", str(out)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stderr[-3000:]
    records = json.loads(out.read_text())
    assert {r["impl"] for r in records} == {"scalefree", "gloo", "memcpy"}
    for r in records:
        assert r["median_s"] > 0 and r["n"] >= 5
        assert r["straggler_ms"] == (0.0 if r["impl"] == "memcpy" else 0.2)
    assert "vs gloo" in p.stdout


def test_bench_flash_gemm_end_to_end(tmp_path):
    import json
    import subprocess
    import sys

    out = tmp_path / "fg.json"
    p = subprocess.run([sys.executable, "-m", "scalefree.cli", "bench", "flash-gemm", "--n", "64,96", "--repeat", "2",
                        "--json", str(out)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    recs = json.loads(out.read_text())
    assert {(r["impl"], r["n_rows"]) for r in recs} == {("numpy", 64), ("scalefree", 64), ("numpy", 96), ("scalefree", 96)}
    for r in recs:
        assert r["bench"] == "flash-gemm" and r["median_s"] > 0
        if r["impl"] == "scalefree":
            assert r["peak_resident_bytes"] <= r["budget_bytes"]
        if sys.platform == "linux":  # the process's peak RSS around the timed calls
            assert r["peak_rss_bytes"] >= r["rss_before_bytes"] > 0
    assert "vs numpy" in p.stdout and "peak RSS" in p.stdout


def test_bench_flash_kernels_end_to_end(tmp_path):
    import json
    import subprocess
    import sys

    out = tmp_path / "fk.json"
    p = subprocess.run([sys.executable, "-m", "scalefree.cli", "bench", "flash-kernels", "--sort-n", "50000",
                        "--kmeans-n", "5000", "--kmeans-d", "4", "--kmeans-k", "3", "--kmeans-iterations", "2",
                        "--repeat", "1", "--json", str(out)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    recs = json.loads(out.read_text())
    assert {r["variant"] for r in recs} == {"sort", "csrcsc", "csrmm", "kmeans"}
    for r in recs:
        assert r["bench"] == "flash-kernels" and r["median_s"] > 0
        if r["impl"] == "scalefree":
            assert r["peak_resident_bytes"] <= r["budget_bytes"]
        if sys.platform == "linux":  # the process's peak RSS around the timed calls
            assert r["peak_rss_bytes"] >= r["rss_before_bytes"] > 0
    assert "vs peer" in p.stdout and "peak RSS" in p.stdout


# --- bench ps across simulated hosts -------------------------------------------------------


def test_bench_ps_hosts_table_compares_with_tracing_off():
    from scalefree_bench import ps

    def rec(trace, sps, copied):
        return {"variant": f"slots, tracing {trace}", "trace": trace, "samples_per_s": sps, "comm_fraction": 0.25,
                "bytes_copied_per_step": copied, "final_loss": 2.0, "peak_rss_bytes": [100 << 20, 120 << 20]}

    table = ps.render_hosts([rec("on", 120.0, 3112), rec("off", 100.0, 1 << 20)])
    on = [l for l in table.splitlines() if l.startswith("slots, tracing on")][0]
    assert "3.04 KiB" in on and "0.003x copied, 1.20x samples/s" in on and "100 MiB, 120 MiB" in on
    assert "1 MiB" in [l for l in table.splitlines() if l.startswith("slots, tracing off")][0]


def test_bench_ps_trace_settings_are_checked(capsys):
    with pytest.raises(SystemExit) as e:
        _bench_parser().parse_args(["bench", "ps", "--hosts", "2", "--trace", "on,maybe"])
    assert e.value.code == 2
    assert "maybe" in capsys.readouterr().err


# --- bench torch-trace ----------------------------------------------------------------------


def test_bench_torch_trace_table_compares_with_tracing_off():
    from scalefree_bench import torch_trace

    def rec(workload, trace, sps, copied):
        return {"variant": f"{workload}, tracing {trace}", "workload": workload, "trace": trace,
                "samples_per_s": sps, "samples_per_s_rounds": [sps], "bytes_copied_per_step": copied,
                "bytes_staged_per_step": copied, "bytes_copied_recv_per_step": 0,
                "peak_rss_bytes": [100 << 20, 120 << 20]}

    table = torch_trace.render([rec("pipeline", "on", 110.0, 0), rec("pipeline", "off", 100.0, 1 << 19),
                                rec("ddp", "on", 50.0, 0), rec("ddp", "off", 50.0, 0)]).splitlines()
    on = [line for line in table if line.startswith("pipeline, tracing on")][0]
    assert "0.000x copied, 1.10x samples/s" in on and "100 MiB, 120 MiB" in on
    assert "512 KiB" in [line for line in table if line.startswith("pipeline, tracing off")][0]
    assert "nothing copied either way, 1.00x samples/s" in [line for line in table if line.startswith("ddp, tracing on")][0]


def test_bench_torch_trace_workloads_are_checked(capsys):
    with pytest.raises(SystemExit) as e:
        _bench_parser().parse_args(["bench", "torch-trace", "--workload", "pipeline,fsdp"])
    assert e.value.code == 2
    assert "fsdp" in capsys.readouterr().err
