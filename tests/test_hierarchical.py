"""The hierarchical allreduce on hosts of uneven rank counts, and the compressed allreduce
(``wire="bf16"``/``"fp16"``), with real rank processes on simulated hosts
(``SCALEFREE_SIMULATE_HOSTS=a,b,...``: shared memory within a host, UCX between), against
numpy; which algorithm ran is read from ``g.last_algorithm``."""

import pytest

from ranks import run_ranks
from test_collectives import _ucx_or_skip

EXACT = r"""
import numpy as np, scalefree
g = scalefree.init(timeout=60)
me, n = g.rank, g.size
assert g.transport == "ucx", g.transport
AUTO = {auto!r}  # what auto picks for large calls on this layout
checked = 0
for dtype in [np.float32, np.float64, np.int64]:
    for size in [0, 1, 7, 100_003]:
        large = size * np.dtype(dtype).itemsize > 32 << 10
        for op, f in [("sum", np.add), ("max", np.maximum)]:
            if op == "max" and dtype not in (np.float32, np.int64):
                continue
            parts = [np.random.default_rng([r, size, 7]).integers(-1000, 1000, size).astype(dtype) for r in range(n)]
            want = parts[0]
            for p in parts[1:]:
                want = f(want, p)
            for algo in ["auto", "hierarchical", "direct"]:
                a = parts[me].copy()
                assert g.allreduce(a, op=op, algorithm=algo) is a
                np.testing.assert_array_equal(a, want, err_msg=f"{{dtype}} {{size}} {{op}} {{algo}}")
                if large:
                    expect = {{"auto": AUTO, "hierarchical": "hierarchical", "direct": "direct"}}[algo]
                    assert g.last_algorithm == expect, (algo, size, g.last_algorithm)
                checked += 1
print("checked", checked)
"""

COMPRESSED = r"""
import numpy as np, scalefree
g = scalefree.init(timeout=60)
me, n = g.rank, g.size
assert g.transport == "ucx", g.transport
U = {{"bf16": 2.0 ** -8, "fp16": 2.0 ** -11}}
for wire in ["bf16", "fp16"]:
    for size in [0, 1, 7, 12345, 300_001]:
        parts = [(np.random.default_rng([r, size]).standard_normal(size) * 10).astype(np.float32) for r in range(n)]
        exact = np.sum(np.array(parts, np.float64), axis=0)
        scale = np.sum(np.abs(np.array(parts, np.float64)), axis=0)
        a = parts[me].copy()
        g.allreduce(a, wire=wire)
        u = U[wire]
        bound = (2 * u + n * 2.0 ** -24) * (1 + u) * scale  # docs/algorithms.md, "Compressed allreduce"
        err = np.abs(a.astype(np.float64) - exact)
        assert (err <= bound).all(), (wire, size, float((err / np.maximum(scale, 1e-30)).max()))
        if size * 4 > 32 << 10:
            assert g.last_algorithm == {large!r}, g.last_algorithm
            # Compressed, not exact: some element differs from the float32 allreduce.
            b = parts[me].copy()
            g.allreduce(b)
            assert (a != b).any()
        # Every rank holds the same bits.
        every = g.allgather(a)
        assert (every.view(np.uint32) == every[0].view(np.uint32)).all()
try:
    g.allreduce(np.ones(100_000, np.int64), wire="bf16")
except scalefree.InvalidArgumentError as e:
    assert "float32 sums only" in str(e), e
else:
    raise AssertionError("wire=bf16 on int64 was accepted")
try:
    g.allreduce(np.ones(10, np.float32), wire="fp8")
except scalefree.InvalidArgumentError as e:
    assert "unknown wire" in str(e), e
else:
    raise AssertionError("wire=fp8 was accepted")
print("compressed ok")
"""


@pytest.mark.parametrize("layout,auto", [("1,2,3", "hierarchical"), ("2,1", "direct")])
def test_uneven_hosts_exact(layout, auto):
    """Hosts of 1, 2 and 3 ranks (the model picks hierarchical), of 2 and 1 (it keeps the flat
    all-to-all); the hierarchical plan forced works on both."""
    _ucx_or_skip()
    n = sum(int(k) for k in layout.split(","))
    res = run_ranks(n, EXACT.format(auto=auto), timeout=300, extra_env={"SCALEFREE_SIMULATE_HOSTS": layout})
    assert all("checked" in r.stdout for r in res), [r.stderr[-2000:] for r in res]


@pytest.mark.parametrize("layout,large", [("1", "direct"), ("1,2", "hierarchical"), ("1,1,1", "direct")])
def test_compressed_allreduce_within_bound(layout, large):
    """wire=bf16/fp16 between 2 hosts of one rank each, of 1 and 2 ranks, and between 3 hosts
    (two peers: one summed in as it arrives, the other by the owner) in small pieces (many
    per part: the ring of rounded pieces wraps)."""
    _ucx_or_skip()
    n = sum(int(k) for k in layout.split(","))
    if n == 1:
        n, layout = 2, "1"  # one rank per host
    env = {"SCALEFREE_SIMULATE_HOSTS": layout}
    if n == 3:
        env["SCALEFREE_PIECE_BYTES"] = "4096"
    res = run_ranks(n, COMPRESSED.format(large=large), timeout=300, extra_env=env)
    assert all("compressed ok" in r.stdout for r in res), [r.stderr[-2000:] for r in res]


def test_compressed_on_one_host_is_exact():
    """On one host there is no step between hosts: wire= changes nothing."""
    code = r"""
import numpy as np, scalefree
g = scalefree.init(timeout=60)
a = (np.arange(100_000, dtype=np.float32) * 1e-3 + g.rank)
b = a.copy()
g.allreduce(a, wire="bf16")
g.allreduce(b)
assert (a == b).all()
print("exact ok")
"""
    res = run_ranks(2, code, timeout=120)
    assert all("exact ok" in r.stdout for r in res), [r.stderr[-2000:] for r in res]


def test_scalefree_run_on_hosts_of_different_sizes(can_simulate):
    """`scalefree run --nproc-per-node 1,2` across two simulated hosts (network namespaces):
    ranks 0 | 1, 2; the hierarchical allreduce forced, and compressed, on real hosts."""
    from test_hosts import launch_all

    code = r"""
import numpy as np, scalefree
g = scalefree.init(timeout=60)
assert g.size == 3 and list(g._hosts) == [0, 1, 1], (g.size, g._hosts)
parts = [np.random.default_rng([r, 3]).standard_normal(200_001).astype(np.float32) for r in range(3)]
a = parts[g.rank].copy()
g.allreduce(a, algorithm="hierarchical")
assert g.last_algorithm == "hierarchical"
np.testing.assert_allclose(a, parts[0] + parts[1] + parts[2], rtol=1e-5, atol=1e-5)
b = parts[g.rank].copy()
g.allreduce(b, wire="bf16")
scale = np.abs(parts[0]) + np.abs(parts[1]) + np.abs(parts[2])
assert (np.abs(b - a) <= (2 * 2.0 ** -8 + 3 * 2.0 ** -24) * (1 + 2.0 ** -8) * scale + 1e-6).all()
print("checked")
"""
    with can_simulate.SimHosts(2) as h:
        for rc, out in launch_all(h, "1,2", code, timeout=180):
            assert rc == 0, out[-3000:]
            assert "checked" in out, out[-2000:]
