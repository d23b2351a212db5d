"""Allocation-site tracing for torch tensors (the RDMA tensor paper, §3.4).

numpy's allocator can be replaced (scalefree's arena does it, see ``arena.rs``); torch's CPU
allocator cannot be hooked from outside per allocation site. So the tracing sits one level
up, at torch's dispatcher, in two stages:

* **learning**, a ``TorchDispatchMode`` in the thread that set up tensor slots, channels, a
  parameter server or asked for it (the torch backend, after a staged send): every new CPU
  tensor of at least :data:`SITE_MIN` bytes an operator returns (not a view or an in-place
  result) remembers its *site* (the innermost two Python frames outside torch and
  scalefree: code object and instruction) and operator, keyed by the address of its data (a
  bounded table); a send that had to stage a torch tensor (it was not in registered memory)
  traces that site and operator; an operator called from a traced site runs in its ``out=``
  form into a tensor over the registered arena, so the tensor is born in registered memory
  and the next send copies nothing, with no site named in user code. The output's shape and
  dtype come from an earlier real call with the same argument shapes (no meta tensors: their
  kernels import ``torch._dynamo``, seconds);
* **settled** (:func:`settle`, in that thread, once a staged tensor's operator is known): each
  traced operator gets a CPU kernel of its own (``torch.library``, the operator's computed
  kernel called for everything else) that sends the calls from its traced sites to the arena,
  and the dispatch mode is left. Other operators then run as without tracing; the traced
  ones pay a Python call and a look at the caller's frames (microseconds).

An operator without an ``out=`` form, with a non-contiguous result, several results or an
output shape that depends on the data runs as before (its result is then staged when sent:
correct, not zero copy); so does everything when torch has no ``torch.library.get_kernel``
(the mode then stays on). The mode sits below autograd, so gradients are unaffected.
``SCALEFREE_TORCH_SITES=0`` turns it all off. It is only on when the arena is
(``SCALEFREE_ARENA``), since the arena is where traced sites allocate.
"""

from __future__ import annotations

import collections
import os
import sys
import threading

import numpy as np

from .. import arena

#: Smallest tensor whose site is remembered (as for numpy arrays).
SITE_MIN = 4096
_LIVE_MAX = 1 << 16  # remembered allocations (oldest forgotten first)
_ROUNDS_MAX = 8  # learning rounds in a thread that gave no operator a kernel (then it stops)
# Operators Python code (and torch's own C++) call with plain numbers where the schema has a
# tensor: a kernel of ours receives those as Python numbers, which torch's kernels cannot be
# called back with exactly (a number's type promotion differs from a tensor's), so these
# stay without a kernel of ours (a site of theirs is staged once the mode is left).
_NUMBER_OPS = frozenset((
    "add", "sub", "rsub", "mul", "div", "true_divide", "floor_divide", "remainder", "fmod", "pow",
    "eq", "ne", "lt", "le", "gt", "ge", "where", "bitwise_and", "bitwise_or", "bitwise_xor",
    "bitwise_left_shift", "bitwise_right_shift", "__and__", "__or__", "__xor__", "__lshift__",
    "__rshift__", "maximum", "minimum", "fmax", "fmin", "atan2", "copysign", "xlogy", "hypot",
    "nextafter", "logaddexp", "logaddexp2", "clamp", "clamp_min", "clamp_max", "lerp",
))

_traced: set = set()
# data address -> (site, operator, weak reference to the storage) of the large results made
# under the learning mode or by a traced operator's kernel (an entry whose storage is gone
# is stale: the address may hold a tensor made since without either)
_live: "collections.OrderedDict[int, tuple]" = collections.OrderedDict()
# operator -> the traced sites it allocates at (what the settled kernels send to the arena)
_hot: dict = {}
_kernels: dict = {}  # operator -> its computed CPU kernel, once a kernel of ours replaced it
_libs: dict = {}     # namespace -> torch.library.Library holding those kernels
_pending = False     # a staged tensor's site was traced since the last settle()
_lock = threading.Lock()
_active = threading.local()
_stats = {"arena_allocations": 0}


_skip_dirs: tuple = ()


def _skip(filename: str) -> bool:
    """Frames of torch's or scalefree's own code (and Python's frozen modules)."""
    return filename.startswith(_skip_dirs) or filename.startswith("<frozen")


def _site():
    """The calling site: the innermost two frames outside torch and scalefree."""
    try:
        f = sys._getframe(2)
    except ValueError:  # called from a thread with no Python frames above (torch's own)
        return None
    key = []
    depth = 0
    while f is not None and len(key) < 2 and depth < 40:
        if not _skip(f.f_code.co_filename):
            key.append((id(f.f_code), f.f_lasti))
        f = f.f_back
        depth += 1
    return tuple(key) if key else None


def _np_dtype(dtype):
    import torch

    if dtype == torch.bfloat16:
        return np.dtype(np.int16)
    return np.dtype(str(dtype).replace("torch.", ""))


