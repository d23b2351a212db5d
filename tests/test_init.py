"""Rank and size from every launcher's environment, and clear errors for bad ones."""

import os
import subprocess
import sys

import pytest

CODE = "import scalefree; g = scalefree.init(bootstrap_timeout=5); print(g.rank, g.size, g.launcher)"


def run_with(env_extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SCALEFREE_", "OMPI_", "PMI_", "SLURM_"))}
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        env.pop(k, None)
    env.update(env_extra)
    return subprocess.run([sys.executable, "-c", CODE], env=env, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(
    "env, launcher",
    [
        ({}, "single"),
        ({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "1"}, "openmpi"),
        ({"PMI_RANK": "0", "PMI_SIZE": "1"}, "mpich-hydra"),
        ({"SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_JOB_ID": "7"}, "slurm"),
        ({"RANK": "0", "WORLD_SIZE": "1", "MASTER_PORT": "29500"}, "torchrun"),
        ({"SCALEFREE_RANK": "0", "SCALEFREE_WORLD_SIZE": "1", "SCALEFREE_JOB_ID": "x"}, "scalefree"),
    ],
)
def test_launcher_environments(env, launcher):
    p = run_with(env)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["0", "1", launcher]


@pytest.mark.parametrize(
    "env, text",
    [
        ({"RANK": "2", "WORLD_SIZE": "2"}, "is not below"),
        ({"OMPI_COMM_WORLD_RANK": "x", "OMPI_COMM_WORLD_SIZE": "2"}, "not a non-negative integer"),
        ({"SCALEFREE_RANK": "0", "SCALEFREE_WORLD_SIZE": "2"}, "SCALEFREE_JOB_ID"),
    ],
)
def test_bad_environments_raise_bootstrap_error(env, text):
    p = run_with(env)
    assert p.returncode != 0
    assert "BootstrapError" in p.stderr and text in p.stderr, p.stderr


def test_missing_peer_is_a_timeout_not_a_hang():
    p = run_with({"SCALEFREE_RANK": "0", "SCALEFREE_WORLD_SIZE": "2", "SCALEFREE_JOB_ID": "lonely-" + str(os.getpid())})
    assert p.returncode != 0
    assert "ScalefreeTimeoutError" in p.stderr and "[1]" in p.stderr


def test_under_mpiexec_when_available():
    import shutil

    mpiexec = shutil.which("mpiexec")
    if mpiexec is None:
        pytest.skip("mpiexec is not installed (pip install '.[test]' brings Open MPI)")
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    for k in [k for k in env if k.startswith("SCALEFREE_")]:
        env.pop(k)
    code = ("import numpy as np, scalefree\n"
            "g = scalefree.init(bootstrap_timeout=30)\n"
            "a = np.full(1 << 18, g.rank + 1.0)\n"
            "g.allreduce(a)\n"
            "print(g.rank, g.size, g.launcher, a[0])\n")
    p = subprocess.run([mpiexec, "--oversubscribe", "-n", "3", sys.executable, "-c", code],
                       env=env, capture_output=True, text=True, timeout=120)
    if p.returncode != 0 and "mpi" not in p.stdout and "not" in p.stderr.lower() and "scalefree" not in p.stderr:
        pytest.skip(f"mpiexec cannot start processes here: {p.stderr[-300:]}")
    assert p.returncode == 0, p.stderr
    rows = sorted(p.stdout.split("\n")[:-1])
    assert [r.split()[1:] for r in rows] == [["3", "openmpi", "6.0"]] * 3
