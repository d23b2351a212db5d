"""``scalefree bench topics``: ISLE topic modelling (``flash.topics``, the counts on flash
under a budget) against scikit-learn's LatentDirichletAllocation (online variational Bayes)
and NMF, on KOS; and ``flash.topics`` on flash against itself in memory on a planted
corpus, with its recovery error.

    flock -x /tmp/bench.lock env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE \\
        scalefree bench topics --k 20 --budget-fraction 0.25 --json OUT
    scalefree bench topics --skip-kos --planted 1000000,50000,100 --sample 0.1 --json OUT

KOS (``../shared/data/kos/docword.kos.txt.gz``, or ``--data`` a docword file): the documents
are split (seeded) into a training part (``1 - --holdout``), written to a docword file, and a
held-out part. Every row is timed from that file on disk: load plus fit. Rows:
``scalefree/flash-<f>`` (``flash.load`` + ``flash.topics`` with a budget of ``f`` times the
matrix's flash CSR bytes: the matrix is streamed from flash), ``scalefree/memory`` (budget 4x
the matrix: loaded once and applied in memory), ``sklearn-lda/online`` (the same loader,
then ``LatentDirichletAllocation(k, learning_method="online", max_iter=--lda-passes, n_jobs=1)``:
its BLAS has ``--threads``; ``n_jobs=2`` took 2.2x longer on KOS, a process pool per
mini-batch),
``sklearn-nmf`` (``NMF(k)`` on the counts, scikit-learn's defaults). Quality: the mean over
topics of the UMass coherence of each topic's top 10 words (Mimno et al.: ``sum_{m>l}
log((D(w_m, w_l) + 1) / D(w_l))``, D = document frequencies) on the held-out documents
(``D(w_l)`` floored at 1 there, since a top word may be absent from them) and on the training
documents (the usual definition). Higher (closer to 0) is better.

Planted (``--planted DOCS,WORDS,K``): a corpus drawn by ``flash.write_corpus`` (LDA's
process; untimed set-up), then ``flash.topics`` at ``--budget-fraction`` (on flash) and in
memory, each from the file: time, peak RSS, and the recovery error (mean and largest L1 per
topic after Hungarian matching against the planted topics).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from . import common

BENCH = "topics"


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(BENCH, help="flash.topics (ISLE, counts on flash) vs scikit-learn LDA and NMF",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default="kos", help="kos or a docword file (default: kos)")
    p.add_argument("--k", type=common.argparse_type(common.positive_int), default=20, help="topics (default 20)")
    p.add_argument("--budget-fraction", type=common.argparse_type(common.positive_float), default=0.25,
                   help="flash memory budget as a fraction of the matrix's flash CSR bytes (default 0.25)")
    p.add_argument("--holdout", type=common.argparse_type(common.positive_float), default=0.2,
                   help="fraction of KOS documents held out for coherence (default 0.2)")
    p.add_argument("--lda-passes", type=common.argparse_type(common.positive_int), default=10,
                   help="LDA's passes over the data (max_iter, default 10)")
    p.add_argument("--sample", type=common.argparse_type(common.positive_float), default=1.0,
                   help="flash.topics' sample rate for its SVD and k-means steps (default 1)")
    p.add_argument("--repeat", type=common.argparse_type(common.positive_int), default=1, help="timed calls per row")
    p.add_argument("--skip-kos", action="store_true", help="only the planted corpus")
    p.add_argument("--skip-nmf", action="store_true", help="no NMF row")
    p.add_argument("--planted", default=None, metavar="DOCS,WORDS,K|FILE",
                   help="also a planted corpus of DOCS documents, WORDS words and K topics (written first, "
                        "untimed), or a docword FILE written by `scalefree flash corpus` (its .topics.npy beside it)")
    p.add_argument("--planted-length", type=common.argparse_type(common.positive_float), default=100.0,
                   help="planted documents' mean length (default 100)")
    p.add_argument("--budget", default=None, metavar="SIZE",
                   help="--planted: the flash row's budget as a size (e.g. 256M) instead of --budget-fraction")
    p.add_argument("--as-command", action="store_true", dest="in_child",
                   help="--planted: the flash row runs the command `scalefree flash topics FILE -k K --memory B "
                        "--sample S --truth T` in a child process (its whole peak RSS, a fresh process's), and a "
                        "row measures the fixed overhead: the RSS of a child that imported the command's modules and "
                        "warmed its libraries (a small fit, OpenBLAS's per-thread buffers at full size), holding no "
                        "data")
    p.add_argument("--threads", type=common.argparse_type(common.positive_int), default=common.usable_cores())
    p.add_argument("--dir", default=None, help="scratch directory for flash files and the corpora")
    common.add_cold_arg(p)
    common.add_output_args(p)
    p.set_defaults(func=run)
    return p


def _kos_path() -> Path | None:
    here = Path(__file__).resolve()
    for base in [Path.cwd(), *here.parents]:
        p = base.parent.joinpath("shared", "data", "kos", "docword.kos.txt.gz")
        if p.exists():
            return p
    return None


def _write_docword(path: Path, a) -> None:
    a = a.tocoo()
    order = np.lexsort((a.col, a.row))
    rows = np.stack([a.row[order] + 1, a.col[order] + 1, a.data[order].astype(np.int64)], axis=1)
    with open(path, "w") as f:
        f.write(f"{a.shape[0]}\n{a.shape[1]}\n{a.nnz}\n")
        np.savetxt(f, rows, fmt="%d")


def umass(top: np.ndarray, a) -> float:
    """Mean over topics of the UMass coherence of ``top`` (``k x n`` word ids, best first) on
    the documents of the count matrix ``a`` (``D(w)`` floored at 1)."""
    present = (a > 0).astype(np.float64).tocsc()
    out = []
    for words in top:
        cols = present[:, words]
        df = np.asarray(cols.sum(axis=0)).ravel()
        co = (cols.T @ cols).toarray()
        s = 0.0
        for m in range(1, len(words)):
            for l in range(m):
                s += np.log((co[m, l] + 1.0) / max(df[l], 1.0))
        out.append(s)
    return float(np.mean(out))


def _load_counts(path, tmp):
    """The docword file as a scipy CSR matrix (scalefree's native reader: the fastest here)."""
    from scalefree import flash

    return flash.load(path, flash.Runtime(dir=tmp), dtype=np.float64).to_scipy()


def _timed(fn, repeat, cache):
    times, rss, out = [], {}, None
    for _ in range(repeat):
        seconds, out = common.timed_call(fn, cache, rss)
        times.append(seconds)
    return common.Stats.of(times), out, rss


def run(args) -> int:
    blas = common.numpy_blas(BENCH)
    cache = common.PageCache(args.cold, BENCH)
    records = []
    with tempfile.TemporaryDirectory(prefix="scalefree-topics-bench-", dir=args.dir) as tmp:
        tmp = Path(tmp)
        if not args.skip_kos:
            records += _kos(args, tmp, cache, blas)
        if args.planted:
            records += _planted(args, tmp, cache, blas)
    if not records:
        raise SystemExit("topics: nothing to run (--skip-kos without --planted)")
    headers = ["data", "impl", "variant", "median", "min", "UMass held-out", "UMass train", "recovery L1",
               "budget", "peak", "peak RSS", "+call", "vs LDA", "vs memory"]
    rows = []
    for r in records:
        rows.append([r["data"], r["impl"], r["variant"], common.human_time(r["median_s"]),
                     common.human_time(r["min_s"]),
                     f"{r['umass_heldout']:.2f}" if "umass_heldout" in r else "",
                     f"{r['umass_train']:.2f}" if "umass_train" in r else "",
                     f"{r['recovery_l1_mean']:.3f} (max {r['recovery_l1_max']:.3f})" if "recovery_l1_mean" in r else "",
                     common.human_bytes(r["budget_bytes"]) if "budget_bytes" in r else "",
                     common.human_bytes(r["peak_resident_bytes"]) if "peak_resident_bytes" in r else "",
                     *(common.rss_cells(r) if "command_peak_rss_bytes" not in r
                       else [common.human_bytes(r["command_peak_rss_bytes"]) + " (cmd)", ""]),
                     f"{r['speedup_vs_lda']:.2f}x" if "speedup_vs_lda" in r else "",
                     f"{r['time_vs_memory']:.2f}x time" if "time_vs_memory" in r else ""])
    print(f"# topics: BLAS {blas}; page cache: {cache.state}; threads {args.threads}")
    print(common.format_table(headers, rows, left_columns=3))
    if args.json:
        common.write_json(Path(args.json), records)
    return 0


def _kos(args, tmp: Path, cache, blas) -> list[dict]:
    from sklearn.decomposition import NMF, LatentDirichletAllocation
    from threadpoolctl import threadpool_limits

    from scalefree import flash

    src = _kos_path() if args.data == "kos" else Path(args.data)
    if src is None or not src.exists():
        raise SystemExit(f"topics: {args.data if args.data != 'kos' else '../shared/data/kos/docword.kos.txt.gz'} "
                         f"not found")
    full = _load_counts(src, tmp)
    rng = np.random.default_rng(0)
    perm = rng.permutation(full.shape[0])
    n_test = int(round(args.holdout * full.shape[0]))
    test = full[np.sort(perm[:n_test])]
    train = full[np.sort(perm[n_test:])]
    train_path = tmp / "docword.train.txt"
    _write_docword(train_path, train)
    k = args.k
    csr_bytes = train.nnz * 8 + (train.shape[0] + 1) * 8  # float32 counts, as flash topics loads them
    name = f"{src.name} train {train.shape[0]}x{train.shape[1]}"
    common.progress(f"topics: {name} ({train.nnz} entries, {common.human_bytes(csr_bytes)} as float32 flash CSR), "
                    f"held out {test.shape[0]} documents; k={k}")
    out = []

    def record(impl, variant, st, rss, top, **extra):
        rec = common.make_record(bench=BENCH, impl=impl, variant=variant, ranks=1, nbytes=csr_bytes, dtype="float32",
                                 stats=st, gbps=0.0, data="kos", k=k, blas=blas, page_cache=cache.state,
                                 umass_heldout=umass(top, test), umass_train=umass(top, train),
                                 top_words=[[int(w) + 1 for w in t] for t in top], **extra, **rss)
        common.progress(f"  {impl} {variant}: median {common.human_time(st.median_s)}, UMass held-out "
                        f"{rec['umass_heldout']:.2f}, train {rec['umass_train']:.2f}")
        out.append(rec)
        return rec

    for variant, budget in ((f"flash-{args.budget_fraction:g}", max(1 << 16, int(csr_bytes * args.budget_fraction))),
                            ("memory", 4 * csr_bytes + (64 << 20))):
        rt = flash.Runtime(memory_budget=budget, threads=args.threads, dir=tmp)

        def fit(rt=rt):
            a = flash.load(train_path, rt, dtype=np.float32)
            return flash.topics(a, k, sample=args.sample, runtime=rt)

        st, model, rss = _timed(fit, args.repeat, cache)
        record("scalefree", variant, st, rss, model.top_words(10), budget_bytes=budget,
               peak_resident_bytes=model.stats["peak_resident_bytes"], on_flash=model.stats["on_flash"],
               steps=model.seconds, sample=args.sample)

    def lda():
        a = _load_counts(train_path, tmp)
        with threadpool_limits(args.threads):
            m = LatentDirichletAllocation(n_components=k, learning_method="online", max_iter=args.lda_passes,
                                          random_state=0, n_jobs=1)
            m.fit(a)
        return m

    st, m, rss = _timed(lda, args.repeat, cache)
    lda_rec = record("sklearn-lda", "online", st, rss, np.argsort(-m.components_, axis=1)[:, :10],
                     passes=args.lda_passes)
    if not args.skip_nmf:
        def nmf():
            a = _load_counts(train_path, tmp)
            with threadpool_limits(args.threads):
                return NMF(n_components=k, random_state=0).fit(a)

        st, m, rss = _timed(nmf, args.repeat, cache)
        record("sklearn-nmf", "cd", st, rss, np.argsort(-m.components_, axis=1)[:, :10])
    for r in out:
        if r["impl"] == "scalefree":
            r["speedup_vs_lda"] = common.ratio(lda_rec["median_s"], r["median_s"])
            r["umass_heldout_minus_lda"] = r["umass_heldout"] - lda_rec["umass_heldout"]
    return out


def _planted(args, tmp: Path, cache, blas) -> list[dict]:
    from scalefree import flash

    given = Path(args.planted)
    if given.exists():  # a corpus written by `scalefree flash corpus`, its topics beside it
        path = given
        truth = np.load(flash.truth_path(given), allow_pickle=False)
        words, k = truth.shape
        with open(path) as f:
            docs, _, nnz = (int(f.readline()) for _ in range(3))
        common.progress(f"topics: {path} ({docs} documents, {nnz} entries), topics {flash.truth_path(given)}")
    else:
        try:
            docs, words, k = (int(x) for x in args.planted.split(","))
        except ValueError:
            raise SystemExit(f"topics: --planted takes DOCS,WORDS,K or a corpus file, got {args.planted!r}") from None
        path = tmp / "docword.planted.txt"
        t = time.perf_counter()
        truth = flash.planted_topics(words, k, seed=0)
        nnz = flash.write_corpus(path, truth, docs, mean_length=args.planted_length, seed=0)
        np.save(flash.truth_path(path), truth)  # beside it, as `scalefree flash corpus` does (--command reads it)
        common.progress(f"topics: planted corpus written in {time.perf_counter() - t:.1f} s")
    csr_bytes = nnz * 8 + (docs + 1) * 8
    name = f"planted {docs}x{words} k={k}"
    common.progress(f"topics: {name}: {nnz} entries ({common.human_bytes(csr_bytes)} as float32 flash CSR)")
    out = []
    if args.budget:
        from scalefree._units import parse_bytes

        flash_row = (f"flash-{args.budget}", parse_bytes(args.budget, "--budget"))
    else:
        flash_row = (f"flash-{args.budget_fraction:g}", max(1 << 16, int(csr_bytes * args.budget_fraction)))
    if args.in_child:
        overheads = [warmed_overhead_bytes(args.threads, tmp) for _ in range(args.repeat)]
        out.append(common.make_record(bench=BENCH, impl="scalefree", variant="overhead (warmed, no data)", ranks=1,
                                      nbytes=0, dtype="float32", stats=common.Stats.of([0.0]), gbps=0.0,
                                      data="no data", k=0, blas=blas, page_cache=cache.state, budget_bytes=0,
                                      command_peak_rss_bytes=max(overheads), overhead_rss_runs=overheads))
        common.progress(f"  fixed overhead (warmed process, no data): {common.human_bytes(max(overheads))} "
                        f"(runs {', '.join(common.human_bytes(o) for o in overheads)})")
        for variant, corpus, kk, budget, sample, truth_file in (
                (f"command-{flash_row[0]}", path, k, flash_row[1], args.sample, flash.truth_path(path)),):
            runs = [_command_topics(corpus, kk, budget, sample, truth_file, args, tmp, cache) for _ in range(args.repeat)]
            st = common.Stats.of([r["seconds"] for r in runs])
            rec = common.make_record(bench=BENCH, impl="scalefree", variant=variant, ranks=1,
                                     nbytes=csr_bytes if corpus == path else 0, dtype="float32", stats=st, gbps=0.0,
                                     data=name if corpus == path else "planted 2000x500 k=10", k=kk, blas=blas,
                                     page_cache=cache.state, budget_bytes=budget, sample=sample,
                                     peak_resident_bytes=max(r["peak_resident_bytes"] for r in runs),
                                     command_peak_rss_bytes=max(r["peak_rss_bytes"] for r in runs),
                                     command_peak_rss_runs=[r["peak_rss_bytes"] for r in runs],
                                     steps=runs[-1]["steps"], on_flash=runs[-1]["on_flash"],
                                     lloyd_row_blocks=runs[-1].get("lloyd_row_blocks"),
                                     svd_basis_on_flash=runs[-1].get("svd_basis_on_flash"),
                                     svd_vectors_on_flash=runs[-1].get("svd_vectors_on_flash"))
            if truth_file is not None:
                rec.update(recovery_l1_mean=runs[-1]["recovery_l1_mean"], recovery_l1_max=runs[-1]["recovery_l1_max"],
                           docs=docs, words=words, nnz=nnz)
            allowed = budget + max(overheads)
            rec.update(overhead_rss_bytes=max(overheads), allowed_rss_bytes=allowed,
                       within_budget=rec["command_peak_rss_bytes"] <= allowed)
            common.progress(f"  scalefree {variant}: median {common.human_time(st.median_s)}, peak RSS "
                            f"{common.human_bytes(rec['command_peak_rss_bytes'])} (runs "
                            f"{', '.join(common.human_bytes(r) for r in rec['command_peak_rss_runs'])}) against "
                            f"budget + overhead {common.human_bytes(allowed)}: "
                            f"{'within' if rec['within_budget'] else 'OVER'}")
            out.append(rec)
    for variant, budget in (() if args.in_child else (flash_row,)) + (("memory", 4 * csr_bytes + (64 << 20)),):
        rt = flash.Runtime(memory_budget=budget, threads=args.threads, dir=tmp)

        def fit(rt=rt):
            a = flash.load(path, rt, dtype=np.float32)
            return flash.topics(a, k, sample=args.sample, runtime=rt,
                                progress=lambda line: common.progress(f"    {line}"))

        st, model, rss = _timed(fit, args.repeat, cache)
        mean, worst, _ = flash.recovery_error(model.topic_word, truth)
        rec = common.make_record(bench=BENCH, impl="scalefree", variant=variant, ranks=1, nbytes=csr_bytes,
                                 dtype="float32", stats=st, gbps=0.0, data=name, k=k, blas=blas, page_cache=cache.state,
                                 budget_bytes=budget, peak_resident_bytes=model.stats["peak_resident_bytes"],
                                 on_flash=model.stats["on_flash"], recovery_l1_mean=mean, recovery_l1_max=worst,
                                 steps=model.seconds, sample=args.sample, docs=docs, words=words, nnz=nnz, **rss)
        common.progress(f"  scalefree {variant}: median {common.human_time(st.median_s)}, recovery L1 mean {mean:.3f} "
                        f"max {worst:.3f}")
        out.append(rec)
    mem = out[-1]["median_s"]
    out[-2]["time_vs_memory"] = out[-2]["median_s"] / mem
    return out


# The fixed overhead of a `--memory` command: a process that imported what `flash topics`
# imports and warmed its libraries — a small fit through every step (loader, svds, k-means,
# the flash kernels and their BLAS), then a float32 and a float64 2048² matmul, which touch
# OpenBLAS's per-thread buffers to their full size — then freed it all: its RSS is what the
# process holds with no data, whatever the corpus.
_WARM = """
import gc, sys
import numpy as np
from scalefree._rss import return_freed_memory, status_bytes, trim_heap
return_freed_memory()
import scalefree.cli.flash
from scalefree import flash
rt = flash.Runtime(memory_budget="64M", threads=int(sys.argv[1]), dir=sys.argv[2])
path = sys.argv[2] + "/docword.warm.txt"
flash.write_corpus(path, flash.planted_topics(500, 10, seed=1), 2000, seed=1)
m = flash.topics(flash.load(path, rt, dtype=np.float32), 10, sample=0.5, runtime=rt)
for dt in (np.float32, np.float64):
    x = np.ones((2048, 2048), dt)
    y = x @ x
del m, x, y
gc.collect()
trim_heap()
print(status_bytes("VmRSS"))
"""


def warmed_overhead_bytes(threads: int, tmp: Path) -> int:
    """The RSS of a warmed process that holds no data (``_WARM``, in a child)."""
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-c", _WARM, str(threads), str(tmp)], capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"topics: the overhead child failed ({p.returncode}): {p.stderr.strip()[-500:]}")
    return int(p.stdout.split()[-1])


def _command_topics(path, k, budget, sample, truth, args, tmp, cache) -> dict:
    """One run of ``scalefree flash topics`` in a child process: its ``--json`` record (load +
    fit ``seconds``, ``peak_rss_bytes``: the command's own VmHWM over load and fit)."""
    import json
    import subprocess
    import sys

    out = tmp / "command-topics.json"
    cmd = [sys.executable, "-m", "scalefree.cli", "flash", "topics", str(path), "-k", str(k), "--memory", str(budget),
           "--sample", str(sample), "--threads", str(args.threads), "--dir", str(tmp), "--quiet", "--json", str(out)]
    if truth is not None:
        cmd += ["--truth", str(truth)]
    cache.drop()
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"topics: {' '.join(cmd)} failed ({p.returncode}): {p.stderr.strip()[-500:]}")
    return json.loads(out.read_text())
