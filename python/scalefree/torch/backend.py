"""The ``"scalefree"`` backend of ``torch.distributed``: a ``ProcessGroup`` for CPU tensors
over scalefree's one-sided transport.

Every collective runs on one worker thread per group, in the order it was called, and
returns a :class:`Work` backed by a ``torch.futures.Future``: DDP overlaps its bucket
allreduces with the backward pass as with gloo. Contiguous tensors go to the transport
through ``tensor.numpy()`` (their own memory, no copy: peers read it with one
cross-memory-attach copy); others through a contiguous staging copy. bfloat16 and float16
move as 16-bit words and reduce in float32 (sum, avg, min, max, product); bool as bytes.

The group joins through the store torch passes: rank 0 makes a job id and token and puts
them in the store, every rank puts its host name there, and the transport's own connection
set-up (local ranks over a Unix socket, other hosts through rank 0's TCP address, also
published in the store) uses them. Rank and size are the ones torch passes, so it works the
same under torchrun, ``scalefree run``, mpirun, srun or ``mp.spawn``.

A peer that dies makes every rank's pending and later operations raise
``torch.distributed.DistBackendError`` naming the lost rank.
"""

from __future__ import annotations

import atexit
import json
import os
import queue
import secrets
import socket
import threading
import time
import weakref
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist
from torch.futures import Future

from .. import arena
from .._units import env_bytes
from ..errors import ScalefreeError, ScalefreeTimeoutError
from ..tensors import torch_sites
from .p2p import Mailbox, send_message, unpack_into

BACKEND_NAME = "scalefree"

_REDUCE_OPS = {}


def _op_name(op) -> str:
    """torch's ReduceOp (or its RedOpType) -> scalefree's op name ("avg" is sum then divide)."""
    if not _REDUCE_OPS:
        R = dist.ReduceOp
        _REDUCE_OPS.update({R.SUM: "sum", R.AVG: "avg", R.MIN: "min", R.MAX: "max", R.PRODUCT: "prod"})
    for k, v in _REDUCE_OPS.items():
        if op == k:
            return v
    raise ValueError(f"scalefree backend: unsupported reduce op {op}")


# Dtypes the native reductions handle as they are; the others are widened for the reduction.
_NATIVE_REDUCE = {torch.float32, torch.float64, torch.int32, torch.int64}
_WIDEN = {torch.bfloat16: torch.float32, torch.float16: torch.float32, torch.int8: torch.int32,
          torch.uint8: torch.int32, torch.int16: torch.int32, torch.bool: torch.int32}
# How dtypes without a numpy twin move (same width, bits unchanged).
MOVE_AS = {torch.bfloat16: torch.int16}


def as_numpy(t: torch.Tensor) -> np.ndarray:
    """A numpy view of a contiguous CPU tensor's memory (no copy), 1-D."""
    t = t.detach()
    if t.dtype in MOVE_AS:
        t = t.view(MOVE_AS[t.dtype])
    if t.is_complex():
        t = torch.view_as_real(t)
    return t.reshape(-1).numpy()


def _check_cpu(t: torch.Tensor, what: str) -> None:
    if t.device.type != "cpu":
        raise ValueError(f"scalefree backend: {what} must be a CPU tensor, got device {t.device}")
    if t.is_sparse:
        raise ValueError(f"scalefree backend: {what} must be dense (use scalefree.torch.hooks.sparse for "
                         "sparse gradients)")


class _Staged:
    """A contiguous tensor for the transport; ``finish()`` copies a result back when the
    caller's tensor was not contiguous (the common case needs no copy at all)."""

    def __init__(self, t: torch.Tensor, dtype=None):
        self.orig = t
        want = dtype or t.dtype
        if t.is_contiguous() and want == t.dtype:
            self.t = t
        else:
            self.t = t.detach().to(want).contiguous()

    def finish(self) -> None:
        if self.t is not self.orig:
            with torch.no_grad():
                self.orig.copy_(self.t)


class _SharedStorages:
    """Storages that allreduce sees again during backward passes (DDP's gradient buckets,
    which it reuses every step) are moved to shared memory once (torch's ``share_memory_``:
    in place, every view stays valid) and registered, so the peers read and write them
    through their own mapping instead of cross-memory-attach copies. A storage is moved on
    its second allreduce (one-off tensors are never copied), only while no queued allreduce
    holds it, and let go when only this cache holds it.
    With allocation-site tracing on (the default) every storage of 64 KiB or more is moved
    (the bytes peers would otherwise get through a staging copy each step); without it,
    from 1 MiB. ``SCALEFREE_TORCH_SHARE_BUCKETS=0`` turns this off."""

    MIN_BYTES = 1 << 20
    SHM_DIR = "/dev/shm"

    def __init__(self, device, min_bytes: int = MIN_BYTES):
        self._dev = device
        self._min = min_bytes
        self._seen: dict = {}    # storage identity -> (weak ref, data pointer), first sighting
        self._held: dict = {}    # data pointer -> (storage, region), moved and registered
        self._lock = threading.Lock()

    def prepare(self, t: torch.Tensor, quiet) -> None:
        """Called before ``t`` is handed to the transport (on the caller's thread: the
        storage's owner does not touch it until the collective completes). ``quiet(ptr)``
        says no queued allreduce holds the storage at ``ptr`` (it would keep the old address)."""
        st = t.untyped_storage()
        n = st.nbytes()
        if n < self._min:
            return
        from torch.multiprocessing.reductions import StorageWeakRef

        with self._lock:
            ptr = st.data_ptr()
            if ptr in self._held:
                return
            self._sweep()
            key = st._cdata  # unique while our weak reference lives
            first = self._seen.get(key)
            if first is None or first[1] != ptr:
                self._seen[key] = (StorageWeakRef(st), ptr)
                return
            del self._seen[key]
            if not quiet(ptr):
                self._seen[key] = first  # in use by a queued operation: next time
                return
            try:
                free = os.statvfs(self.SHM_DIR)
                if free.f_bavail * free.f_frsize < 2 * n:
                    return
                fd, _ = st._share_fd_cpu_()  # no-op when already shared
                self._held[st.data_ptr()] = (st, self._dev._register_shared(st.data_ptr(), n, fd))
            except (RuntimeError, OSError, ScalefreeError):
                return  # stays ordinary memory (cross-memory attach), as before

    def _sweep(self) -> None:
        for k in [k for k, (w, _) in self._seen.items() if w.expired()]:
            del self._seen[k]
        use = torch._C._storage_Use_Count
        for p in [p for p, (st, _) in self._held.items() if use(st._cdata) <= 1]:
            del self._held[p]

    def clear(self) -> None:
        with self._lock:
            self._seen.clear()
            self._held.clear()


