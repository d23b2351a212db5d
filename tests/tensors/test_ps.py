"""Parameter-server training end to end (small net): it learns, workers and the single
process agree on the loss for the same global batches, and nothing is copied."""

import json
import subprocess
import sys

import numpy as np
import pytest


def _train(tmp_path, *extra, ranks=3):
    out = tmp_path / "r"
    cmd = [sys.executable, "-m", "scalefree.cli", "ps", "train", "-n", str(ranks), "--hidden", "64", "64",
           "--steps", "30", "--lr", "0.1", *extra]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    return p.stdout


def test_ps_learns_and_reports(tmp_path):
    out = _train(tmp_path)
    line = [l for l in out.splitlines() if l.startswith("ps train")][0]
    first, last = [float(x) for x in line.split("loss ")[1].split(";")[0].split(" -> ")]
    assert last < first - 0.3, line
    assert "samples/s" in line and "communication" in line


def test_ps_matches_one_process_on_the_same_global_batches():
    # Workers average their half-batch gradients: the update equals the one-process update
    # on the whole global batch, so the weights after each step agree to rounding.
    from scalefree.cli import ps as ps_train

    xtr, ytr, _, _, n_in, n_out = ps_train.load_data("synthetic", 0, n=2048)
    sizes = ps_train.fcn_sizes(n_in, n_out, hidden=(32,))
    p_local = ps_train.init_params(sizes, 0)
    p_ps = {k: v.copy() for k, v in p_local.items()}
    plan = ps_train.batches(len(ytr), 64, 5, 0)
    for idx in plan:
        _, g = ps_train.loss_and_grads(p_local, xtr[idx], ytr[idx], 2)
        for k in p_local:
            p_local[k] -= 0.1 * g[k]
        halves = [ps_train.loss_and_grads(p_ps, xtr[idx[h * 32:(h + 1) * 32]], ytr[idx[h * 32:(h + 1) * 32]], 2)[1]
                  for h in range(2)]
        for k in p_ps:
            p_ps[k] -= 0.1 / 2 * (halves[0][k] + halves[1][k])
    for k in p_local:
        np.testing.assert_allclose(p_ps[k], p_local[k], rtol=1e-4, atol=1e-6)


def test_torch_adapter_places_parameters_in_registered_memory():
    torch = pytest.importorskip("torch")
    from ranks import run_ranks

    res = run_ranks(3, r"""
import numpy as np, torch, scalefree
from scalefree.tensors.ps import ParameterServer, TorchParams
g = scalefree.init(timeout=60)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(20, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
tp = TorchParams(model)
ps = ParameterServer(g, tp.variables(), lr=0.1)
x = torch.randn(64, 20); y = torch.randint(0, 3, (64,))
if ps.is_server:
    ps.serve(10)
    print("stats", ps.stats(), flush=True)
else:
    for step in range(10):
        tp.load(ps.pull())
        model.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        ps.push(tp.grads())
    print("loss", float(loss), flush=True)
""", timeout=120)
    stats = [l for l in res[0].stdout.splitlines() if l.startswith("stats")][0]
    assert "'bytes_copied': 0" in stats


# Tracing on and off in the same job: the same training (the weights after every step bit
# for bit), and the bytes staged per step go down once the allocation sites are traced.
# Hidden 64, 64 over 1024 inputs: W0's gradient (256 KiB) is born in the arena, W1's
# (16 KiB) once its site is traced, the biases and W2 (below 4 KiB) are always staged.
TRACE = r"""
import numpy as np, scalefree
from scalefree.cli import ps as T
from scalefree.tensors.ps import ParameterServer
g = scalefree.init(timeout=60)
xtr, ytr, _, _, n_in, n_out = T.load_data("synthetic", 0, n=1024 + 256)
sizes = T.fcn_sizes(n_in, n_out, hidden=(64, 64))
L = len(sizes) - 1
order = [k for i in range(L - 1, -1, -1) for k in (f"W{i}", f"b{i}")]
steps, got = 6, {}
plan = T.batches(len(ytr), 16 * (g.size - 1), steps, 0)
for trace in (True, False):
    ps = ParameterServer(g, T.init_params(sizes, 0), lr=0.1, order=order, mode="slots", trace=trace)
    assert ps.trace is trace and not ps.mapped
    if ps.is_server:
        ps.serve(steps)
        continue
    me, copied, losses = g.rank - 1, [], []
    for idx in plan:
        w = ps.pull()
        before = ps.stats()["bytes_copied"]
        part = idx[me * 16:(me + 1) * 16]
        losses.append(T.loss_and_grads(w, xtr[part], ytr[part], L, None, on_grad=ps.push_one)[0])
        copied.append(ps.stats()["bytes_copied"] - before)
    got[trace] = ({k: np.array(v) for k, v in ps.pull().items()}, losses, copied)
if got:
    (w_on, l_on, c_on), (w_off, l_off, c_off) = got[True], got[False]
    assert l_on == l_off, (l_on, l_off)
    for k in w_on:
        assert np.array_equal(w_on[k], w_off[k]), k
    total = sum(int(np.prod(s)) * 4 for s in [(a, b) for a, b in zip(sizes[:-1], sizes[1:])] + [(b,) for b in sizes[1:]])
    assert c_off == [total] * steps, (c_off, total)
    small = 4 * (sizes[-2] * sizes[-1] + sum(sizes[1:]))  # W2 and the biases: below 4 KiB, always staged
    assert c_on[1:] == [small] * (steps - 1), (c_on, small)
    assert 0 < c_on[1] <= total / 2, (c_on, total)
g.barrier()
print("ok", flush=True)
"""


def test_tracing_on_and_off_same_training_fewer_bytes_copied():
    from ranks import run_ranks

    for r in run_ranks(2, TRACE, timeout=120):
        assert r.stdout.strip().endswith("ok"), r.stdout + r.stderr
