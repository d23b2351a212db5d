"""``scalefree bench xml``: extreme multi-label scoring (``flash.xml.predict``, batched
breadth-first beam search on the flash scheduler) against omikuji, on a model omikuji trained.

    scalefree flash xml generate --points 200000 -o train.txt
    scalefree flash xml generate --points 50000 --first-point 200000 -o test.txt
    omikuji train train.txt --model_path omk            # untimed set-up (or --train-omikuji)
    flock -x /tmp/bench.lock scalefree bench xml --omikuji-model omk --test test.txt \\
        --threads 2 --replicate 8 --replicate-points 20000 --batch 20000 --budget-fraction 0.25 \\
        --cold --repeat 3 --json OUT
    flock -x /tmp/bench.lock scalefree bench xml --stream stream.txt --stream-model model.sfxml --json OUT

Rows, each timed end to end from files on disk (model and test set), same threads:

* ``omikuji/test`` — omikuji's own batch scorer, ``omikuji test MODEL TEST --n_threads T
  --beam_size B --k_top K --out_path F`` (its CLI, ``cargo install omikuji --features cli``;
  ``--omikuji-bin``): wall time of the command, which loads the whole model and test set
  first (its log's scoring-only time is reported beside it), and its peak RSS (GNU time's); with
  ``--repeat N`` it alternates with ``scalefree/memory`` (omikuji, ours, omikuji, ...), each
  cold, and ``vs omikuji test`` is the median of the N rounds' ratios;
* ``omikuji/python`` — the Python binding, ``Model.load`` then ``predict`` point by point
  (``--python-points`` of them; its rate is scaled to the whole set);
* ``scalefree/memory`` — ``flash.xml.predict(in_memory=True)`` of the imported model: the
  in-memory twin, every level read into memory first (``load``, not in ``median``), then
  scored with no IO; ``vs omikuji test`` compares it with omikuji's own scoring time (from its
  log: model and data loaded), ``speedup_vs_omikuji_test_wall`` in the JSON the two wall times
  with the loads;
* ``scalefree/flash-<f>`` — the same with ``--replicate R`` copies of the trees
  (``xml.concat_models``: R times the bytes and the work, the same averaged scores) under a
  budget of ``f`` times that model's level bytes (cold, timed whole: its reads are its work),
  and ``scalefree/memory-xR`` the replicated model in memory (as ``memory``): out of core
  against in memory on the same model. With ``--repeat N`` the
  two alternate (memory, flash, memory, flash, ...), each cold, so that a change of load on a
  shared machine hits both alike; ``vs memory`` is the median of the N pairs' ratios (each in
  the JSON, ``speed_vs_memory_runs``);
* ``scalefree/stream-N`` — ``--stream FILE --stream-model MODEL``: ``scalefree flash xml
  predict`` as a child process on the first N points of FILE (``--stream-points``, default
  20000,200000,1000000; ``--stream-memory``, default 64M), its peak RSS (the child's own,
  by GNU time: ``common.child_wall_rss``) against the number of points — bounded memory in a stream.
  ``python`` beside them is the child's fixed overhead: the interpreter with scalefree, numpy
  and scipy imported.

Every row reports points/s, peak RSS (the process's, over the call; a child's for
``omikuji/test`` and the stream rows) and ``+call`` (the peak over what the process held
before the call), and for ours the flash counters, with ``idle`` the wall time during which no
task computed (waiting for reads or memory). Agreement: for every test point, our
top-k against omikuji test's (same labels in the same order, except where omikuji's printed
scores tie), the points whose top-k label *sets* differ, each classed by omikuji's exact scores
from its Python binding (``tie``, ``rounding``, ``beam``, ``other``: ``_classify``), and
precision@1/3/5 of both from the files.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
from pathlib import Path

import numpy as np

from . import common

BENCH = "xml"


def add_parser(sub) -> argparse.ArgumentParser:
    arg = common.argparse_type
    p = sub.add_parser(BENCH, help="flash.xml.predict (model on flash) vs omikuji test and omikuji's Python predict",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--omikuji-model", default=None, help="directory of a model saved by omikuji")
    p.add_argument("--test", default=None, help="test set, XC repository text format")
    p.add_argument("--omikuji-bin", default="omikuji", help="omikuji's CLI (default: omikuji on PATH)")
    p.add_argument("-k", type=arg(common.positive_int), default=5)
    p.add_argument("--beam", type=arg(common.positive_int), default=10)
    p.add_argument("--threads", type=arg(common.positive_int), default=common.usable_cores())
    p.add_argument("--batch", type=arg(common.positive_int), default=8192, help="our points per batch")
    p.add_argument("--in-flight", type=arg(common.positive_int), default=4, help="our batches in flight")
    p.add_argument("--python-points", type=arg(common.non_negative_int), default=2000, help="points scored by the Python binding (0: skip)")
    p.add_argument("--replicate", type=arg(common.non_negative_int), default=0, help="copies of the trees for the out-of-core rows (0: skip)")
    p.add_argument("--replicate-points", type=arg(common.non_negative_int), default=0,
                   help="points of the test set scored by the replicated-model rows (default 0: all)")
    p.add_argument("--budget-fraction", type=arg(common.positive_float), default=0.25,
                   help="out-of-core budget as a fraction of the replicated model's level bytes (default 0.25)")
    p.add_argument("--skip-peers", action="store_true",
                   help="no omikuji rows (only ours: a repeat of the in-memory / out-of-core comparison)")
    p.add_argument("--repeat", type=arg(common.positive_int), default=1, help="timed calls per row")
    p.add_argument("--stream", default=None, help="a large XC text file scored as a stream (the stream rows)")
    p.add_argument("--stream-model", default=None, help="our model file for --stream")
    p.add_argument("--stream-points", default="20000,200000,1000000",
                   help="prefixes of --stream scored, comma-separated (default 20000,200000,1000000)")
    p.add_argument("--stream-memory", default="64M", help="budget of the stream runs (default 64M)")
    p.add_argument("--dir", default=None, help="where the imported models go (default: a temporary directory)")
    common.add_cold_arg(p)
    common.add_output_args(p)
    p.set_defaults(func=run)
    return p


def _read_truth(path):
    truth = []
    with open(path) as f:
        next(f)
        for line in f:
            first = line.split(" ", 1)[0]
            truth.append(set(int(x) for x in first.split(",") if x) if ":" not in first else set())
    return truth


def _read_omikuji_out(path, k):
    labels, scores = [], []
    with open(path) as f:
        for line in f:
            pairs = [t.split(" ") for t in line.rstrip("\n").split("\t") if t]
            labels.append([int(a) for a, _ in pairs][:k])
            scores.append([float(b) for _, b in pairs][:k])
    return labels, scores


def _precision(pred, truth, k):
    return float(np.mean([len(set(p[:k]) & t) / k for p, t in zip(pred, truth)]))


def _compare(ours, theirs, their_scores):
    """Our top-k against omikuji test's, point by point. Returns ``(agree, order_ties, sets)``:
    ``agree`` the number of points equal ties aside (a differing position only where omikuji's
    printed, 3-decimal, scores tie), ``order_ties`` the indices of those whose order differs at
    such a printed tie, and ``sets`` the indices of the points whose top-k label *sets* differ."""
    agree, order_ties, sets = 0, [], []
    for i, (a, b, s) in enumerate(zip(ours, theirs, their_scores)):
        a = [x for x in a if x >= 0]
        if set(a) != set(b):
            sets.append(i)
        ok = len(a) == len(b)
        if ok:
            for j in range(len(b)):
                if a[j] != b[j] and not any(abs(s[j] - s[i2]) <= 1e-3 for i2 in range(len(b)) if b[i2] == a[j]):
                    ok = False
                    break
        agree += ok
        if ok and a != b:
            order_ties.append(i)
    return agree, order_ties, sets


def _read_points(path, wanted):
    """The feature lists ``[(id, value), ...]`` of the points ``wanted`` (indices) of an XC file."""
    wanted, pts = set(wanted), {}
    with open(path) as f:
        next(f)
        for i, line in enumerate(f):
            if len(pts) == len(wanted):
                break
            if i in wanted:
                toks = line.split()
                toks = toks[1:] if toks and ":" not in toks[0] else toks
                pts[i] = [(int(a), float(b)) for a, b in (t.split(":") for t in toks)]
    return pts


_CLASSES = ("tie", "rounding", "beam", "other")  # a point takes its worst pair's class


def _omikuji_model(model_dir):
    """omikuji's model through its Python binding, weights densified as ``omikuji test`` does
    by default (``--max_sparse_density 0.1``)."""
    import omikuji

    m = omikuji.Model.load(str(model_dir))
    m.densify_weights(0.1)
    return m


def _classify(m, points, ours_labels, ours_scores, theirs_labels, test, beam):
    """Why each point's top-k differs from omikuji test's (``theirs_labels``: in set, or in
    order at a printed tie), by omikuji's exact (float32) scores from its Python binding ``m``
    (:func:`_omikuji_model`: the same ``Model::predict``, weights densified as ``omikuji test``
    does), every label its beam reached. Each pair of labels the two rank the other way round (one in our top k and not in
    omikuji's against one in omikuji's and not in ours, or two in both in the other order) is:

    * ``tie`` — omikuji scores the two exactly equal: a tie omikuji breaks by hash order, ours
      by label id;
    * ``rounding`` — they differ by at most 1e-5 relative, and our scores of both match
      omikuji's to 1e-5: the order decided by the last bits of float32 sums done in another
      order (sparse against dense dot products, the trees' sum);
    * ``beam`` — one of the two is scored otherwise (beyond 1e-5) or was not reached by
      omikuji's beam: one beam kept a node the other dropped at a (near-)tie of path scores, so
      that label's average is over other leaves;
    * ``other`` — none of these: omikuji ranks them apart by more than rounding (to look at).

    Fewer labels than omikuji's (a beam that reached fewer) is ``beam`` too.
    A point takes the worst class of its pairs. Returns ``({class: count}, {class: [first
    point indices]})``."""
    pts = _read_points(test, points)
    counts, examples = {}, {}
    rel = 1e-5

    def near(x, y):
        return abs(x - y) <= rel * max(abs(x), abs(y), 1e-30)

    for i in points:
        full = dict(m.predict(pts[i], beam_size=beam, top_k=1 << 30))
        ours = {int(lab): float(sc) for lab, sc in zip(ours_labels[i], ours_scores[i]) if lab >= 0}
        rank_o = {lab: j for j, lab in enumerate(ours)}
        rank_t = {lab: j for j, lab in enumerate(theirs_labels[i])}
        pairs = [(a, b) for a in ours for b in theirs_labels[i] if b not in ours and a not in rank_t]
        pairs += [(a, b) for a in ours for b in ours if a in rank_t and b in rank_t and rank_o[a] < rank_o[b]
                  and rank_t[a] > rank_t[b]]
        worst = 2 if len(ours) < len(theirs_labels[i]) else 0  # fewer labels reached: the beam
        for a, b in pairs:  # we rank a above b, omikuji b above a
            if a not in full or b not in full or any(lab in ours and not near(ours[lab], full[lab]) for lab in (a, b)):
                c = 2
            elif full[a] == full[b]:
                c = 0
            elif near(full[a], full[b]):
                c = 1
            else:
                c = 3
            worst = max(worst, c)
        name = _CLASSES[worst]
        counts[name] = counts.get(name, 0) + 1
        if len(examples.setdefault(name, [])) < 5:
            examples[name].append(i)
    return counts, examples


def _run_child(cmd):
    """Runs ``cmd``; returns (seconds, the child's own peak RSS bytes or None, stderr)."""
    seconds, rss, _, err = common.child_wall_rss([str(c) for c in cmd], timeout=4 * 3600)
    return seconds, rss, err


def run(args) -> int:
    if (args.test is None) != (args.omikuji_model is None):
        raise SystemExit("xml: --omikuji-model and --test go together")
    if args.test is None and args.stream is None:
        raise SystemExit("xml: give --omikuji-model and --test (scoring rows), or --stream and --stream-model (stream rows)")
    if (args.stream is None) != (args.stream_model is None):
        raise SystemExit("xml: --stream and --stream-model go together")
    cache = common.PageCache(args.cold, BENCH)
    records: list[dict] = []
    title = []
    with tempfile.TemporaryDirectory(prefix="scalefree-xml-bench-", dir=args.dir) as tmp:
        tmp = Path(tmp)
        if args.test is not None:
            n = _scoring_rows(args, cache, tmp, records)
            title.append(f"{args.test}, {n} points")
        if args.stream is not None:
            _stream_rows(args, cache, tmp, records)
            title.append(f"stream {args.stream}")

    headers = ["impl", "variant", "median", "points/s", "P@1", "P@3", "P@5", "budget", "load", "read", "idle", "peak",
               "peak RSS", "+call", "vs omikuji test", "vs memory", "agree"]
    rows = []
    for r in records:
        rows.append([r["impl"], r["variant"], common.human_time(r["median_s"]) if r.get("median_s") else "",
                     f"{r['points_per_s']:.0f}" if r.get("points_per_s") else "",
                     *(f"{r[f'p@{k}']:.4f}" if f"p@{k}" in r else "" for k in (1, 3, 5)),
                     common.human_bytes(r["budget_bytes"]) if "budget_bytes" in r else "",
                     common.human_time(r["load_s"]) if r.get("load_s") else "",
                     common.human_bytes(r["bytes_read"]) if "bytes_read" in r else "",
                     common.human_time(r["compute_idle_s"]) if "compute_idle_s" in r else "",
                     common.human_bytes(r["peak_resident_bytes"]) if "peak_resident_bytes" in r else "",
                     *common.rss_cells(r),
                     f"{r['speedup_vs_omikuji_test']:.2f}x" if "speedup_vs_omikuji_test" in r else "",
                     f"{r['speed_vs_memory']:.2f}x" if "speed_vs_memory" in r else "",
                     f"{r['agree_points']}/{r['points']}" if "agree_points" in r else ""])
    print(f"# xml: {'; '.join(title)}; k={args.k}, beam={args.beam}, threads {args.threads}; page cache: {cache.state}")
    print(common.format_table(headers, rows, left_columns=2))
    if args.json:
        common.write_json(Path(args.json), records)
    return 0


def _scoring_rows(args, cache, tmp: Path, records: list) -> int:
    """The rows on the test set: omikuji's, ours in memory, and the replicated model in memory
    and out of core. Returns the number of test points."""
    from scalefree import flash
    from scalefree.flash import xml

    truth = _read_truth(args.test)
    n = len(truth)
    model = tmp / "model.sfxml"
    info = xml.import_omikuji(args.omikuji_model, model)
    common.progress(f"xml: imported {args.omikuji_model}: {info.n_trees} trees, {info.n_labels} labels, "
                    f"{common.human_bytes(info.file_bytes)}; {n} test points")

    # omikuji test (its own batch scorer), run in the same rounds as our in-memory row (below)
    out = tmp / "omikuji.out"
    cmd = [args.omikuji_bin, "test", args.omikuji_model, args.test, "--n_threads", str(args.threads),
           "--beam_size", str(args.beam), "--k_top", str(args.k), "--out_path", str(out)]
    if args.skip_peers:
        args.python_points = 0
        cmd = None
    peer = {"times": [], "rss": 0, "scoring": []}

    def omikuji_test():
        cache.drop()
        s, r, err = _run_child(cmd)
        m = re.search(r"Done testing on \d+ examples; it took ([0-9.]+)s", err)
        peer["times"].append(s)
        peer["rss"] = max(peer["rss"], r or 0)  # 0: no GNU time here, no figure
        peer["scoring"].append(float(m.group(1)) if m else float("nan"))
        common.progress(f"xml: omikuji test {common.human_time(s)} ({n / s:.0f} points/s; scoring "
                        f"{peer['scoring'][-1]:.1f} s by its log)")

    # omikuji's Python binding, point by point
    if args.python_points > 0:
        pts = list(_read_points(args.test, range(min(args.python_points, n))).values())

        def python_predict():
            m = _omikuji_model(args.omikuji_model)
            return [m.predict(p, beam_size=args.beam, top_k=args.k) for p in pts]

        rss_py: dict = {}
        s, _out = common.timed_call(python_predict, cache, rss_py)
        rate = len(pts) / s
        records.append(common.make_record(bench=BENCH, impl="omikuji", variant="python", ranks=1,
                                          nbytes=info.file_bytes, dtype="float32",
                                          stats=common.Stats.of([n / rate]), gbps=0.0, points=len(pts),
                                          points_per_s=rate, threads=1, **rss_py))
        common.progress(f"xml: omikuji python {rate:.0f} points/s (load included, {len(pts)} points)")

    def ours_record(variant, budget, nbytes, times, loads, p, rss, m):
        st = common.Stats.of(times)
        run_ = p.stats["run"]
        rec = common.make_record(bench=BENCH, impl="scalefree", variant=variant, ranks=1, nbytes=nbytes,
                                 dtype="float32", stats=st, gbps=run_["bytes_read"] / st.median_s / 1e9, points=m,
                                 points_per_s=m / st.median_s, budget_bytes=budget, load_s=float(np.median(loads)),
                                 peak_resident_bytes=run_["peak_resident_bytes"], bytes_read=run_["bytes_read"],
                                 compute_busy_s=run_["compute_busy_seconds"], compute_idle_s=run_["compute_idle_seconds"],
                                 peak_batch_bytes=p.stats["peak_batch_bytes"], threads=args.threads, **rss,
                                 **{f"p@{k}": p.metrics[f"precision@{k}"] for k in (1, 3, 5)})
        common.progress(f"xml: scalefree {variant} {common.human_time(st.median_s)} ({m / st.median_s:.0f} points/s, "
                        f"load {rec['load_s']:.1f} s, read {common.human_bytes(run_['bytes_read'])}, compute idle "
                        f"{run_['compute_idle_seconds']:.1f} s, peak RSS {common.human_bytes(rss.get('peak_rss_bytes', 0))})")
        return rec

    def ours(runs, each_round=None):
        """``runs``: (variant, model, budget, nbytes, test, points, in_memory) rows timed in turn,
        ``--repeat`` rounds (``each_round()`` first in each: a peer's run). An in-memory row (the model read into memory first, no IO while
        scoring) is timed without that load (its own ``load_s``): the in-memory speed. Returns
        per row (record, last predictions, times)."""
        state = []
        for variant, model_path, budget, nbytes, test, m, in_memory in runs:
            rt = flash.Runtime(memory_budget=budget, threads=args.threads, dir=tmp)
            state.append({"rt": rt, "times": [], "loads": [], "rss": {}, "p": None})
        for _ in range(args.repeat):
            if each_round is not None:
                each_round()
            for (variant, model_path, budget, nbytes, test, m, in_memory), st in zip(runs, state):
                s, st["p"] = common.timed_call(lambda: xml.predict(model_path, test, k=args.k, beam=args.beam,
                                                                   runtime=st["rt"], batch_points=args.batch,
                                                                   batches_in_flight=args.in_flight,
                                                                   in_memory=in_memory), cache, st["rss"])
                load = st["p"].stats["load_seconds"]
                st["times"].append(s - load)
                st["loads"].append(load)
        return [(ours_record(variant, nbytes if in_memory else budget, nbytes, st["times"], st["loads"], st["p"], st["rss"], m),
                 st["p"], st["times"])
                for (variant, model_path, budget, nbytes, test, m, in_memory), st in zip(runs, state)]

    [(rec, p, mem_t)] = ours([("memory", model, 64 << 20, info.level_bytes, args.test, n, True)],
                             each_round=omikuji_test if cmd else None)
    if cmd:
        o_labels, o_scores = _read_omikuji_out(out, args.k)
        st = common.Stats.of(peer["times"])
        records.insert(0, common.make_record(bench=BENCH, impl="omikuji", variant="test", ranks=1, nbytes=info.file_bytes,
                                             dtype="float32", stats=st, gbps=0.0, points=n, points_per_s=n / st.median_s,
                                             scoring_only_s=float(np.median(peer["scoring"])),
                                             scoring_only_runs=peer["scoring"], threads=args.threads,
                                             **({"peak_rss_bytes": peer["rss"], "rss_before_bytes": 0} if peer["rss"] else {}),
                                             **{f"p@{k}": _precision(o_labels, truth, k) for k in (1, 3, 5)}))
        ours_l, ours_s = p.labels.tolist(), p.scores.tolist()
        agree, order_ties, differ = _compare(ours_l, o_labels, o_scores)
        rec["agree_points"] = agree
        rec["topk_set_differs_points"] = len(differ)
        rec["order_differs_at_printed_ties_points"] = len(order_ties)
        if differ or order_ties:
            exact = _omikuji_model(args.omikuji_model)
            for key, idx in (("set", differ), ("order", order_ties)):
                if idx:
                    rec[f"{key}_difference_classes"], rec[f"{key}_difference_examples"] = _classify(
                        exact, idx, ours_l, ours_s, o_labels, args.test, args.beam)
            del exact
        # like with like: omikuji's own scoring time (its log's, model and data loaded) against ours, per round
        rec["speedup_vs_omikuji_test_runs"] = [common.ratio(a, b) for a, b in zip(peer["scoring"], mem_t)]
        rec["speedup_vs_omikuji_test"] = float(np.median(rec["speedup_vs_omikuji_test_runs"]))
        rec["speedup_vs_omikuji_test_wall"] = common.ratio(records[0]["median_s"], rec["median_s"] + rec["load_s"])
        common.progress(f"xml: top-{args.k} equal to omikuji test's for {agree} of {n} points ({len(order_ties)} "
                        f"ordered otherwise at printed ties: {rec.get('order_difference_classes', {})}); top-{args.k} "
                        f"sets differ for {len(differ)}: {rec.get('set_difference_classes', {})}; vs omikuji test per round: "
                        + ", ".join(f"{x:.2f}x" for x in rec["speedup_vs_omikuji_test_runs"]))
    records.append(rec)
    if args.replicate > 1:
        big = tmp / f"model-x{args.replicate}.sfxml"
        binfo = xml.concat_models(big, [model] * args.replicate)
        budget = int(args.budget_fraction * binfo.level_bytes)
        sub, m = args.test, n
        if 0 < args.replicate_points < n:
            sub, m = tmp / "test-head.txt", args.replicate_points
            with open(args.test) as f, open(sub, "w") as g:
                g.write(f"{m} {info.n_features} {info.n_labels}\n")
                next(f)
                for _, line in zip(range(m), f):
                    g.write(line)
        common.progress(f"xml: {big.name}: {common.human_bytes(binfo.file_bytes)}, budget "
                        f"{common.human_bytes(budget)} out of core; {m} points")
        (mem_rec, mem_p, mem_t), (ooc_rec, ooc_p, ooc_t) = ours([
            (f"memory-x{args.replicate}", big, 64 << 20, binfo.level_bytes, sub, m, True),
            (f"flash-{args.budget_fraction:g}-x{args.replicate}", big, budget, binfo.file_bytes, sub, m, False)])
        pairs = [a / b for a, b in zip(mem_t, ooc_t)]
        ooc_rec["speed_vs_memory_runs"] = pairs
        ooc_rec["speed_vs_memory"] = float(np.median(pairs))
        ooc_rec["same_as_memory"] = bool(np.array_equal(ooc_p.labels, mem_p.labels))
        common.progress("xml: out of core vs in memory, per pair: " + ", ".join(f"{x:.3f}x" for x in pairs))
        records.extend([mem_rec, ooc_rec])
    return n


def _stream_rows(args, cache, tmp: Path, records: list) -> None:
    """Our CLI as a child on growing prefixes of a large file: peak RSS against points."""
    counts = [int(x) for x in str(args.stream_points).split(",") if x.strip()]
    with open(args.stream) as f:
        header = f.readline().split()
    if len(header) != 3 or not all(t.isdigit() for t in header):
        raise SystemExit(f"xml: {args.stream}: expected an 'N F L' header line")
    total, n_features, n_labels = (int(t) for t in header)
    base_cmd = [sys.executable, "-m", "scalefree.cli", "flash", "xml", "predict", args.stream_model]
    # The fixed overhead of such a child: the interpreter with the modules it imports.
    _, base_rss, _ = _run_child([sys.executable, "-c", "import numpy, scipy.sparse, scalefree.cli, scalefree.flash.xml"])
    records.append(common.make_record(bench=BENCH, impl="python", variant="imports", ranks=1, nbytes=0, dtype="float32",
                                      stats=common.Stats.of([0.0]), gbps=0.0,
                                      **({"peak_rss_bytes": base_rss, "rss_before_bytes": base_rss} if base_rss else {})))
    for count in counts:
        count = min(count, total)
        data = Path(args.stream)
        if count < total:
            data = tmp / f"stream-{count}.txt"
            with open(args.stream) as f, open(data, "w") as g:
                f.readline()
                g.write(f"{count} {n_features} {n_labels}\n")
                for _, line in zip(range(count), f):
                    g.write(line)
        out, js = tmp / "stream.pred", tmp / "stream.json"
        cache.drop()
        seconds, rss, _ = _run_child([*base_cmd, str(data), "--memory", args.stream_memory, "--threads", str(args.threads),
                                      "-k", str(args.k), "--beam", str(args.beam), "--batch", str(args.batch),
                                      "--in-flight", str(args.in_flight), "-o", str(out), "--json", str(js), "-q"])
        run_ = json.loads(js.read_text())
        records.append(common.make_record(bench=BENCH, impl="scalefree", variant=f"stream-{count}", ranks=1, nbytes=0,
                                          dtype="float32", stats=common.Stats.of([seconds]), gbps=0.0, points=count,
                                          points_per_s=count / seconds, budget_bytes=run_["memory_budget_bytes"],
                                          peak_batch_bytes=run_["peak_batch_bytes"], threads=args.threads,
                                          **({"peak_rss_bytes": rss, "rss_before_bytes": base_rss} if rss and base_rss else {}),
                                          **{f"p@{k}": run_["metrics"][f"precision@{k}"] for k in (1, 3, 5)}))
        common.progress(f"xml: stream of {count} points: {common.human_time(seconds)}, peak RSS "
                        f"{common.human_bytes(rss) if rss else '(no GNU time)'}")
        if data != Path(args.stream):
            data.unlink()


