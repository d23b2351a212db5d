"""A text file in one gzip stream, read by one rank and parsed by the others: one gzip
member cannot be split by bytes or members, so instead of every rank decompressing all of it
(the share readers' fallback), rank 0 decompresses it once and hands its chunks (about
``chunk_bytes`` of text, cut at line ends) to ranks 1 .. P-1 in turn, one round of
``alltoallv`` per P-1 chunks; the receivers parse them while rank 0 decompresses the next
round (``_native.TextStream``). Used by the graph, MF and sgd readers alike (``kind``:
``"edges"``, ``"ratings"``, ``"svmlight"``).

Errors keep the rounds going: a receiver that meets a bad line drops the rest of what it gets
and raises once the stream ends; a corrupt or truncated stream ends the rounds on rank 0,
which raises after telling the others. So every rank leaves :func:`stream_share` at the same
round, and a caller's next collective (``agree``) sees the error."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from . import _native
from .errors import DataError

_END = np.uint64(2**64 - 1)  # the stream is done
_NONE = np.uint64(2**64 - 2)  # no chunk for this rank in this round

# Text per round of chunks: each round costs a collective whatever its size, so a round
# carries about this much however many ranks parse (4 MiB chunks at 2 ranks made about 260 rounds
# of 1 GB, and the job's read took longer than decompressing and parsing on one rank).
ROUND_BYTES = 48 << 20
MIN_CHUNK_BYTES = 4 << 20


def chunk_bytes_for(ranks: int) -> int:
    """The chunk size that makes a round of ``ranks - 1`` chunks about :data:`ROUND_BYTES`."""
    return max(MIN_CHUNK_BYTES, ROUND_BYTES // max(1, int(ranks) - 1))


def _is_gzip(path) -> bool:
    with open(path, "rb") as f:
        return f.read(2) == b"\x1f\x8b"


def single_gzip_stream(path, kind: str, delimiter: str | None = None, header: str = "auto", ranks: int = 2,
                       chunk_bytes: int | None = None, **kw):
    """The opened ``_native.TextStream`` if ``path`` is one text file in one gzip stream (which
    ranks cannot split), else None. ``chunk_bytes`` defaults to :func:`chunk_bytes_for`
    ``(ranks)``."""
    p = Path(path)
    if not p.is_file() or not _is_gzip(p):
        return None
    chunk_bytes = chunk_bytes_for(ranks) if chunk_bytes is None else int(chunk_bytes)
    stream = _native.TextStream(str(p), kind, delimiter, header, chunk_bytes, **kw)
    return stream if stream.is_single_stream() else None


def stream_share(group, stream) -> list[tuple]:
    """Collective: what this rank parsed of ``stream`` (opened on every rank), as a list of
    what ``stream.take()`` returns: one item on a parsing rank, none on rank 0, which
    decompresses the next round on a thread while the current one is sent (the
    decompression releases the GIL). No rank holds more than two rounds of text besides what
    it parsed. Raises on the rank that met the error, after the last round (module doc)."""
    if group.rank != 0:
        return _receive(group, stream)
    with ThreadPoolExecutor(1, thread_name_prefix="scalefree-inflate") as pool:
        return _hand_out(group, stream, pool)


def _hand_out(group, stream, pool) -> list[tuple]:
    """Rank 0's side of :func:`stream_share`."""
    P = group.size
    error: Exception | None = None
    ahead = pool.submit(stream.read_chunks, P - 1)
    while True:
        counts = np.zeros(P, np.int64)
        try:
            lines, lens, data = ahead.result()
        except (DataError, OSError) as e:
            error, lines, lens, data = e, [], [], np.zeros(0, np.uint8)
        done = len(lens) == 0
        if not done:
            ahead = pool.submit(stream.read_chunks, P - 1)
        heads = np.full(P - 1, _END if done else _NONE, np.uint64)
        heads[:len(lines)] = lines
        pieces, at = [], 0
        for r in range(1, P):
            n = int(lens[r - 1]) if r - 1 < len(lens) else 0
            pieces += [heads[r - 1:r].view(np.uint8), np.asarray(data[at:at + n], np.uint8)]
            at += n
            counts[r] = 8 + n
        group.alltoallv(np.concatenate(pieces), counts)
        if done:
            break
    if error is not None:
        raise error
    return []


def _receive(group, stream) -> list[tuple]:
    """A parsing rank's side of :func:`stream_share`: the chunks are parsed into the stream's
    own growing arrays and taken once at the end (no second copy of the share to join pieces)."""
    P = group.size
    error: Exception | None = None
    counts = np.zeros(P, np.int64)
    while True:
        received = group.alltoallv(np.zeros(0, np.uint8), counts)
        head = received[:8].view(np.uint64)[0]
        if head == _END:
            break
        if head != _NONE and error is None:
            try:
                stream.parse(received[8:], int(head))
            except DataError as e:
                error = e
        del received
    if error is not None:
        raise error
    return [stream.take()]