class _Copies:
    """What the group's transfers copied (see :meth:`ProcessGroupScalefree.stats`): the
    collectives' staging as the transport counts it (``collective_staged()``, a running
    total), the rest as the channels and the mailbox report it."""

    KEYS = ("bytes_staged", "bytes_copied_recv", "bytes_zero_copy", "transfers")

    def __init__(self, collective_staged):
        self._lock = threading.Lock()
        self._n = dict.fromkeys(self.KEYS, 0)
        self._collective_staged = collective_staged
        self._base = collective_staged()

    def add(self, **counts) -> None:
        with self._lock:
            for k, v in counts.items():
                self._n[k] += int(v)
            self._n["transfers"] += 1

    def snapshot(self) -> dict:
        with self._lock:
            out = dict(self._n)
        out["bytes_staged"] += self._collective_staged() - self._base
        out["bytes_copied"] = out["bytes_staged"] + out["bytes_copied_recv"]
        return out


def _arena_for(store, g, rank: int, size: int) -> None:
    """With tracing: the registered arena in this process (numpy's allocator for arrays of
    ``SCALEFREE_ARENA_MIN`` bytes or more, where traced torch sites allocate), when the
    process has none yet; every rank of the group agrees through the store first, since
    setting it up is collective."""
    want = arena.threshold() is None and os.environ.get("SCALEFREE_ARENA", "1").strip().lower() not in (
        "0", "false", "no", "off")
    store.set(f"scalefree/arena/{rank}", "1" if want else "0")
    if not all(store.get(f"scalefree/arena/{r}") == b"1" for r in range(size)):
        return
    min_bytes = env_bytes("SCALEFREE_ARENA_MIN", 64 << 10)
    try:
        g._enable_arena(min_bytes)
    except ScalefreeError:
        return  # the same outcome on every rank (the set-up agrees first): no arena
    arena.attach(g, min_bytes)


def _seconds(timeout) -> float | None:
    """A torch timeout (timedelta, or milliseconds as torch's C++ API passes them) in seconds;
    None when it is unset (torch's kNoTimeout is 0, its kUnsetTimeout -1 ms)."""
    if timeout is None:
        return None
    s = timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout) / 1000.0
    return s if s > 0 else None


def _timed_out(what: str, seconds: float) -> "dist.DistBackendError":
    return dist.DistBackendError(f"scalefree: Timed out waiting {int(round(seconds * 1000))}ms for {what} to "
                                 "complete")


class Work(dist.distributed_c10d.Work):
    """A pending operation; completes on the group's worker thread.

    ``wait()`` returns when the operation is done, or raises ``DistBackendError`` ("Timed
    out waiting N ms ...") once its deadline passes: ``wait(timeout)`` when given, else the
    operation's own timeout (``barrier(timeout=)``), else the process group's
    (``init_process_group(timeout=)``), counted from the call to ``wait()``. A collective that
    outlives the group's timeout leaves the group out of step with its peers, so it fails
    every later operation of the group too (as gloo's closed pairs do); a shorter timeout given
    to ``wait`` only ends that wait.
    """

    def __init__(self, fut: Future, what: str = "operation", timeout_s: float | None = None, on_deadline=None):
        super().__init__()
        self._fut = fut
        self._done = threading.Event()
        self._what = what
        self._timeout_s = timeout_s
        self._on_deadline = on_deadline
        self._source = -1
        self._outcome: list = []  # [(ok, value or error)] once done (set by the worker)

    def _finish(self) -> None:
        self._done.set()

    def is_completed(self) -> bool:
        return self._done.is_set()

    def is_success(self) -> bool:
        if not self._done.is_set():
            return False
        try:
            self._fut.value()
            return True
        except Exception:
            return False

    def exception(self):
        if self._outcome and not self._outcome[0][0]:
            return self._outcome[0][1]  # the error itself, not the future's wrapping of it
        try:
            self._fut.value()
        except Exception as e:  # noqa: BLE001 - handed to the caller
            return e
        return None

    def wait(self, timeout: timedelta | None = None) -> bool:
        explicit = _seconds(timeout)
        limit = explicit if explicit is not None else self._timeout_s
        if not self._done.wait(limit):
            err = _timed_out(self._what, limit)
            if explicit is None and self._on_deadline is not None:
                self._on_deadline(err)
            raise err
        if self._outcome and not self._outcome[0][0]:
            raise self._outcome[0][1]
        self._fut.wait()
        return True

    def get_future(self) -> Future:
        return self._fut

    def result(self):
        return self._fut.value()

    def source_rank(self) -> int:
        return self._source

    def _source_rank(self) -> int:
        return self._source


