"""Planted-topic corpora (LDA's generative process with a known topic matrix), written as
UCI ``docword`` files in a stream, and the recovery error of a learned topic matrix.

``planted_topics(words, k, beta, seed)``: ``k`` topics, each a Dirichlet(``beta``) draw over
the ``words`` (``words x k``, columns sum to 1).

``write_corpus(path, topic_word, docs, ...)``: for each document, topic weights ``theta ~
Dirichlet(alpha)``, a length ``~ Poisson(mean_length)`` (at least 1), its tokens' topics
``~ Multinomial(length, theta)`` and each token's word from its topic's column; the counts
per (document, word) are written as ``docID wordID count`` lines (1-based, documents in
order), ``chunk`` documents at a time, so a corpus of any size is written in
``O(chunk * mean_length + words * k)`` memory. The header's NNZ is padded to a fixed width and
filled in at the end (the file is written under a temporary name and renamed when complete).

``recovery_error(learned, true)``: topics matched one to one by the Hungarian method
(``scipy.optimize.linear_sum_assignment``) on the L1 distances of their columns (each
normalised to sum 1); returns the mean and the largest L1 distance of the matched pairs and
the matching.
"""

from __future__ import annotations

import os

import numpy as np

from ..errors import InvalidArgumentError

_NNZ_WIDTH = 20


def truth_path(corpus) -> str:
    """Where ``scalefree flash corpus`` saves a corpus's topic matrix: its name with
    ``.topics.npy`` for ``.txt``."""
    corpus = os.fspath(corpus)
    return (corpus[:-4] if corpus.endswith(".txt") else corpus) + ".topics.npy"


def planted_topics(words: int, k: int, beta: float = 0.01, seed: int = 0) -> np.ndarray:
    """``words x k`` topic matrix, each column a Dirichlet(``beta``) draw."""
    if words < 2 or k < 1:
        raise InvalidArgumentError(f"planted topics need at least 2 words and 1 topic, got {words} words, {k} topics")
    if not beta > 0:
        raise InvalidArgumentError(f"beta must be > 0, got {beta}")
    rng = np.random.default_rng([seed, 1])
    m = rng.dirichlet(np.full(words, float(beta)), size=k).T
    return np.ascontiguousarray(m / m.sum(axis=0, keepdims=True))


def write_corpus(path, topic_word: np.ndarray, docs: int, *, alpha: float | None = None, mean_length: float = 100.0,
                 seed: int = 0, chunk: int = 20000, progress=None) -> int:
    """Writes ``docs`` documents drawn from ``topic_word`` (``words x k``) to the docword file
    ``path``; returns the number of entries (distinct document-word pairs). ``alpha``: the
    Dirichlet parameter of each document's topic weights (default ``1/k``: the weights sum to
    one draw's worth, so most documents have a dominant topic)."""
    from .._atomic import atomic_path

    words, k = topic_word.shape
    if alpha is None:
        alpha = 1.0 / k
    if docs < 1:
        raise InvalidArgumentError(f"a corpus needs at least 1 document, got {docs}")
    if not alpha > 0 or not mean_length > 0:
        raise InvalidArgumentError(f"alpha and mean_length must be > 0, got {alpha}, {mean_length}")
    path = os.fspath(path)
    if path.endswith(".gz"):
        raise InvalidArgumentError(f"{path}: the corpus is written as plain text (compress it afterwards)")
    rng = np.random.default_rng([seed, 2])
    cum = np.cumsum(topic_word, axis=0).T.copy()  # k x words
    cum[:, -1] = 1.0
    nnz = 0
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as f:
            f.write(f"{docs}\n{words}\n".encode())
            nnz_at = f.tell()
            f.write(b" " * _NNZ_WIDTH + b"\n")
            for lo in range(0, docs, chunk):
                n = min(chunk, docs - lo)
                theta = rng.dirichlet(np.full(k, float(alpha)), size=n)
                lengths = np.maximum(rng.poisson(mean_length, size=n), 1)
                per_topic = rng.multinomial(lengths, theta)  # n x k token counts
                doc_parts, word_parts = [], []
                for t in range(k):
                    c = per_topic[:, t]
                    total = int(c.sum())
                    if total == 0:
                        continue
                    w = np.searchsorted(cum[t], rng.random(total), side="right")
                    doc_parts.append(np.repeat(np.arange(n, dtype=np.int64), c))
                    word_parts.append(np.minimum(w, words - 1))
                key = np.concatenate(doc_parts) * words + np.concatenate(word_parts)
                key, counts = np.unique(key, return_counts=True)
                d, w = np.divmod(key, words)
                rows = np.empty((len(key), 3), dtype=np.int64)
                rows[:, 0], rows[:, 1], rows[:, 2] = d + lo + 1, w + 1, counts
                f.write((("%d %d %d\n" * len(key)) % tuple(rows.ravel().tolist())).encode())
                nnz += len(key)
                if progress is not None:
                    progress(lo + n, docs, nnz)
            f.seek(nnz_at)
            f.write(f"{nnz:>{_NNZ_WIDTH}d}".encode())
    return nnz


def recovery_error(learned: np.ndarray, true: np.ndarray):
    """``(mean L1, max L1, matching)`` between the columns of ``learned`` and ``true``
    (``words x k`` each, normalised to sum 1), matched one to one by the Hungarian method;
    ``matching[j]`` is the learned topic matched to true topic ``j``."""
    from scipy.optimize import linear_sum_assignment

    learned, true = np.asarray(learned), np.asarray(true)
    if learned.shape != true.shape:
        raise InvalidArgumentError(f"recovery_error: shapes differ, {learned.shape} and {true.shape}")
    sa = np.maximum(learned.sum(axis=0, dtype=np.float64), 1e-300)
    sb = np.maximum(true.sum(axis=0, dtype=np.float64), 1e-300)
    words, k = learned.shape
    # A block of words at a time (a few MiB), not float64 copies of both words x k matrices:
    # `flash topics --truth` scores within the command's memory budget.
    cost = np.zeros((k, k))
    step = max(1, (1 << 20) // max(1, k * k))
    for lo in range(0, words, step):
        a = np.asarray(learned[lo:lo + step], dtype=np.float64) / sa
        b = np.asarray(true[lo:lo + step], dtype=np.float64) / sb
        cost += np.abs(a[:, :, None] - b[:, None, :]).sum(axis=0)
    rows, cols = linear_sum_assignment(cost)
    matched = cost[rows, cols]
    matching = np.empty(k, dtype=np.int64)
    matching[cols] = rows
    return float(matched.mean()), float(matched.max()), matching
