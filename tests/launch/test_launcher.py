"""`scalefree run` (scalefree.cli.run over scalefree.launch.launcher) with real processes: rank environment, prefixed
output, exit codes, stopping a failed or timed-out job, signals, and no leftover processes.

Ranks coordinate through files in a temporary directory instead of sleeps, so no test
depends on how fast processes start.
"""

import argparse
import importlib.util
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

SOURCE = Path(__file__).resolve().parents[2] / "python"
if importlib.util.find_spec("scalefree.launch.launcher") is None:  # not installed: use the source tree
    sys.path.insert(0, str(SOURCE))
    ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(SOURCE), os.environ.get("PYTHONPATH")]))}
else:
    ENV = dict(os.environ)

from scalefree.launch import launcher  # noqa: E402

RUN = [sys.executable, "-m", "scalefree.cli", "run"]

# Prelude of every rank script: its rank, and helpers to meet the test through files.
PRELUDE = """\
import os, signal, sys, time
rank = int(os.environ["SCALEFREE_RANK"])
def mark(name):
    open(os.path.join(DIR, name), "w").close()
def wait_for(*names):
    while not all(os.path.exists(os.path.join(DIR, n)) for n in names):
        time.sleep(0.01)
mark(f"pid-{os.getpid()}")
"""


def rank_cmd(code: str, tmp_path=None) -> list[str]:
    prelude = f"DIR = {str(tmp_path)!r}\n" + PRELUDE if tmp_path is not None else PRELUDE.split("def mark")[0]
    return ["--", sys.executable, "-c", prelude + textwrap.dedent(code)]


def run(args, timeout=30, env=None):
    return subprocess.run(RUN + args, capture_output=True, timeout=timeout, env=env or ENV)


def _as_from_a_terminal():
    """The signals a launcher typed at a terminal gets: the launcher keeps a signal its parent
    ignored ignored (``nohup``, a script's background job), so tests that send it Ctrl-C must
    not inherit the test runner's own ignores (pytest started as a background job of a script
    ignores SIGINT and SIGQUIT; under ``nohup``, SIGHUP)."""
    for sig in (signal.SIGINT, signal.SIGQUIT, signal.SIGHUP, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)


def start(args):
    return subprocess.Popen(RUN + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV,
                            preexec_fn=_as_from_a_terminal)


def pids(tmp_path) -> list[int]:
    return [int(f.name[4:]) for f in tmp_path.glob("pid-*")]


def wait_for_pids(tmp_path, n, timeout=20.0):
    deadline = time.monotonic() + timeout
    while len(pids(tmp_path)) < n:
        assert time.monotonic() < deadline, f"only {len(pids(tmp_path))} of {n} ranks started"
        time.sleep(0.02)


