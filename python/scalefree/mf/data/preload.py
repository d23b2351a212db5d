"""Preloading R blocks from disk within a memory budget (the Rima paper, section III-D).

With a memory budget, a rank does not keep its rating blocks in memory. At set-up it writes
the blocks its pattern sequence visits to one block file (:class:`BlockFile`; packed records,
each block at a known offset). The file is anonymous — created already unlinked — so nothing is
left on disk however the process ends, a crash or ``kill -9`` included.

Rima's pattern sequence is fixed in advance (the directions come from the shared seed), so the
rank knows every block it will train, in order. A :class:`Preloader` thread reads them in that
order into an arena of at most ``budget`` bytes (a ring: blocks are used in the order they are
read, so the oldest is always freed first), up to as many as fit, and the trainer frees each
block once its SGD pass is done; the reads overlap compute and the ring's communication. The
data really comes from the disk every time (rather than from memory the budget does not count):
where the file system takes it, the blocks are read with O_DIRECT — each block starts on a 4 KiB
boundary in the file and is read as whole 4 KiB pages straight into a page-aligned place in the
arena, bypassing the page cache (no copy out of it, nothing to drop: far less loader CPU).
Where O_DIRECT is refused (EINVAL, e.g. tmpfs), the blocks are packed and read through the page
cache, and the file's pages are dropped from it after each read.

``rating bytes resident`` are the bytes of blocks held in the arena (read ahead or in use),
counted as they are read: padded to whole 4 KiB pages with O_DIRECT, so the budget must hold
the largest block's padded size. The arena itself is ``min(budget, block file size)`` bytes
(plus at most 4 KiB to start it on a page boundary), touched once at start-up.
"""

from __future__ import annotations

import collections
import errno
import os
import tempfile
import threading
import time

import numpy as np

from ... import _native
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


def trim_heap() -> None:
    """Give free C-heap memory back to the system (glibc ``malloc_trim``; no-op elsewhere)."""
    try:
        import ctypes

        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass


_RUN_MAX = 8  # blocks per read at most

ALIGN = 4096  # O_DIRECT granularity: file offsets, read lengths and buffer addresses


def _direct_fd(fd: int) -> int | None:
    """A second descriptor on ``fd``'s file opened with O_DIRECT, or None where the file system
    (e.g. tmpfs on older kernels) or the platform refuses it."""
    flag = getattr(os, "O_DIRECT", 0)
    if not flag:
        return None
    try:
        return os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | flag)
    except OSError:
        return None


