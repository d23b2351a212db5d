"""Rank side of ``scalefree bench onesided``: rank 0 writes ``--window`` blocks of ``--size``
bytes into rank 1's region per round, three ways, then notifies; rank 1 answers with a
notification once it has seen it, so every round's time covers the data landing:

* ``blocking``: ``Channel.write(...)`` (the blocking form) ``window`` times in a row;
* ``posted-serial``: ``start_write(...).wait()`` ``window`` times in a row (the posted path,
  one at a time);
* ``posted``: ``window`` ``start_write`` calls outstanding at once, then all waited for;
* with ``--compute-ms``, also ``blocking+compute`` (the blocking writes, then a fixed amount
  of numpy work calibrated to about that long) and ``posted+compute`` (post the writes, do
  the same work, then wait for them): what posting buys when the caller has work to do;
* ``raw-tcp``: the wire floor in the same run: the same bytes per round over one plain TCP
  socket between the two ranks (``sendall`` of each block, the receiver reads them all and
  answers with one byte), and ``raw-tcp-x{window}`` over ``window`` sockets at once (one
  sender thread each): what the link between the hosts carries without scalefree.

Every round runs each way once, in turn (the first pass of ``--rounds`` rounds warms up,
the second is measured), so the machine's load moving during the run falls on every way
alike. Writes one JSON object to ``--out`` (rank 0)."""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from .common import recv_exact


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--size", type=int, required=True)
    p.add_argument("--window", type=int, required=True)
    p.add_argument("--rounds", type=int, required=True)
    p.add_argument("--compute-ms", type=float, default=0.0)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    import scalefree

    g = scalefree.init(timeout=120)
    if g.size != 2:
        raise SystemExit("bench onesided runs on exactly 2 ranks")
    dev = g.device
    n, w = args.size, args.window
    src = dev.alloc_region(n * w)
    dst = dev.alloc_region(n * w)
    np.frombuffer(src, np.uint8)[:] = 7
    h = np.frombuffer(dst.handle, np.uint8)
    hs = np.asarray(g.allgather(h)).reshape(-1)
    other = 1 - g.rank
    remote = dev.attach(bytes(hs[other * len(h):(other + 1) * len(h)]))
    ch = dev.channel(other)

    def blocking():
        for i in range(w):
            ch.write(src, i * n, remote, i * n, n).wait()

    def posted_serial():
        for i in range(w):
            ch.start_write(src, i * n, remote, i * n, n).wait()

    def posted():
        done = [ch.start_write(src, i * n, remote, i * n, n) for i in range(w)]
        for c in done:
            c.wait()

    socks = _raw_sockets(g, w)
    buf = np.frombuffer(src, np.uint8)
    sink = np.empty(n * w, np.uint8)

    def raw_tcp():
        if g.rank == 0:
            for i in range(w):
                socks[0].sendall(buf[i * n:(i + 1) * n])
        else:
            recv_exact(socks[0], sink)
        _ack(socks[0], g.rank)

    pool = __import__("concurrent.futures").futures.ThreadPoolExecutor(w)

    def raw_tcp_parallel():
        if g.rank == 0:
            list(pool.map(lambda i: socks[i].sendall(buf[i * n:(i + 1) * n]), range(w)))
        else:
            list(pool.map(lambda i: recv_exact(socks[i], sink[i * n:(i + 1) * n]), range(w)))
        _ack(socks[0], g.rank)

    work = np.ones(1 << 20, np.float64)
    reps = 0
    if args.compute_ms > 0:
        # Calibrate: numpy passes over 8 MiB taking about --compute-ms on this rank.
        t = time.perf_counter()
        k = 0
        while time.perf_counter() - t < 0.2:
            work.sum()
            k += 1
        reps = max(1, int(k * args.compute_ms / 200))

    def compute():
        for _ in range(reps):
            work.sum()

    def blocking_compute():
        blocking()
        compute()

    def posted_compute():
        done = [ch.start_write(src, i * n, remote, i * n, n) for i in range(w)]
        compute()
        for c in done:
            c.wait()

    out = {"transport": g.transport, "ucx_transports": g._ucx_transports(other), "size": n, "window": w, "modes": {},
           "compute_reps": reps}
    seq = 0

    def scalefree_round(fn):
        nonlocal seq
        seq += 1
        g.barrier()
        t = time.perf_counter()
        if g.rank == 0:
            fn()
            ch.notify(1, seq)
            dev.wait(2)
        else:
            dev.wait(1)
            ch.notify(2, seq)
        return time.perf_counter() - t

    def raw_round(fn):
        g.barrier()
        t = time.perf_counter()
        fn()
        return time.perf_counter() - t

    ways = [("blocking", blocking), ("posted-serial", posted_serial), ("posted", posted)]
    if reps:
        ways += [("blocking+compute", blocking_compute), ("posted+compute", posted_compute)]
    ways = [(name, scalefree_round, fn) for name, fn in ways]
    ways += [("raw-tcp", raw_round, raw_tcp), (f"raw-tcp-x{w}", raw_round, raw_tcp_parallel)]
    # Every round runs each way once, in turn: a change of the machine's load while the
    # bench runs falls on every way alike (the ratios between ways are what it reports).
    for rep in range(2):  # the first pass warms up, the second is measured
        times = {name: [] for name, _, _ in ways}
        for _ in range(args.rounds):
            for name, timed, fn in ways:
                times[name].append(timed(fn))
        if rep == 1:
            out["modes"] = times
    pool.shutdown()
    for s in socks:
        s.close()
    if g.rank == 1:
        assert (np.frombuffer(dst, np.uint8) == 7).all(), "the written bytes did not land"
    from scalefree._rss import peak_rss_bytes

    out["peak_rss_bytes"] = [int(x) for x in g.allgather(np.array([peak_rss_bytes()], np.int64)).reshape(-1)]
    if g.rank == 0:
        with open(args.out, "w") as f:
            json.dump(out, f)
    return 0


def _raw_sockets(g, k: int) -> list:
    """``k`` plain TCP connections between the two ranks (rank 0 listens on its host's
    address, the rendezvous address; rank 1 connects), with Nagle off."""
    import os
    import socket

    port = np.zeros(1, np.int64)
    if g.rank == 0:
        lst = socket.create_server(("0.0.0.0", 0))
        port[0] = lst.getsockname()[1]
    port = int(g.allreduce(port, op="max")[0])
    if g.rank == 0:
        socks = [lst.accept()[0] for _ in range(k)]
        lst.close()
        # Accepted in arrival order: the peer sends each socket's index first.
        order = [int.from_bytes(_recv_bytes(s, 4), "little") for s in socks]
        socks = [s for _, s in sorted(zip(order, socks))]
    else:
        socks = []
        for i in range(k):
            s = socket.create_connection((os.environ["SCALEFREE_MASTER_ADDR"], port), timeout=60)
            s.sendall(i.to_bytes(4, "little"))
            socks.append(s)
    for s in socks:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.settimeout(120)
    return socks


def _recv_bytes(s, n: int) -> bytes:
    b = bytearray(n)
    recv_exact(s, b)
    return bytes(b)


def _ack(s, rank: int) -> None:
    """The receiver answers the round with one byte; the sender waits for it."""
    if rank == 0:
        _recv_bytes(s, 1)
    else:
        s.sendall(b"k")


if __name__ == "__main__":
    raise SystemExit(main())
