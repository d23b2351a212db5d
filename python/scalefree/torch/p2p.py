"""Point-to-point messages of the ``"scalefree"`` torch backend: ``send``/``recv`` with tags and
``recv`` from any source, over scalefree's dynamic tensor channels (one per ordered pair of
ranks, made when the group is).

A message is the tensor's bytes followed by its tag (8 bytes). On the receiving side one pump
thread per source (started at the first ``recv`` that may match it) takes messages off that
source's channel in the order they were sent and files them in a mailbox; ``recv(src, tag)``
takes the oldest message from ``src`` with ``tag``, ``recv(None, tag)`` the oldest with ``tag``
from any source (as gloo: messages from one source with one tag arrive in send order; other
tags and sources wait in the mailbox). A sender's work completes when the pump has the message.
"""

from __future__ import annotations

import threading
import time
from collections import deque

import numpy as np

from ..errors import ScalefreeTimeoutError

TAG_BYTES = 8
# How long a pump's wait for the next message lasts before it checks whether the group closed.
_PUMP_POLL_S = 0.5


class Mailbox:
    """Messages received from every source, waiting for a matching ``recv``."""

    def __init__(self, channels: dict, rank: int, translate):
        # channels: (src, dst) -> DynamicChannel, this rank's ends.
        self._rx = {src: ch for (src, dst), ch in channels.items() if dst == rank}
        self._translate = translate
        self._cv = threading.Condition()
        self._msgs: deque = deque()  # (src, tag, bytes as a uint8 array), arrival order
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

    def _pump(self, src: int) -> None:
        native = self._rx[src]._native
        while not self._closed:
            try:
                _code, _itemsize, shape = native.recv_meta(_PUMP_POLL_S)
                buf = np.empty(int(np.prod(shape)) if shape else 1, np.uint8)
                native.recv_into(buf)
            except ScalefreeTimeoutError:
                continue
            except BaseException as e:  # noqa: BLE001 - handed to every waiting recv
                with self._cv:
                    if not self._closed:
                        self._errors[src] = self._translate(e)
                    self._cv.notify_all()
                return
            tag = int(buf[-TAG_BYTES:].view(np.int64)[0])
            with self._cv:
                self._msgs.append((src, tag, buf[:-TAG_BYTES]))
                self._cv.notify_all()

    def recv(self, src: int | None, tag: int, timeout_s: float | None) -> tuple[int, np.ndarray]:
        """The oldest message matching (src or any source, tag): (its source, its bytes).
        Raises TimeoutError after ``timeout_s`` seconds (None: no limit)."""
        sources = list(self._rx) if src is None else [src]
        self._start(sources)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._cv:
            while True:
                for i, (s, t, payload) in enumerate(self._msgs):
                    if t == tag and (src is None or s == src):
                        del self._msgs[i]
                        return s, payload
                failed = [self._errors[s] for s in sources if s in self._errors]
                if failed and (src is not None or len(failed) == len(sources)):
                    raise failed[0]
                if self._closed:
                    raise RuntimeError("scalefree backend: the process group was shut down")
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    who = "any source" if src is None else f"rank {src}"
                    raise TimeoutError(f"scalefree: Timed out waiting {int(timeout_s * 1000)}ms for recv operation "
                                       f"to complete (from {who}, tag {tag})")
                self._cv.wait(left)

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify_all()


def pack(payload: np.ndarray, tag: int) -> np.ndarray:
    """A message: ``payload`` (any contiguous array) as bytes, then ``tag``."""
    raw = payload.reshape(-1).view(np.uint8)
    msg = np.empty(raw.size + TAG_BYTES, np.uint8)
    msg[:raw.size] = raw
    msg[raw.size:].view(np.int64)[0] = tag
    return msg


def unpack_into(payload: np.ndarray, out: np.ndarray, what: str) -> None:
    """Copies a received message's bytes into ``out`` (a contiguous array of the same size)."""
    dst = out.reshape(-1).view(np.uint8)
    if payload.size != dst.size:
        raise ValueError(f"scalefree backend: {what} received {payload.size} bytes, the tensor holds {dst.size}")
    dst[:] = payload

