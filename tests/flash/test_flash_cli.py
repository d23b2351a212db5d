"""`scalefree flash gemm` on .npy files, .npy mapping, and the block BLAS choice."""

import os
import signal
import subprocess
import sys

import numpy as np
import pytest

from scalefree import flash
import scalefree.errors


def run_cli(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "scalefree.cli", "flash", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("m,n,k", [(1, 1, 1), (37, 19, 23), (130, 70, 300)])
@pytest.mark.parametrize("trans_a,trans_b,fortran", [(False, False, False), (True, False, True), (False, True, False),
                                                     (True, True, True)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_cli_gemm_matches_numpy(tmp_path, m, n, k, trans_a, trans_b, fortran, dtype):
    rng = np.random.default_rng([m, n, k])
    a = rng.standard_normal((k, m) if trans_a else (m, k)).astype(dtype)
    b = rng.standard_normal((n, k) if trans_b else (k, n)).astype(dtype)
    if fortran:
        a = np.asfortranarray(a)
    np.save(tmp_path / "a.npy", a)
    np.save(tmp_path / "b.npy", b)
    out = tmp_path / "c.npy"
    args = ["gemm", tmp_path / "a.npy", tmp_path / "b.npy", "-o", out, "--memory", "256K", "--dir", tmp_path,
            "--alpha", "0.5"]
    args += ["--transpose-a"] * trans_a + ["--transpose-b"] * trans_b
    p = run_cli(*args)
    assert p.returncode == 0, p.stderr
    c = np.load(out)
    want = 0.5 * (a.T if trans_a else a) @ (b.T if trans_b else b)
    assert c.shape == (m, n) and c.dtype == dtype and c.flags.c_contiguous
    tol = 1e-4 if dtype == np.float32 else 1e-10
    np.testing.assert_allclose(c, want, rtol=tol, atol=tol * k)
    # The IO/compute summary.
    assert "cache hit rate" in p.stderr and "GB/s" in p.stderr and "bytes_read" not in p.stderr
    assert "flash gemm: " in p.stderr and " tasks, read " in p.stderr  # progress: a line (not a terminal)


def test_cli_gemm_errors_before_any_io(tmp_path):
    a, b = np.ones((4, 5), np.float32), np.ones((6, 3), np.float32)
    np.save(tmp_path / "a.npy", a)
    np.save(tmp_path / "b.npy", b)
    out = tmp_path / "c.npy"
    p = run_cli("gemm", tmp_path / "a.npy", tmp_path / "b.npy", "-o", out)
    assert p.returncode == 2
    assert "shape mismatch: op(A) is 4x5" in p.stderr and "a.npy" in p.stderr and "b.npy" in p.stderr
    assert not out.exists()
    # Transposing B makes the shapes agree? No: Bᵀ is 3x6. Transposing A: Aᵀ (5x4) x B (6x3) neither.
    p = run_cli("gemm", tmp_path / "a.npy", tmp_path / "b.npy", "-o", out, "--transpose-a")
    assert p.returncode == 2 and "shape mismatch" in p.stderr and not out.exists()
    np.save(tmp_path / "b64.npy", np.ones((5, 3)))
    p = run_cli("gemm", tmp_path / "a.npy", tmp_path / "b64.npy", "-o", out)
    assert p.returncode == 2 and "float32" in p.stderr and "float64" in p.stderr and not out.exists()
    np.save(tmp_path / "v.npy", np.ones(5, np.float32))
    p = run_cli("gemm", tmp_path / "a.npy", tmp_path / "v.npy", "-o", out)
    assert p.returncode == 2 and "2-D" in p.stderr and "v.npy" in p.stderr
    p = run_cli("gemm", tmp_path / "missing.npy", tmp_path / "b.npy", "-o", out)
    assert p.returncode == 2 and "missing.npy" in p.stderr
    # A truncated file is named before its data is used.
    data = (tmp_path / "b64.npy").read_bytes()
    (tmp_path / "short.npy").write_bytes(data[:-8])
    np.save(tmp_path / "a64.npy", np.ones((4, 5)))
    p = run_cli("gemm", tmp_path / "a64.npy", tmp_path / "short.npy", "-o", out)
    assert p.returncode == 2 and "short.npy" in p.stderr and "truncated" in p.stderr
    p = run_cli("gemm", tmp_path / "a.npy", tmp_path / "a.npy", "-o", tmp_path / "a.npy", "--transpose-b")
    assert p.returncode == 2 and "also an input" in p.stderr
    assert not out.exists()


def test_cli_gemm_killed_leaves_no_output(tmp_path):
    """SIGKILL mid-run: nothing at the output path (an old file there stays intact)."""
    rng = np.random.default_rng(0)
    n = 1536
    np.save(tmp_path / "a.npy", rng.standard_normal((n, n)))
    np.save(tmp_path / "b.npy", rng.standard_normal((n, n)))
    out = tmp_path / "c.npy"
    old = np.arange(6.0).reshape(2, 3)
    np.save(out, old)
    p = subprocess.Popen([sys.executable, "-m", "scalefree.cli", "flash", "gemm", str(tmp_path / "a.npy"),
                          str(tmp_path / "b.npy"), "-o", str(out), "--memory", "1M", "--threads", "1",
                          "--blas", "faer", "--dir", str(tmp_path)], stderr=subprocess.PIPE, text=True)
    try:
        line = p.stderr.readline()  # printed once the output file exists (unpublished) and the run starts
        assert line.startswith("flash gemm: C (1536x1536)"), line
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
        p.stderr.close()
    assert p.returncode == -signal.SIGKILL
    np.testing.assert_array_equal(np.load(out), old)


def test_open_npy_and_create_npy(tmp_path):
    rt = flash.Runtime(memory_budget="1M", dir=tmp_path)
    a = np.asfortranarray(np.random.default_rng(1).standard_normal((33, 17)))
    np.save(tmp_path / "a.npy", a)
    A = flash.Matrix.open_npy(tmp_path / "a.npy", rt)
    assert A.shape == (33, 17) and A.dtype == np.float64
    np.testing.assert_array_equal(A.to_numpy(), a)
    C = flash.Matrix.create_npy(tmp_path / "c.npy", (17, 17), np.float64, rt)
    flash.gemm(A, A, C, trans_a=True, runtime=rt)
    assert not (tmp_path / "c.npy").exists()
    C.publish()
    np.testing.assert_allclose(np.load(tmp_path / "c.npy"), a.T @ a, rtol=1e-12)
    header = flash.npy_header_bytes((17, 17), np.float64)
    assert len(header) == 4096 and flash.npy_header(tmp_path / "c.npy")[3] == 4096
    np.save(tmp_path / "i.npy", np.ones((2, 2), np.int32))
    with pytest.raises(scalefree.errors.InvalidArgumentError, match="i.npy"):
        flash.Matrix.open_npy(tmp_path / "i.npy", rt)


def test_blas_choice_and_progress(tmp_path):
    faer = flash.Runtime(memory_budget="1M", dir=tmp_path, blas="faer")
    assert faer.blas is None
    if flash.numpy_blas_path() is not None:
        auto = flash.Runtime(memory_budget="1M", dir=tmp_path)
        assert auto.blas == flash.numpy_blas_path()
    with pytest.raises(scalefree.errors.InvalidArgumentError, match="/nonexistent/libcblas.so"):
        flash.Runtime(dir=tmp_path, blas="/nonexistent/libcblas.so")
    rng = np.random.default_rng(2)
    a, b = rng.standard_normal((200, 300)), rng.standard_normal((300, 100))
    before = faer._rt.progress
    stats = {}
    flash.gemm(a, b, runtime=faer, stats=stats)
    added, done, read, written = (x - y for x, y in zip(faer._rt.progress, before))
    assert added == done == stats["tasks"] > 1
    assert read == stats["bytes_read"] and written == stats["bytes_written"] > 0


RSS_SCRIPT = r"""
import sys, numpy as np
from scalefree import flash

def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024

n, budget, blas, d = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
rt = flash.Runtime(memory_budget=budget, threads=2, dir=d, blas=blas)
rng = np.random.default_rng(0)
for name in ("a", "b"):  # written a block of rows at a time, never whole in memory
    m = np.lib.format.open_memmap(f"{d}/{name}.npy", mode="w+", dtype=np.float32, shape=(n, n))
    for r in range(0, n, 256):
        m[r:r + 256] = rng.standard_normal((min(256, n - r), n), dtype=np.float32)
    m.flush()
    del m
A, B = flash.Matrix.open_npy(f"{d}/a.npy", rt), flash.Matrix.open_npy(f"{d}/b.npy", rt)
C = flash.Matrix.create_npy(f"{d}/c.npy", (n, n), np.float32, rt)
flash.gemm(A, B, C, runtime=rt)  # warm-up: libraries' own buffers, thread stacks
open("/proc/self/clear_refs", "w").write("5")  # resets the peak (VmHWM) to the current RSS
base = status("VmRSS")
stats = {}
flash.gemm(A, B, C, runtime=rt, stats=stats)
print(status("VmHWM") - base, stats["peak_resident_bytes"])
"""


@pytest.mark.parametrize("blas", ["auto", "faer"])
def test_peak_rss_stays_within_the_budget(tmp_path, blas):
    """The process's resident memory grows by at most the budget plus a small fixed overhead
    while gemm runs on 3 x 36 MiB of matrices under a 16 MiB budget."""
    if not os.path.exists("/proc/self/clear_refs"):
        pytest.skip("needs Linux /proc/self/clear_refs")
    budget = 16 << 20
    p = subprocess.run([sys.executable, "-c", RSS_SCRIPT, "3072", str(budget), blas, str(tmp_path)],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    grown, peak = map(int, p.stdout.split())
    assert peak <= budget
    assert grown <= budget + (8 << 20), f"RSS grew by {grown >> 20} MiB under a {budget >> 20} MiB budget"
