"""Who may join a job (docs/security.md): a job across hosts needs a secret; a joiner with no
secret, a secret derived from public job ids, or a wrong one is refused under every launcher
while the real host still joins; a stopped rank is named in a warning.

The rendezvous' own properties (50 silent connections, an oversized hello, the bytes of the
handshake) are tested in Rust: crates/scalefree-transport/src/bootstrap/rendezvous/tests.rs,
src/backends/lanes/handshake.rs and tests/rendezvous_alloc.rs.
"""

import hashlib
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from scalefree.launch import launcher

CLI = [sys.executable, "-m", "scalefree.cli", "run"]
FOREIGN = ("SCALEFREE_", "SLURM_", "OMPI_", "PMI_", "PMIX_", "MPI_LOCAL", "TORCHELASTIC_")
FOREIGN_NAMES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def clean_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(FOREIGN) and k not in FOREIGN_NAMES}
    env.update(extra)
    return env


def one_line_error(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    return lines[0]


# ---------------------------------------------------------------------------------------
# The secret (no network needed)


def test_another_host_without_a_secret_is_a_one_line_error():
    p = subprocess.run(CLI + ["--nnodes", "2", "--node-rank", "1", "-n", "1", "--master-addr", "127.0.0.1", "--",
                              sys.executable, "-c", "pass"], env=clean_env(), capture_output=True, text=True, timeout=60)
    assert p.returncode == 2
    line = one_line_error(p.stderr)
    assert line.startswith("scalefree run: error: a job across hosts needs a secret") and "SCALEFREE_JOB_TOKEN" in line, line
    assert "--token-file" in line and "--insecure-no-token" in line


def test_host_0_makes_a_secret_and_prints_the_command_for_the_others(tmp_path):
    out = tmp_path / "env"
    code = f"import os; open({str(out)!r}, 'w').write(os.environ['SCALEFREE_JOB_TOKEN'])"
    p = subprocess.run(CLI + ["--nnodes", "3", "--node-rank", "0", "-n", "1", "--master-addr", "10.1.2.3", "--master-port", "29999",
                              "--", sys.executable, "-c", code], env=clean_env(), capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    m = re.search(r"SCALEFREE_JOB_TOKEN=([0-9a-f]{32}) scalefree run --nnodes 3 --node-rank \$I --nproc-per-node 1 "
                  r"--master-addr 10\.1\.2\.3 --master-port 29999 -- ", p.stderr)
    assert m, p.stderr
    assert out.read_text() == m.group(1)
    # A fresh one every run.
    p2 = subprocess.run(CLI + ["--nnodes", "3", "--node-rank", "0", "-n", "1", "--master-addr", "10.1.2.3", "--master-port", "29999",
                               "--", sys.executable, "-c", code], env=clean_env(), capture_output=True, text=True, timeout=60)
    assert out.read_text() != m.group(1), p2.stderr


def test_token_file_must_be_private(tmp_path):
    f = tmp_path / "token"
    f.write_text("0123456789abcdef\n")
    argv = CLI + ["--nnodes", "2", "--node-rank", "1", "-n", "1", "--master-addr", "127.0.0.1", "--token-file", str(f),
                  "--", sys.executable, "-c", "pass"]
    for mode in (0o644, 0o640, 0o604, 0o660):
        f.chmod(mode)
        p = subprocess.run(argv, env=clean_env(), capture_output=True, text=True, timeout=60)
        assert p.returncode == 2 and "chmod 600" in one_line_error(p.stderr), p.stderr
    f.chmod(0o600)
    assert launcher.read_token_file(f) == "0123456789abcdef"
    assert launcher.job_secret(env={"SCALEFREE_JOB_TOKEN_FILE": str(f)}) == "0123456789abcdef"
    assert launcher.job_secret(env={"SCALEFREE_JOB_TOKEN": "x", "SCALEFREE_JOB_TOKEN_FILE": str(f)}) == "x"
    f.write_text("\n")
    with pytest.raises(ValueError, match="empty"):
        launcher.read_token_file(f)


def test_the_library_refuses_a_job_across_hosts_without_a_secret():
    with pytest.raises(ValueError, match="needs a secret"):
        launcher.launch([sys.executable, "-c", "pass"], 1, env=clean_env(),
                        nodes=launcher.Nodes(2, 1, "127.0.0.1", 29999))


@pytest.mark.parametrize("launched_by", ["openmpi", "slurm", "torchrun"])
def test_other_launchers_across_hosts_need_a_secret(launched_by):
    """The transport refuses a job across hosts without SCALEFREE_JOB_TOKEN(_FILE), naming how
    to set one; SCALEFREE_INSECURE_NO_TOKEN=1 lets it try (and warns)."""
    env = launcher_env(launched_by, 1, "127.0.0.1", 29611, None)
    code = "import scalefree; scalefree.init(bootstrap_timeout=1)"
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode != 0 and "needs a secret shared by its hosts" in p.stderr and "SCALEFREE_JOB_TOKEN" in p.stderr, p.stderr[-2000:]
    p = subprocess.run([sys.executable, "-c", code], env={**env, "SCALEFREE_INSECURE_NO_TOKEN": "1"},
                       capture_output=True, text=True, timeout=60)
    assert "without a secret" in p.stderr and "needs a secret" not in p.stderr, p.stderr[-2000:]


def test_one_host_needs_no_configuration():
    code = "import numpy as np, scalefree; g = scalefree.init(); print('sum', g.allreduce(np.ones(3, np.float32))[0])"
    p = subprocess.run(CLI + ["-n", "3", "--", sys.executable, "-c", code], env=clean_env(), capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0 and p.stdout.count("sum 3.0") == 3, p.stdout + p.stderr


# ---------------------------------------------------------------------------------------
# Across simulated hosts: outsiders are refused on every launcher path


def launcher_env(launched_by: str, rank: int, master: str, port: int, token: str | None) -> dict:
    """The environment `launched_by` gives rank `rank` of a 2-rank job over 2 hosts."""
    env = clean_env(PYTHONUNBUFFERED="1")
    if launched_by == "openmpi":
        env.update(OMPI_COMM_WORLD_RANK=str(rank), OMPI_COMM_WORLD_SIZE="2", OMPI_COMM_WORLD_LOCAL_RANK="0",
                   OMPI_COMM_WORLD_LOCAL_SIZE="1", PMIX_NAMESPACE="prterun-x-4242@1",
                   SCALEFREE_MASTER_ADDR=master, SCALEFREE_MASTER_PORT=str(port))
    elif launched_by == "hydra":
        env.update(PMI_RANK=str(rank), PMI_SIZE="2", MPI_LOCALRANKID="0", MPI_LOCALNRANKS="1", PMI_KVSNAME="kvs_4242_0",
                   SCALEFREE_MASTER_ADDR=master, SCALEFREE_MASTER_PORT=str(port))
    elif launched_by == "slurm":
        env.update(SLURM_PROCID=str(rank), SLURM_NTASKS="2", SLURM_LOCALID="0", SLURM_STEP_NUM_TASKS="2",
                   SLURM_STEP_NUM_NODES="2", SLURM_NODEID=str(rank), SLURM_STEP_TASKS_PER_NODE="1(x2)",
                   SLURM_STEP_NODELIST=f"{master},other", SLURM_JOB_ID="4242", SLURM_STEP_ID="0",
                   SCALEFREE_MASTER_PORT=str(port))
    elif launched_by == "torchrun":
        env.update(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", MASTER_ADDR=master,
                   MASTER_PORT=str(port - 1), TORCHELASTIC_RUN_ID="t1")
    if token is not None:
        env["SCALEFREE_JOB_TOKEN"] = token
    return env


def derived_token(launched_by: str, master: str, port: int) -> str:
    """What the token used to be, computed from what every user of the network sees."""
    if launched_by == "scalefree":
        where = f"{master}:{port}"
        job_id = "sf-" + hashlib.sha256(where.encode()).hexdigest()[:12]
        return hashlib.sha256(f"{where}:{os.getuid()}:{job_id}".encode()).hexdigest()[:32]
    return {"openmpi": "ompi:prterun-x-4242@1", "hydra": "hydra:kvs_4242_0", "slurm": "slurm:4242.0",
            "torchrun": f"torch:t1-{port - 1}"}[launched_by]


JOIN = """import numpy as np, scalefree
g = scalefree.init(timeout=60, bootstrap_timeout=90)
out = g.allreduce(np.full(100, g.rank + 1.0, np.float32))
assert (out == 3).all(), out[:4]
print("ok", g.rank, flush=True)
"""


def rank_argv(launched_by: str, node: int, master: str, port: int) -> list[str]:
    if launched_by == "scalefree":
        return CLI + ["--nnodes", "2", "--node-rank", str(node), "--nproc-per-node", "1", "--master-addr", master,
                      "--master-port", str(port), "--", sys.executable, "-c", JOIN]
    return [sys.executable, "-c", JOIN]


@pytest.mark.parametrize("launched_by", ["scalefree", "openmpi", "hydra", "slurm", "torchrun"])
def test_outsiders_are_refused_and_the_real_host_still_joins(can_simulate, launched_by):
    port = 29700 + ["scalefree", "openmpi", "hydra", "slurm", "torchrun"].index(launched_by) * 7
    secret = secrets.token_hex(16)
    with can_simulate.SimHosts(2, secret=False) as h:
        master = h.ip(0)

        def start(node: int, token):
            env = launcher_env(launched_by, node, master, port, token)
            return h.popen(node, rank_argv(launched_by, node, master, port), env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

        host0 = start(0, secret)
        outsiders = {"no token": start(1, None), "derived token": start(1, derived_token(launched_by, master, port)),
                     "wrong token": start(1, secrets.token_hex(16))}
        for why, p in outsiders.items():
            out, _ = p.communicate(timeout=90)
            assert p.returncode != 0, f"{why}: joined!\n{out[-2000:]}"
            expected = "needs a secret" if why == "no token" else "wrong job token"
            assert expected in out and "ok 1" not in out, f"{why}: {out[-2000:]}"
        assert host0.poll() is None, "rank 0 gave up"
        real = start(1, secret)
        out1, _ = real.communicate(timeout=120)
        out0, _ = host0.communicate(timeout=60)
    assert real.returncode == 0 and "ok 1" in out1, out1[-2000:]
    assert host0.returncode == 0 and "ok 0" in out0, out0[-2000:]
    assert secret not in out0 + out1


# ---------------------------------------------------------------------------------------
# A stopped rank is named

STOPPED = """import os, signal, time, numpy as np, scalefree
g = scalefree.init(timeout=120)
a = np.ones(1000, np.float32)
g.allreduce(a)
if g.rank == 1:
    os.kill(os.getpid(), signal.SIGSTOP)
time.sleep(0.5)
print("waiting", flush=True)
g.allreduce(a)
"""


def test_a_stopped_rank_is_named_in_a_warning():
    peer_timeout = 2.0
    env = clean_env(SCALEFREE_PEER_TIMEOUT=str(peer_timeout), SCALEFREE_TIMEOUT="120", PYTHONUNBUFFERED="1")
    p = subprocess.Popen(CLI + ["-n", "3", "--", sys.executable, "-c", STOPPED], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    seen: dict[str, float] = {}
    lines: list[str] = []

    def read(stream, tag):
        for line in stream:
            lines.append(line)
            now = time.monotonic()
            if tag == "out" and line.startswith("[0] waiting"):
                seen.setdefault("waiting", now)
            if tag == "err" and line.startswith("[0] scalefree: warning:"):
                seen.setdefault("warning", now)

    readers = [threading.Thread(target=read, args=(p.stdout, "out"), daemon=True),
               threading.Thread(target=read, args=(p.stderr, "err"), daemon=True)]
    for t in readers:
        t.start()
    try:
        deadline = time.monotonic() + 90
        while "warning" not in seen and time.monotonic() < deadline and p.poll() is None:
            time.sleep(0.05)
    finally:
        os.killpg(p.pid, signal.SIGTERM)
        p.wait(timeout=30)
    text = "".join(lines)
    assert "waiting" in seen and "warning" in seen, text[-3000:]
    assert seen["warning"] - seen["waiting"] <= peer_timeout + 5, (seen, text[-2000:])
    warning = next(line for line in lines if line.startswith("[0] scalefree: warning:"))
    assert f"rank 1 (host {socket.gethostname()})" in warning and "no progress for" in warning, warning
    assert "SCALEFREE_TIMEOUT=120" in warning, warning


def test_bench_rendezvous_runs(tmp_path):
    """`scalefree bench rendezvous` (its numbers are in docs/benchmarks/launch.md) measures a join."""
    out = tmp_path / "r.json"
    p = subprocess.run([sys.executable, "-m", "scalefree.cli", "bench", "rendezvous", "--silent", "0,3", "--repeats", "1",
                        "--json", str(out)], env=clean_env(), capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stderr[-2000:]
    import json

    records = json.loads(out.read_text())
    assert [r["silent"] for r in records] == [0, 3]
    # Generous: a join takes well under a second here; 3 silent connections must not add seconds.
    assert all(r["median_s"] < 30 and r["peak_rss_rank1"] > 0 for r in records), records


def _proxy(to_port: int):
    """A TCP proxy on a port of its own to 127.0.0.1:`to_port` for one connection; returns
    (port, thread, record) where record gets the bytes each way."""
    listener = socket.create_server(("127.0.0.1", 0))
    record = {"up": bytearray(), "down": bytearray()}

    def pump(a, b, key):
        try:
            while data := a.recv(65536):
                record[key] += data
                b.sendall(data)
        except OSError:
            pass
        finally:
            try:
                b.shutdown(socket.SHUT_WR)
            except OSError:
                pass

    def serve():
        listener.settimeout(60)
        client, _ = listener.accept()
        server = socket.create_connection(("127.0.0.1", to_port))
        t = threading.Thread(target=pump, args=(server, client, "down"), daemon=True)
        t.start()
        pump(client, server, "up")
        t.join(30)
        listener.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return listener.getsockname()[1], thread, record


def test_the_token_does_not_cross_the_wire_in_a_real_job():
    """Host 1's rank reaches rank 0 through a proxy that records every byte: the job runs,
    and neither direction carries the secret (nor half of it)."""
    secret = secrets.token_hex(16)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port0 = s.getsockname()[1]
    via, thread, record = _proxy(port0)
    env = clean_env(SCALEFREE_JOB_TOKEN=secret, SCALEFREE_JOB_ID="sf-proxied")
    code = JOIN.replace("bootstrap_timeout=90", "bootstrap_timeout=60")

    def start(node, port):
        return subprocess.Popen(CLI + ["--nnodes", "2", "--node-rank", str(node), "-n", "1", "--master-addr", "127.0.0.1",
                                       "--master-port", str(port), "--", sys.executable, "-c", code],
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    procs = [start(0, port0)]
    deadline = time.monotonic() + 60
    while True:  # rank 0 listens before host 1 starts (the proxy forwards one connection)
        try:
            socket.create_connection(("127.0.0.1", port0), timeout=1).close()
            break
        except OSError:
            assert time.monotonic() < deadline and procs[0].poll() is None, "rank 0 does not listen"
            time.sleep(0.05)
    procs.append(start(1, via))
    outs = [p.communicate(timeout=120)[0] for p in procs]
    thread.join(30)
    assert all(p.returncode == 0 for p in procs) and "ok 0" in outs[0] and "ok 1" in outs[1], outs
    up, down = bytes(record["up"]), bytes(record["down"])
    assert up.startswith(b"\x38\x00\x00\x00\x00\x00\x00\x00SCLFREE5") and len(down) > 64, (up[:32], len(down))
    for data in (up, down):
        for piece in (secret, secret[:16], secret[16:]):
            assert piece.encode() not in data