def gone(pid: int, timeout=5.0) -> bool:
    """True once `pid` no longer exists (or is a zombie awaiting init, i.e. dead)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            os.kill(pid, 0)
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            if state == "Z":
                return True
        except (ProcessLookupError, FileNotFoundError):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)


def assert_no_leftovers(tmp_path, expected: int):
    found = pids(tmp_path)
    assert len(found) == expected
    alive = [pid for pid in found if not gone(pid)]
    assert not alive, f"processes left behind: {alive}"


# ---------------------------------------------------------------------------------------
# Environment


@pytest.mark.parametrize("n", [1, 3])
def test_every_rank_gets_its_environment_and_no_foreign_one(n):
    env = {**ENV, "INHERITED": "yes", "RANK": "7", "WORLD_SIZE": "9", "LOCAL_RANK": "7", "LOCAL_WORLD_SIZE": "9",
           "OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2", "PMI_RANK": "1", "PMI_SIZE": "2",
           "SLURM_PROCID": "1"}
    code = """\
        e = os.environ
        print(e["SCALEFREE_RANK"], e["SCALEFREE_WORLD_SIZE"], e["SCALEFREE_LOCAL_RANK"], e["SCALEFREE_LOCAL_SIZE"],
              e["SCALEFREE_JOB_ID"], e["SCALEFREE_JOB_TOKEN"], e.get("INHERITED"),
              sorted(set(e) & set(launcher_vars)) or None)
    """
    code = f"launcher_vars = {list(launcher.FOREIGN_RANK_VARIABLES)!r}\n" + textwrap.dedent(code)
    p = run(["-n", str(n)] + rank_cmd(code), env=env)
    assert p.returncode == 0, p.stderr
    rows = sorted(line.split() for line in p.stdout.decode().splitlines())
    assert [row[:5] for row in rows] == [[f"[{r}]", str(r), str(n), str(r), str(n)] for r in range(n)]
    job_ids, tokens = {row[5] for row in rows}, {row[6] for row in rows}
    assert len(job_ids) == 1 and re.fullmatch(r"sf-[0-9a-f]{12}", job_ids.pop())
    assert len(tokens) == 1 and re.fullmatch(r"[0-9a-f]{32}", tokens.pop())
    assert all(row[7:] == ["yes", "None"] for row in rows)


@pytest.mark.parametrize("local,given,expected", [
    (1, {}, None),  # one rank: its pools as numpy/torch size them
    (3, {}, "cores // 3"),
    (5, {}, "cores // 5"),
    (4, {"OMP_NUM_THREADS": "3"}, "kept"),  # a size the user set stays, and no other is added
    (2, {"OPENBLAS_NUM_THREADS": "2"}, "kept"),
])
def test_ranks_sharing_a_host_get_their_share_of_the_cores_as_thread_pools(local, given, expected):
    base = {k: v for k, v in os.environ.items() if k not in launcher.THREAD_VARIABLES}
    base.update(given)
    env = launcher.rank_environment(0, local, "sf-000000000000", "t" * 32, base, local_rank=0, local_size=local)
    pools = {k: env.get(k) for k in launcher.THREAD_VARIABLES}
    if expected is None:
        assert pools == dict.fromkeys(launcher.THREAD_VARIABLES)
    elif expected == "kept":
        assert pools == {k: given.get(k) for k in launcher.THREAD_VARIABLES}
    else:
        share = str(max(1, len(os.sched_getaffinity(0)) // local))
        assert pools == dict.fromkeys(launcher.THREAD_VARIABLES, share)
    # Across hosts only the ranks on this host share its cores.
    two_hosts = launcher.rank_environment(0, 2 * local, "sf-000000000000", "t" * 32, base, local_rank=0,
                                          local_size=local)
    assert {k: two_hosts.get(k) for k in launcher.THREAD_VARIABLES} == pools


def test_every_run_is_a_new_job():
    code = 'print(os.environ["SCALEFREE_JOB_ID"], os.environ["SCALEFREE_JOB_TOKEN"])'
    first, second = (run(["-n", "1"] + rank_cmd(code)).stdout.split()[1:] for _ in range(2))
    assert first[0] != second[0] and first[1] != second[1]


# ---------------------------------------------------------------------------------------
# Output


def test_lines_stay_whole_and_carry_their_rank():
    # Four ranks write concurrently, one flushed write per line, some lines larger than a
    # pipe buffer, raw bytes that are not UTF-8, and a last line without a newline.
    code = """\
        out = sys.stdout.buffer
        for i in range(400):
            out.write(b"%d:%d:\\xff" % (rank, i) + b"x" * (100_000 if i % 40 == 0 else i) + b"\\n")
            out.flush()
        sys.stderr.buffer.write(b"warning %d\\n" % rank)
        out.write(b"tail %d" % rank)
    """
    p = run(["-n", "4"] + rank_cmd(code))
    assert p.returncode == 0, p.stderr
    lines = p.stdout.split(b"\n")
    assert lines.pop() == b""
    per_rank = {r: [] for r in range(4)}
    for line in lines:
        m = re.fullmatch(rb"\[(\d)\] (?:(\d):(\d+):\xff(x*)|tail (\d))", line)
        assert m and m[1] == (m[2] or m[5]), line[:80]
        per_rank[int(m[1])].append(int(m[3]) if m[3] else "tail")
        if m[3]:
            assert len(m[4]) == (100_000 if int(m[3]) % 40 == 0 else int(m[3]))
    assert all(got == list(range(400)) + ["tail"] for got in per_rank.values())
    assert sorted(p.stderr.splitlines()) == [b"[%d] warning %d" % (r, r) for r in range(4)]


def test_carriage_return_ends_a_line_for_progress_bars():
    p = run(["-n", "1"] + rank_cmd(r'sys.stdout.write("10%\r50%\r100%\r\nok\r\n")'))
    assert p.stdout == b"[0] 10%\r[0] 50%\r[0] 100%\r\n[0] ok\r\n"


def test_no_prefix_passes_bytes_through_unchanged():
    p = run(["-n", "1", "--no-prefix"] + rank_cmd(r'sys.stdout.buffer.write(b"a\xff\nno newline")'))
    assert p.returncode == 0 and p.stdout == b"a\xff\nno newline"


def test_a_closed_stdout_does_not_block_the_ranks():
    p = subprocess.Popen(RUN + ["-n", "2"] + rank_cmd('for _ in range(20000): print("x" * 200)'),
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=ENV)
    p.stdout.close()
    assert p.wait(timeout=30) == 0


# ---------------------------------------------------------------------------------------
# Exit codes and stopping


@pytest.mark.parametrize("code, expected", [
    ("sys.exit(3 if rank == 2 else 0)", 3),
    ("sys.exit(0)", 0),
    ("os.kill(os.getpid(), signal.SIGKILL) if rank == 1 else None", 137),
])
def test_exit_code_is_that_of_the_failed_rank(code, expected):
    p = run(["-n", "3"] + rank_cmd(code))
    assert p.returncode == expected, p.stderr
    if expected == 0:
        assert p.stderr == b""
    else:
        rank = 2 if expected == 3 else 1
        assert f"scalefree run: rank {rank} exited with code {expected}".encode() in p.stderr


def test_one_rank_fails_the_sleeping_others_are_stopped(tmp_path):
    code = """\
        while len([f for f in os.listdir(DIR) if f.startswith("pid-")]) < 3:
            time.sleep(0.01)
        os._exit(5) if rank == 0 else time.sleep(600)
    """
    t0 = time.monotonic()
    p = run(["-n", "3", "--grace", "1"] + rank_cmd(code, tmp_path))
    elapsed = time.monotonic() - t0
    assert p.returncode == 5, p.stderr
    assert b"scalefree run: rank 0 exited with code 5; stopping the other ranks\n" in p.stderr
    assert elapsed < 1 + 8
    assert_no_leftovers(tmp_path, 3)


def test_survivors_that_exit_within_the_grace_are_not_signalled(tmp_path):
    code = """\
        signal.signal(signal.SIGTERM, lambda *_: (mark(f"term-{rank}"), os._exit(1)))
        if rank == 0:
            mark("failing")
            os._exit(9)
        wait_for("failing")
        time.sleep(0.2)
    """
    t0 = time.monotonic()
    p = run(["-n", "2", "--grace", "25"] + rank_cmd(code, tmp_path))
    assert p.returncode == 9, p.stderr
    assert time.monotonic() - t0 < 20  # it did not wait out the grace
    assert not list(tmp_path.glob("term-*"))


def test_sigterm_comes_first_then_sigkill_for_ranks_that_ignore_it(tmp_path):
    code = """\
        if rank == 1:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        else:
            signal.signal(signal.SIGTERM, lambda *_: (mark(f"term-{rank}"), os._exit(1)))
        mark(f"ready-{rank}")
        if rank == 0:
            wait_for("ready-1", "ready-2")
            os._exit(7)
        time.sleep(600)
    """
    t0 = time.monotonic()
    p = run(["-n", "3", "--grace", "0"] + rank_cmd(code, tmp_path))
    elapsed = time.monotonic() - t0
    assert p.returncode == 7, p.stderr
    assert (tmp_path / "term-2").exists() and not (tmp_path / "term-1").exists()
    assert launcher.TERM_TO_KILL_SECONDS <= elapsed < launcher.TERM_TO_KILL_SECONDS + 8
    assert_no_leftovers(tmp_path, 3)


def test_timeout_stops_the_job(tmp_path):
    t0 = time.monotonic()
    p = run(["-n", "2", "--timeout", "2"] + rank_cmd("time.sleep(600)", tmp_path))
    assert p.returncode == 124
    assert b"scalefree run: timeout after 2 s; stopping all ranks\n" in p.stderr
    assert time.monotonic() - t0 < 2 + 8
    assert_no_leftovers(tmp_path, 2)


def test_processes_a_rank_leaves_in_its_group_are_killed_at_the_end(tmp_path):
    code = """\
        import subprocess
        child = subprocess.Popen(["sleep", "600"])  # inherits our output pipes
        mark(f"pid-{child.pid}")
    """
    t0 = time.monotonic()
    p = run(["-n", "2"] + rank_cmd(code, tmp_path))
    assert p.returncode == 0, p.stderr
    assert time.monotonic() - t0 < 4  # did not wait for the sleeper's pipes to close
    assert_no_leftovers(tmp_path, 4)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_signal_to_the_launcher_stops_every_rank(tmp_path, sig):
    """Ctrl-C is passed on as SIGINT (Python raises KeyboardInterrupt in every rank); SIGTERM
    and SIGHUP stop the ranks with SIGTERM."""
    code = """\
        signal.signal(signal.SIGTERM, lambda *_: (mark(f"term-{rank}"), os._exit(1)))
        signal.signal(signal.SIGINT, lambda *_: (mark(f"int-{rank}"), os._exit(1)))
        mark(f"ready-{rank}")
        time.sleep(600)
    """
    p = start(["-n", "2"] + rank_cmd(code, tmp_path))
    deadline = time.monotonic() + 20
    while not all((tmp_path / f"ready-{r}").exists() for r in range(2)):  # the handlers are in place
        assert time.monotonic() < deadline
        time.sleep(0.01)
    p.send_signal(sig)
    assert p.wait(timeout=20) == 128 + sig
    assert f"received {sig.name}".encode() in p.stderr.read()
    kind = "int" if sig == signal.SIGINT else "term"
    assert sorted(f.name for f in tmp_path.glob("*-?") if f.name.startswith(("int", "term"))) == [f"{kind}-0", f"{kind}-1"]
    assert_no_leftovers(tmp_path, 2)


def test_ranks_that_ignore_ctrl_c_are_stopped_after_the_grace(tmp_path):
    code = """\
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, lambda *_: (mark(f"term-{rank}"), os._exit(1)))
        mark(f"ready-{rank}")
        time.sleep(600)
    """
    p = start(["-n", "2", "--grace", "1"] + rank_cmd(code, tmp_path))
    deadline = time.monotonic() + 20
    while not all((tmp_path / f"ready-{r}").exists() for r in range(2)):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    t0 = time.monotonic()
    p.send_signal(signal.SIGINT)
    assert p.wait(timeout=20) == 130
    assert time.monotonic() - t0 >= 1.0  # the grace
    assert sorted(f.name for f in tmp_path.glob("term-*")) == ["term-0", "term-1"]
    assert_no_leftovers(tmp_path, 2)


def test_a_signal_the_launcher_was_started_with_ignored_stays_ignored(tmp_path):
    """``nohup scalefree run ...`` survives SIGHUP (and a background job of a script, SIGINT)."""
    p = subprocess.Popen(RUN + ["-n", "1"] + rank_cmd("time.sleep(600)", tmp_path), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, env=ENV, preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN))
    wait_for_pids(tmp_path, 1)
    p.send_signal(signal.SIGHUP)
    with pytest.raises(subprocess.TimeoutExpired):
        p.wait(timeout=1.0)
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=20) == 128 + signal.SIGTERM
    assert_no_leftovers(tmp_path, 1)


def test_ctrl_c_to_the_launcher_ends_every_ranks_parked_wait(tmp_path):
    """Every rank parks waiting for a notification nobody sends; a SIGINT to the launcher
    raises KeyboardInterrupt in each within the bound, and the job ends with 130."""
    from ranks import parked_in_wait

    code = """\
        import scalefree
        g = scalefree.init(timeout=120)
        try:
            g.device.wait(5)
        except KeyboardInterrupt:
            print(f"interrupted at {time.monotonic():.6f}", flush=True)
            raise
    """
    p = start(["-n", "3"] + rank_cmd(code, tmp_path))
    wait_for_pids(tmp_path, 3)
    deadline = time.monotonic() + 60
    while not all(parked_in_wait(pid) for pid in pids(tmp_path)):
        assert time.monotonic() < deadline, "the ranks never parked"
        time.sleep(0.02)
    time.sleep(0.2)
    sent = time.monotonic()
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 130, err
    times = {int(m[1]): float(m[2]) for m in re.finditer(rb"\[(\d)\] interrupted at (\S+)", out)}
    assert sorted(times) == [0, 1, 2], (out, err)
    assert max(times.values()) - sent < 2.0, times
    assert_no_leftovers(tmp_path, 3)


# ---------------------------------------------------------------------------------------
# Restarts


def test_a_rank_that_fails_once_is_restarted_with_a_new_rendezvous(tmp_path):
    code = """\
        import scalefree
        count, most = os.environ["SCALEFREE_RESTART_COUNT"], os.environ["SCALEFREE_MAX_RESTARTS"]
        g = scalefree.init(timeout=60)
        g.barrier()
        if rank == 1 and count == "0":
            os._exit(3)
        g.barrier()
        print(f"start {count} of at most {int(most) + 1} done in job {g.job_id}", flush=True)
    """
    p = run(["-n", "2", "--grace", "1", "--max-restarts", "2"] + rank_cmd(code, tmp_path), timeout=120)
    assert p.returncode == 0, p.stderr
    done = re.findall(rb"\[(\d)\] start (\d) of at most 3 done in job (\S+)", p.stdout)
    assert sorted(d[:2] for d in done) == [(b"0", b"1"), (b"1", b"1")], p.stdout
    assert b"scalefree run: rank 1 exited with code 3; stopping the other ranks; restarting the job" in p.stderr \
        or b"scalefree run: rank 1 exited with code 3; restarting the job" in p.stderr, p.stderr
    assert b"restart 1 of 2 (--max-restarts)" in p.stderr and b"restart 2 of 2" not in p.stderr


def test_restarts_exhausted_end_with_the_failed_ranks_code(tmp_path):
    code = """\
        print(f"start {os.environ['SCALEFREE_RESTART_COUNT']}", flush=True)
        sys.exit(3 if rank == 1 else 0)
    """
    p = run(["-n", "2", "--grace", "0", "--max-restarts", "2"] + rank_cmd(code, tmp_path), timeout=60)
    assert p.returncode == 3, p.stderr
    assert sorted(re.findall(rb"\[1\] start (\d)", p.stdout)) == [b"0", b"1", b"2"]
    assert p.stderr.count(b"rank 1 exited with code 3") == 3
    assert b"no restarts left: the job failed in all 3 starts (--max-restarts 2)" in p.stderr


def test_no_restart_after_a_signal_to_the_launcher(tmp_path):
    p = start(["-n", "1", "--max-restarts", "3"] + rank_cmd("time.sleep(600)", tmp_path))
    wait_for_pids(tmp_path, 1)
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=20) == 128 + signal.SIGTERM
    assert len(pids(tmp_path)) == 1 and b"restart" not in p.stderr.read()


def test_ranks_die_with_a_killed_launcher(tmp_path):
    p = start(["-n", "2"] + rank_cmd("time.sleep(600)", tmp_path))
    wait_for_pids(tmp_path, 2)
    p.kill()
    p.wait(timeout=10)
    assert_no_leftovers(tmp_path, 2)


# ---------------------------------------------------------------------------------------
# Bad invocations


def test_a_command_that_does_not_exist():
    p = run(["-n", "2", "--", "no-such-command-xyz", "arg"])
    assert p.returncode == 127
    assert b"scalefree run: cannot run 'no-such-command-xyz'" in p.stderr


@pytest.mark.parametrize("args, message", [
    (["-n", "0", "--", "true"], b"at least 1"),
    (["-n", "two", "--", "true"], b"not an integer"),
    (["-n", "2"], b"no command given"),
    (["-n", "2", "--"], b"no command given"),
    (["-n", "1", "--timeout", "0", "--", "true"], b"positive"),
    (["-n", "1", "--grace", "-1", "--", "true"], b"non-negative"),
    (["--", "true"], b"required"),
])
def test_bad_arguments_are_usage_errors(args, message):
    p = run(args)
    assert p.returncode == 2
    assert b"error:" in p.stderr and message in p.stderr


# ---------------------------------------------------------------------------------------
# Programmatic use


def test_launch_returns_the_exit_code_and_uses_the_given_environment(capfd):
    env = {"PATH": os.environ.get("PATH", ""), "GREETING": "hello"}
    code = 'import os, sys; print(os.environ["GREETING"], os.environ["SCALEFREE_RANK"]); sys.exit(4)'
    assert launcher.launch([sys.executable, "-c", code], 2, env=env) == 4
    out = capfd.readouterr().out.splitlines()
    assert sorted(out) == ["[0] hello 0", "[1] hello 1"]
    with pytest.raises(ValueError):
        launcher.launch(["true"], 0)
    with pytest.raises(ValueError):
        launcher.launch([], 1)


def test_run_is_a_subcommand_whose_func_returns_the_exit_code():
    from scalefree.cli import run as run_command

    parser = argparse.ArgumentParser(prog="scalefree")
    run_command.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["run", "-n", "2", "--", sys.executable, "-c", "raise SystemExit(6)"])
    assert args.func(args) == 6


@pytest.mark.skipif(importlib.util.find_spec("scalefree._native") is None, reason="native module not built")
def test_survivors_report_peer_lost_through_the_launcher():
    code = """\
        import numpy as np, scalefree
        g = scalefree.init(); a = np.ones(1 << 20, np.float32)
        for i in range(10**6):
            if g.rank == 1 and i == 30: os.kill(os.getpid(), signal.SIGKILL)
            g.allreduce(a)
    """
    p = run(["-n", "3"] + rank_cmd(code), timeout=60)
    assert p.returncode == 137
    assert b"rank 1 exited with code 137 (SIGKILL); stopping the other ranks" in p.stderr
    assert p.stderr.count(b"PeerLostError: rank 1") == 2, p.stderr.decode(errors="replace")


def test_the_timeout_counts_for_all_starts_together(tmp_path):
    code = """\
        time.sleep(0.5)
        sys.exit(3)
    """
    t0 = time.monotonic()
    p = run(["-n", "1", "--grace", "0", "--max-restarts", "100", "--timeout", "3"] + rank_cmd(code, tmp_path), timeout=60)
    assert p.returncode == 124, p.stderr
    assert b"scalefree run: timeout after 3 s; stopping all ranks\n" in p.stderr
    assert 1 < len(pids(tmp_path)) < 100 and time.monotonic() - t0 < 3 + 8
