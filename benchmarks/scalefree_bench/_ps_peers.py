"""Parameter-server transports over the peers of ``scalefree bench ps`` (same interface as
:class:`scalefree.tensors.ps.SlotTransport`): torch.distributed gloo send/recv into preallocated
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


class GrpcTransport:
    """The parameter server over gRPC, as a user would write it without code generation:
    rank 0 serves ``Pull(name, version) -> weights`` and ``Push(name, worker, gradient)``;
    weights and gradients travel as ``arr.tobytes()`` (unary), or in 1 MiB chunks
    (``streaming=True``: a server stream for pulls, a client stream for pushes)."""

    CHUNK = 1 << 20

    def __init__(self, group, variables: dict, order, streaming: bool = False):
        import queue
        import threading

        import grpc

        self.grpc = grpc
        self.streaming = streaming
        self.me = group.rank
        self.workers = list(range(1, group.size))
        self.shapes = {k: np.shape(v) for k, v in variables.items()}
        self.dtypes = {k: np.asarray(v).dtype for k, v in variables.items()}
        port = int(os.environ.get("SCALEFREE_PS_GLOO_PORT", "29533"))
        opts = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
        self.version = {k: 0 for k in variables}
        self.step = 0
        if self.me == 0:
            from concurrent import futures

            self.cond = threading.Condition()
            self.published = {}  # name -> (version, bytes)
            self.queues = {(w, k): queue.Queue() for w in self.workers for k in variables}

            def head(req):
                name, version, worker = req.split(b"\0")[:3]
                return name.decode(), int(version), int(worker)

            def pull(request, context):
                name, version, _ = head(request)
                with self.cond:
                    self.cond.wait_for(lambda: self.published.get(name, (-1,))[0] >= version)
                    return self.published[name][1]

            def pull_stream(request, context):
                data = pull(request, context)
                for i in range(0, max(len(data), 1), self.CHUNK):
                    yield data[i:i + self.CHUNK]

            def push(request, context):
                hdr, data = request.split(b"\n", 1)
                name, _, worker = head(hdr)
                self.queues[(worker, name)].put(data)
                return b""

            def push_stream(it, context):
                first = next(it)
                hdr, data = first.split(b"\n", 1)
                name, _, worker = head(hdr)
                self.queues[(worker, name)].put(data + b"".join(it))
                return b""

            handler = grpc.method_handlers_generic_handler("ps.PS", {
                "Pull": grpc.unary_unary_rpc_method_handler(pull),
                "PullStream": grpc.unary_stream_rpc_method_handler(pull_stream),
                "Push": grpc.unary_unary_rpc_method_handler(push),
                "PushStream": grpc.stream_unary_rpc_method_handler(push_stream),
            })
            self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4 * len(self.workers)), options=opts)
            self.server.add_generic_rpc_handlers((handler,))
            self.server.add_insecure_port(f"127.0.0.1:{port}")
            self.server.start()
        group.barrier()
        if self.me != 0:
            ch = grpc.insecure_channel(f"127.0.0.1:{port}", options=opts)
            self.pull_rpc = ch.unary_unary("/ps.PS/Pull")
            self.pull_stream_rpc = ch.unary_stream("/ps.PS/PullStream")
            self.push_rpc = ch.unary_unary("/ps.PS/Push")
            self.push_stream_rpc = ch.stream_unary("/ps.PS/PushStream")

    # server side
    def publish_initial(self, name, arr):
        self.publish(name, arr, initial=True)

    def publish(self, name, arr, initial=False):
        if not initial:
            self.version[name] += 1
        with self.cond:
            self.published[name] = (self.version[name], arr.tobytes())
            self.cond.notify_all()

    def update_buffers(self, name, param):
        return param, param  # published bytes are a snapshot

    def recv_grad(self, worker, name):
        data = self.queues[(worker, name)].get()
        return np.frombuffer(data, self.dtypes[name]).reshape(self.shapes[name])

    def release_grads(self, name):
        pass

    # worker side
    def recv_weights(self, name):
        req = f"{name}\0{self.version[name]}\0{self.me}".encode()
        data = b"".join(self.pull_stream_rpc(req)) if self.streaming else self.pull_rpc(req)
        self.version[name] += 1
        return np.frombuffer(data, self.dtypes[name]).reshape(self.shapes[name])

    def grad_buffers(self):
        return {}

    def send_grad(self, name, arr):
        hdr = f"{name}\0{0}\0{self.me}\n".encode()
        if self.streaming:
            data = arr.tobytes()
            chunks = [hdr + data[:self.CHUNK]] + [data[i:i + self.CHUNK] for i in range(self.CHUNK, len(data), self.CHUNK)]
            self.push_stream_rpc(iter(chunks))
        else:
            self.push_rpc(hdr + arr.tobytes())

    def release_weights(self):
        pass

    def release_weight(self, name):
        pass

    def stats(self):
        return {}


class GrpcStreamTransport(GrpcTransport):
    def __init__(self, group, variables, order):
        super().__init__(group, variables, order, streaming=True)
