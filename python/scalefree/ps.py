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

from .errors import InvalidArgumentError


class ParameterServer:
    """Collective: every rank passes the same variable names, shapes and dtypes (the values
    matter on the servers: they are the initial weights)."""

    def __init__(self, group, variables: dict, lr: float = 0.1, n_servers: int = 1, transport=None, order=None):
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
        self.shapes = {k: tuple(np.shape(v)) for k, v in variables.items()}
        self.dtypes = {k: np.asarray(v).dtype for k, v in variables.items()}
        if self.is_server:
            from . import _registered_empty

            self.params = {}
            for k in self.names:
                if self.server_of[k] == group.rank:
                    a = _registered_empty(self.shapes[k], self.dtypes[k])
                    a[...] = variables[k]
                    self.params[k] = a
        self.transport = transport or SlotTransport(group, self)

    def pull(self) -> dict:
        """Worker: the current weights (the receive buffers: read-only until the next pull)."""
        return {k: self.transport.recv_weights(k) for k in self.order}

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
        """Server: sends weights, then for each step and each of its variables (in order,
        so workers can pull early layers while later ones are updated) averages every
        worker's gradient into it in one pass and sends the new value."""
        from . import _native

        order = [k for k in self.order if k in self.params]
        for w in self.workers:
            for k in order:
                self.transport.send_weights(w, k, self.params[k])
        alpha = -self.lr / len(self.workers)
        for step in range(steps):
            for k in order:
                grads = [self.transport.recv_grad(w, k) for w in self.workers]
                p = self.params[k]
                self.transport.before_update(k)
                if p.dtype == np.float32:
                    _native.sgd_apply(p.reshape(-1), [g.reshape(-1) for g in grads], alpha)
                else:
                    p += alpha * sum(grads)
                self.transport.release_grads(k)
                for w in self.workers:
                    self.transport.send_weights(w, k, p)
            if on_step:
                on_step(step)

    def stats(self) -> dict:
        return self.transport.stats()


class SlotTransport:
    """Static slots: weights server -> worker, gradients worker -> server, per variable."""

    def __init__(self, group, ps: ParameterServer):
        from .tensors import static_slots

        specs = []
        for k in ps.names:
            s = ps.server_of[k]
            for w in ps.workers:
                specs.append(dict(name=f"w/{k}/{w}", src=s, dst=w, shape=ps.shapes[k], dtype=ps.dtypes[k]))
                specs.append(dict(name=f"g/{k}/{w}", src=w, dst=s, shape=ps.shapes[k], dtype=ps.dtypes[k]))
        self.slots = static_slots(group, specs)
        self.me = group.rank
        self.names = ps.names
        self.workers = ps.workers

    def send_weights(self, worker, name, arr):
        self.slots[f"w/{name}/{worker}"].send(arr)

    def recv_weights(self, name):
        return self.slots[f"w/{name}/{self.me}"].recv()

    def send_grad(self, name, arr):
        self.slots[f"g/{name}/{self.me}"].send(arr)

    def recv_grad(self, worker, name):
        return self.slots[f"g/{name}/{worker}"].recv()

    def release_weights(self):
        for k in self.names:
            self.slots[f"w/{k}/{self.me}"].release()

    def release_weight(self, name):
        self.slots[f"w/{name}/{self.me}"].release()

    def before_update(self, name):
        pass  # a slot send has completed when it returns

    def release_grads(self, name):
        for w in self.workers:
            self.slots[f"g/{name}/{w}"].release()

    def stats(self):
        tot = {"bytes_zero_copy": 0, "bytes_copied": 0, "transfers": 0}
        for s in self.slots.values():
            for k, v in s.stats().items():
                tot[k] += v
        return tot


class TorchParams:
    """Thin adapter for a torch module: its parameters (moved into registered memory) as
    the PS variables, its ``.grad`` tensors as the gradients, and loading pulled weights."""

    def __init__(self, module):
        from .tensors import place

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
