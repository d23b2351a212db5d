"""Zero-copy tensor transfer between ranks (numpy arrays and CPU torch tensors).

Two ways, as in the RDMA tensor paper (§3.2–3.4):

* **Static slots** — a fixed shape and dtype, set up once. The receiver's buffer lives in a
  registered region; ``send`` is one one-sided write into it followed by a sequence word, and
  ``recv`` returns an array that *is* that buffer (no copy). The sender cannot overwrite a
  message the receiver has not released (``release()``, or the next ``recv``).
* **Dynamic channels** — any shape and dtype per message. The sender writes a small metadata
  record; the receiver allocates and pulls the data with a one-sided read. Tensors in
  registered memory (the arena: numpy arrays of 64 KiB or more allocated after
  ``scalefree.init()``, or :func:`empty`) go without a copy; others through one staging copy,
  counted in ``stats()["bytes_copied"]``.

>>> slots = tensors.static_slots(g, [dict(name="w", src=0, dst=1, shape=(1024,), dtype="float32")])
>>> if g.rank == 0: slots["w"].send(weights)
>>> if g.rank == 1: w = slots["w"].recv()          # the receive buffer itself

Set-up is collective: every rank passes the same list.
"""

from __future__ import annotations

import concurrent.futures
import threading

import numpy as np

from ..arena import registered_empty
from ..errors import InvalidArgumentError
from . import torch_sites

# Dtype codes carried in dynamic records (the same table on every rank).
_DTYPES = ["bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64",
           "float16", "float32", "float64", "complex64", "complex128"]
_CODE = {np.dtype(d): i for i, d in enumerate(_DTYPES)}


_pool = None
_pool_lock = threading.Lock()


def _submit(fn, *args) -> concurrent.futures.Future:
    """Runs a transfer on the tensors' thread pool (the native calls release the GIL, so
    transfers on different slots and channels proceed in parallel, like the paper's QPs)."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = concurrent.futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="scalefree-tensors")
    return _pool.submit(fn, *args)


def _background(fn, callback, *args) -> concurrent.futures.Future:
    f = _submit(fn, *args)
    if callback is not None:
        f.add_done_callback(callback)
    return f


def aio(future: concurrent.futures.Future):
    """An asyncio awaitable for a transfer's future: ``await tensors.aio(slot.recv_async())``."""
    import asyncio

    return asyncio.wrap_future(future)


def as_array(t, what: str) -> np.ndarray:
    """A numpy view of a numpy array or CPU torch tensor (no copy); contiguity checked."""
    if isinstance(t, np.ndarray):
        a = t
    elif isinstance(t, np.generic):
        a = np.asarray(t)
    elif hasattr(t, "__dlpack__") and type(t).__module__.startswith("torch"):
        if t.device.type != "cpu":
            raise InvalidArgumentError(f"{what}: only CPU tensors can be sent (got {t.device})")
        if not t.is_contiguous():
            raise InvalidArgumentError(f"{what}: the tensor is not contiguous (call .contiguous())")
        a = t.detach().numpy()
    else:
        raise InvalidArgumentError(f"{what}: expected a numpy array or a torch tensor, got {type(t).__name__}")
    if not a.flags.c_contiguous:
        raise InvalidArgumentError(f"{what}: the array is not C-contiguous (np.ascontiguousarray makes one)")
    return a


