"""Extreme multi-label data sets with power-law label frequencies, at any scale, written in the
Extreme Classification Repository's text format (``N F L`` header, then ``l1,l2 f:v ...``).

Label ``l`` (0-based) is drawn with probability proportional to ``(l + 1) ** -alpha`` (the
head-and-long-tail frequencies of real XML sets). Each label has a prototype: ``prototype``
feature ids drawn from a Zipf-like law over the features (so frequent features are shared
between labels). A point has ``1 + Poisson(mean_labels - 1)`` labels (distinct); for each, it
draws ``features_per_label`` features from that label's prototype, plus ``noise`` features
from the global law; a feature drawn ``c`` times gets the value ``1 + ln c``. Points are made
and written ``chunk`` at a time: memory is one chunk plus the prototypes (``labels x
prototype`` ids), whatever ``points`` is. The same seed gives the same file; ``first_point``
lets a test set continue a training set's stream without repeating it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from .._atomic import atomic_path
from ..errors import InvalidArgumentError


@dataclass(frozen=True)
class XmlDataSpec:
    """The law of a generated data set (the same spec and seed make the same points)."""

    features: int = 100_000
    labels: int = 30_000
    alpha: float = 1.0
    mean_labels: float = 3.0
    prototype: int = 24
    features_per_label: int = 12
    noise: int = 12
    seed: int = 0


def _feature_law(n: int, rng) -> np.ndarray:
    """A Zipf-like cumulative law over ``n`` feature ids, ids shuffled so frequency is not id order."""
    weights = 1.0 / np.arange(1, n + 1) ** 0.8
    perm = rng.permutation(n)
    w = np.empty(n)
    w[perm] = weights
    return np.cumsum(w / w.sum())


class _Law:
    def __init__(self, spec: XmlDataSpec):
        if spec.features < 1 or spec.labels < 1 or spec.mean_labels < 1 or spec.prototype < 1:
            raise InvalidArgumentError("features, labels, prototype >= 1 and mean_labels >= 1 are required")
        rng = np.random.default_rng([spec.seed, 0])
        self.spec = spec
        self.feature_cdf = _feature_law(spec.features, rng)
        lw = 1.0 / np.arange(1, spec.labels + 1) ** spec.alpha
        self.label_cdf = np.cumsum(lw / lw.sum())
        self.prototypes = np.searchsorted(self.feature_cdf, rng.random((spec.labels, spec.prototype)), side="right")
        np.minimum(self.prototypes, spec.features - 1, out=self.prototypes)

    def chunk(self, first: int, n: int):
        """Points ``first .. first + n``: (label_ptr, labels, indptr, indices, values)."""
        s = self.spec
        rng = np.random.default_rng([s.seed, 1, first])
        n_labels = np.minimum(1 + rng.poisson(s.mean_labels - 1, n), s.labels)
        owner = np.repeat(np.arange(n), n_labels)
        lab = np.minimum(np.searchsorted(self.label_cdf, rng.random(owner.size), side="right"), s.labels - 1)
        keys = np.unique(owner.astype(np.int64) * s.labels + lab)
        l_owner, labels = keys // s.labels, keys % s.labels
        label_ptr = np.zeros(n + 1, np.int64)
        np.cumsum(np.bincount(l_owner, minlength=n), out=label_ptr[1:])
        m = s.features_per_label
        picks = self.prototypes[np.repeat(labels, m), rng.integers(0, s.prototype, labels.size * m)]
        f_owner = np.repeat(l_owner, m)
        noise = np.minimum(np.searchsorted(self.feature_cdf, rng.random(n * s.noise), side="right"), s.features - 1)
        f_owner = np.concatenate([f_owner, np.repeat(np.arange(n), s.noise)])
        feats = np.concatenate([picks, noise])
        fkeys, counts = np.unique(f_owner.astype(np.int64) * s.features + feats, return_counts=True)
        owner_f = fkeys // s.features
        indices = fkeys % s.features
        values = (1.0 + np.log(counts)).astype(np.float32)
        indptr = np.zeros(n + 1, np.int64)
        np.cumsum(np.bincount(owner_f, minlength=n), out=indptr[1:])
        return label_ptr, labels, indptr, indices, values


def generate_xml(path, points: int, spec: XmlDataSpec = XmlDataSpec(), *, first_point: int = 0, chunk: int = 20_000) -> str:
    """Writes ``points`` points of the law ``spec`` to ``path`` (XC repository text format);
    the file appears only once complete. Returns the path."""
    if points < 1:
        raise InvalidArgumentError("points must be at least 1")
    law = _Law(spec)
    path = os.fspath(path)
    with atomic_path(path) as tmp, open(tmp, "w") as out:
        out.write(f"{points} {spec.features} {spec.labels}\n")
        for start in range(0, points, chunk):
            n = min(chunk, points - start)
            label_ptr, labels, indptr, indices, values = law.chunk(first_point + start, n)
            lab_s = labels.astype(str)
            feat_s = np.char.add(np.char.add(indices.astype(str), ":"), np.char.mod("%.4g", values))
            lines = []
            for i in range(n):
                lines.append(",".join(lab_s[label_ptr[i]:label_ptr[i + 1]]) + " " + " ".join(feat_s[indptr[i]:indptr[i + 1]]))
            out.write("\n".join(lines))
            out.write("\n")
    return path
