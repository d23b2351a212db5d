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

from pathlib import Path

import numpy as np

from . import _native
from .errors import DataError

_END = np.uint64(2**64 - 1)  # the stream is done
_NONE = np.uint64(2**64 - 2)  # no chunk for this rank in this round


def _is_gzip(path) -> bool:
    with open(path, "rb") as f:
        return f.read(2) == b"\x1f\x8b"


def single_gzip_stream(path, kind: str, delimiter: str | None = None, header: str = "auto",
                       chunk_bytes: int = 4 << 20, **kw):
    """The opened ``_native.TextStream`` if ``path`` is one text file in one gzip stream (which
    ranks cannot split), else None."""
    p = Path(path)
    if not p.is_file() or not _is_gzip(p):
        return None
    stream = _native.TextStream(str(p), kind, delimiter, header, chunk_bytes, **kw)
    return stream if stream.is_single_stream() else None


def stream_share(group, stream) -> list[tuple]:
    """Collective: the pieces this rank parsed of ``stream`` (opened on every rank), each what
    ``stream.take()`` returns; rank 0 parses none. No rank holds more than a round of text
    besides what it parsed. Raises on the rank that met the error, after the last round
    (module doc)."""
    P, me = group.size, group.rank
    got: list[tuple] = []
    error: Exception | None = None
    while True:
        counts = np.zeros(P, np.int64)
        done = False
        if me == 0:
            try:
                lines, lens, data = stream.read_chunks(P - 1)
            except (DataError, OSError) as e:
                error, lines, lens, data = e, [], [], np.zeros(0, np.uint8)
            done = len(lens) == 0
            heads = np.full(P - 1, _END if done else _NONE, np.uint64)
            heads[:len(lines)] = lines
            pieces, at = [], 0
            for r in range(1, P):
                n = int(lens[r - 1]) if r - 1 < len(lens) else 0
                pieces += [heads[r - 1:r].view(np.uint8), np.asarray(data[at:at + n], np.uint8)]
                at += n
                counts[r] = 8 + n
            send = np.concatenate(pieces)
        else:
            send = np.zeros(0, np.uint8)
        received = group.alltoallv(send, counts)
        if me == 0:
            if done:
                break
            continue
        head = received[:8].view(np.uint64)[0]
        if head == _END:
            break
        if head != _NONE and error is None:
            try:
                stream.parse(received[8:], int(head))
                got.append(stream.take())
            except DataError as e:
                error = e
    if error is not None:
        raise error
    return got
