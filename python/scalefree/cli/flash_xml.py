"""``scalefree flash xml``: extreme multi-label models on flash.

    scalefree flash xml import OMIKUJI_MODEL_DIR -o MODEL
    scalefree flash xml train DATA -o MODEL [--trees 3] [--loss hinge|log] [--threads N]
    scalefree flash xml predict MODEL DATA -k 5 --beam 10 --memory 1G [-o OUT] [--json OUT.json]
    scalefree flash xml generate --points 200000 --features 100000 --labels 30000 -o train.txt

``predict`` scores DATA — the Extreme Classification Repository's text format (``N F L``
header, then ``l1,l2 f:v ...``), the same lines without the header (multi-label svmlight),
or a scipy ``.npz`` — by batched breadth-first beam search with the model on flash
(``scalefree.flash.xml``); text is streamed a batch at a time. ``-o OUT`` gets one line per
point, ``label:score`` pairs best first (written atomically); when DATA has labels,
precision@1/3/5 and nDCG@1/3/5 are printed. Progress (points/s, IO rate) on stderr.
``train`` runs omikuji (the ``xml`` extra) on DATA and imports the model. ``generate``
writes a data set with power-law label frequencies (``--first-point`` continues a stream:
a test set after a training set).
"""

from __future__ import annotations

import sys
import time

from .common import add_quiet, count, fail, message, number
from .flash_report import gib, summary


def add_parser(flash_sub, runtime_args) -> None:
    x = flash_sub.add_parser("xml", help="extreme multi-label inference with the model on flash (import, predict, train, generate)",
                             description=__doc__, formatter_class=__import__("argparse").RawDescriptionHelpFormatter)
    sub = x.add_subparsers(dest="xml_command", metavar="COMMAND")
    sub.required = True

    i = sub.add_parser("import", help="convert an omikuji model directory into a model file")
    i.add_argument("model_dir", metavar="OMIKUJI_MODEL_DIR")
    i.add_argument("-o", "--output", "--out", dest="out", required=True, metavar="MODEL")
    i.set_defaults(func=_import)

    p = sub.add_parser("predict", help="top-k labels of every point of DATA")
    p.add_argument("model", metavar="MODEL")
    p.add_argument("data", metavar="DATA", help="XC repository text, multi-label svmlight, or .npz")
    p.add_argument("-k", type=count(1), default=5, help="labels per point (default 5)")
    p.add_argument("--beam", type=count(1), default=10, help="beam width per tree (default 10, omikuji's)")
    p.add_argument("--batch", type=count(1), default=8192, help="points per batch (default 8192)")
    p.add_argument("--in-flight", type=count(1), default=4, help="batches scored at once (default 4)")
    p.add_argument("--chunk", default=None, help="largest level read per task, e.g. 64M (default budget/8)")
    p.add_argument("--in-memory", action="store_true",
                   help="read the whole model into memory first (outside the budget), then score with no IO")
    p.add_argument("-o", "--output", "--out", dest="out", default=None, metavar="OUT",
                   help="write label:score lines, one per point (atomically)")
    p.add_argument("--json", default=None, metavar="OUT.json", help="write the metrics, times and IO counters")
    runtime_args(p)
    p.set_defaults(func=_predict)

    t = sub.add_parser("train", help="train a Parabel model with omikuji and import it")
    t.add_argument("data", metavar="DATA", help="training set, XC repository text format")
    t.add_argument("-o", "--output", "--out", dest="out", required=True, metavar="MODEL")
    t.add_argument("--trees", type=count(1), default=3, help="trees (default 3)")
    t.add_argument("--loss", choices=("hinge", "log"), default="hinge", help="classifier loss (default hinge)")
    t.add_argument("--threads", type=count(1), default=None, help="training threads (default: cores)")
    t.add_argument("--min-branch-size", type=count(2), default=100, help="labels below which a node is a leaf (default 100)")
    t.add_argument("--omikuji-dir", default=None, help="also keep omikuji's saved model there")
    t.set_defaults(func=_train)

    g = sub.add_parser("generate", help="write an XML data set with power-law label frequencies")
    g.add_argument("--points", type=count(1), required=True)
    g.add_argument("--features", type=count(1), default=100_000, help="(default 100000)")
    g.add_argument("--labels", type=count(1), default=30_000, help="(default 30000)")
    g.add_argument("--alpha", type=number(0), default=1.0, help="label frequency exponent (default 1)")
    g.add_argument("--mean-labels", type=number(1), default=3.0, help="mean labels per point (default 3)")
    g.add_argument("--seed", type=count(0), default=0)
    g.add_argument("--first-point", type=count(0), default=0, help="index of the first point of the stream (default 0)")
    g.add_argument("-o", "--output", "--out", dest="out", required=True, metavar="DATA")
    add_quiet(g)
    g.set_defaults(func=_generate)


