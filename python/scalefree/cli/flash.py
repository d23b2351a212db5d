"""``scalefree flash``: out-of-core kernels from the command line.

    scalefree flash svd docword.kos.txt.gz -k 100 --tol 1e-4 --memory 1G
    scalefree flash gemm A.npy B.npy -o C.npy --memory 1G [--transpose-a] [--transpose-b]
    scalefree flash topics docword.kos.txt.gz -k 20 --memory 1M --json OUT.json [--sample 0.1]
    scalefree flash corpus --docs 100000 --words 50000 --topics 100 -o docword.planted.txt
    scalefree flash xml predict MODEL DATA -k 5 --beam 10 --memory 1G   (see scalefree flash xml -h)

``topics`` runs ISLE's SVD-based topic model (``flash.topics``: thresholding, block
Krylov-Schur SVD, k-means++ and k-means on the projection, k-means on the thresholded
documents, catchword-based topics) with the document-word counts of a docword (or any
sparse file ``flash.load`` opens) on flash; prints each topic's top words (``TOPIC: id:weight
...``, 1-based word ids, or the words of ``--vocab``), writes ``--json OUT`` (``top_words``:
K lists of 1-based word ids, best first; ``seconds``; the per-step times and IO counters),
``--out OUT.npz`` (``topic_word`` words x K, ``labels`` per document), and with ``--truth
TOPICS.npy`` the recovery error (L1 per topic after Hungarian matching).

``corpus`` writes a planted-topic corpus (LDA's generative process: Dirichlet(beta) topics,
Dirichlet(alpha) document weights, Poisson lengths) as a docword file, streamed, and its
topic matrix as ``.npy`` (``--truth``, default OUT's name with ``.topics.npy``).

``svd`` opens DATA with ``flash.load`` (``.npz``, ``.mtx[.gz]``, ``docword*.txt[.gz]``,
``.npy``), keeps it on flash, and prints the top-k singular values (largest first);
``--out OUT.npz`` saves ``u``, ``s``, ``vt``.

``gemm`` computes ``C = alpha op(A) op(B)`` on 2-D float32/float64 ``.npy`` files: A and B are
used in place (their data is read straight from the files, never loaded whole), and C is
written straight into the output ``.npy``, which appears at its path only once complete and
synced (an interrupted run leaves nothing there). Shapes and dtypes are checked from the
headers before any data is read or the output created.

Both show progress on stderr (a bar on a terminal, a line every few seconds otherwise;
``-q/--quiet`` hides it) and end with an IO/compute summary: bytes read and written by the flash
kernels, their GB/s, program-cache hit rate, time the compute threads waited, peak resident
bytes against the budget.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time

from .common import add_quiet, add_text_dialect, count, fail, message, number
from .flash_report import gib, summary


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("flash", help="out-of-core kernels on matrices kept on flash (svd, gemm, topics, corpus, xml)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    flash_sub = p.add_subparsers(dest="flash_command", metavar="COMMAND")
    flash_sub.required = True

    def runtime_args(s):
        s.add_argument("--memory", default=None,
                       help="memory budget, e.g. 1G (default SCALEFREE_FLASH_MEMORY or 1G): the flash kernels'; "
                            "for svd and topics the whole command's state too (peak RSS about the budget plus the "
                            "interpreter's fixed overhead, docs/flash.md)")
        s.add_argument("--threads", type=count(1), default=None,
                       help="compute threads (default SCALEFREE_FLASH_THREADS or cores)")
        s.add_argument("--dir", default=None, help="scratch directory (default SCALEFREE_FLASH_DIR or temp)")
        add_quiet(s)

    s = flash_sub.add_parser("svd", help="top-k singular values of a matrix file, the matrix staying on flash")
    s.add_argument("data", help="matrix file (.npz, .mtx[.gz], docword*.txt[.gz], .npy) or a directory of docword "
                                "parts (doc word count lines)")
    s.add_argument("-k", type=count(1), default=6, help="number of singular values (default 6)")
    s.add_argument("--tol", type=number(0), default=0.0, help="tolerance of the singular values, as scipy svds' tol (default 0: machine precision)")
    s.add_argument("--dtype", choices=("float32", "float64"), default=None, help="element type (default: the file's)")
    s.add_argument("-o", "--output", "--out", dest="out", default=None, metavar="OUT.npz",
                   help="save u, s, vt (written atomically)")
    s.add_argument("--json", metavar="FILE", help="write the singular values, times and IO counters as JSON")
    add_text_dialect(s)
    runtime_args(s)
    s.set_defaults(func=_svd)

    g = flash_sub.add_parser("gemm", help="C = alpha op(A) op(B) on .npy files under a memory budget")
    g.add_argument("a", metavar="A", help="2-D float32/float64 .npy file")
    g.add_argument("b", metavar="B", help="2-D .npy file of the same dtype")
    g.add_argument("-o", "--output", "--out", dest="out", required=True, metavar="C", help="output .npy file (C order)")
    g.add_argument("--transpose-a", action="store_true", help="use Aᵀ")
    g.add_argument("--transpose-b", action="store_true", help="use Bᵀ")
    g.add_argument("--alpha", type=number(), default=1.0, help="scale of the product (default 1)")
    g.add_argument("--blas", default="auto",
                   help="block multiply: auto (numpy's BLAS), faer, or a CBLAS library path (default auto)")
    runtime_args(g)
    g.set_defaults(func=_gemm)

    t = flash_sub.add_parser("topics", help="ISLE topic model of a docword file, the counts staying on flash")
    t.add_argument("data", metavar="DOCWORD", help="docword*.txt[.gz] (UCI, or doc word count lines: CSV, TSV), a "
                                                   "directory of such parts, or .npz, .mtx[.gz]: documents x words counts")
    t.add_argument("-k", type=count(2), required=True, help="number of topics")
    t.add_argument("--sample", type=number(0, 1, low_open=True), default=1.0,
                   help="fraction of documents for the SVD and the k-means steps (default 1)")
    t.add_argument("--tol", type=number(0), default=1e-4, help="relative residual of the SVD's eigenpairs (default 1e-4)")
    t.add_argument("--seed", type=count(0), default=0, help="seed of the sampling and k-means++ (default 0)")
    t.add_argument("--top", type=count(1), default=10, help="top words per topic printed and in --json (default 10)")
    t.add_argument("--vocab", default=None, help="vocab file (one word a line) to print words instead of ids")
    t.add_argument("--json", default=None, metavar="OUT", help="write top_words, seconds and the run's counters")
    t.add_argument("-o", "--output", "--out", dest="out", default=None, metavar="OUT.npz",
                   help="save topic_word (words x K) and labels (written atomically)")
    t.add_argument("--truth", default=None, metavar="TOPICS.npy", help="true topic matrix: print the recovery error")
    t.add_argument("--checkpoint", default=None, metavar="PATH",
                   help="after the SVD (step 2) and the k-means on its projection (step 3), write the state here "
                        "atomically (PATH.rank0-of-1)")
    t.add_argument("--resume", action="store_true",
                   help="continue after the last step in --checkpoint (refused when taken from other input or "
                        "options); the result is the uninterrupted run's")
    t.add_argument("--stop-after", type=int, choices=[2, 3], default=None, metavar="STEP",
                   help="with --checkpoint: end after step 2 or 3, with a checkpoint")
    add_text_dialect(t)
    runtime_args(t)
    t.set_defaults(func=_topics)

    c = flash_sub.add_parser("corpus", help="write a planted-topic (LDA) corpus as a docword file")
    c.add_argument("--docs", type=count(1), required=True, help="documents")
    c.add_argument("--words", type=count(2), required=True, help="vocabulary size")
    c.add_argument("--topics", type=count(1), required=True, help="topics")
    c.add_argument("--alpha", type=number(0, low_open=True), default=None,
                   help="Dirichlet parameter of the documents' topic weights (default 1/topics)")
    c.add_argument("--beta", type=number(0, low_open=True), default=0.01,
                   help="Dirichlet parameter of the topics' word weights (default 0.01)")
    c.add_argument("--length", type=number(0, low_open=True), default=100.0, help="mean document length (default 100)")
    c.add_argument("--seed", type=count(0), default=0, help="seed (default 0)")
    c.add_argument("-o", "--output", "--out", dest="out", required=True, metavar="DOCWORD",
                   help="output docword file (plain text, written atomically)")
    c.add_argument("--truth", default=None, metavar="TOPICS.npy",
                   help="where to save the topic matrix (default: OUT with .topics.npy)")
    add_quiet(c)
    c.set_defaults(func=_corpus)

    from . import flash_xml

    flash_xml.add_parser(flash_sub, runtime_args)
    return p


def _topics(args) -> int:
    import numpy as np

    if (args.resume or args.stop_after is not None) and not args.checkpoint:
        fail("scalefree flash topics", "--resume and --stop-after need --checkpoint PATH")

    from .. import flash
    from .._atomic import atomic_path, write_json
    from .._rss import peak_rss_bytes, return_freed_memory
    from ..errors import DataError, FlashIOError, InvalidArgumentError

    return_freed_memory()  # --memory bounds the whole process: freed row blocks go back
    from ..flash.topics import check_k

    truth = None
    if args.truth:
        truth = np.load(args.truth, allow_pickle=False, mmap_mode="r")  # read when scored, after the fit
    vocab = None
    if args.vocab:
        with open(args.vocab, encoding="utf-8") as f:
            vocab = [line.strip() for line in f]
    rt = flash.Runtime(memory_budget=args.memory, threads=args.threads, dir=args.dir)
    t_start = time.perf_counter()
    try:
        a = flash.load(args.data, rt, dtype=np.float32, delimiter=args.delimiter, header=args.header)
    except FlashIOError as e:  # a bad line of the input: bad input, exit 2
        raise DataError(str(e)) from e
    if not isinstance(a, flash.Csr):
        raise InvalidArgumentError(f"{args.data}: topics takes a sparse matrix of counts (docword, .npz, .mtx)")
    load_s = time.perf_counter() - t_start
    loaded = repr(a)
    # Ids past 32 bits (documents or words): the model runs on the stored rows and columns,
    # and the words it reports are mapped back to their ids.
    doc_ids, word_ids = a.row_ids, a.col_ids
    if doc_ids is not None or word_ids is not None:
        a = a.compact()
    check_k(args.k, a.shape)
    print(f"flash topics: {args.data}: {loaded}, loaded in {load_s:.2f} s; budget {rt.memory_budget_bytes} bytes",
          file=sys.stderr)
    if truth is not None and truth.shape != (a.shape[1], args.k):
        raise InvalidArgumentError(f"{args.truth}: the topic matrix has shape {truth.shape}, expected "
                                   f"({a.shape[1]}, {args.k}) (words x K)")
    words = a.shape[1] if word_ids is None else int(word_ids[-1]) + 1 if len(word_ids) else 0
    if vocab is not None and len(vocab) < words:
        raise InvalidArgumentError(f"{args.vocab}: {len(vocab)} words, but {args.data} has {words}")

    def say(line):
        if not args.quiet:
            print(f"flash topics: {line}", file=sys.stderr, flush=True)

    progress = _Progress(rt, "flash topics", show=not args.quiet)
    ck = None
    if args.checkpoint:
        from ..checkpoint import Checkpoints, files_fingerprint

        ck = Checkpoints(None, args.checkpoint, every=1, stop_after=args.stop_after, resume=args.resume,
                         expect={"input": files_fingerprint([args.data]), "k": args.k, "sample": args.sample,
                                 "seed": args.seed, "tol": args.tol, "memory_budget_bytes": rt.memory_budget_bytes},
                         kind="topics")
    model = progress.run(lambda: flash.topics(a, args.k, sample=args.sample, seed=args.seed, tol=args.tol,
                                              runtime=rt, progress=say, checkpoints=ck))
    if model is None:
        print(f"stopped after step {args.stop_after}; checkpoint {args.checkpoint} (continue with --resume)")
        return 0
    seconds = time.perf_counter() - t_start
    peak_rss = peak_rss_bytes()  # load and fit (before the scoring against --truth)
    top = model.top_words(args.top)
    for l in range(args.k):
        ids = top[l]
        weights = model.topic_word[ids, l]
        ids = ids if word_ids is None else word_ids[ids]  # 0-based word ids
        names = [vocab[i] if vocab else str(i + 1) for i in ids]
        print(f"{l + 1}: " + " ".join(f"{n}:{w:.4f}" for n, w in zip(names, weights)))
    if word_ids is not None:
        top = word_ids[top]
    record = {"top_words": [[int(i) + 1 for i in row] for row in top], "seconds": seconds,
              "load_seconds": load_s, "steps": model.seconds, "docs": a.shape[0], "words": a.shape[1], "k": args.k,
              "sample": args.sample, "memory_budget_bytes": rt.memory_budget_bytes, "peak_rss_bytes": peak_rss,
              "topic_sizes": np.bincount(model.labels, minlength=args.k).tolist(),
              **{key: v for key, v in model.stats.items()}}
    if truth is not None:
        mean, worst, _ = flash.recovery_error(model.topic_word, truth)
        record.update(recovery_l1_mean=mean, recovery_l1_max=worst)
        print(f"flash topics: recovery error (L1 per topic, matched): mean {mean:.4f}, max {worst:.4f}",
              file=sys.stderr)
    st = model.stats
    print(summary(f"flash topics: k={args.k}, {st['svd_operator_columns']} SVD operator columns, "
                   f"{st['lloyd_iterations']} k-means iterations on B, {st['row_passes']} row-block passes over A",
                   st, seconds, rt, f" (load {load_s:.2f} s, flash kernels {st['kernel_seconds']:.2f} s)", blas=False),
          file=sys.stderr)
    if args.json:
        write_json(args.json, record)
    if args.out:
        with atomic_path(args.out) as tmp:
            with open(tmp, "wb") as f:  # a file object: savez adds no ".npz" to the name
                ids = {k: v for k, v in (("doc_ids", doc_ids), ("word_ids", word_ids)) if v is not None}
                np.savez(f, topic_word=model.topic_word, labels=model.labels, **ids)
    return 0


def _corpus(args) -> int:
    import numpy as np

    from .. import flash
    from .._atomic import atomic_path

    truth_path = args.truth or flash.truth_path(args.out)
    t0 = time.perf_counter()
    m = flash.planted_topics(args.words, args.topics, beta=args.beta, seed=args.seed)
    last = [0.0]

    def progress(done, total, nnz):
        now = time.perf_counter() - t0
        if not args.quiet and (done == total or now - last[0] >= 5.0):
            last[0] = now
            print(f"flash corpus: {done}/{total} documents, {nnz} entries, {now:.1f} s", file=sys.stderr, flush=True)

    nnz = flash.write_corpus(args.out, m, args.docs, alpha=args.alpha, mean_length=args.length, seed=args.seed,
                             progress=progress)
    with atomic_path(truth_path) as tmp:
        with open(tmp, "wb") as f:
            np.save(f, m)
    print(f"flash corpus: wrote {args.out} ({args.docs} documents x {args.words} words, {nnz} entries) and "
          f"{truth_path} (the {args.words} x {args.topics} topic matrix) in {time.perf_counter() - t0:.1f} s",
          file=sys.stderr)
    return 0


class _Progress:
    """Polls a runtime's live counters from the main thread while ``work`` runs in another
    (which releases the GIL), and shows them on stderr: a tqdm bar of tasks on a terminal, a
    line every few seconds otherwise (logs get no carriage-return frames). Wakes every
    ``interval`` seconds; no busy-waiting."""

    def __init__(self, rt, label: str, show: bool, interval: float = 0.25):
        self.rt, self.label, self.show, self.interval = rt, label, show, interval
        self.start = rt.progress
        self.t0 = time.perf_counter()
        self.bar = None

    def run(self, work):
        result: dict = {}

        def target():
            try:
                result["value"] = work()
            except BaseException as e:  # re-raised in the caller's thread
                result["error"] = e

        thread = threading.Thread(target=target, name="scalefree-flash-work", daemon=True)
        thread.start()
        if self.show:
            from .._progress import bar

            self.bar = bar(0, self.label, " tasks", every=5.0)
        try:
            while thread.is_alive():
                thread.join(self.interval)
                if self.show:
                    self._draw()
            if self.show:
                self._draw()
        finally:
            if self.bar is not None:
                self.bar.close()
        if "error" in result:
            raise result["error"]
        return result["value"]

    def counters(self):
        now = self.rt.progress
        return tuple(n - s for n, s in zip(now, self.start))

    def _draw(self):
        added, done, read, written = self.counters()
        elapsed = time.perf_counter() - self.t0
        rate = (read + written) / elapsed / 1e9 if elapsed > 0 else 0.0
        self.bar.total = added
        self.bar.n = done
        self.bar.set_postfix_str(f"read {gib(read)}, wrote {gib(written)}, {rate:.2f} GB/s", refresh=False)
        self.bar.refresh()


def _svd(args) -> int:
    import numpy as np

    from .. import flash
    from .._atomic import atomic_path, write_json
    from .._rss import peak_rss_bytes, return_freed_memory
    from ..errors import ScalefreeError

    return_freed_memory()  # --memory bounds the whole process: freed row blocks go back
    try:
        rt = flash.Runtime(memory_budget=args.memory, threads=args.threads, dir=args.dir)
        t0 = time.perf_counter()
        a = flash.load(args.data, rt, dtype=args.dtype, delimiter=args.delimiter, header=args.header)
        load_s = time.perf_counter() - t0
        print(f"flash svd: {args.data}: {a!r}, loaded in {load_s:.2f} s; budget {rt.memory_budget_bytes} bytes",
              file=sys.stderr)
        stats: dict = {}
        t0 = time.perf_counter()
        progress = _Progress(rt, "flash svd", show=not args.quiet)
        if args.out:
            u, s, vt = progress.run(lambda: flash.svds(a, k=args.k, tol=args.tol, runtime=rt, stats=stats,
                                                       u_on_flash=True))
        else:
            s = progress.run(lambda: flash.svds(a, k=args.k, tol=args.tol, runtime=rt, stats=stats,
                                                return_singular_vectors=False))
        solve_s = time.perf_counter() - t0
    except (ScalefreeError, ValueError, OSError) as e:
        fail("scalefree flash svd", message(e))
    order = np.argsort(s)[::-1]
    for v in np.asarray(s)[order]:
        print(f"{v:.10g}")
    print(summary(f"flash svd: k={args.k}, {stats['operator_columns']} operator columns, {stats['restarts']} restarts",
                   stats, solve_s, rt, f" (flash kernels {stats['kernel_seconds']:.2f} s)", blas=False), file=sys.stderr)
    if args.out:
        with atomic_path(args.out) as tmp:
            with open(tmp, "wb") as f:  # a file object: savez adds no ".npz" to the name
                if isinstance(u, flash.Matrix):  # u did not fit the budget: copied a row block at a time
                    _savez_flash(f, u, order, s=s[order], vt=vt[order], block_bytes=rt.memory_budget_bytes // 4)
                else:
                    np.savez(f, u=u[:, order], s=s[order], vt=vt[order])
    if args.json:
        doc = {"data": args.data, "k": args.k, "singular_values": [float(v) for v in np.asarray(s)[order]],
               "load_seconds": load_s, "seconds": solve_s, "memory_budget_bytes": rt.memory_budget_bytes,
               "peak_rss_bytes": peak_rss_bytes(),
               **{key: v for key, v in stats.items() if isinstance(v, (int, float, str))}}
        write_json(args.json, doc)
    return 0


def _savez_flash(f, u, order, *, block_bytes, **arrays) -> None:
    """``np.savez(f, u=u[:, order], **arrays)`` for a flash matrix ``u``, read a row block of at
    most ``block_bytes`` at a time (the same uncompressed ``.npz``: ``np.load`` reads it)."""
    import zipfile

    import numpy as np

    rows, cols = u.shape
    step = max(1, block_bytes // max(1, cols * u.dtype.itemsize))
    with zipfile.ZipFile(f, "w", zipfile.ZIP_STORED, allowZip64=True) as zf:
        with zf.open("u.npy", "w", force_zip64=True) as out:
            np.lib.format.write_array_header_1_0(out, {"descr": np.lib.format.dtype_to_descr(u.dtype),
                                                       "fortran_order": False, "shape": (rows, cols)})
            for lo in range(0, rows, step):
                blk = u.read_block(lo, 0, min(step, rows - lo), cols)
                out.write(np.ascontiguousarray(blk[:, order]).tobytes())
        for name, a in arrays.items():
            with zf.open(f"{name}.npy", "w", force_zip64=True) as out:
                np.lib.format.write_array(out, np.asarray(a), allow_pickle=False)


def _gemm(args) -> int:
    import numpy as np

    from .. import flash
    from ..errors import ScalefreeError

    try:
        (a_shape, _, a_dt, _), (b_shape, _, b_dt, _) = flash.npy_header(args.a), flash.npy_header(args.b)
        for path, shape, dt in ((args.a, a_shape, a_dt), (args.b, b_shape, b_dt)):
            if len(shape) != 2:
                raise ValueError(f"{path}: gemm takes 2-D matrices, the array has shape {shape}")
            if dt not in (np.float32, np.float64) or not dt.isnative:
                raise ValueError(f"{path}: gemm takes native float32/float64 arrays, not {dt}")
        if a_dt != b_dt:
            raise ValueError(f"{args.a} is {a_dt} but {args.b} is {b_dt}; convert one first")
        m, k = (a_shape[1], a_shape[0]) if args.transpose_a else a_shape
        k2, n = (b_shape[1], b_shape[0]) if args.transpose_b else b_shape
        if k != k2:
            raise ValueError(f"shape mismatch: op(A) is {m}x{k} ({args.a}: {a_shape[0]}x{a_shape[1]}"
                             f"{', transposed' if args.transpose_a else ''}) but op(B) is {k2}x{n} "
                             f"({args.b}: {b_shape[0]}x{b_shape[1]}{', transposed' if args.transpose_b else ''})")
        for path in (args.a, args.b):
            if os.path.exists(args.out) and os.path.samefile(path, args.out):
                raise ValueError(f"the output {args.out} is also an input")
        rt = flash.Runtime(memory_budget=args.memory, threads=args.threads, dir=args.dir, blas=args.blas)
        A, B = flash.Matrix.open_npy(args.a, rt), flash.Matrix.open_npy(args.b, rt)
        C = flash.Matrix.create_npy(args.out, (m, n), a_dt, rt)
        print(f"flash gemm: C ({m}x{n}) = {args.alpha:g} {'A^T' if args.transpose_a else 'A'} "
              f"{'B^T' if args.transpose_b else 'B'}, k = {k}, {a_dt}; budget {rt.memory_budget_bytes} bytes",
              file=sys.stderr)
        stats: dict = {}
        t0 = time.perf_counter()
        _Progress(rt, "flash gemm", show=not args.quiet).run(
            lambda: flash.gemm(A, B, C, alpha=args.alpha, trans_a=args.transpose_a, trans_b=args.transpose_b,
                               runtime=rt, stats=stats))
        seconds = time.perf_counter() - t0
        C.publish()
    except (ScalefreeError, ValueError, OSError) as e:
        fail("scalefree flash gemm", message(e))
    gflops = 2.0 * m * n * k / seconds / 1e9 if seconds > 0 else 0.0
    print(summary(f"flash gemm: wrote {args.out}", stats, seconds, rt, f", {gflops:.1f} GFLOP/s"), file=sys.stderr)
    return 0
