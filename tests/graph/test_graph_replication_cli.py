"""``scalefree graph pagerank --replication 2``: with one rank SIGKILLed mid-run (the
CLI's fault injection), the job exits 0 and every surviving rank ends with the scores of a
dense numpy PageRank; the replicas of logical node 0 print the top list."""

import subprocess
import sys

import numpy as np
import pytest

from scalefree.graph.io import read_edges

from scalefree.graph.rmat import write_rmat

from ranks import pagerank_reference

ITERS = 25


def reference(path) -> np.ndarray:
    src, dst, ids = read_edges(path)
    return pagerank_reference(src, dst, len(ids), ITERS), ids


@pytest.mark.parametrize("ranks,fail", [(4, "3:6"), (4, "0:6"), (6, "4:10"), (4, None)])
def test_pagerank_cli_replicated_survives_a_killed_rank(tmp_path, ranks, fail):
    edges = tmp_path / "g.txt"
    write_rmat(edges, 11, 30000, seed=5, progress=False)
    ref, ids = reference(edges)
    out = tmp_path / "scores"
    cmd = [sys.executable, "-m", "scalefree.cli", "graph", "pagerank", str(edges), "-n", str(ranks),
           "--replication", "2", "--tol", "0", "--max-iter", str(ITERS), "--save-scores", str(out), "--top", "5"]
    if fail:
        cmd += ["--fail-rank", fail]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    dead = int(fail.split(":")[0]) if fail else None
    survivors = [r for r in range(ranks) if r != dead]
    files = sorted(out.glob("scores.rank*.npz"))
    assert sorted(int(f.stem.split("rank")[1]) for f in files) == survivors
    m = ranks // 2
    owned_all = []
    for f in files:
        z = np.load(f)
        # Scores are saved under the ids as written; the reference is in compact ids.
        compact = np.searchsorted(ids, z["owned"])
        assert np.array_equal(ids[compact], z["owned"])
        np.testing.assert_allclose(z["scores"], ref[compact], rtol=0, atol=1e-12, err_msg=f.name)
        owned_all.append(z["owned"])
    # Replicas own the same vertices; the logical nodes together own every vertex once.
    by_rank = {int(f.stem.split("rank")[1]): o for f, o in zip(files, owned_all)}
    union = np.concatenate([by_rank[r] if r in by_rank else by_rank[r + m] for r in range(m)])
    assert np.array_equal(np.sort(union), ids)
    # The top list from every surviving replica of logical node 0, with the reference's top vertex.
    printers = [r for r in survivors if r % m == 0]
    best = ids[int(np.argmax(ref))]
    for r in printers:
        assert f"this is replica {r // m} of logical node 0" in proc.stdout, proc.stdout[-2000:]
        assert any(line.startswith(f"[{r}] {best}\t") for line in proc.stdout.splitlines()), proc.stdout[-2000:]
