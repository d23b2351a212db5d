"""Parameter-server transports over the peers of ``scalefree bench ps`` (same interface as
:class:`scalefree.ps.SlotTransport`): torch.distributed gloo send/recv into preallocated
buffers. Server is rank 0."""

from __future__ import annotations

import os

import numpy as np


class GlooTransport:
    def __init__(self, group, variables: dict, order):
        import torch
        import torch.distributed as dist

        self.dist = dist
        self.torch = torch
        port = int(os.environ.get("SCALEFREE_PS_GLOO_PORT", "29533"))
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=group.rank, world_size=group.size)
        self.me = group.rank
        self._pending = {}
        self.workers = list(range(1, group.size))
        shapes = {k: np.shape(v) for k, v in variables.items()}
        dtypes = {k: np.asarray(v).dtype for k, v in variables.items()}
        if self.me == 0:
            self.gbuf = {(w, k): np.empty(shapes[k], dtypes[k]) for w in self.workers for k in variables}
        else:
            self.wbuf = {k: np.empty(shapes[k], dtypes[k]) for k in variables}

    # Sends are asynchronous (isend), as a careful gloo user would write them: blocking sends
    # both ways deadlock. A buffer is reused only after its send completed.
    _pending: dict

    def _wait(self, key):
        h = self._pending.pop(key, None)
        if h is not None:
            h.wait()

    def send_weights(self, worker, name, arr):
        self._wait(("w", worker, name))
        self._pending[("w", worker, name)] = self.dist.isend(self.torch.from_numpy(np.ascontiguousarray(arr)), worker)

    def recv_weights(self, name):
        self.dist.recv(self.torch.from_numpy(self.wbuf[name]), 0)
        return self.wbuf[name]

    def send_grad(self, name, arr):
        self._wait(("g", name))
        self._pending[("g", name)] = self.dist.isend(self.torch.from_numpy(np.ascontiguousarray(arr)), 0)

    def recv_grad(self, worker, name):
        b = self.gbuf[(worker, name)]
        self.dist.recv(self.torch.from_numpy(b), worker)
        return b

    def release_weights(self):
        pass

    def release_weight(self, name):
        pass

    def release_grads(self, name):
        pass

    def update_buffers(self, name, param):
        # The server is about to update this parameter in place: its sends must be done.
        for w in self.workers:
            self._wait(("w", w, name))
        return param, param

    def publish_initial(self, name, arr):
        self.publish(name, arr)

    def publish(self, name, arr):
        for w in self.workers:
            self.send_weights(w, name, arr)

    def grad_buffers(self):
        return {}

    def stats(self):
        return {}
