"""A subset of torch's own distributed test suite (``torch_dist_suite.py``, as
``scripts/conformance_torch.py`` runs it in full) against the "scalefree" backend, with the
backend running under gloo's name (``scalefree-as-gloo``): the features the suite's gloo-name
gates used to hide from us, the ones that failed before (all_gather_coalesced, recv from any
source), and a body that branches on the name (accumulate_gradients_no_sync). Every test
listed must pass, none may skip, and every group made must be scalefree's. About 9 forked
2-rank runs.
"""

import importlib.util
import json
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SUBSET = [
    "test_all_gather_coalesced_simple",
    "test_send_recv_any_source",
    "test_send_recv_with_tag",
    "test_batch_isend_irecv_gloo_tags",
    "test_monitored_barrier_gloo",
    "test_barrier_timeout_full_group",
    "test_get_future",
    "test_sparse_all_reduce_sum",
    "test_accumulate_gradients_no_sync",
]

KEEP = f"({' or '.join(SUBSET)}) and not profiler and not subgroup and not rank_0 and not hook and not grad_is_view"


def _conformance():
    spec = importlib.util.spec_from_file_location("conformance_torch", os.path.join(ROOT, "scripts",
                                                                                    "conformance_torch.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_torch_suite_subset_passes_on_scalefree(tmp_path, monkeypatch):
    conf = _conformance()
    # Ranks forked from the suite's runner: each test skips two imports of torch and its suite
    # (the full runs spawn, as torch does).
    monkeypatch.setenv("SCALEFREE_SUITE_START", "fork")
    # -k matches substrings: the variants of these names (profiler, subgroup, rank 0) stay out.
    xml = conf.run_one("scalefree-as-gloo", 2, tmp_path, KEEP)
    got = {name: res for name, res in conf.outcomes(xml).items() if name in SUBSET}
    assert sorted(got) == sorted(SUBSET), f"not run: {sorted(set(SUBSET) - set(got))}"
    bad = {name: res for name, res in got.items() if res[0] != "passed"}
    assert not bad, bad
    # Under gloo's name, every group the suite made was scalefree's (2 ranks, a default group
    # per test at least), none gloo's.
    made = json.loads(conf.groups_file(xml).read_text())
    assert conf.check_backend("scalefree-as-gloo", made) is None and made["scalefree"] >= 2 * len(SUBSET), made
