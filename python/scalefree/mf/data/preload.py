"""Rating blocks on flash within a memory budget (the Rima paper, section III-D), read through
the flash runtime's program cache.

With a memory budget, a rank does not keep its rating blocks in memory. At set-up it writes
the blocks its schedule visits to one block file (:class:`BlockFile`; packed records, each
block at a 4 KiB boundary, the gaps holes that read as zeros). The file is anonymous — created
already unlinked — so nothing is left on disk however the process ends, a crash or ``kill -9``
included.

The schedule is fixed in advance (Rima's pattern sequence follows from the shared seed,
dsgd-ps's permutations too), so the rank knows every block it will train, in order. A
:class:`Preloader` hands the whole sequence to a ``_native.FlashBlockReader`` — the flash
runtime's program cache (``scalefree_flash::CacheReader``) over the block file — which reads
the blocks with the runtime's IO executor (O_DIRECT where the file system takes it, whole 4 KiB
pages straight into aligned cache buffers; through the page cache elsewhere) and prefetches
the next visits in order as far as its budget allows, while the trainer computes and the ring
communicates. One out-of-core mechanism for the library: the flash kernels' cache, budget and
executor.

The trainer copies each block, in a fresh random order, into one scratch buffer of the largest
block (the kernel's shuffle-and-copy pass, as for an in-memory block), so the cache's copy
stays intact for a later hit. ``rating bytes resident`` are the cache's buffers (padded to
whole 4 KiB pages) plus that scratch buffer: the budget covers both, so it must hold two of
the largest blocks.

Since the whole sequence is known, the preloader also decides which blocks to keep between
their visits (:func:`retention_plan`: Belady's rule, evict the block used farthest ahead, with
bypass — a block used later than everything kept is not kept). A rima rank's 2w visits of an
iteration cycle through 2w distinct blocks; a cache of fewer than that, refilled in visit order
and evicting the least recently used, would read every visit from flash. Kept blocks stay in
the cache's buffers (held by the preloader, so the same budget counts them) and are handed
out again without a read; the rest of the cache streams the other visits ahead. Only the
visits that are not kept go through the reader's read-ahead.
"""

from __future__ import annotations

import os
import tempfile
import threading

import numpy as np

from ... import _native
from ..._rss import trim_heap
from ..._units import human_bytes, parse_positive_bytes
from ...errors import InvalidArgumentError, OutOfBudgetError
from .blocks import ENTRY_BYTES


def parse_bytes(text) -> int:
    """A memory budget: ``"64M"``, ``"1.5G"``, ``"4096"`` or an int, at least one byte."""
    return parse_positive_bytes(text, "memory budget")


def _mib(n: int) -> str:
    return f"{human_bytes(n)} ({n} bytes)"


def outside_arena(fn):
    """``fn()`` on a helper thread, so the arrays it allocates come from the C allocator
    rather than the rank's registered arena (numpy's allocator is per thread context), and what
    it frees goes back to the system — set-up transients then leave no resident memory behind."""
    box: dict = {}

    def run():
        try:
            box["value"] = fn()
        except BaseException as e:  # re-raised in the caller
            box["error"] = e

    t = threading.Thread(target=run, name="scalefree-mf-setup")
    t.start()
    t.join()
    if "error" in box:
        raise box["error"]
    trim_heap()
    return box["value"]


ALIGN = 4096  # blocks start on page boundaries and are read as whole pages


