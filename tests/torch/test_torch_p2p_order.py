"""The p2p mailbox of the ``"scalefree"`` torch backend keeps send order per (source, tag):
a ``recv`` posted while an older matching message sits in the mailbox takes that message,
never the next one off the wire (which once swapped two consecutive messages under load)."""

import threading

import numpy as np

from scalefree.errors import ScalefreeTimeoutError
from scalefree.torch.p2p import Mailbox


class _Wire:
    """A fake channel end: messages (tag, bytes) handed out in order; the pump thread's
    ``recv_meta``/``recv_into`` calls. A message going to the mailbox (no recv waiting when
    it came) is held until a recv is posted: then it is in the mailbox while a recv for it
    waits (the window the bug needed)."""

    def __init__(self, messages, mailbox_of, theirs):
        self.messages = list(messages)
        self.i = 0
        self.mailbox_of = mailbox_of
        self.theirs = theirs  # the recvs' own buffers (a message landing there is not held)
        self._native = self

    def recv_meta(self, timeout):
        if self.i >= len(self.messages):
            threading.Event().wait(timeout)
            raise ScalefreeTimeoutError("no message")
        tag, data = self.messages[self.i]
        return tag, 1, [data.size]

    def recv_into(self, out):
        tag, data = self.messages[self.i]
        mb = self.mailbox_of()
        if not any(out is b for b in self.theirs):
            for _ in range(400):  # a recv is posted (bounded: the test still ends if none is)
                with mb._cv:
                    if mb._waiting:
                        break
                threading.Event().wait(0.0005)
        out[:] = data
        self.i += 1


def test_messages_from_one_source_and_tag_are_received_in_send_order():
    n, size = 200, 16
    msgs = [(5, np.full(size, k % 251, np.uint8)) for k in range(n)]
    holder, outs = {}, []
    wire = _Wire(msgs, lambda: holder["mb"], outs)
    mb = holder["mb"] = Mailbox({(1, 0): wire}, 0, lambda e: e)
    try:
        for k in range(n):
            out = np.zeros(size, np.uint8)
            outs[:] = [out]
            src, payload = mb.recv(1, 5, 30.0, out)
            got = out if payload is None else payload
            assert src == 1
            assert got[0] == k % 251, f"recv {k} got message {got[0]}"
    finally:
        mb.close()
