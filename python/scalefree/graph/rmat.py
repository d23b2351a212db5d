"""Seeded R-MAT power-law graphs: in memory, or written as an edge list."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np

from .._atomic import atomic_path
from .io import compact_edges


def rmat_block(rng, m: int, scale: int, a=0.57, b=0.19, c=0.19) -> tuple[np.ndarray, np.ndarray]:
    """``m`` R-MAT edges over ``2**scale`` vertices: at each of ``scale`` levels every edge
    picks a quadrant of the adjacency matrix with probabilities (a, b, c, 1-a-b-c)."""
    src = np.zeros(m, np.int64)
    dst = np.zeros(m, np.int64)
    for _ in range(scale):
        r = rng.random(m)
        down = r >= a + b  # quadrants c, d: source bit set
        right = ((r >= a) & (r < a + b)) | (r >= a + b + c)  # quadrants b, d: target bit set
        src = (src << 1) | down
        dst = (dst << 1) | right
    return src, dst


def rmat_blocks(scale: int, edges: int, seed: int = 0, block: int = 1 << 20):
    """Yields the (src, dst) blocks of a seeded R-MAT graph (at most ``block`` edges each).
    Vertex ids are scrambled by a fixed permutation so that high-degree vertices are not all
    small ids. The same arguments give the same edges, whatever the consumer."""
    if scale < 1 or scale > 40:
        raise ValueError(f"R-MAT scale must be in [1, 40], got {scale}")
    if edges < 0:
        raise ValueError(f"R-MAT edge count must be >= 0, got {edges}")
    rng = np.random.default_rng(seed)
    perm = np.random.default_rng([seed, 1]).permutation(1 << scale)
    done = 0
    while done < edges:
        m = min(block, edges - done)
        s, d = rmat_block(rng, m, scale)
        yield perm[s], perm[d]
        done += m


def rmat_edges(scale: int, edges: int, seed: int = 0, block: int = 1 << 20):
    """A seeded R-MAT graph in memory, read as :func:`read_edges` reads the file
    :func:`write_rmat` writes: (src, dst, ids) with compact ids, duplicate edges dropped."""
    parts = list(rmat_blocks(scale, edges, seed, block))
    src = np.concatenate([p[0] for p in parts]) if parts else np.zeros(0, np.int64)
    dst = np.concatenate([p[1] for p in parts]) if parts else np.zeros(0, np.int64)
    return compact_edges(src, dst)


def write_rmat(path, scale: int, edges: int, seed: int = 0, block: int = 1 << 20, progress: bool = True,
               parts: int = 0) -> None:
    """Writes the edges of :func:`rmat_blocks` atomically (temporary file, then rename).

    By the name of ``path``: ``.npz`` holds arrays ``src`` and ``dst`` (int32 while ids fit,
    uncompressed, so readers map slices of it); ``.gz`` a compressed SNAP edge list;
    anything else a SNAP edge list. With ``parts`` N > 0, ``path`` is a directory that
    receives N text parts ``part-00000`` ... (as Spark and Hadoop write them), the edges
    in N consecutive runs."""
    path = Path(path)
    header = f"# R-MAT scale={scale} edges={edges} seed={seed} (a,b,c)=(0.57,0.19,0.19)\n".encode()
    blocks = rmat_blocks(scale, edges, seed, block)
    from .._progress import bar as progress_bar

    bar = progress_bar(edges, "R-MAT", " edges", show=progress, unit_scale=True)

    def tick(m):
        bar.update(m)

    if parts:
        path.mkdir(parents=True, exist_ok=True)
        bounds = [edges * i // parts for i in range(parts + 1)]
        pending = (np.zeros(0, np.int64), np.zeros(0, np.int64))
        for i in range(parts):
            with atomic_path(path / f"part-{i:05d}") as tmp, open(tmp, "wb") as f:
                f.write(header)
                want = bounds[i + 1] - bounds[i]
                while want:
                    if not len(pending[0]):
                        pending = next(blocks)
                    m = min(want, len(pending[0]))
                    f.write(_edge_lines(pending[0][:m], pending[1][:m]))
                    pending = (pending[0][m:], pending[1][m:])
                    want -= m
                    tick(m)
    elif path.name.lower().endswith(".npz"):
        dt = np.int32 if scale <= 31 else np.int64
        got = []
        for s, d in blocks:
            got.append((s.astype(dt), d.astype(dt)))
            tick(len(s))
        src = np.concatenate([s for s, _ in got]) if got else np.zeros(0, dt)
        dst = np.concatenate([d for _, d in got]) if got else np.zeros(0, dt)
        del got
        with atomic_path(path) as tmp, open(tmp, "wb") as f:
            np.savez(f, src=src, dst=dst)
    else:
        opener = gzip.open if path.suffix == ".gz" else open
        with atomic_path(path) as tmp, opener(tmp, "wb") as f:
            f.write(header)
            for s, d in blocks:
                f.write(_edge_lines(s, d))
                tick(len(s))
    bar.close()


def _edge_lines(src, dst) -> bytes:
    """``src<TAB>dst`` lines."""
    if not len(src):
        return b""
    return ("\n".join(map("%d\t%d".__mod__, zip(src.tolist(), dst.tolist()))) + "\n").encode()