class _Worker:
    """One thread running a group's operations in call order."""

    def __init__(self, name: str, inline: bool = False, timeout_s: float | None = None):
        self._inline = inline
        self._timeout_s = timeout_s
        self._q: queue.Queue = queue.Queue()
        self._failed: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, fn, result, what: str = "operation", timeout_s: float | None = None) -> Work:
        # The work's future is a continuation of ``done``: a failure then completes it with a
        # real error (raised in the callback), which torch's C++ callbacks on it (DDP's reducer)
        # see as an error; an exception object set as a future's value would reach them as a
        # value of the wrong type (and crash the process).
        outcome: list = []
        done: Future = Future()
        fut = done.then(lambda _f: _outcome(outcome))
        work = Work(fut, what, timeout_s if timeout_s is not None else self._timeout_s, self.fail)
        work._outcome = outcome
        item = (fn, result, done, outcome, work)
        if self._inline:
            self._one(*item)
        else:
            self._q.put(item)
        return work

    def fail(self, err: BaseException) -> None:
        """Every operation not yet started fails with ``err`` (the group is out of step)."""
        if self._failed is None:
            self._failed = err

    def _run(self) -> None:
        while True:
            item = self._q.get()
            if item is None:
                return
            self._one(*item)

    def _one(self, fn, result, done, outcome, work) -> None:
        try:
            if self._failed is not None:
                outcome.append((False, self._failed))
                return
            try:
                value = fn()
            except BaseException as e:  # noqa: BLE001 - every later op fails the same way
                if isinstance(e, TimeoutError) and not str(e).startswith("scalefree: Timed out"):
                    limit = work._timeout_s
                    e2 = ScalefreeTimeoutError(f"scalefree: Timed out waiting "
                                               f"{int(round(limit * 1000)) if limit else '?'}ms for {work._what} to "
                                               f"complete ({e})")
                    e2.__cause__ = e
                    e = e2
                err = _translate(e)
                # A lost peer or a transport failure leaves the group unusable: fail later ops too.
                if isinstance(err, dist.DistBackendError):
                    self._failed = err
                outcome.append((False, err))
                return
            if isinstance(value, _Source):
                work._source = value.rank
            outcome.append((True, result))
        finally:
            done.set_result(None)
            work._finish()

    def stop(self) -> None:
        self._q.put(None)
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=10)


def _outcome(outcome: list):
    """The value of a finished operation, or its error raised."""
    ok, value = outcome[0]
    if not ok:
        raise value
    return value


class _Source:
    """What a receive returns to its worker: the rank the message came from."""

    def __init__(self, rank: int):
        self.rank = rank


def _translate(e: BaseException) -> BaseException:
    """scalefree's transport errors (and timeouts) as torch's DistBackendError (the message kept)."""
    if isinstance(e, dist.DistBackendError):
        return e
    if isinstance(e, ScalefreeError) and not isinstance(e, ValueError) or isinstance(e, TimeoutError):
        msg = str(e) if str(e).startswith("scalefree") else f"scalefree: {e}"
        err = dist.DistBackendError(msg)
        err.__cause__ = e
        return err
    return e