def _arena_tensor(shape, dtype):
    """A contiguous torch tensor over registered memory (the arena)."""
    import torch

    t = torch.from_numpy(arena.registered_empty(tuple(shape), _np_dtype(dtype)))
    return t.view(dtype) if dtype == torch.bfloat16 else t


_FACTORY_KW = ("dtype", "layout", "device", "pin_memory")


_out_forms: dict = {}
# What an operator returned for given argument shapes, dtypes and values (seen on a real
# call): (shape, dtype), or False when that cannot go to the arena. The same operator at the
# same site sees the same arguments every step.
_results: dict = {}
_RESULTS_MAX = 4096


def _meta_key(func, args, kwargs):
    """A hashable key of an operator call by its tensors' shapes, dtypes and contiguity and
    its other arguments' values (floats by their type only: a fill value or a learning rate
    that changes every step does not change the result's shape; where one does, the shape
    check after the out= call catches it); None when an argument has no such key."""
    import torch

    def k(x):
        if isinstance(x, torch.Tensor):
            return ("T", tuple(x.shape), x.dtype, x.device.type, x.is_contiguous())
        if isinstance(x, float):
            return float
        if isinstance(x, (list, tuple)):
            return tuple(k(v) for v in x)
        hash(x)
        return x

    try:
        return (func, k(args), tuple(sorted((n, k(v)) for n, v in kwargs.items())))
    except TypeError:
        return None


def _large(res) -> bool:
    import torch

    return (isinstance(res, torch.Tensor) and res.device.type == "cpu" and not res.is_sparse
            and res.numel() * res.element_size() >= SITE_MIN)


def _remember(key, res) -> None:
    """Records what a call with ``key`` returned (the shape and dtype of its arena twin)."""
    if key is None:
        return
    ok = _large(res) and res.is_contiguous()
    if len(_results) >= _RESULTS_MAX:
        _results.clear()
    _results[key] = (tuple(res.shape), res.dtype) if ok else False


def _out_form(func):
    """The operator's out= overload and the name of its one output argument (``out``, or
    ``grad_input`` for backward kernels such as ``tanh_backward``), or None (also for
    operators whose output's shape depends on the data)."""
    if func in _out_forms:
        return _out_forms[func]
    import torch

    packet = func.overloadpacket
    found = (packet.out, "out") if "out" in packet.overloads() else None
    base = [a.name for a in func._schema.arguments]
    for name in packet.overloads() if found is None else ():
        op = getattr(packet, name)
        args = op._schema.arguments
        outs = [a.name for a in args if a.is_out]
        if len(outs) == 1 and [a.name for a in args if not a.is_out] == base:
            found = (op, outs[0])
            break
    if torch.Tag.dynamic_output_shape in func.tags or torch.Tag.data_dependent_output in func.tags:
        found = None
    _out_forms[func] = found
    return found


def _into_arena(func, args, kwargs):
    """Runs ``func`` in its out= form into an arena tensor; None if it cannot (or no call
    with these argument shapes was seen yet)."""
    found = _out_form(func)
    if found is None:
        return None
    out_op, out_name = found
    allowed = {a.name for a in out_op._schema.arguments}
    if any(k not in allowed for k in kwargs if k not in _FACTORY_KW):
        return None
    result = _results.get(_meta_key(func, args, kwargs))
    if not result:
        return None
    kw = {k: v for k, v in kwargs.items() if k in allowed and k != out_name}
    out = _arena_tensor(*result)
    try:
        res = out_op(*args, **kw, **{out_name: out})
    except Exception:  # noqa: BLE001 - the out form takes other arguments: run it as before
        return None
    if (res is not out and not (hasattr(res, "data_ptr") and res.data_ptr() == out.data_ptr())
            or tuple(out.shape) != result[0]):
        return None
    _stats["arena_allocations"] += 1
    return out


def _aliases(func) -> bool:
    """Whether the operator returns a view of (or writes into) an input: no new allocation."""
    rets = func._schema.returns
    return bool(rets) and rets[0].alias_info is not None


def _mode_class():
    from torch.utils._python_dispatch import TorchDispatchMode

    class SiteMode(TorchDispatchMode):
        """Records the site and operator of large CPU results; runs operators of traced
        sites into the arena."""

        @classmethod
        def _should_skip_dynamo(cls) -> bool:
            # torch otherwise wraps __torch_dispatch__ in torch._dynamo.disable, whose first
            # call imports torch._dynamo (seconds); nothing here is compiled.
            return False

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            site = _site()
            if site is not None and site in _traced:
                out = _into_arena(func, args, kwargs)
                if out is not None:
                    return out
            res = func(*args, **kwargs)
            if site is not None and not _aliases(func) and _large(res):
                _record(site, func, args, kwargs, res)
            return res

    return SiteMode