class BlockFile:
    """A rank's R blocks in one anonymous file, each at a recorded offset.

    Where the file system takes O_DIRECT (``direct``), blocks start at 4 KiB-aligned offsets
    (the gaps are holes: they read as zeros) and are read with O_DIRECT, a whole number of 4 KiB
    pages per block, straight from the disk into the (aligned) arena: no page-cache copy and no
    page-cache drop. Otherwise the blocks are packed and read through the page cache, which is
    dropped after every read. :meth:`span` is the bytes a block takes in the arena either way."""

    def __init__(self, directory: str | os.PathLike | None = None, direct: bool = True):
        if directory is not None and not os.path.isdir(directory):
            raise InvalidArgumentError(f"block directory {str(directory)!r} does not exist")
        self._f = tempfile.TemporaryFile(prefix="scalefree-mf-blocks-", dir=directory)
        self.fd = self._f.fileno()
        self.directory = directory or tempfile.gettempdir()
        self.index: dict[int, tuple[int, int]] = {}  # block → (byte offset, ratings)
        self.size = 0
        self.dfd = _direct_fd(self.fd) if direct else None
        self.align = ALIGN if self.dfd is not None else 1  # the layout: fixed at creation
        self.direct_fallback: str | None = None  # why O_DIRECT reads were given up, if they were

    @property
    def direct(self) -> bool:
        return self.dfd is not None

    def padded(self, nbytes: int) -> int:
        """``nbytes`` of ratings as laid out and read: rounded up to the alignment."""
        return -(-int(nbytes) // self.align) * self.align

    def span(self, block: int) -> int:
        return self.padded(self.index[block][1] * ENTRY_BYTES)

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
        self.size += self.padded(n * ENTRY_BYTES)

    def finish(self) -> None:
        """Everything on disk, nothing of it left in the page cache."""
        if self.align > 1:
            os.ftruncate(self.fd, self.size)  # the last block's padding too: whole-page reads
        os.fsync(self.fd)
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(self.fd, 0, 0, os.POSIX_FADV_DONTNEED)

    def read_into(self, block, out: np.ndarray) -> None:
        """Block ``block`` — or a list of blocks consecutive in the file, in one read — into
        ``out``: a contiguous buffer of their ``span`` bytes (4 KiB aligned when ``direct``);
        each block's ratings are the first ``ratings × 12`` bytes of its span."""
        run = list(block) if isinstance(block, (list, tuple)) else [block]
        off = self.index[run[0]][0]
        last_off, last_n = self.index[run[-1]]
        need = last_off + last_n * ENTRY_BYTES - off  # up to the last rating: its padding may be cut
        view = memoryview(out.reshape(-1).view(np.uint8))  # out is contiguous: a view, not a copy
        got = 0
        if self.dfd is not None:
            try:
                got = max(os.preadv(self.dfd, [view], off), 0)
            except OSError as e:
                if e.errno != errno.EINVAL:
                    raise
                # Refused (alignment the device does not take, ...): buffered from now on.
                self.direct_fallback = f"O_DIRECT read refused ({e.strerror}); reading through the page cache"
                os.close(self.dfd)
                self.dfd = None
            if got >= need:
                return
        while got < need:
            k = os.preadv(self.fd, [view[got:need]], off + got)
            if k <= 0:
                what = f"R block {run[0]}" if len(run) == 1 else f"R blocks {run}"
                raise OSError(f"block file in {self.directory}: short read of {what} "
                              f"({got} of {need} bytes at offset {off})")
            got += k
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(self.fd, off, need, os.POSIX_FADV_DONTNEED)

    def close(self) -> None:
        if self.dfd is not None:
            os.close(self.dfd)
            self.dfd = None
        self._f.close()


class Preloader:
    """Reads ``sequence`` (block ids, in the order they will be trained) from ``blocks`` on a
    thread, at most ``budget`` bytes of them resident. ``get(n)`` waits for the n-th and
    returns its records (an ``(m, 3)`` uint32 view the caller may shuffle in place);
    ``release(n)`` frees it (blocks must be released in order)."""

    def __init__(self, blocks: BlockFile, sequence: list[int], budget: int):
        self.blocks, self.seq, self.budget = blocks, list(sequence), int(budget)
        spans = {b: blocks.span(b) for b in blocks.index}
        big = max(set(self.seq), key=lambda b: spans[b], default=None)
        if big is not None and spans[big] > self.budget:
            nbytes = blocks.index[big][1] * ENTRY_BYTES
            padded = "" if spans[big] == nbytes else \
                f" ({spans[big]} bytes as read: direct IO reads whole 4 KiB pages)"
            raise OutOfBudgetError(
                f"memory budget {_mib(self.budget)} is smaller than one R block: the largest block this "
                f"rank trains holds {_mib(nbytes)}{padded}; raise the budget to at least "
                f"{spans[big]} bytes or cut R into more blocks")
        self._words = {b: spans[b] // 4 for b in spans}  # arena words per block
        # The arena, in uint32 words, starting at an ALIGN boundary (direct reads need it;
        # spans are whole pages then, so every placement stays aligned); touched once here so
        # reads never fault fresh pages.
        cap = min(self.budget, blocks.size) // blocks.align * blocks.align // 4 * 4
        raw = np.zeros(cap // 4 + ALIGN // 4, np.uint32)
        skip = (-raw.ctypes.data % ALIGN) // 4
        self._arena = raw[skip:skip + cap // 4]
        self._cap = len(self._arena)
        self._cond = threading.Condition()
        self._live: collections.deque = collections.deque()  # (n, word offset, words), oldest first
        self._head = 0
        self._ready: dict[int, np.ndarray] = {}
        self._next_free = 0
        self._error: BaseException | None = None
        self._stop = False
        self.resident = 0  # bytes of blocks read and not yet released
        self.peak_resident = 0
        self.read_seconds = 0.0  # loader time in reads
        self.wait_seconds = 0.0  # trainer time waiting for a block not yet read
        self.bytes_read = 0
        self.reads = 0  # read calls (a run of blocks consecutive in the file is one)
        self.loader_cpu_seconds = 0.0  # the loader thread's CPU time (set when it ends)
        self._thread = threading.Thread(target=self._run, name="scalefree-mf-preload", daemon=True)
        self._thread.start()
        # The loader needs a core now and then while the trainer waits for its ring partners:
        # waits skip their yield phase meanwhile (spin, then park).
        self._helper = _native.HelperThread()

    def _place(self, words: int) -> int | None:
        """Arena offset for ``words`` more, or None while they do not fit (lock held)."""
        if not self._live:
            self._head = 0
            return 0 if words <= self._cap else None
        tail = self._live[0][1]
        if self._head > tail:  # live data is [tail, head): room at the end, else at the start
            if self._head + words <= self._cap:
                return self._head
            return 0 if words <= tail else None
        return self._head if self._head + words <= tail else None  # wrapped: room in [head, tail)

    def _run(self) -> None:
        c0 = time.thread_time()
        try:
            n, total = 0, len(self.seq)
            while n < total:
                b = self.seq[n]
                words = self._words[b]
                with self._cond:
                    while True:
                        if self._stop:
                            return
                        at = self._place(words) if words else 0
                        if at is not None:
                            break
                        self._cond.wait()
                    run = [(n, b, at, words)]
                    if words:
                        self._live.append((n, at, words))
                        self._head = at + words
                        # Fewer, larger reads: the next visits' blocks too while each follows
                        # the previous one both in the file and in the arena (and fits now).
                        while n + len(run) < total and len(run) < _RUN_MAX:
                            pn, pb, pat, pw = run[-1]
                            nb = self.seq[pn + 1]
                            nw = self._words[nb]
                            if not nw or self.blocks.index[nb][0] != self.blocks.index[pb][0] + pw * 4 \
                                    or self._place(nw) != pat + pw:
                                break
                            run.append((pn + 1, nb, pat + pw, nw))
                            self._live.append((pn + 1, pat + pw, nw))
                            self._head = pat + pw + nw
                    for _, _, _, w_ in run:
                        self.resident += w_ * 4
                    self.peak_resident = max(self.peak_resident, self.resident)
                span = sum(w_ for _, _, _, w_ in run)
                t0 = time.perf_counter()
                if span:
                    self.blocks.read_into([rb for _, rb, _, _ in run], self._arena[at:at + span])
                dt = time.perf_counter() - t0
                with self._cond:
                    self.read_seconds += dt
                    self.reads += 1 if span else 0
                    for rn, rb, rat, _ in run:
                        m = self.blocks.index[rb][1]
                        self.bytes_read += m * ENTRY_BYTES
                        self._ready[rn] = self._arena[rat:rat + m * 3].reshape(-1, 3)
                    self._cond.notify_all()
                n += len(run)
        except BaseException as e:  # handed to the trainer by get()
            with self._cond:
                self._error = e
                self._cond.notify_all()
        finally:
            self.loader_cpu_seconds = time.thread_time() - c0

    def get(self, n: int) -> np.ndarray:
        t0 = time.perf_counter()
        with self._cond:
            while n not in self._ready:
                if self._error is not None:
                    raise OSError(f"preloading R blocks failed: {self._error}") from self._error
                if self._stop:
                    raise InvalidArgumentError("preloader is closed")
                self._cond.wait()
            out = self._ready.pop(n)
        self.wait_seconds += time.perf_counter() - t0
        return out

    def release(self, n: int) -> None:
        with self._cond:
            if n != self._next_free:
                raise InvalidArgumentError(f"blocks are released in order: expected visit {self._next_free}, got {n}")
            self._next_free += 1
            if self._live and self._live[0][0] == n:
                self.resident -= self._live.popleft()[2] * 4
            self._cond.notify_all()

    def close(self) -> None:
        """Stops the loader (idempotent)."""
        if self._arena is None:
            return
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        self._thread.join()
        self._helper.close()
        self._arena = None
