"""`scalefree bench ... --compare`: a run's headline figures against the last recorded result,
moved or not by more than the noise (the larger of --noise and the recorded repeats' spread)."""

import argparse
import json
import os

import pytest

from scalefree_bench import cli as bench_cli
from scalefree_bench import compare


def _rec(variant="hypercube", ranks=4, wall=1.0, median=0.001, n=200, calls=200, **extra):
    return {"bench": "ssp", "impl": "scalefree", "variant": variant, "ranks": ranks, "hosts": 1, "bytes": 1 << 20, "calls": calls,
            "dtype": "float32", "median_s": median, "min_s": median / 2, "max_s": median * 3, "n": n, "gbps": 0.0,
            "slack": 8, "delay_ms": 20.0, "wall_s": wall, "coll_s": 0.2, "ideal_s": 0.65, **extra}


def _verdicts(changes):
    return {(c.point.split("variant=")[1], c.figure): c.verdict for c in changes}


def test_identity_is_the_settings_not_the_measurements():
    a, b = _rec(wall=1.0, n=200), _rec(wall=2.0, n=57, coll_s=9.0, peak_rss_bytes=123)
    assert compare.identity(a) == compare.identity(b)
    assert compare.identity(a) != compare.identity(_rec(ranks=2))
    assert compare.identity(a) != compare.identity(_rec(delay_ms=0.0))
    # `bench ssp --calls` is a setting (a loop of 5 calls is not a loop of 200).
    assert compare.identity(a) != compare.identity(_rec(calls=5))


@pytest.mark.parametrize("factor, verdict", [(1.05, "within noise"), (1.2, "worse"), (0.8, "better"), (0.95, "within noise")])
def test_a_time_moved_by_more_than_the_threshold(factor, verdict):
    changes, unmatched = compare.compare([_rec(wall=factor)], [_rec(wall=1.0)], noise=0.10)
    assert unmatched == 0
    assert _verdicts(changes)[("hypercube", "wall_s")] == verdict
    assert _verdicts(changes)[("hypercube", "median_s")] == "within noise"


def test_higher_is_better_for_throughput():
    run = dict(_rec(), updates_per_s=80e6)
    changes, _ = compare.compare([run], [dict(_rec(), updates_per_s=100e6)], noise=0.10)
    assert _verdicts(changes)[("hypercube", "updates_per_s")] == "worse"


def test_the_recorded_repeats_spread_widens_the_noise():
    # Three recorded rounds of one point spread by 30 %: a 20 % change is within their noise.
    recorded = [_rec(wall=w) for w in (0.9, 1.0, 1.2)]
    changes, _ = compare.compare([_rec(wall=1.2)], recorded, noise=0.10)
    c = next(c for c in changes if c.figure == "wall_s")
    assert c.recorded == 1.0 and c.noise == pytest.approx(0.3) and c.verdict == "within noise"


def test_points_the_record_lacks_are_counted_not_compared():
    changes, unmatched = compare.compare([_rec(), _rec(variant="sharded")], [_rec()], noise=0.1)
    assert unmatched == 1 and {c.point.split("variant=")[1] for c in changes} == {"hypercube"}


def test_the_newest_matching_file_is_the_baseline(tmp_path):
    old, new, other = tmp_path / "ssp-old.json", tmp_path / "sub" / "ssp-new.json", tmp_path / "mf.json"
    new.parent.mkdir()
    old.write_text(json.dumps([_rec(wall=1.0)]))
    new.write_text(json.dumps([_rec(wall=2.0)]))
    other.write_text(json.dumps([{"bench": "mf", "median_s": 1.0}]))
    os.utime(old, (1e9, 1e9))
    os.utime(new, (2e9, 2e9))
    os.utime(other, (3e9, 3e9))
    assert compare.find_baseline([_rec()], tmp_path) == new
    assert compare.find_baseline([_rec(ranks=3)], tmp_path) is None
    # A run that records into the results folder is not its own baseline.
    assert compare.find_baseline([_rec()], tmp_path, exclude=new) == old


def _parse(*argv):
    p = argparse.ArgumentParser(prog="scalefree")
    bench_cli.add_parser(p.add_subparsers(dest="command"))
    return p.parse_args(["bench", *argv])


@pytest.mark.parametrize("bench", ["allreduce", "sparse", "mf", "ssp"])
def test_every_recording_bench_takes_compare(bench, tmp_path):
    base = tmp_path / "base.json"
    base.write_text("[]")
    args = _parse(bench, "--compare", str(base), "--noise", "5")
    assert args.compare == str(base) and args.noise == 5.0
    assert args.func._compares and args.func.__wrapped__ is _parse(bench).func
    plain = _parse(bench)
    assert not hasattr(plain, "compare") and not getattr(plain.func, "_compares", False)


def test_a_missing_baseline_file_is_a_usage_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        _parse("ssp", "--compare", str(tmp_path / "nope.json"))
    assert e.value.code == 2
    assert "--compare: no such results file" in capsys.readouterr().err


@pytest.mark.parametrize("wall, rc", [(1.0, 0), (1.5, 1)])
def test_the_guarded_run_compares_what_it_recorded(tmp_path, capsys, wall, rc):
    base = tmp_path / "base.json"
    base.write_text(json.dumps([_rec(wall=1.0)]))

    def run(args):
        args.json.write_text(json.dumps([_rec(wall=wall)]))
        return 0

    args = argparse.Namespace(json=None, compare=str(base), noise=10.0)
    assert compare.guarded(run)(args) == rc
    assert args.json is None  # the temporary record file is the guard's, not the caller's
    out = capsys.readouterr().out
    assert f"compared with {base}" in out and ("1 worse" if rc else "0 worse") in out


def test_the_ssp_loop_is_also_compared_with_its_slept_ideal():
    # The machine slept late (wall and slept ideal both up 20 %): the wall is worse, the loop
    # over its slept ideal is not.
    changes, _ = compare.compare([_rec(wall=1.2, ideal_slept_s=0.78)], [_rec(wall=1.0, ideal_slept_s=0.65)], noise=0.1)
    v = _verdicts(changes)
    assert v[("hypercube", "wall_s")] == "worse" and v[("hypercube", "wall_over_ideal_slept")] == "within noise"