def _record(site, func, args, kwargs, res) -> None:
    """Remembers where the large tensor ``res`` was made (and the call's result shape)."""
    from torch.multiprocessing.reductions import StorageWeakRef

    try:
        st = res.untyped_storage()
        ptr = st.data_ptr()
    except Exception:  # noqa: BLE001 - tensors without storage
        return
    _remember(_meta_key(func, args, kwargs), res)
    with _lock:
        _live[ptr] = (site, func, StorageWeakRef(st))
        _live.move_to_end(ptr)
        if len(_live) > _LIVE_MAX:
            _live.popitem(last=False)


def _tensors(args, tensor_at):
    """``args`` with a plain number where the schema has a tensor (a wrapped number, as torch
    hands it to a Python kernel) made a 0-dim tensor of the wrapped number's dtype again."""
    if not any(not hasattr(args[i], "dtype") for i in tensor_at if i < len(args)):
        return args
    import torch

    wrapped = {bool: torch.bool, int: torch.int64, float: torch.float64, complex: torch.complex128}
    return tuple(torch.tensor(a, dtype=wrapped[type(a)]) if i in tensor_at and type(a) in wrapped else a
                 for i, a in enumerate(args))


def _install(func) -> bool:
    """Gives ``func`` a CPU kernel that sends its calls from traced sites to the arena and
    the others to its own kernel (True when it has one)."""
    if func in _kernels:
        return True
    import torch

    if (_out_form(func) is None or func.overloadpacket.__name__ in _NUMBER_OPS
            or not hasattr(torch.library, "get_kernel")):
        return False
    try:
        own = torch.library.get_kernel(func, "CPU")
    except Exception:  # noqa: BLE001 - no CPU kernel to fall back to
        return False

    tensor_at = [i for i, a in enumerate(func._schema.arguments) if not a.kwarg_only
                 and isinstance(a.type, torch.TensorType)]

    def kernel(keyset, *args, **kwargs):
        sites = _hot.get(func)
        site = _site() if sites else None
        if site is not None and site in sites:
            out = _into_arena(func, args, kwargs)
            if out is not None:
                return out
            res = own.call_boxed(keyset, *_tensors(args, tensor_at), **kwargs)
            if _large(res):  # new argument shapes: the next call of these goes to the arena
                _record(site, func, args, kwargs, res)
            return res
        return own.call_boxed(keyset, *_tensors(args, tensor_at), **kwargs)

    ns = func.namespace
    try:
        lib = _libs.get(ns) or _libs.setdefault(ns, torch.library.Library(ns, "IMPL"))
        lib.impl(func, kernel, "CPU", with_keyset=True)
    except Exception:  # noqa: BLE001 - not registrable here: the mode keeps doing it
        return False
    _kernels[func] = own
    return True


def activate() -> bool:
    """Turns the learning mode on in the calling thread (idempotent); False when it stays
    off (torch not imported, the arena off, ``SCALEFREE_TORCH_SITES=0``, or this thread
    settled :data:`_ROUNDS_MAX` times already)."""
    if getattr(_active, "on", False):
        return True
    if "torch" not in sys.modules or os.environ.get("SCALEFREE_TORCH_SITES", "1").strip() in ("0", ""):
        return False
    if arena.threshold() is None or getattr(_active, "rounds", 0) >= _ROUNDS_MAX:
        return False
    import torch
    from torch.utils._python_dispatch import _push_mode

    global _skip_dirs
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # scalefree/
    _skip_dirs = (os.path.dirname(torch.__file__) + os.sep, package + os.sep)
    mode = _mode_class()()
    _push_mode(mode)
    _active.on, _active.mode = True, mode
    return True


def settle() -> bool:
    """In a thread whose learning mode traced a site since: gives the traced operators
    their kernels and leaves the mode (a traced operator that cannot have one, see
    :func:`_install`, is staged again at its sites). True when the thread left it; a later
    :func:`activate` starts another round (up to :data:`_ROUNDS_MAX` that installed nothing)."""
    global _pending
    if not _pending or not getattr(_active, "on", False):
        return False
    from torch.utils._python_dispatch import _get_current_dispatch_mode, _pop_mode

    with _lock:
        _pending = False
        funcs = [f for f in _hot if f not in _kernels]
    new = sum(_install(f) for f in funcs)
    if _get_current_dispatch_mode() is not _active.mode:
        return False  # another mode sits above it: left as it is
    _pop_mode()
    _active.on, _active.mode = False, None
    if not new:
        _active.rounds = getattr(_active, "rounds", 0) + 1
    return True


def note_staged(tensor) -> bool:
    """A send had to stage ``tensor``: traces its allocation site (True if it had one)."""
    global _pending
    try:
        ptr = tensor.untyped_storage().data_ptr()
    except Exception:  # noqa: BLE001
        return False
    with _lock:
        made = _live.get(ptr)
        if made is None or made[2].expired():
            return False
        site, func, _ = made
        _traced.add(site)
        _hot.setdefault(func, set()).add(site)
        _pending = True
        return True


def traced_count() -> int:
    """How many torch allocation sites are traced in this process."""
    return len(_traced)


def arena_allocations() -> int:
    """How many torch operator results were allocated in the arena because of tracing."""
    return _stats["arena_allocations"]