class StaticSlot:
    """One end of a static slot (see :func:`static_slots`)."""

    def __init__(self, native, name: str, shape: tuple, dtype: np.dtype):
        self._native = native
        self.name = name
        self.shape = tuple(shape)
        self.dtype = dtype
        self.src, self.dst = native.src, native.dst
        self.is_sender = native.is_sender
        # The receive buffer, viewed once: every recv returns this same array.
        self.array = None if self.is_sender else np.frombuffer(native, dtype=dtype).reshape(self.shape)

    def send(self, tensor, timeout: float | None = None) -> None:
        """Writes ``tensor`` (this slot's shape and dtype) into the receiver's buffer."""
        a = as_array(tensor, f"slot {self.name!r}")
        if a.shape != self.shape or a.dtype != self.dtype:
            raise InvalidArgumentError(f"slot {self.name!r} carries {self.shape} {self.dtype}, got {a.shape} {a.dtype}")
        is_torch = a is not tensor and not isinstance(tensor, np.generic)
        before = self._native.stats()[1] if is_torch else 0
        self._native.send(a, timeout)
        if is_torch and self._native.stats()[1] > before:  # staged: trace the tensor's site
            torch_sites.note_staged(tensor)

    def recv(self, timeout: float | None = None) -> np.ndarray:
        """Releases the previous message, waits for the next and returns the buffer holding
        it (valid until ``release()`` or the next ``recv``)."""
        self._native.recv(timeout)
        return self.array

    def recv_torch(self, timeout: float | None = None):
        """``recv`` as a torch tensor sharing the buffer."""
        import torch

        return torch.from_numpy(self.recv(timeout))

    def release(self) -> None:
        """Done with the last message: the sender may write the next one."""
        self._native.release()

    def send_async(self, tensor, callback=None) -> concurrent.futures.Future:
        """``send`` in the background. The future's ``done()`` tests, ``result()`` waits,
        ``callback(future)`` runs on completion, and ``aio(future)`` awaits it. The tensor
        must stay unchanged until then."""
        return _background(self.send, callback, tensor)

    def recv_async(self, callback=None) -> concurrent.futures.Future:
        """``recv`` in the background; the future's result is the buffer."""
        return _background(self.recv, callback)

    def poll(self) -> bool:
        return self._native.poll()

    def stats(self) -> dict:
        z, c, n = self._native.stats()
        return {"bytes_zero_copy": z, "bytes_copied": c, "transfers": n}

    def __repr__(self):
        role = "send" if self.is_sender else "recv"
        return f"StaticSlot({self.name!r}, {self.src}->{self.dst}, {self.shape} {self.dtype}, {role})"


def _torch_sites() -> None:
    """Allocation-site tracing for torch tensors in this thread, if torch is in use (see
    :mod:`.torch_sites`)."""
    import sys

    if "torch" in sys.modules:
        torch_sites.activate()


def static_slots(group, specs, *, trace_torch: bool = True) -> dict[str, StaticSlot]:
    """Collective: sets up static slots from ``specs`` (dicts with name, src, dst, shape,
    dtype; the same list on every rank). Returns this rank's ends by name. With torch
    imported, ``trace_torch`` turns on the allocation-site tracing of torch tensors in the
    calling thread (:mod:`scalefree.tensors.torch_sites`)."""
    if trace_torch:
        _torch_sites()
    parsed = []
    names = set()
    for s in specs:
        name, shape, dtype = s["name"], tuple(int(d) for d in s["shape"]), np.dtype(s["dtype"])
        if name in names:
            raise InvalidArgumentError(f"slot name {name!r} appears twice")
        names.add(name)
        parsed.append((name, int(s["src"]), int(s["dst"]), shape, dtype))
    nbytes = [int(np.prod(shape, dtype=np.int64)) * dtype.itemsize for _, _, _, shape, dtype in parsed]
    natives = group._static_slots([(src, dst, n) for (_, src, dst, _, _), n in zip(parsed, nbytes)])
    return {p[0]: StaticSlot(nat, p[0], p[3], p[4]) for p, nat in zip(parsed, natives) if nat is not None}


# Allocation-site tracing (§3.4). Automatic: numpy arrays of 4 KiB up to the arena
# threshold remember where in Python code they were allocated (the arena's allocator keys
# the site on the innermost two frames outside numpy); a channel that has to stage such an
# array traces its site, and later allocations from that site come from the arena, so the
# next send copies nothing, with no site named in user code. By name: `send(site=...)`
# records a name, and `empty(site=...)` allocates from the arena for a recorded name.
_traced_sites: set = set()


def traced_sites() -> set:
    """Allocation sites named with ``send(site=...)`` that were seen sending unregistered
    memory so far."""
    return set(_traced_sites)


def traced_allocation_sites() -> int:
    """How many allocation sites were traced automatically in this process (each turned
    into arena allocations from then on)."""
    from .. import _native

    return _native._traced_site_count()


def _trace(a: np.ndarray) -> bool:
    """Traces the allocation site of the array ``a`` was staged from (if it has one)."""
    from .. import _native

    return a.size > 0 and _native._trace_site(a.ctypes.data)


def trace_staged(tensor, a: np.ndarray) -> bool:
    """A send had to stage ``tensor`` (``a``: its numpy view) into registered memory: traces
    its allocation site, so the next tensor allocated there is born in registered memory
    (torch tensors through :mod:`.torch_sites`, numpy arrays through the arena's
    allocator). True if it had a site."""
    if a is not tensor and not isinstance(tensor, np.generic):  # a torch tensor
        return torch_sites.note_staged(tensor)
    return _trace(a)