def padded(nbytes: int) -> int:
    """``nbytes`` of ratings as laid out and read: rounded up to whole 4 KiB pages."""
    return -(-int(nbytes) // ALIGN) * ALIGN


def min_budget(largest_block_bytes: int) -> int:
    """The smallest budget that trains a block of ``largest_block_bytes`` ratings: its pages in
    the cache and its shuffled copy in the scratch buffer."""
    return padded(largest_block_bytes) + int(largest_block_bytes)


class BlockFile:
    """A rank's R blocks in one anonymous file, each at a recorded 4 KiB-aligned offset (the
    gaps are holes: they read as zeros). Written with plain ``pwrite`` at set-up; read through
    the flash runtime (:class:`Preloader`). :meth:`span` is the bytes a block takes in the
    cache."""

    def __init__(self, directory: str | os.PathLike | None = None):
        if directory is not None and not os.path.isdir(directory):
            raise InvalidArgumentError(f"block directory {str(directory)!r} does not exist")
        self._f = tempfile.TemporaryFile(prefix="scalefree-mf-blocks-", dir=directory)
        self.fd = self._f.fileno()
        self.directory = directory or tempfile.gettempdir()
        self.index: dict[int, tuple[int, int]] = {}  # block → (byte offset, ratings)
        self.size = 0

    @property
    def path(self) -> str:
        """A path that opens this (unlinked) file."""
        return f"/proc/self/fd/{self.fd}"

    def span(self, block: int) -> int:
        return padded(self.index[block][1] * ENTRY_BYTES)

    def append(self, block: int, entries) -> None:
        """Block ``block``'s records: an ``(n, 3)`` uint32 array, or an iterable of them written
        one after another (a block laid out in pieces, never whole in memory twice)."""
        parts = [entries] if isinstance(entries, np.ndarray) else entries
        at = self.size
        n = 0
        try:
            for part in parts:
                data = memoryview(np.ascontiguousarray(part).reshape(-1).view(np.uint8))
                off = 0
                while off < len(data):
                    off += os.pwrite(self.fd, data[off:], at + off)
                at += len(data)
                n += len(part)
        except OSError as e:
            raise OSError(e.errno, f"writing R block {block} to the block file in {self.directory}: {e.strerror}") from e
        self.index[block] = (self.size, n)
        self.size += padded(n * ENTRY_BYTES)

    def finish(self) -> None:
        """Everything on disk (the last block's padding too: whole-page reads), nothing of it
        left in the page cache."""
        os.ftruncate(self.fd, max(self.size, ALIGN))
        os.fsync(self.fd)
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(self.fd, 0, 0, os.POSIX_FADV_DONTNEED)

    def close(self) -> None:
        self._f.close()


def retention_plan(seq: list[int], spans: dict[int, int], room: int) -> tuple[list[bool], list[bool], list[list[int]]]:
    """Which visits of ``seq`` (block ids, in order) keep their block for its next visit, with
    at most ``room`` bytes (``spans[b]`` each) kept at any time: Belady's rule with bypass.
    Returns ``(hit, keep, drop)``: visit n is served from a kept block (no read); after visit
    n its block is kept until its next visit; ``drop[n]``: kept blocks to give back after
    visit n (ahead of their next visit: something used sooner took their room)."""
    n_visits = len(seq)
    nxt = [n_visits] * n_visits
    last: dict[int, int] = {}
    for n in range(n_visits - 1, -1, -1):
        nxt[n] = last.get(seq[n], n_visits)
        last[seq[n]] = n
    hit, keep = [False] * n_visits, [False] * n_visits
    drop: list[list[int]] = [[] for _ in range(n_visits)]
    kept: dict[int, int] = {}  # block -> its next visit
    used = 0
    for n, b in enumerate(seq):
        if b in kept:
            hit[n] = True
            del kept[b]
            used -= spans[b]
        if nxt[n] == n_visits or spans[b] == 0 or spans[b] > room:
            continue
        kept[b] = nxt[n]
        used += spans[b]
        keep[n] = True
        while used > room:
            far = max(kept, key=kept.__getitem__)
            del kept[far]
            used -= spans[far]
            if far == b:
                keep[n] = False  # used later than everything kept: not kept
            else:
                drop[n].append(far)
    return hit, keep, drop


class Preloader:
    """Reads ``sequence`` (block ids, in the order they will be trained) from ``blocks``
    through the flash runtime's program cache, at most ``budget`` bytes resident with the
    trainer's scratch copy. ``get(n)`` waits for the n-th and returns its records (an
    ``(m, 3)`` read-only uint32 view, valid until ``release(n)``; train it through
    :func:`~scalefree.mf.data.blocks.train_block`, which copies it); blocks are released in
    order. Blocks are kept between visits by :func:`retention_plan` in what the cache can spare
    beyond ``STREAM_BLOCKS`` of the largest block for the read-ahead (``keep=False``: none).
    ``bytes_read``: ratings read from flash; ``bytes_reused``: handed out again from a kept
    block. ``dir``: the runtime's scratch directory (default ``SCALEFREE_FLASH_DIR`` or the
    temp directory)."""

    STREAM_BLOCKS = 3  # cache room left to the read-ahead: the visit being trained and two ahead

    def __init__(self, blocks: BlockFile, sequence: list[int], budget: int, *, scratch_bytes: int | None = None,
                 dir=None, keep: bool = True):
        self.blocks, self.seq, self.budget = blocks, [int(b) for b in sequence], int(budget)
        used = set(self.seq)
        largest = max((blocks.index[b][1] * ENTRY_BYTES for b in used), default=0)
        # The trainer's scratch copy: the partition's largest block (all ranks alike) or this
        # sequence's.
        self.scratch_bytes = int(largest if scratch_bytes is None else scratch_bytes)
        cache = self.budget - self.scratch_bytes
        big = max(used, key=lambda b: blocks.span(b), default=None)
        if big is not None and blocks.span(big) > cache:
            nbytes = blocks.index[big][1] * ENTRY_BYTES
            raise OutOfBudgetError(
                f"memory budget {_mib(self.budget)} is smaller than two R blocks: the largest block this "
                f"rank trains holds {_mib(nbytes)} ({blocks.span(big)} bytes as whole 4 KiB pages in the cache, "
                f"and a shuffled copy of {self.scratch_bytes} bytes is trained); raise the budget to at least "
                f"{blocks.span(big) + self.scratch_bytes} bytes or cut R into more blocks")
        self._rt = _native.FlashRuntime(max(cache, 1), 1, None if dir is None else os.fspath(dir), "")
        self._reader = _native.FlashBlockReader(self._rt, blocks.path, max(cache, 1))
        self._at = 0  # next visit to hand out
        self._held: dict[int, object] = {}  # visit → FlashBlock
        self._kept: dict[int, object] = {}  # block → FlashBlock kept for its next visit
        self._next_free = 0
        self._wait_at_close = 0.0
        self.bytes_read = self.bytes_reused = 0
        self._empty = np.zeros((0, 3), np.uint32)
        spans = {b: blocks.span(b) for b in used}
        largest_span = max(spans.values(), default=0)
        room = max(cache - self.STREAM_BLOCKS * largest_span, 0) if keep else 0
        self._hit, self._keep, self._drop = retention_plan(self.seq, spans, room)
        offs = [blocks.index[b][0] for b in self.seq]
        lens = [spans[b] for b in self.seq]
        # The visits read from flash, in order: not the empty blocks, not those kept.
        reads = [i for i, b in enumerate(self.seq) if blocks.index[b][1] and not self._hit[i]]
        self._reader.push_ahead([offs[i] for i in reads], [lens[i] for i in reads])
        self._reader.reset_peak()
        self._direct = bool(self._reader.direct)
        # The runtime's IO threads need a core now and then while the trainer waits for its
        # ring partners: waits skip their yield phase meanwhile (spin, then park).
        self._helper = _native.HelperThread()

    @property
    def direct(self) -> bool:
        """Whether the blocks are read with O_DIRECT (else through the page cache)."""
        return self._direct

    @property
    def wait_seconds(self) -> float:
        """Time ``get`` has waited for reads (or memory) so far (the reader's count: no
        per-block bookkeeping here)."""
        return self._wait_at_close if self._reader is None else float(self._reader.stats()["wait_seconds"])

    @property
    def resident(self) -> int:
        """Bytes held now: the cache's buffers and the scratch copy."""
        return int(self._reader.stats()["resident_bytes"]) + self.scratch_bytes

    def take_peak(self) -> int:
        """Peak bytes held since the last call (or the start), then a new peak starts."""
        peak = int(self._reader.stats()["peak_resident_bytes"]) + self.scratch_bytes
        self._reader.reset_peak()
        return peak

    def stats(self) -> dict:
        """The reader's counters (``_native.FlashBlockReader.stats``)."""
        return dict(self._reader.stats())

    def get(self, n: int) -> np.ndarray:
        if self._reader is None:
            raise InvalidArgumentError("preloader is closed")
        if n != self._at:
            raise InvalidArgumentError(f"blocks are fetched in order: expected visit {self._at}, got {n}")
        self._at += 1
        b = self.seq[n]
        off, count = self.blocks.index[b]
        if count == 0:
            return self._empty
        if self._hit[n]:
            if b not in self._kept:
                raise InvalidArgumentError(f"visit {n} reuses block {b} kept at an earlier visit: release that visit first")
            block = self._kept.pop(b)
            self.bytes_reused += count * ENTRY_BYTES
        else:
            block = self._reader.get(off, self.blocks.span(b))
            self.bytes_read += count * ENTRY_BYTES
        self._held[n] = block
        return np.frombuffer(block, np.uint32, count=count * 3).reshape(-1, 3)

    def release(self, n: int) -> None:
        """Hands visit ``n``'s block back to the cache (once the arrays made from it are gone)."""
        if n != self._next_free:
            raise InvalidArgumentError(f"blocks are released in order: expected visit {self._next_free}, got {n}")
        self._next_free += 1
        block = self._held.pop(n, None)
        if block is not None:
            if self._keep[n]:
                self._kept[self.seq[n]] = block  # for its next visit
            else:
                block.release()
        for b in self._drop[n]:
            self._kept.pop(b).release()

    def close(self) -> None:
        """Stops prefetching and frees the cache (idempotent)."""
        if self._reader is None:
            return
        self._wait_at_close = float(self._reader.stats()["wait_seconds"])
        self._reader.clear_ahead()
        for block in [*self._held.values(), *self._kept.values()]:
            block.release()
        self._held.clear()
        self._kept.clear()
        self._helper.close()
        self._reader = None
        self._rt = None
