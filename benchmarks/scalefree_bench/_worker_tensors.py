"""Both ranks of one ``scalefree bench tensors`` implementation: ping-pong of a preallocated
buffer between rank 0 and rank 1 (one-way time = round trip / 2), or, for gRPC, a call
carrying the buffer with an empty reply. Rank 0 writes ``<out>`` (JSON: size -> times, or for
ours size -> {times, peak_rss_bytes per rank}; ours check every byte received in one more,
untimed, round trip)."""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from pathlib import Path

import numpy as np


def _reps(nbytes: int, target_s: float, min_reps: int) -> int:
    # About target_s of traffic at ~2 GB/s, at least min_reps, at most 2000.
    return int(max(min_reps, min(2000, target_s * 2e9 / max(nbytes, 1))))


def _time(fn, reps: int, warmup: int = 3) -> list[float]:
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def run_scalefree(args, sizes):
    import scalefree
    from scalefree import tensors
    from scalefree._rss import peak_rss_bytes

    from .common import first_mismatch

    g = scalefree.init()
    me = g.rank
    res = {}
    for n in sizes:
        reps = _reps(n, args.target_seconds, args.min_reps)
        if args.impl == "static":
            slots = tensors.static_slots(g, [dict(name="ping", src=0, dst=1, shape=(n,), dtype="uint8"),
                                             dict(name="pong", src=1, dst=0, shape=(n,), dtype="uint8")])
            src = np.full(n, 7, np.uint8) if me == 0 else None  # rank 1 sends back what it got
            if me == 0:
                def rt():
                    slots["ping"].send(src)
                    return slots["pong"].recv()
            else:
                def rt():
                    a = slots["ping"].recv()
                    slots["pong"].send(a)
                    return a
        else:
            chans = tensors.dynamic_channels(g, [(0, 1), (1, 0)])
            if args.impl == "copy":
                src = np.frombuffer(bytearray(n), np.uint8)  # ordinary memory: not registered
            else:
                from scalefree.arena import registered_empty

                src = registered_empty((n,), np.uint8)
            src[...] = 7
            if me == 0:
                def rt():
                    chans[(0, 1)].send(src)
                    return chans[(1, 0)].recv()
            else:
                def rt():
                    a = chans[(0, 1)].recv()
                    chans[(1, 0)].send(a if args.impl != "copy" else src)
                    return a
        g.barrier()
        times = [t / 2 for t in _time(rt, reps)]
        g.barrier()
        got = rt()  # one more round trip, untimed: what this rank receives is checked
        bad = first_mismatch(np.asarray(got), 7) if len(got) == n else -1
        if bad is not None:
            raise RuntimeError(f"{args.impl}: rank {me} received a wrong buffer of {n} B: "
                               + (f"{len(got)} B" if bad == -1 else f"byte {bad} is {got[bad]}, should be 7"))
        del got
        rss = [int(x) for x in g.allgather(np.array([peak_rss_bytes()], np.int64)).reshape(-1)]
        if me == 0:
            res[n] = {"times": times, "peak_rss_bytes": rss}
            print(f"  {args.impl} {n} B: median {np.median(times) * 1e6:.1f} us, checked, "
                  f"peak RSS per rank {[f'{x / 2**30:.2f} GiB' for x in rss]}", file=sys.stderr, flush=True)
    return me, res


def run_tcp(args, sizes):
    from .common import recv_exact

    me = int(os.environ["SCALEFREE_RANK"])
    if me == 1:
        srv = socket.create_server(("127.0.0.1", args.port))
        conn, _ = srv.accept()
    else:
        for _ in range(200):
            try:
                conn = socket.create_connection(("127.0.0.1", args.port))
                break
            except OSError:
                time.sleep(0.05)
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    res = {}

    for n in sizes:
        buf = np.full(n, 7, np.uint8)
        dst = np.zeros(n, np.uint8)
        v = memoryview(dst)
        reps = _reps(n, args.target_seconds, args.min_reps)
        if me == 0:
            def rt():
                conn.sendall(buf)
                recv_exact(conn, v)
            times = [t / 2 for t in _time(rt, reps)]
            res[n] = times
            print(f"  tcp {n} B: median {np.median(times) * 1e6:.1f} us", file=sys.stderr, flush=True)
        else:
            for _ in range(reps + 3):
                recv_exact(conn, v)
                conn.sendall(dst)
    conn.close()
    return me, res