def _import(args) -> int:
    from ..errors import ScalefreeError
    from ..flash import xml

    try:
        info = xml.import_omikuji(args.model_dir, args.out)
    except (ScalefreeError, ValueError, OSError) as e:
        fail("scalefree flash xml import", message(e))
    print(f"flash xml import: {args.out}: {info.n_trees} trees, {info.n_features} features, {info.n_labels} labels, "
          f"{info.loss} loss, depth {info.depth}, {info.file_bytes} bytes", file=sys.stderr)
    return 0


def _predict(args) -> int:
    from .. import flash
    from .._atomic import write_json
    from .._units import parse_positive_bytes
    from ..errors import ScalefreeError
    from ..flash import xml

    try:
        rt = flash.Runtime(memory_budget=args.memory, threads=args.threads, dir=args.dir)
        chunk = None if args.chunk is None else parse_positive_bytes(args.chunk, "--chunk")
        info = xml.model_info(args.model)
        if not args.quiet:
            print(f"flash xml predict: {args.model}: {info.n_trees} trees, {info.n_labels} labels, "
                  f"{gib(info.file_bytes)}; budget {rt.memory_budget_bytes} bytes", file=sys.stderr)
        start = rt.progress
        last = [0.0]

        def progress(points, seconds):
            if args.quiet or seconds - last[0] < 5.0:
                return
            last[0] = seconds
            read = rt.progress[2] - start[2]
            print(f"flash xml predict: {points} points, {points / seconds:.0f} points/s, read {gib(read)} "
                  f"({read / seconds / 1e9:.2f} GB/s)", file=sys.stderr, flush=True)

        p = xml.predict(args.model, args.data, k=args.k, beam=args.beam, runtime=rt, batch_points=args.batch,
                        batches_in_flight=args.in_flight, max_chunk_bytes=chunk, out=args.out, collect=False,
                        progress=progress, in_memory=args.in_memory)
    except (ScalefreeError, ValueError, OSError) as e:
        fail("scalefree flash xml predict", message(e))
    s = p.stats
    if p.metrics:
        m = p.metrics
        print(" ".join(f"P@{k}={m[f'precision@{k}']:.4f}" for k in (1, 3, 5)) + " "
              + " ".join(f"nDCG@{k}={m[f'ndcg@{k}']:.4f}" for k in (1, 3, 5)))
    if not args.quiet:
        print(summary(f"flash xml predict: {s['points']} points, {s['points'] / max(s['seconds'], 1e-9):.0f} points/s",
                       s["run"], s["seconds"], rt, blas=False), file=sys.stderr)
    if args.json:
        write_json(args.json, {"model": args.model, "data": args.data, "k": args.k, "beam": args.beam,
                               "points": s["points"], "seconds": s["seconds"], "metrics": p.metrics,
                               "memory_budget_bytes": rt.memory_budget_bytes, "peak_batch_bytes": s["peak_batch_bytes"],
                               **{f"run_{k}": v for k, v in s["run"].items()}})
    return 0


def _train(args) -> int:
    from ..errors import ScalefreeError
    from ..flash import xml

    t0 = time.perf_counter()
    try:
        info = xml.train(args.data, args.out, n_trees=args.trees, threads=args.threads, loss=args.loss,
                         min_branch_size=args.min_branch_size, model_dir=args.omikuji_dir)
    except (ScalefreeError, ValueError, OSError) as e:
        fail("scalefree flash xml train", message(e))
    print(f"flash xml train: {args.out}: {info.n_trees} trees, {info.n_labels} labels, {info.file_bytes} bytes, "
          f"{time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return 0


def _generate(args) -> int:
    from ..errors import ScalefreeError
    from ..flash import xml

    t0 = time.perf_counter()
    try:
        spec = xml.XmlDataSpec(features=args.features, labels=args.labels, alpha=args.alpha,
                               mean_labels=args.mean_labels, seed=args.seed)
        xml.generate_xml(args.out, args.points, spec, first_point=args.first_point)
    except (ScalefreeError, ValueError, OSError) as e:
        fail("scalefree flash xml generate", message(e))
    if not args.quiet:
        print(f"flash xml generate: wrote {args.out} ({args.points} points, {args.features} features, "
              f"{args.labels} labels) in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return 0