def _join(store, rank: int, size: int, timeout: timedelta):
    """The scalefree group of torch's (store, rank, size): agree on a job id, token, local
    ranks and (across hosts) rank 0's address through the store, then start the transport."""
    from ..group import Group
    from ..launch.ucx import prepare

    prepare()
    host = socket.gethostname()
    if rank == 0:
        info = {"job_id": "torch-" + secrets.token_hex(8), "token": secrets.token_hex(16)}
        store.set("scalefree/job", json.dumps(info))
    store.set(f"scalefree/host/{rank}", host)
    info = json.loads(store.get("scalefree/job").decode())
    hosts = [store.get(f"scalefree/host/{r}").decode() for r in range(size)]
    local = [r for r in range(size) if hosts[r] == host]
    env = {
        "SCALEFREE_RANK": str(rank),
        "SCALEFREE_WORLD_SIZE": str(size),
        "SCALEFREE_LOCAL_RANK": str(local.index(rank)),
        "SCALEFREE_LOCAL_SIZE": str(len(local)),
        "SCALEFREE_JOB_ID": info["job_id"],
        "SCALEFREE_JOB_TOKEN": info["token"],
    }
    if len(local) == size:
        # One host: the local socket (whatever address a launcher set for its own group).
        env["SCALEFREE_MASTER_ADDR"] = env["SCALEFREE_MASTER_PORT"] = ""
    else:
        # Across hosts: rank 0's address and a port of its own (not that of a group made by
        # scalefree.init() in the same job). The job's secret above travels through torch's
        # store, which is as open as the store itself.
        if rank == 0:
            addr = (os.environ.get("SCALEFREE_MASTER_ADDR") or os.environ.get("MASTER_ADDR")
                    or socket.gethostbyname(host))
            with socket.socket() as s:  # a free port on rank 0's host for the transport's rendezvous
                s.bind(("", 0))
                port = s.getsockname()[1]
            store.set("scalefree/master", f"{addr}:{port}")
        addr, port = store.get("scalefree/master").decode().rsplit(":", 1)
        env["SCALEFREE_MASTER_ADDR"], env["SCALEFREE_MASTER_PORT"] = addr, port
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        seconds = timeout.total_seconds() if timeout is not None else None
        return Group(timeout=seconds if seconds and seconds > 0 else None)
    except ScalefreeError as e:
        raise _translate(e) from e
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class ProcessGroupScalefree(dist.ProcessGroup):
    """torch's ProcessGroup interface over a scalefree group (CPU tensors)."""

    def __init__(self, store, rank: int, size: int, timeout: timedelta | None = None, trace: bool | None = None):
        super().__init__(rank, size)
        self._g = _join(store, rank, size, timeout)
        # Allocation-site tracing (the RDMA tensor paper, 3.4; default SCALEFREE_TRACE, on):
        # tensors the transport has to stage trace their allocation site, so the next tensor
        # made there is born in registered memory; persistent ones (DDP's buckets) are moved
        # there. Off: tensors go where they are, staged by the transport every time.
        self._trace = arena.tracing(trace)
        # Calls up to this size travel inline with the header (a copy, registered or not).
        self._inline_max = min(env_bytes("SCALEFREE_ONE_SHOT_MAX", 32 << 10), env_bytes("SCALEFREE_INLINE_BYTES",
                                                                                          256 << 10))
        if self._trace:
            _arena_for(store, self._g, rank, size)
        # SCALEFREE_TORCH_INLINE=1 runs collectives on the calling thread (no overlap with
        # compute; for comparison).
        inline = os.environ.get("SCALEFREE_TORCH_INLINE", "0").strip() not in ("", "0")
        self._timeout_s = _seconds(timeout)
        self._worker = _Worker(f"scalefree-pg-{rank}", inline=inline, timeout_s=self._timeout_s)
        share = os.environ.get("SCALEFREE_TORCH_SHARE_BUCKETS", "1").strip() not in ("", "0")
        # Peers map a shared storage through /proc (as cross-memory attach needs); over UCX
        # buffers are sent from where they are.
        self._shared = (_SharedStorages(self._g.device, self._inline_max + 1 if self._trace else _SharedStorages.MIN_BYTES)
                        if share and self._g.transport == "shm" and self._g.cross_memory_attach else None)
        self._ar_lock = threading.Lock()
        self._ar_inflight: dict = {}  # storage address -> allreduces queued on it
        # Dynamic channels between every ordered pair of ranks for send/recv (collective, so
        # made here, where every rank is).
        from ..tensors.slots import dynamic_channels

        # With tracing, torch's allocation sites are traced (scalefree.tensors.torch_sites: a
        # dispatch mode, microseconds per operator, until the staged tensors' operators are
        # known; then kernels of their own for those operators only) in a thread that calls
        # the group once a tensor of at least SITE_MIN bytes had to be staged outside a
        # backward pass (DDP's buckets are registered instead): a DDP-only job never runs
        # under the mode.
        self._sites_wanted = False
        self._p2p = dynamic_channels(self._g, [(s, d) for s in range(size) for d in range(size) if s != d],
                                     trace_torch=False)
        self._p2p_workers: dict = {}
        self._p2p_lock = threading.Lock()
        self._mailbox = Mailbox(self._p2p, rank, _translate)
        self._closed = False
        self._copies = _Copies(self._g._bytes_staged)  # from here on (the set-up above is not counted)
        _live.add(self)

    # -- plumbing ------------------------------------------------------------------------------
    def getBackendName(self) -> str:
        return BACKEND_NAME

    # torch keeps a group's name in its backends; a Python ProcessGroup has none, so the name
    # torch gives the group is kept here (DeviceMesh, and so FSDP2, looks groups up by it).
    def _set_group_name(self, name) -> None:
        self._sf_group_name = name

    @property
    def group_name(self):
        name = getattr(self, "_sf_group_name", None)
        if name is None:
            raise RuntimeError("ProcessGroup name not set")
        return name

    # batch_isend_irecv asks the group for its CPU backend (to see whether it coalesces): this
    # group is its own.
    def _get_backend(self, device):
        if torch.device(device).type != "cpu":
            raise RuntimeError(f"scalefree backend: no backend for device {device} (CPU tensors only)")
        return self

    # torch asks a group which devices it serves (monitored_barrier, object collectives); a
    # Python ProcessGroup has no per-device backends registered, so the answer is given here.
    @property
    def _device_types(self):
        return [torch.device("cpu")]

    def _set_group_desc(self, desc) -> None:
        self._sf_group_desc = desc

    @property
    def group_desc(self):
        return getattr(self, "_sf_group_desc", "")

    @property
    def group(self):
        """The underlying :class:`scalefree.Group`."""
        return self._g

    @property
    def trace(self) -> bool:
        """Whether allocation-site tracing is on for this group."""
        return self._trace

    def stats(self) -> dict:
        """Bytes this rank's transfers copied since the group started: ``bytes_staged``
        (tensors copied into the transport's registered buffers: a send's staging, a
        collective's buffer the transport stages, a non-contiguous tensor's contiguous
        copy), ``bytes_copied_recv`` (a message that arrived before its ``recv`` was posted,
        copied out of the mailbox), ``bytes_copied`` (their sum), ``bytes_zero_copy`` (moved
        from or into the tensor's own memory) and ``transfers``. The collectives' staging is
        the transport's own count (``Group._bytes_staged``: the bytes it copied into its
        staging region or into a call's header message, once per peer it went to), the
        sends' is what the channel reports it staged. Take two readings and subtract for one
        step."""
        return self._copies.snapshot()

    def _moved(self, call, t: torch.Tensor, traced: torch.Tensor | None = None, sent: bool = True):
        """Runs the collective ``call`` (on the worker thread, the only one calling this
        group's collectives) on the contiguous buffer ``t`` and sees what the transport
        staged for it (its own count: ``Group._bytes_staged``); the rest of ``t`` moved from
        where it is (``sent``: this rank's data goes out at all). A buffer that was staged
        although too large to travel with the call's header traces the allocation site of
        ``traced`` (the caller's tensor): registered memory would spare that copy."""
        before = self._g._bytes_staged()
        out = call()
        staged = self._g._bytes_staged() - before
        n = t.numel() * t.element_size() if sent else 0
        self._copies.add(bytes_zero_copy=max(n - staged, 0))
        if staged and n > self._inline_max and self._trace and traced is not None and n >= torch_sites.SITE_MIN:
            self._traced_staged(traced)
        return out

    def _traced_staged(self, t: torch.Tensor) -> None:
        """A tensor of at least SITE_MIN bytes had to be staged: traces its site, or, when
        its site is not known (no dispatch mode recorded it), has the caller's thread learn
        sites from its next call on."""
        if not torch_sites.note_staged(t):
            self._sites_wanted = True

    def _sites(self) -> None:
        """On the caller's thread: traces torch's allocation sites here once a staged
        tensor asked for it, and settles once they are known (torch_sites.settle: the
        dispatch mode is left, the traced operators' own kernels allocate in the arena)."""
        if self._sites_wanted:
            self._sites_wanted = False
            torch_sites.activate()
        torch_sites.settle()

    def _submit(self, fn, result, what: str = "collective", opts=None) -> Work:
        self._sites()
        timeout_s = _seconds(getattr(opts, "timeout", None)) if opts is not None else None
        return self._worker.submit(fn, result, what, timeout_s)

    def run_async(self, fn, value) -> Future:
        """Runs ``fn()`` on the group's worker thread, after the operations already called;
        the future's value is ``value`` (for DDP comm hooks)."""
        return self._submit(fn, value).get_future()

    def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._mailbox.close()
        self._worker.stop()
        for w in self._p2p_workers.values():
            w.stop()
        self._g.close()
        if self._shared is not None:
            self._shared.clear()

    def abort(self) -> None:
        self.shutdown()

    # -- collectives ---------------------------------------------------------------------------
    def _reduce_into(self, t: torch.Tensor, op: str, trace: bool = True) -> None:
        """Allreduce of one contiguous tensor, in place (``trace``: a staged tensor traces
        its allocation site)."""
        if t.numel() == 0:
            return
        native_op = "sum" if op == "avg" else op
        if t.dtype in _NATIVE_REDUCE:
            self._moved(lambda: self._g.allreduce(as_numpy(t), native_op), t, t if trace else None)
        else:
            wide = _WIDEN.get(t.dtype)
            if wide is None:
                raise ValueError(f"scalefree backend: cannot reduce dtype {t.dtype}")
            w = t.to(wide)
            self._moved(lambda: self._g.allreduce(as_numpy(w), native_op), w)
            t.copy_(w)
        if op == "avg":
            if t.is_floating_point():
                t.div_(self.size())
            else:
                t.copy_(torch.div(t, self.size(), rounding_mode="floor"))

    def _allgather_bytes(self, raw: np.ndarray) -> list:
        """Every rank's byte string (sizes may differ), in rank order."""
        n = self.size()
        sizes = torch.empty(n, dtype=torch.int64)
        self._allgather_flat(torch.tensor([raw.size], dtype=torch.int64), sizes)
        if not int(sizes.sum()):
            return [np.empty(0, np.uint8) for _ in range(n)]
        got = self._g.alltoallv(np.tile(raw, n), np.full(n, raw.size, np.int64)).reshape(-1)
        offsets = np.concatenate([[0], np.cumsum(sizes.numpy())])
        return [got[offsets[r]:offsets[r + 1]] for r in range(n)]

    def _sparse_allreduce(self, t: torch.Tensor, op: str) -> None:
        """Sum of a sparse COO tensor over ranks, in place (as gloo: every rank's indices and
        values gathered, then coalesced)."""
        if op != "sum":
            raise ValueError(f"scalefree backend: sparse all_reduce supports sum only, got {op}")
        c = t.detach().coalesce()
        idx, val = c.indices().contiguous(), c.values().contiguous()
        idx_all = self._allgather_bytes(as_numpy(idx).view(np.uint8))
        val_all = self._allgather_bytes(as_numpy(val).view(np.uint8))
        ind = [torch.from_numpy(b.copy()).view(torch.int64).view(idx.shape[0], -1) for b in idx_all]
        vals = [torch.from_numpy(b.copy()).view(val.dtype).view((-1,) + tuple(val.shape[1:])) for b in val_all]
        total = torch.sparse_coo_tensor(torch.cat(ind, 1), torch.cat(vals), t.shape).coalesce()
        with torch.no_grad():
            t.copy_(total)

    def allreduce(self, tensors, opts=None):
        op = _op_name(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)
        if any(t.is_sparse for t in tensors):
            sparse = list(tensors)

            def run_sparse():
                for t in sparse:
                    self._sparse_allreduce(t, op)

            return self._submit(run_sparse, sparse, "allreduce", opts)
        for t in tensors:
            _check_cpu(t, "allreduce input")
        staged = [_Staged(t) for t in tensors]
        # Only during a backward pass (DDP's bucket allreduces): a storage moved to shared
        # memory changes address, which a caller holding its raw pointer (a numpy view)
        # would not see.
        backward = torch._C._current_graph_task_id() != -1
        if self._shared is not None and backward:
            for st in staged:
                if st.t is st.orig and st.t.dtype in _NATIVE_REDUCE:
                    self._shared.prepare(st.t, self._quiet_for)
        # Queued allreduces per storage, for the move above (nothing to count without it).
        keys = [s.t.untyped_storage().data_ptr() for s in staged] if self._shared is not None else []
        if keys:
            with self._ar_lock:
                for k in keys:
                    self._ar_inflight[k] = self._ar_inflight.get(k, 0) + 1

        def run():
            try:
                for s in staged:
                    self._reduce_into(s.t, op, not backward)
                    s.finish()
            finally:
                if keys:
                    with self._ar_lock:
                        for k in keys:
                            self._ar_inflight[k] -= 1
                            if not self._ar_inflight[k]:
                                del self._ar_inflight[k]

        return self._submit(run, list(tensors), "allreduce", opts)

    def _quiet_for(self, ptr: int) -> bool:
        """No queued allreduce holds the storage at ``ptr`` (it would keep the old address)."""
        with self._ar_lock:
            return ptr not in self._ar_inflight

    def allreduce_coalesced(self, tensors, opts=None):
        return self.allreduce(tensors, opts)

    def broadcast(self, tensors, opts=None):
        root = opts.rootRank if opts is not None else 0
        for t in tensors:
            _check_cpu(t, "broadcast tensor")
        staged = [_Staged(t) for t in tensors]

        def run():
            for s in staged:
                if s.t.numel():
                    # parameters and buffers (DDP's): persistent, nothing to trace
                    self._moved(lambda: self._g.broadcast(as_numpy(s.t), root), s.t, sent=self.rank() == root)
                s.finish()

        return self._submit(run, list(tensors), "broadcast", opts)

    def _allgather_flat(self, inp: torch.Tensor, out: torch.Tensor) -> None:
        """Every rank's ``inp`` into contiguous ``out`` (size * inp.numel() elements, rank order)."""
        if inp.numel() == 0:
            return
        self._moved(lambda: self._g._allgather_into(as_numpy(inp), as_numpy(out)), inp, inp)

    def allgather(self, output_tensors, input_tensors, opts=None):
        for t in input_tensors:
            _check_cpu(t, "allgather input")
        jobs = []
        for outs, inp in zip(output_tensors, input_tensors):
            if len(outs) != self.size():
                raise ValueError(f"scalefree backend: allgather needs {self.size()} output tensors, got {len(outs)}")
            jobs.append((outs, inp.detach().contiguous()))

        def run():
            for outs, inp in jobs:
                flat = torch.empty((self.size(),) + tuple(inp.shape), dtype=inp.dtype)
                self._allgather_flat(inp, flat)
                with torch.no_grad():
                    for r, o in enumerate(outs):
                        o.copy_(flat[r].view(o.shape))

        return self._submit(run, list(output_tensors), "allgather", opts)

    def allgather_coalesced(self, output_lists, input_list, opts=None):
        """``output_lists[r][i]`` receives rank r's ``input_list[i]``: every input's bytes in
        one allgather (inputs may differ in dtype and shape; each rank's are alike)."""
        n = self.size()
        if len(output_lists) != n:
            raise ValueError(f"scalefree backend: all_gather_coalesced needs {n} output lists, got {len(output_lists)}")
        for r, outs in enumerate(output_lists):
            if len(outs) != len(input_list):
                raise ValueError(f"scalefree backend: all_gather_coalesced output list {r} holds {len(outs)} tensors, "
                                 f"the input list {len(input_list)}")
            for o, i in zip(outs, input_list):
                if o.numel() != i.numel() or o.dtype != i.dtype:
                    raise ValueError("scalefree backend: all_gather_coalesced outputs must match the inputs' sizes "
                                     "and dtypes")
        for t in input_list:
            _check_cpu(t, "all_gather_coalesced input")
        ins = [t.detach().contiguous() for t in input_list]

        def run():
            raw = [as_numpy(t).view(np.uint8) for t in ins]
            send = np.concatenate(raw) if raw else np.empty(0, np.uint8)
            if not send.size:
                return
            got = np.empty(n * send.size, np.uint8)
            self._g._allgather_into(send, got)
            with torch.no_grad():
                for r, outs in enumerate(output_lists):
                    at = r * send.size
                    for o, piece in zip(outs, raw):
                        st = _Staged(o)
                        as_numpy(st.t).view(np.uint8)[:] = got[at:at + piece.size]
                        st.finish()
                        at += piece.size

        return self._submit(run, [t for outs in output_lists for t in outs], "allgather", opts)

    def _allgather_base(self, output, input, opts=None):
        _check_cpu(input, "allgather input")
        if output.numel() != input.numel() * self.size():
            raise ValueError(f"scalefree backend: all_gather_into_tensor output must hold {self.size()} x "
                             f"{input.numel()} elements, has {output.numel()}")
        if output.dtype != input.dtype:
            raise ValueError("scalefree backend: all_gather_into_tensor output and input dtypes differ")
        out = _Staged(output)
        inp = input.detach().contiguous()

        def run():
            self._allgather_flat(inp, out.t)
            out.finish()

        return self._submit(run, output, "allgather", opts)

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
        works = [self._allgather_base(o, i, opts) for o, i in zip(outputs, inputs)]
        return works[-1] if works else self._submit(lambda: None, [])

    def _reduce_scatter_flat(self, inp: torch.Tensor, out: torch.Tensor, op: str) -> None:
        """Reduces contiguous ``inp`` (size equal shares) and leaves this rank's share in ``out``."""
        if out.numel() == 0:
            return
        native_op = "sum" if op == "avg" else op
        if inp.dtype in _NATIVE_REDUCE:
            self._moved(lambda: self._g._reduce_scatter_into(as_numpy(inp), as_numpy(out), native_op), inp, inp)
            res = out
        else:
            wide = _WIDEN.get(inp.dtype)
            if wide is None:
                raise ValueError(f"scalefree backend: cannot reduce dtype {inp.dtype}")
            res = torch.empty(out.shape, dtype=wide)
            self._g._reduce_scatter_into(as_numpy(inp.to(wide)), as_numpy(res), native_op)
        if op == "avg":
            if res.is_floating_point():
                res.div_(self.size())
            else:
                res.copy_(torch.div(res, self.size(), rounding_mode="floor"))
        if res is not out:
            out.copy_(res)

    def _reduce_scatter_base(self, output, input, opts=None):
        op = _op_name(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)
        _check_cpu(input, "reduce_scatter input")
        if input.numel() != output.numel() * self.size():
            raise ValueError(f"scalefree backend: reduce_scatter_tensor input must hold {self.size()} x "
                             f"{output.numel()} elements, has {input.numel()}")
        out = _Staged(output)
        inp = input.detach().contiguous()

        def run():
            self._reduce_scatter_flat(inp, out.t, op)
            out.finish()

        return self._submit(run, output, "reduce_scatter", opts)

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts=None):
        works = [self._reduce_scatter_base(o, i, opts) for o, i in zip(outputs, inputs)]
        return works[-1] if works else self._submit(lambda: None, [])

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        op = _op_name(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)
        jobs = []
        for out, ins in zip(output_tensors, input_tensors):
            if len(ins) != self.size():
                raise ValueError(f"scalefree backend: reduce_scatter needs {self.size()} inputs, got {len(ins)}")
            if any(i.numel() != out.numel() for i in ins):
                raise ValueError("scalefree backend: reduce_scatter inputs must match the output's size")
            flat = torch.cat([i.detach().reshape(-1) for i in ins])
            jobs.append((_Staged(out), flat))

        def run():
            for out, flat in jobs:
                self._reduce_scatter_flat(flat, out.t.view(-1), op)
                out.finish()

        return self._submit(run, list(output_tensors), "reduce_scatter", opts)

    def reduce(self, tensors, opts=None):
        # Allreduce, kept on the root only (others' tensors are left as they were).
        op = _op_name(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)
        root = opts.rootRank if opts is not None else 0
        staged = [(_Staged(t), t.detach().clone()) for t in tensors]

        def run():
            for s, scratch in staged:
                self._reduce_into(scratch, op)
                if self.rank() == root:
                    with torch.no_grad():
                        s.orig.copy_(scratch)

        return self._submit(run, list(tensors), "reduce", opts)

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        _check_cpu(input, "all_to_all input")
        n = self.size()
        rows_in = input.shape[0] if input.dim() else 1
        if not input_split_sizes:
            if rows_in % n:
                raise ValueError(f"scalefree backend: all_to_all_single input of {rows_in} rows does not split "
                                 f"evenly over {n} ranks")
            input_split_sizes = [rows_in // n] * n
        if len(input_split_sizes) != n or sum(input_split_sizes) != rows_in:
            raise ValueError(f"scalefree backend: input_split_sizes {list(input_split_sizes)} do not cover "
                             f"{rows_in} rows over {n} ranks")
        row = int(input[0].numel()) if input.dim() and rows_in else 1
        inp = input.detach().contiguous()
        out = _Staged(output)

        def run():
            send = as_numpy(inp).view(np.uint8).reshape(rows_in, -1) if rows_in else \
                np.empty((0, row * input.element_size()), np.uint8)
            got = self._g.alltoallv(send, np.asarray(input_split_sizes, np.int64))
            dst = as_numpy(out.t).view(np.uint8)
            if got.size != dst.size:
                raise ValueError(f"scalefree backend: all_to_all_single received {got.size} bytes, "
                                 f"the output holds {dst.size}")
            dst[:] = got.reshape(-1)
            out.finish()

        return self._submit(run, output, "alltoall", opts)

    def alltoall(self, output_tensors, input_tensors, opts=None):
        n = self.size()
        ins = [t.detach().contiguous() for t in input_tensors]
        outs = list(output_tensors)
        if len(ins) != n or len(outs) != n:
            raise ValueError(f"scalefree backend: all_to_all needs {n} input and output tensors")

        def run():
            send = np.concatenate([as_numpy(t).view(np.uint8) for t in ins])
            counts = np.array([t.numel() * t.element_size() for t in ins], np.int64)
            got = self._g.alltoallv(send, counts)
            # What arrives from rank r has the size of output r.
            at = 0
            with torch.no_grad():
                for o in outs:
                    nb = o.numel() * o.element_size()
                    piece = torch.from_numpy(got[at:at + nb].copy())
                    o.copy_(piece.view(o.dtype if o.dtype not in MOVE_AS else MOVE_AS[o.dtype]).view(o.dtype)
                            .view(o.shape))
                    at += nb

        return self._submit(run, outs, "alltoall", opts)

    # torch >= 2.10 calls these names (the tensor forms of the collectives above).
    def all_gather_single(self, output, input, opts=None):
        return self._allgather_base(output, input, opts)

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        return self.allgather_into_tensor_coalesced(outputs, inputs, opts)

    def reduce_scatter_single(self, output, input, opts=None):
        return self._reduce_scatter_base(output, input, opts)

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        return self.reduce_scatter_tensor_coalesced(outputs, inputs, opts)

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        return self.alltoall_base(output, input, output_split_sizes, input_split_sizes, opts)

    def gather(self, output_tensors, input_tensors, opts=None):
        # Everyone gathers; the root keeps the result.
        root = opts.rootRank if opts is not None else 0
        inp = input_tensors[0].detach().contiguous()
        outs = output_tensors[0] if output_tensors else []

        def run():
            flat = torch.empty((self.size(),) + tuple(inp.shape), dtype=inp.dtype)
            self._allgather_flat(inp, flat)
            if self.rank() == root:
                with torch.no_grad():
                    for r, o in enumerate(outs):
                        o.copy_(flat[r].view(o.shape))

        return self._submit(run, list(output_tensors), "gather", opts)

    def gather_single(self, output, input, opts=None):
        root = opts.rootRank if opts is not None else 0
        inp = input.detach().contiguous()

        def run():
            flat = torch.empty((self.size() * inp.numel(),), dtype=inp.dtype)
            self._allgather_flat(inp, flat)
            if self.rank() == root:
                with torch.no_grad():
                    output.copy_(flat.view(output.shape))

        return self._submit(run, output, "gather", opts)

    def scatter(self, output_tensors, input_tensors, opts=None):
        # The root sends piece r to rank r (an all-to-all in which only the root sends).
        root = opts.rootRank if opts is not None else 0
        out = output_tensors[0]
        ins = [t.detach().contiguous() for t in input_tensors[0]] if self.rank() == root else []

        def run():
            n = self.size()
            if self.rank() == root:
                send = np.concatenate([as_numpy(t).view(np.uint8) for t in ins])
                counts = np.array([t.numel() * t.element_size() for t in ins], np.int64)
            else:
                send, counts = np.empty(0, np.uint8), np.zeros(n, np.int64)
            got = self._g.alltoallv(send, counts)
            dst = _Staged(out)
            as_numpy(dst.t).view(np.uint8)[:] = got
            dst.finish()

        return self._submit(run, list(output_tensors), "scatter", opts)

    def barrier(self, opts=None):
        return self._submit(self._g.barrier, [], "barrier", opts)

    # -- point to point ----------------------------------------------------------------------------
    def _p2p_worker(self, key) -> _Worker:
        with self._p2p_lock:
            w = self._p2p_workers.get(key)
            if w is None:
                w = self._p2p_workers[key] = _Worker(f"scalefree-p2p-{key}")
            return w

    def send(self, tensors, dst: int, tag: int = 0):
        ch = self._p2p[(self.rank(), dst)]
        self._sites()
        # Each tensor goes from its own memory (a contiguous copy only when it is not
        # contiguous); the channel stages it unless it is in registered memory.
        msgs = []
        for t in tensors:
            _check_cpu(t, "send tensor")
            c = t.detach().contiguous()
            own = c.data_ptr() == t.data_ptr() or c.numel() == 0
            if not own:
                self._copies.add(bytes_staged=c.numel() * c.element_size())
            msgs.append((c, t if own and self._trace else None))

        def run():
            for c, traced in msgs:
                a = as_numpy(c)
                staged = send_message(ch, a, tag)
                self._copies.add(bytes_staged=staged, bytes_zero_copy=a.nbytes - staged)
                if traced is not None and staged >= torch_sites.SITE_MIN:
                    self._traced_staged(traced)

        return self._p2p_worker(("send", dst)).submit(run, list(tensors), "send", self._timeout_s)

    def _recv(self, tensors, src, tag: int) -> Work:
        """Receives into ``tensors`` from ``src`` (None: any source) the messages with ``tag``."""
        staged = [_Staged(t) for t in tensors]
        timeout_s = self._timeout_s

        def run():
            got = src
            for s in staged:
                out = as_numpy(s.t).view(np.uint8)
                got, payload = self._mailbox.recv(src if got is None else got, tag, timeout_s, out)
                if payload is None:  # landed in the tensor itself
                    self._copies.add(bytes_zero_copy=out.size)
                else:
                    unpack_into(payload, out, "recv")
                    self._copies.add(bytes_copied_recv=out.size)
                s.finish()
            return _Source(got)

        key = ("recv", "any" if src is None else src)
        return self._p2p_worker(key).submit(run, list(tensors), "recv", timeout_s)

    def recv(self, tensors, src: int, tag: int = 0):
        return self._recv(tensors, src, tag)

    def recv_anysource(self, tensors, tag: int = 0):
        return self._recv(tensors, None, tag)

    # monitored_barrier: every rank reports to rank 0 within the timeout, then rank 0 lets them go
    # (gloo's protocol and messages). Its messages use tags user code cannot (negative).
    _MB_ARRIVE, _MB_RELEASE = -(1 << 62), -(1 << 62) + 1

    def monitored_barrier(self, timeout=None, wait_all_ranks: bool = False) -> None:
        if timeout is None:
            limit = self._timeout_s
        else:  # here 0 means no time at all (gloo: rank 0 times out at once)
            limit = max(0.0, timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout) / 1000.0)
        rank, n = self.rank(), self.size()
        token = np.zeros(1, np.uint8)
        if rank != 0:
            try:
                send_message(self._p2p[(rank, 0)], token, self._MB_ARRIVE, timeout=limit)
                self._mailbox.recv(0, self._MB_RELEASE, limit)
            except BaseException as e:  # noqa: BLE001 - reworded as gloo's
                raise RuntimeError(f"Rank {rank} successfully reached monitoredBarrier, but received errors while "
                                   f"waiting for send/recv from rank 0. Please check rank 0 logs for faulty rank. "
                                   f"({e})") from e
            return
        deadline = time.monotonic() + (limit if limit is not None else float("inf"))
        self._mailbox.listen(range(1, n))
        failed = []
        for r in range(1, n):
            left = max(0.0, deadline - time.monotonic())
            if limit is not None and left <= 0.0 and not wait_all_ranks:
                raise RuntimeError(f"Rank 0 timed out in monitoredBarrier after {int(round(limit * 1000))} ms")
            try:
                self._mailbox.recv(r, self._MB_ARRIVE, left if limit is not None else None)
            except BaseException as e:  # noqa: BLE001 - a rank that did not arrive
                ms = int(round((limit or 0) * 1000))
                if not wait_all_ranks:
                    raise RuntimeError(f"Rank {r} failed to pass monitoredBarrier in {ms} ms") from e
                failed.append(r)
        if failed:
            ms = int(round((limit or 0) * 1000))
            raise RuntimeError(f"Ranks {', '.join(map(str, failed))} failed to pass monitoredBarrier in {ms} ms")
        for r in range(1, n):
            send_message(self._p2p[(0, r)], token, self._MB_RELEASE)