def run_gloo(args, sizes):
    import torch
    import torch.distributed as dist

    me = int(os.environ["SCALEFREE_RANK"])
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}", rank=me, world_size=2)
    res = {}
    for n in sizes:
        src = torch.full((n,), 7, dtype=torch.uint8)
        dst = torch.zeros(n, dtype=torch.uint8)
        reps = _reps(n, args.target_seconds, args.min_reps)
        if me == 0:
            def rt():
                dist.send(src, 1)
                dist.recv(dst, 1)
        else:
            def rt():
                dist.recv(dst, 0)
                dist.send(dst, 0)
        times = [t / 2 for t in _time(rt, reps)]
        if me == 0:
            res[n] = times
            print(f"  gloo {n} B: median {np.median(times) * 1e6:.1f} us", file=sys.stderr, flush=True)
    dist.destroy_process_group()
    return me, res


def run_grpc(args, sizes):
    import grpc

    me = int(os.environ["SCALEFREE_RANK"])
    opts = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
    if me == 1:
        from concurrent import futures

        received = {}

        def put(request, context):
            received["last"] = np.frombuffer(request, np.uint8)  # what a user gets
            return b""

        def put_stream(it, context):
            parts = [np.frombuffer(c, np.uint8) for c in it]
            received["last"] = parts
            return b""

        handler = grpc.method_handlers_generic_handler("bench.Tensors", {
            "Put": grpc.unary_unary_rpc_method_handler(put),
            "PutStream": grpc.stream_unary_rpc_method_handler(put_stream),
        })
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2), options=opts)
        server.add_generic_rpc_handlers((handler,))
        server.add_insecure_port(f"127.0.0.1:{args.port}")
        server.start()
        Path(args.out + ".ready").write_text("1")
        while not Path(args.out + ".done").exists():
            time.sleep(0.05)
        server.stop(0)
        return me, {}
    while not Path(args.out + ".ready").exists():
        time.sleep(0.05)
    ch = grpc.insecure_channel(f"127.0.0.1:{args.port}", options=opts)
    put = ch.unary_unary("/bench.Tensors/Put")
    put_stream = ch.stream_unary("/bench.Tensors/PutStream")
    res = {}
    chunk = 1 << 20
    for n in sizes:
        x = np.full(n, 7, np.uint8)
        reps = _reps(n, args.target_seconds, args.min_reps)
        if args.impl == "grpc-unary":
            fn = lambda: put(x.tobytes())  # noqa: E731 — the copy a user makes
        else:
            fn = lambda: put_stream(x[i:i + chunk].tobytes() for i in range(0, max(n, 1), chunk))  # noqa: E731
        times = _time(fn, reps)
        res[n] = times
        print(f"  {args.impl} {n} B: median {np.median(times) * 1e6:.1f} us", file=sys.stderr, flush=True)
    Path(args.out + ".done").write_text("1")
    ch.close()
    return me, res


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--impl", required=True, choices=("static", "dynamic", "copy", "tcp", "gloo", "grpc-unary", "grpc-stream"))
    p.add_argument("--sizes", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--target-seconds", type=float, default=0.3)
    p.add_argument("--min-reps", type=int, default=7)
    args = p.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    run = {"static": run_scalefree, "dynamic": run_scalefree, "copy": run_scalefree, "tcp": run_tcp,
           "gloo": run_gloo, "grpc-unary": run_grpc, "grpc-stream": run_grpc}[args.impl]
    me, res = run(args, sizes)
    if me == 0:
        tmp = args.out + ".tmp"
        Path(tmp).write_text(json.dumps({str(k): v for k, v in res.items()}))
        os.replace(tmp, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
