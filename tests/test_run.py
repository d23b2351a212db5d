"""`scalefree run`: environment, prefixed output, exit codes, failure handling, no leftovers."""

import os
import signal
import subprocess
import sys
import time

import pytest

RUN = [sys.executable, "-m", "scalefree.launcher"]


def run(args, timeout=60):
    return subprocess.run(RUN + args, capture_output=True, timeout=timeout)


def py(code):
    return ["--", sys.executable, "-c", code]


def test_environment_of_every_rank():
    p = run(["-n", "3"] + py("import os; e=os.environ; print(e['SCALEFREE_RANK'], e['SCALEFREE_WORLD_SIZE'], "
                             "e['SCALEFREE_LOCAL_RANK'], e['SCALEFREE_LOCAL_SIZE'], e['SCALEFREE_JOB_ID'], "
                             "e['SCALEFREE_JOB_TOKEN'], 'RANK' in e)"))
    assert p.returncode == 0, p.stderr
    rows = sorted(l.split() for l in p.stdout.decode().splitlines())
    assert [r[0] for r in rows] == ["[0]", "[1]", "[2]"]
    assert [r[1:5] for r in rows] == [[str(i), "3", str(i), "3"] for i in range(3)]
    assert len({r[5] for r in rows}) == 1 and len(rows[0][6]) == 32
    assert all(r[7] == "False" for r in rows)
    again = run(["-n", "1"] + py("import os; print(os.environ['SCALEFREE_JOB_ID'])"))
    assert again.stdout.split()[1].decode() != rows[0][5]


def test_output_is_prefixed_line_by_line_and_partial_lines_survive():
    p = run(["-n", "2"] + py("import sys\nfor i in range(200): print('x' * 300)\nsys.stderr.write('err')\nsys.stdout.write('tail')"))
    assert p.returncode == 0
    lines = p.stdout.decode().splitlines()
    assert len(lines) == 402
    assert all(l in ("[0] " + "x" * 300, "[1] " + "x" * 300, "[0] tail", "[1] tail") for l in lines)
    assert sorted(p.stderr.decode().split()) == ["[0]", "[1]", "err", "err"]
    raw = run(["-n", "1", "--no-prefix"] + py("print('plain')"))
    assert raw.stdout == b"plain\n"


@pytest.mark.parametrize("code, expect", [("sys.exit(3 if r == 2 else 0)", 3), ("sys.exit(0)", 0),
                                          ("os.kill(os.getpid(), 9) if r == 1 else None", 137)])
def test_exit_code_of_the_first_failure(code, expect):
    p = run(["-n", "3"] + py(f"import os, sys; r = int(os.environ['SCALEFREE_RANK'])\n{code}"))
    assert p.returncode == expect, p.stderr
    if expect:
        assert b"scalefree run: rank" in p.stderr


def test_one_rank_dies_others_are_stopped_and_nothing_is_left(tmp_path):
    code = (f"import os, time; r = int(os.environ['SCALEFREE_RANK'])\n"
            f"open(os.path.join({str(tmp_path)!r}, str(os.getpid())), 'w').close()\n"
            f"time.sleep(0.5)\n"
            f"os._exit(5) if r == 0 else time.sleep(600)")
    t0 = time.monotonic()
    p = run(["-n", "3", "--grace", "1"] + py(code))
    assert p.returncode == 5
    assert time.monotonic() - t0 < 15
    pids = [int(f) for f in os.listdir(tmp_path)]
    assert len(pids) == 3
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_timeout_stops_the_job():
    t0 = time.monotonic()
    p = run(["-n", "2", "--timeout", "1"] + py("import time; time.sleep(600)"))
    assert p.returncode == 124
    assert b"timeout after 1 s" in p.stderr
    assert time.monotonic() - t0 < 10


def test_sigterm_to_the_launcher_stops_every_rank(tmp_path):
    code = f"import os, time; open(os.path.join({str(tmp_path)!r}, str(os.getpid())), 'w').close(); time.sleep(600)"
    p = subprocess.Popen(RUN + ["-n", "2"] + py(code), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 20
    while len(os.listdir(tmp_path)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=20) == 128 + signal.SIGTERM
    for pid in map(int, os.listdir(tmp_path)):
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_bad_invocations():
    assert run(["-n", "2", "--", "no-such-command-xyz"]).returncode == 127
    p = run(["-n", "0", "--", "true"])
    assert p.returncode != 0 and b"at least 1" in p.stderr
    assert run(["-n", "2"]).returncode != 0


def test_survivors_report_peer_lost_through_the_launcher():
    code = ("import os, signal, numpy as np, scalefree\n"
            "g = scalefree.init(); a = np.ones(1 << 20, np.float32)\n"
            "for i in range(10**6):\n"
            "    if g.rank == 1 and i == 30: os.kill(os.getpid(), signal.SIGKILL)\n"
            "    g.allreduce(a)\n")
    p = run(["-n", "3"] + py(code))
    assert p.returncode == 137
    err = p.stderr.decode()
    assert err.count("PeerLostError: rank 1") == 2, err
