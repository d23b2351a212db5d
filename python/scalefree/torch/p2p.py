"""Point-to-point messages of the ``"scalefree"`` torch backend: ``send``/``recv`` with tags and
``recv`` from any source, over scalefree's dynamic tensor channels (one per ordered pair of
ranks, made when the group is).

A message is the tensor's bytes, sent from the tensor itself (no copy when its storage is in
registered memory; otherwise the channel stages it and traces its allocation site), with
the tag in the record's dtype word (tags of 32 bits; a larger one goes first as an 8-byte
message of its own, marked :data:`TAG_FOLLOWS`). On the receiving side one pump thread per
source (started at the first ``recv`` that may match it) takes messages off that source's
channel in the order they were sent: into the tensor of a ``recv`` already waiting for that
source and tag when there is one (no copy), else into the mailbox; ``recv(src, tag)`` takes
the oldest message from ``src`` with ``tag``, ``recv(None, tag)`` the oldest with ``tag``
from any source (as gloo: messages from one source with one tag arrive in send order; other
tags and sources wait in the mailbox). A sender's work completes when the pump has the
message.
"""

from __future__ import annotations

import threading
import time
from collections import deque

import numpy as np

from ..errors import ScalefreeTimeoutError

# A record's dtype word that says "this 8-byte message is the tag of the next one" (tags
# outside the 32-bit range, and this one).
TAG_FOLLOWS = 0x7FFF_FFFF
_TAG_MIN, _TAG_MAX = -(1 << 31), TAG_FOLLOWS - 1
# How long a pump's wait for the next message lasts before it checks whether the group closed.
_PUMP_POLL_S = 0.5


def send_message(channel, payload: np.ndarray, tag: int, timeout: float | None = None) -> int:
    """Sends ``payload`` (a contiguous array, sent as its bytes) with ``tag`` and returns once
    the receiver has it; returns the bytes the channel had to stage (copy into registered
    memory: 0 when the payload is there already)."""
    native = channel._native
    raw = payload.reshape(-1).view(np.uint8)
    if _TAG_MIN <= tag <= _TAG_MAX:
        code = tag & 0xFFFF_FFFF
    else:
        native.send(np.array([tag], np.int64).view(np.uint8), [8], TAG_FOLLOWS, 1, True, timeout)
        code = TAG_FOLLOWS
    if not native.send(raw, [raw.size], code, 1, True, timeout):
        return 0
    return int(raw.size)


class _Waiting:
    """A ``recv`` waiting for (source or any, tag) with a buffer the message may land in."""

    __slots__ = ("src", "tag", "out", "claimed", "done", "got", "error")

    def __init__(self, src, tag, out):
        self.src, self.tag, self.out = src, tag, out
        self.claimed = self.done = False
        self.got = None
        self.error = None