def empty(shape, dtype="float32", site: str | None = None) -> np.ndarray:
    """An uninitialized array; from registered memory (the arena) when ``site`` was traced
    sending unregistered memory before, or when it is large enough to go there anyway."""
    dtype = np.dtype(dtype)
    n = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if site is not None and site in _traced_sites and n > 0:
        return registered_empty(shape, dtype)
    return np.empty(shape, dtype)


class DynamicChannel:
    """One end of a dynamic channel (see :func:`dynamic_channels`)."""

    def __init__(self, native):
        self._native = native
        self.src, self.dst = native.src, native.dst
        self.is_sender = native.is_sender

    def send(self, tensor, wait: bool = True, site: str | None = None, timeout: float | None = None) -> None:
        """Sends ``tensor`` (any shape, a dtype of the table). With ``wait`` (the default),
        returns once the receiver pulled it, so the tensor may be changed right away;
        otherwise it must stay unchanged until ``wait_sent()``. A tensor that had to be
        copied (not in registered memory) traces its allocation site: numpy arrays allocated
        there later come from registered memory. ``site`` also records a name for
        :func:`empty`."""
        a = as_array(tensor, "send")
        code = _CODE.get(a.dtype)
        if code is None:
            raise InvalidArgumentError(f"send: dtype {a.dtype} is not supported ({', '.join(_DTYPES)})")
        staged = self._native.send(a.reshape(-1).view(np.uint8) if a.size else np.empty(0, np.uint8),
                                   list(a.shape), code, a.dtype.itemsize, wait, timeout)
        if staged:
            trace_staged(tensor, a)
            if site is not None:
                _traced_sites.add(site)

    def wait_sent(self, timeout: float | None = None) -> None:
        self._native.wait_sent(timeout)

    def send_async(self, tensor, callback=None, site: str | None = None) -> concurrent.futures.Future:
        """``send`` (until the receiver pulled it) in the background; see
        :meth:`StaticSlot.send_async`."""
        return _background(self.send, callback, tensor, True, site)

    def recv_async(self, callback=None) -> concurrent.futures.Future:
        """``recv`` in the background; the future's result is the new array."""
        return _background(self.recv, callback)

    def recv(self, out=None, timeout: float | None = None) -> np.ndarray:
        """Waits for the next tensor and returns it in a new array (registered memory when
        64 KiB or more), or in ``out`` if it has the right shape and dtype."""
        code, itemsize, shape = self._native.recv_meta(timeout)
        if code >= len(_DTYPES):
            raise InvalidArgumentError(f"received dtype code {code}, which this version does not know")
        dtype = np.dtype(_DTYPES[code])
        shape = tuple(shape)
        if out is None:
            out = np.empty(shape, dtype)
        elif out.shape != shape or out.dtype != dtype or not out.flags.c_contiguous:
            raise InvalidArgumentError(f"recv: out is {out.shape} {out.dtype}, the message {shape} {dtype}")
        self._native.recv_into(out.reshape(-1).view(np.uint8) if out.size else np.empty(0, np.uint8))
        return out

    def stats(self) -> dict:
        z, c, n = self._native.stats()
        return {"bytes_zero_copy": z, "bytes_copied": c, "transfers": n}


def dynamic_channels(group, pairs, *, trace_torch: bool = True) -> dict[tuple[int, int], DynamicChannel]:
    """Collective: dynamic channels for ``(src, dst)`` pairs (the same list on every rank);
    returns this rank's ends keyed by pair. ``trace_torch``: as for :func:`static_slots`."""
    if trace_torch:
        _torch_sites()
    pairs = [(int(s), int(d)) for s, d in pairs]
    natives = group._dynamic_channels(pairs)
    return {p: DynamicChannel(n) for p, n in zip(pairs, natives) if n is not None}


def place(module) -> int:
    """Moves a torch module's parameters (and existing gradients) into registered memory, so
    sending them is zero-copy; returns the bytes moved."""
    import torch

    moved = 0
    with torch.no_grad():
        for p in module.parameters():
            a = registered_empty(tuple(p.shape), np.dtype(str(p.dtype).replace("torch.", "")))
            t = torch.from_numpy(a)
            t.copy_(p.data)
            p.data = t
            moved += a.nbytes
            if p.grad is not None:
                g = torch.from_numpy(registered_empty(tuple(p.shape), a.dtype))
                g.copy_(p.grad)
                p.grad = g
                moved += a.nbytes
    return moved
