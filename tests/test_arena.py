"""The registered arena as numpy's allocator: arrays behave exactly as before, peers read
them without copies, and a forked child cannot write into the parent's arrays."""

from ranks import run_ranks
from test_collectives import OTHERS, SWEEP

ALLOCATOR = r"""
import os, numpy as np, scalefree
g = scalefree.init(arena=True)
a = np.ones(1 << 20, np.float32)
assert a.base is None and a.flags.owndata
# Many sizes, frees and reuses: contents never bleed between arrays; zeros are zeros.
rng = np.random.default_rng(0)
live = {}
for i in range(400):
    k = int(rng.integers(0, 40))
    if k in live and rng.random() < 0.5:
        arr, val = live.pop(k)
        assert (arr == val).all(), f"array {k} was overwritten"
        continue
    n = int(rng.integers(1, 3 << 18))
    if rng.random() < 0.3:
        arr = np.zeros(n, np.float64); val = 0.0
        assert not arr.any(), "np.zeros on reused memory is not zero"
    else:
        arr = np.empty(n, np.float64); arr[:] = val = float(i)
    live[k] = (arr, val)
for arr, val in live.values():
    assert (arr == val).all()
# realloc path (resize) keeps the data.
b = np.arange(200_000, dtype=np.int64)
b.resize(400_000, refcheck=False)
assert (b[:200_000] == np.arange(200_000)).all()
print("ok")
"""

FORK = r"""
import os, numpy as np, scalefree
g = scalefree.init(arena=True)
a = np.full(1 << 20, 1.0)
pid = os.fork()
if pid == 0:
    a[:] = 99.0                  # copy-on-write in the child
    c = np.ones(1 << 20)         # ordinary memory in the child
    os._exit(0 if (a == 99.0).all() and c.sum() == (1 << 20) else 1)
_, status = os.waitpid(pid, 0)
assert os.waitstatus_to_exitcode(status) == 0
assert (a == 1.0).all(), "the child's writes reached the parent"
print("ok")
"""


def test_arena_allocations_behave_like_numpy():
    res = run_ranks(2, ALLOCATOR, timeout=120)
    assert all(r.stdout.strip() == "ok" for r in res)


def test_forked_child_cannot_write_into_parent_arrays():
    res = run_ranks(1, FORK, timeout=60)
    assert res[0].stdout.strip() == "ok"


def test_collectives_on_arena_arrays():
    for n in (2, 3):
        res = run_ranks(n, SWEEP, timeout=240, extra_env={"SCALEFREE_ARENA": "1"})
        assert all("checked" in r.stdout for r in res)
        res = run_ranks(n, OTHERS, timeout=240, extra_env={"SCALEFREE_ARENA": "1"})
        assert all(r.stdout.strip().endswith("ok") for r in res)


def test_without_address_space_for_the_arena_ranks_agree_to_run_without_it():
    import os
    import resource
    import subprocess
    import sys

    from ranks import rank_env

    code = ("import warnings, numpy as np, scalefree\nwarnings.simplefilter('always')\n"
            "g = scalefree.init(bootstrap_timeout=30)\na = np.ones(1 << 20); g.allreduce(a); print('sum', a[0])\n")

    def limit():  # rank 1 cannot reserve 64 GiB of address space
        resource.setrlimit(resource.RLIMIT_AS, (8 << 30, 8 << 30))

    job = f"arena-limit-{os.getpid()}"
    procs = [subprocess.Popen([sys.executable, "-c", code], env=rank_env(r, 2, job, "t"),
                              preexec_fn=limit if r == 1 else None, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in range(2)]
    outs = [p.communicate(timeout=60) for p in procs]
    for out, err in outs:
        assert "sum 2.0" in out, err
        assert "running without the registered arena" in err