class Mailbox:
    """Messages received from every source, waiting for a matching ``recv``."""

    def __init__(self, channels: dict, rank: int, translate):
        # channels: (src, dst) -> DynamicChannel, this rank's ends.
        self._rx = {src: ch for (src, dst), ch in channels.items() if dst == rank}
        self._translate = translate
        self._cv = threading.Condition()
        self._msgs: deque = deque()  # (src, tag, bytes as a uint8 array), arrival order
        self._waiting: list = []     # _Waiting, in the order the recvs were posted
        self._pumps: dict = {}
        self._errors: dict = {}  # src -> the exception that stopped its pump
        self._closed = False

    def listen(self, sources) -> None:
        """Starts taking messages from ``sources`` (their senders' works then complete)."""
        self._start(sources)

    def _start(self, sources) -> None:
        with self._cv:
            for src in sources:
                if src not in self._pumps and src in self._rx:
                    t = threading.Thread(target=self._pump, args=(src,), name=f"scalefree-p2p-rx-{src}", daemon=True)
                    self._pumps[src] = t
                    t.start()

    def _meta(self, native):
        """The next record (code, byte count), None when the group closed meanwhile."""
        while not self._closed:
            try:
                code, _itemsize, shape = native.recv_meta(_PUMP_POLL_S)
            except ScalefreeTimeoutError:
                continue
            return code, int(np.prod(shape)) if shape else 1
        return None

    def _claim(self, src: int, tag: int, nbytes: int):
        """The oldest waiting recv this message can land in (called holding the lock). Not
        one an older message in the mailbox also matches: that recv takes the older message
        (messages from one source with one tag are received in send order), and this one
        waits in the mailbox for the next."""
        for w in self._waiting:
            if w.tag == tag and (w.src is None or w.src == src) and w.out.size == nbytes and not w.claimed:
                if any(t == w.tag and (w.src is None or s == w.src) for s, t, _ in self._msgs):
                    continue
                w.claimed = True
                self._waiting.remove(w)
                return w
        return None

    def _pump(self, src: int) -> None:
        native = self._rx[src]._native
        while not self._closed:
            w = None
            try:
                got = self._meta(native)
                if got is None:
                    return
                code, n = got
                if code == TAG_FOLLOWS:  # the tag, then the message
                    head = np.empty(8, np.uint8)
                    native.recv_into(head)
                    tag = int(head.view(np.int64)[0])
                    got = self._meta(native)
                    if got is None:
                        return
                    n = got[1]
                else:
                    tag = code - (1 << 32) if code >= 1 << 31 else code
                with self._cv:
                    w = self._claim(src, tag, n)
                if w is not None:
                    native.recv_into(w.out)
                    with self._cv:
                        w.done, w.got = True, src
                        self._cv.notify_all()
                    continue
                buf = np.empty(n, np.uint8)
                native.recv_into(buf)
            except BaseException as e:  # noqa: BLE001 - handed to every waiting recv
                with self._cv:
                    if not self._closed:
                        self._errors[src] = self._translate(e)
                    if w is not None:
                        w.error = self._errors.get(src) or self._translate(e)
                        w.done = True
                    self._cv.notify_all()
                return
            with self._cv:
                self._msgs.append((src, tag, buf))
                self._cv.notify_all()

    def recv(self, src: int | None, tag: int, timeout_s: float | None, out: np.ndarray | None = None):
        """The oldest message matching (src or any source, tag): (its source, its bytes), or
        (its source, None) when it was received straight into ``out`` (a contiguous uint8
        array of the tensor's bytes; a message that arrives while this recv waits and has
        its size lands there). Raises TimeoutError after ``timeout_s`` seconds (None: no
        limit)."""
        sources = list(self._rx) if src is None else [src]
        self._start(sources)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        w = None
        with self._cv:
            try:
                while True:
                    if w is not None and w.done:
                        if w.error is not None:
                            raise w.error
                        return w.got, None
                    if w is None or not w.claimed:
                        for i, (s, t, payload) in enumerate(self._msgs):
                            if t == tag and (src is None or s == src):
                                del self._msgs[i]
                                return s, payload
                    if w is None and out is not None:
                        w = _Waiting(src, tag, out)
                        self._waiting.append(w)
                    claimed = w is not None and w.claimed
                    failed = [self._errors[s] for s in sources if s in self._errors]
                    if not claimed and failed and (src is not None or len(failed) == len(sources)):
                        raise failed[0]
                    if self._closed and not claimed:
                        raise RuntimeError("scalefree backend: the process group was shut down")
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0 and not claimed:  # a claimed one is landing now
                        who = "any source" if src is None else f"rank {src}"
                        raise TimeoutError(f"scalefree: Timed out waiting {int(timeout_s * 1000)}ms for recv "
                                           f"operation to complete (from {who}, tag {tag})")
                    self._cv.wait(None if claimed else left)
            finally:
                if w is not None and not w.claimed and w in self._waiting:
                    self._waiting.remove(w)

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify_all()


def unpack_into(payload: np.ndarray, out: np.ndarray, what: str) -> None:
    """Copies a received message's bytes into ``out`` (a contiguous array of the same size)."""
    dst = out.reshape(-1).view(np.uint8)
    if payload.size != dst.size:
        raise ValueError(f"scalefree backend: {what} received {payload.size} bytes, the tensor holds {dst.size}")
    dst[:] = payload