# Groups still open at interpreter exit are shut down first (their threads stopped, the
# transport closed), also when a script ends without destroy_process_group().
_live: "weakref.WeakSet[ProcessGroupScalefree]" = weakref.WeakSet()


@atexit.register
def _shutdown_all() -> None:
    for pg in list(_live):
        try:
            pg.shutdown()
        except Exception:  # noqa: BLE001 - exiting anyway
            pass


def create_backend(store, rank: int, size: int, timeout: timedelta):
    """The creator ``torch.distributed.Backend.register_backend`` calls."""
    return ProcessGroupScalefree(store, rank, size, timeout)


def register() -> None:
    """Registers the ``"scalefree"`` backend with torch.distributed (idempotent)."""
    if BACKEND_NAME.upper() in dist.Backend._plugins:
        return
    dist.Backend.register_backend(BACKEND_NAME, create_backend, devices=["cpu"])
    # torch's flight-recorder hook files a group's operations under the name its C++ backends
    # hold; a Python ProcessGroup has none, so the hook cannot attach (torch says so itself and
    # skips such a group while it reports no devices). The group reports "cpu" (monitored_barrier
    # needs that), so it is listed with the backends that record themselves: not hooked.
    fr = getattr(dist.distributed_c10d, "_FR_SELF_RECORDING_BACKENDS", None)
    if isinstance(fr, set):
        fr.add(BACKEND_NAME)
