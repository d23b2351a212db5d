"""`scalefree bench ddp`: ratios and table from per-rank documents (no torch needed)."""

from scalefree_bench import ddp
from scalefree_bench.cli import add_parser


class _Args:
    widths, batch, steps, delay = "8,4,2", 2, 3, 0.0
    model, wrap = "mlp", "ddp"


class _EmbArgs(_Args):
    model, emb_rows, emb_dim, touched = "embedding", 1000, 4, 0.01


def _docs(step_s, n=2):
    return [{"times_s": [step_s * (1 + r / 10)] * 3, "wall_s": 3 * step_s * 1.2, "losses": [1.0, 0.9, 0.8],
             "heldout_loss": 0.85, "init_s": 0.1, "load_s": 0.01, "peak_rss_bytes": 1 << 20, "params": 46}
            for r in range(n)]


def test_records_take_the_slowest_rank_and_ratios_are_gloo_over_ours():
    recs = [ddp._record("gloo", "none", 2, _Args, _docs(0.4)), ddp._record("scalefree", "none", 2, _Args, _docs(0.2)),
            ddp._record("scalefree", "ssp:4", 2, _Args, _docs(0.1))]
    ddp._add_ratios(recs)
    assert abs(recs[0]["median_s"] - 0.44) < 1e-12  # rank 1 is 10 % slower
    assert abs(recs[1]["vs_gloo"] - 2.0) < 1e-12
    assert abs(recs[2]["steps_per_s_vs_sync"] - 2.0) < 1e-12
    table = ddp.render_table(recs)
    assert "ssp:4" in table and "2.00" in table


def test_floor_rows_are_compared_with_gloo_not_the_reference():
    recs = [ddp._record("gloo", "floor:nocomm", 2, _Args, _docs(0.1)), ddp._record("gloo", "none", 2, _Args, _docs(0.4)),
            ddp._record("scalefree", "none", 2, _Args, _docs(0.2))]
    ddp._add_ratios(recs)
    assert abs(recs[0]["vs_gloo"] - 4.0) < 1e-12  # gloo's step over the no-exchange floor
    assert abs(recs[2]["vs_gloo"] - 2.0) < 1e-12


def test_embedding_records_time_the_exchange_against_gloos_dense():
    def docs(exch_s):
        d = _docs(0.5)
        for r, x in enumerate(d):
            x["exchange_s"] = [exch_s * (1 + r / 10), exch_s, exch_s * 3]  # per step; slowest rank wins
        return d

    recs = [ddp._record("gloo", "none", 2, _EmbArgs, docs(1.0)), ddp._record("gloo", "sparse", 2, _EmbArgs, docs(0.2)),
            ddp._record("scalefree", "sparse", 2, _EmbArgs, docs(0.1))]
    ddp._add_ratios(recs)
    assert abs(recs[0]["exchange_median_s"] - 1.1) < 1e-12  # median of [1.1, 1.0, 3.0]
    assert abs(recs[2]["exchange_vs_gloo_dense"] - 10.0) < 1e-9
    table = ddp.render_table(recs)
    assert "exchange ms" in table and "10.00" in table


def test_cli_parses_the_documented_command():
    import argparse

    p = argparse.ArgumentParser()
    add_parser(p.add_subparsers())
    args = p.parse_args(["bench", "ddp", "--steps", "20", "--warmup", "3", "--hook", "bf16,ssp:16"])
    assert args.steps == 20 and args.hook == ["bf16", "ssp:16"] and args.backends == ["gloo", "scalefree"]
    args = p.parse_args(["bench", "ddp", "--model", "embedding", "--steps", "5", "--warmup", "2", "--hook", "sparse"])
    assert args.model == "embedding" and args.emb_rows == 10_000_000 and args.emb_dim == 64 and args.touched == 0.01
    assert p.parse_args(["bench", "ddp", "--wrap", "fsdp"]).wrap == "fsdp"
