"""Parameter-server data-parallel training over zero-copy tensor slots (the RDMA tensor
paper's §5.2 setting).

Ranks ``0 .. n_servers-1`` are servers, the others workers. Variables are placed on servers
round-robin. Every step each worker *pulls* the weights (static slots: the arrays it gets are
the receive buffers themselves, no copy) and *pushes* its gradients (static slots into the
server's buffers); a server waits for every worker's gradient (synchronous), averages them,
applies the update and sends the new weights.

>>> ps = ParameterServer(g, {"W1": W1, "b1": b1}, lr=0.1)   # collective; arrays on servers
>>> if ps.is_server: ps.serve(steps)
... else:
...     for step in range(steps):
...         params = ps.pull()
...         ps.push(grads(params, batch(step)))
"""

from __future__ import annotations

import numpy as np

from ..arena import is_registered, registered_empty, tracing
from ..errors import InvalidArgumentError
from .slots import as_array, place, static_slots, trace_staged


class ParameterServer:
    """Collective: every rank passes the same variable names, shapes and dtypes (the values
    matter on the servers: they are the initial weights)."""

    def __init__(self, group, variables: dict, lr: float = 0.1, n_servers: int = 1, transport=None, order=None,
                 mode: str = "auto", trace: bool | None = None):
        """``trace`` (default ``SCALEFREE_TRACE``, on): a gradient pushed over static slots
        that is not in registered memory is staged (copied into a registered buffer) and its
        allocation site traced, so the gradient computed there next is born in registered
        memory and goes without a copy; off, every gradient is staged (the copy the paper's
        §3.4 removes). ``stats()["bytes_copied"]`` counts the staging."""
        if not 1 <= n_servers < group.size:
            raise InvalidArgumentError(f"need 1 <= n_servers < ranks ({group.size}), got {n_servers}")
        self.group = group
        self.lr = float(lr)
        self.names = list(variables)
        # The order gradients are pushed and weights served and pulled in (default: the
        # reverse of the declaration order, as backpropagation produces gradients).
        self.order = list(order) if order is not None else list(reversed(self.names))
        if sorted(self.order) != sorted(self.names):
            raise InvalidArgumentError("order must name every variable once")
        self.server_of = {name: i % n_servers for i, name in enumerate(self.names)}
        self.servers = list(range(n_servers))
        self.workers = list(range(n_servers, group.size))
        self.is_server = group.rank < n_servers
        self.trace = tracing(trace)
        self.shapes = {k: tuple(np.shape(v)) for k, v in variables.items()}
        self.dtypes = {k: np.asarray(v).dtype for k, v in variables.items()}
        if self.is_server:
            self.params = {}
            for k in self.names:
                if self.server_of[k] == group.rank:
                    a = registered_empty(self.shapes[k], self.dtypes[k])
                    a[...] = variables[k]
                    self.params[k] = a
        if mode not in ("auto", "mapped", "slots"):
            raise InvalidArgumentError(f"mode must be auto, mapped or slots, not {mode!r}")
        if transport is None and mode in ("auto", "mapped"):
            transport = MappedTransport(group, self)
            if not transport.ok:
                if mode == "mapped":
                    raise InvalidArgumentError("mode='mapped' needs peers' regions mapped (shared-memory backend)")
                transport = None
        self.transport = transport or SlotTransport(group, self)
        self.mapped = isinstance(self.transport, MappedTransport)

    def pull(self) -> dict:
        """Worker: the current weights (buffers that are not copied: read-only, valid until
        the next pull)."""
        return {k: self.transport.recv_weights(k) for k in self.order}

    def grad_buffers(self) -> dict:
        """Worker: where to compute this step's gradients so that pushing them copies
        nothing (with the mapped transport; otherwise fresh arrays)."""
        return self.transport.grad_buffers()

    def push_one(self, name: str, grad) -> None:
        """Worker: sends one gradient as soon as it is computed (backpropagation yields the
        last layer first: the server updates it while earlier ones are still computed) and
        hands that variable's pulled weights back."""
        self.transport.release_weight(name)
        self.transport.send_grad(name, grad)

    def push(self, grads: dict) -> None:
        """Worker: sends this step's gradients (and hands the pulled weights back first: the
        server may write the next ones while these travel)."""
        self.transport.release_weights()
        for k in self.order:
            self.transport.send_grad(k, grads[k])

    def serve(self, steps: int, on_step=None) -> None:
        """Server: sends weights, then for each step and each of its variables (in the order
        gradients arrive) averages every worker's gradient into it in one pass and sends the
        new value right away."""
        from .. import _native

        order = [k for k in self.order if k in self.params]
        for k in order:
            self.transport.publish_initial(k, self.params[k])
        alpha = -self.lr / len(self.workers)
        for step in range(steps):
            for k in order:
                grads = [self.transport.recv_grad(w, k) for w in self.workers]
                src, dst = self.transport.update_buffers(k, self.params[k])
                if src.dtype == np.float32 and dst is not src:
                    _native.sgd_apply_to(dst.reshape(-1), src.reshape(-1), [g.reshape(-1) for g in grads], alpha)
                elif src.dtype == np.float32:
                    _native.sgd_apply(src.reshape(-1), [g.reshape(-1) for g in grads], alpha)
                else:
                    dst[...] = src + alpha * sum(grads)
                self.transport.release_grads(k)
                self.params[k] = dst
                self.transport.publish(k, dst)
            if on_step:
                on_step(step)

    def stats(self) -> dict:
        return self.transport.stats()


class SlotTransport:
    """Static slots: weights server -> worker, gradients worker -> server, per variable."""

    def __init__(self, group, ps: ParameterServer):
        specs = []
        for k in ps.names:
            s = ps.server_of[k]
            for w in ps.workers:
                specs.append(dict(name=f"w/{k}/{w}", src=s, dst=w, shape=ps.shapes[k], dtype=ps.dtypes[k]))
                specs.append(dict(name=f"g/{k}/{w}", src=w, dst=s, shape=ps.shapes[k], dtype=ps.dtypes[k]))
        self.slots = static_slots(group, specs, trace_torch=ps.trace)
        self.me = group.rank
        self.names = ps.names
        self.workers = ps.workers
        self.stage = Staging(ps.trace)

    def send_weights(self, worker, name, arr):
        self.slots[f"w/{name}/{worker}"].send(arr)

    def recv_weights(self, name):
        return self.slots[f"w/{name}/{self.me}"].recv()

    def send_grad(self, name, arr):
        # A slot send has completed when it returns: the staging buffer is free again.
        self.slots[f"g/{name}/{self.me}"].send(self.stage(name, arr))

    def recv_grad(self, worker, name):
        return self.slots[f"g/{name}/{worker}"].recv()

    def release_weights(self):
        for k in self.names:
            self.slots[f"w/{k}/{self.me}"].release()

    def release_weight(self, name):
        self.slots[f"w/{name}/{self.me}"].release()

    def publish_initial(self, name, arr):
        self.publish(name, arr)

    def publish(self, name, arr):
        for w in self.workers:
            self.send_weights(w, name, arr)

    def update_buffers(self, name, param):
        return param, param  # in place: a slot send has completed when it returns

    def grad_buffers(self):
        return {}

    def release_grads(self, name):
        for w in self.workers:
            self.slots[f"g/{name}/{w}"].release()

    def stats(self):
        """Bytes sent and received over the slots, less the gradients that were staged
        first (``bytes_copied``)."""
        tot = {"bytes_zero_copy": 0, "bytes_copied": 0, "transfers": 0}
        for s in self.slots.values():
            for k, v in s.stats().items():
                tot[k] += v
        tot["bytes_copied"] += self.stage.copied
        tot["bytes_zero_copy"] -= self.stage.copied
        return tot


class Staging:
    """Registered memory for one-sided sends (the RDMA tensor paper, §3.4). A tensor that is
    not in registered memory is copied into a registered buffer kept per name (counted in
    ``copied``); with ``trace``, a tensor already in registered memory goes as it is, and
    one that had to be copied has its allocation site traced, so the tensor allocated there
    next is born in registered memory (numpy: the arena's allocator; torch: the dispatch
    mode of :mod:`.torch_sites`). Without ``trace`` every tensor is copied."""

    def __init__(self, trace: bool):
        self.trace = trace
        self.copied = 0
        self._bufs: dict = {}

    def __call__(self, name, tensor) -> np.ndarray:
        a = as_array(tensor, f"gradient {name!r}")
        if a.nbytes == 0 or (self.trace and is_registered(a)):
            return a
        buf = self._bufs.get(name)
        if buf is None or buf.shape != a.shape or buf.dtype != a.dtype:
            buf = self._bufs[name] = registered_empty(a.shape, a.dtype)
        buf[...] = a
        self.copied += a.nbytes
        if self.trace:
            trace_staged(tensor, a)
        return buf


class MappedTransport:
    """Shared-memory transport that copies nothing: a server keeps each parameter in two
    versions in a region every worker maps, and writes version t+1 from version t and the
    workers' gradients, which it reads where the workers computed them (double-buffered
    regions of theirs). Tiny static slots carry the version numbers. A buffer is rewritten
    only two versions later, when every worker is provably done with it."""

    def __init__(self, group, ps: ParameterServer):
        self.ps = ps
        self.me = group.rank
        self.names, self.workers = ps.names, ps.workers
        self._copied = self._zero_copy = self._sent = 0
        dev = group.device
        nb = {k: int(np.prod(ps.shapes[k], dtype=np.int64)) * ps.dtypes[k].itemsize for k in ps.names}
        self.off = {}
        size = 0
        mine = [k for k in ps.names if (ps.is_server and ps.server_of[k] == self.me) or not ps.is_server]
        for k in mine:
            self.off[k] = size
            size += 2 * ((nb[k] + 63) // 64 * 64)
        self.region = dev.alloc_region(max(size, 64))
        handle = np.frombuffer(self.region.handle, np.uint8)
        handles = group.allgather(handle)
        self.nb = nb
        # Every rank needs the layout of the regions it reads: offsets follow the same rule.
        def layout(rank):
            keys = [k for k in ps.names if ps.server_of[k] == rank] if rank in ps.servers else list(ps.names)
            out, o = {}, 0
            for k in keys:
                out[k] = o
                o += 2 * ((nb[k] + 63) // 64 * 64)
            return out
        self.layout = {r: layout(r) for r in range(group.size)}
        self.remote = {}
        self.ok = True
        peers = ps.workers if ps.is_server else ps.servers
        for r in peers:
            rr = dev.attach(bytes(handles[r]))
            if not rr.mapped:
                self.ok = False
            self.remote[r] = rr
        oks = group.allgather(np.array([self.ok], np.uint8))
        self.ok = bool(oks.all())
        if not self.ok:
            return
        specs = []
        for k in ps.names:
            s = ps.server_of[k]
            for w in ps.workers:
                specs.append(dict(name=f"v/{k}/{w}", src=s, dst=w, shape=(1,), dtype="int64"))
                specs.append(dict(name=f"d/{k}/{w}", src=w, dst=s, shape=(1,), dtype="int64"))
        self.slots = static_slots(group, specs)
        self.version = {k: 0 for k in ps.names}
        self.step = 0
        self.one = np.zeros(1, np.int64)

    def _view(self, buf, rank, name, version, writable):
        k = name
        o = self.layout[rank][k] + (version % 2) * ((self.nb[k] + 63) // 64 * 64)
        a = np.frombuffer(buf, np.uint8, count=self.nb[k], offset=o).view(self.ps.dtypes[k]).reshape(self.ps.shapes[k])
        if not writable:
            a.flags.writeable = False
        return a

    # server side
    def publish_initial(self, name, arr):
        v0 = self._view(self.region, self.me, name, 0, True)
        v0[...] = arr
        self.version[name] = 0
        self._notify(name, 0)

    def update_buffers(self, name, param):
        v = self.version[name]
        return (self._view(self.region, self.me, name, v, True), self._view(self.region, self.me, name, v + 1, True))

    def publish(self, name, arr):
        self.version[name] += 1
        self._notify(name, self.version[name])

    def _notify(self, name, v):
        self.one[0] = v
        for w in self.workers:
            self.slots[f"v/{name}/{w}"].send(self.one)

    def recv_grad(self, worker, name):
        s = self.slots[f"d/{name}/{worker}"]
        v = int(s.recv()[0])
        s.release()
        return self._view(self.remote[worker], worker, name, v, False)

    def release_grads(self, name):
        pass

    # worker side
    def recv_weights(self, name):
        s = self.slots[f"v/{name}/{self.me}"]
        v = int(s.recv()[0])
        s.release()
        self.step = v
        return self._view(self.remote[self.ps.server_of[name]], self.ps.server_of[name], name, v, False)

    def grad_buffers(self):
        return {k: self._view(self.region, self.me, k, self.step, True) for k in self.names}

    def send_grad(self, name, arr):
        buf = self._view(self.region, self.me, name, self.step, True)
        if not np.shares_memory(buf, arr):
            buf[...] = arr  # not computed in place: one copy
            self._copied += buf.nbytes
        else:
            self._zero_copy += buf.nbytes
        self._sent += 1
        self.one[0] = self.step
        self.slots[f"d/{name}/{self.me}"].send(self.one)

    def release_weights(self):
        pass

    def release_weight(self, name):
        pass

    def stats(self):
        """Gradients pushed: computed in the shared buffer (``grad_buffers()``: zero copy)
        or copied into it."""
        return {"bytes_zero_copy": self._zero_copy, "bytes_copied": self._copied, "transfers": self._sent}


class TorchParams:
    """Thin adapter for a torch module: its parameters (moved into registered memory) as
    the PS variables, its ``.grad`` tensors as the gradients, and loading pulled weights."""

    def __init__(self, module):
        self.module = module
        place(module)
        self.params = dict(module.named_parameters())

    def variables(self) -> dict:
        return {k: p.detach().numpy() for k, p in self.params.items()}

    def load(self, weights: dict) -> None:
        import torch

        with torch.no_grad():
            for k, p in self.params.items():
                p.copy_(torch.from_numpy(weights[k]))

    def grads(self) -> dict:
        return {k: p.grad.detach().numpy() for k, p in self.params.items()}
