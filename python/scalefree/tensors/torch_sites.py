"""Allocation-site tracing for torch tensors (the RDMA tensor paper, §3.4).

numpy's allocator can be replaced (scalefree's arena does it, see ``arena.rs``); torch's CPU
allocator cannot be hooked from outside per allocation site. So the tracing sits one level
up, at torch's dispatcher, with a ``TorchDispatchMode`` in the thread that set up tensor
slots, channels or a parameter server:

* every new CPU tensor of at least :data:`SITE_MIN` bytes an operator returns (not a view
  or an in-place result) remembers its
  *site*: the innermost two Python frames outside torch and scalefree (code object and
  instruction), keyed by the address of its data (a bounded table);
* a send that had to stage a torch tensor (it was not in registered memory) traces that
  tensor's site;
* an operator called from a traced site is run in its ``out=`` form into a tensor over the
  registered arena (its shape and dtype found first by running the operator on ``meta``
  tensors, which moves no data), so the tensor is born in registered memory and the next
  send copies nothing, with no site named in user code.

An operator without an ``out=`` form, with a non-contiguous result or several results, or
that fails on meta tensors runs as before (its result is then staged when sent: correct,
not zero copy). The mode sits below autograd, so gradients are unaffected. It costs a few
microseconds per operator in that thread; ``SCALEFREE_TORCH_SITES=0`` turns it off. It is
only on when the arena is (``SCALEFREE_ARENA``), since the arena is where traced sites
allocate.
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

_traced: set = set()
_live: "collections.OrderedDict[int, tuple]" = collections.OrderedDict()
_lock = threading.Lock()
_active = threading.local()
_stats = {"arena_allocations": 0}


_skip_dirs: tuple = ()


def _skip(filename: str) -> bool:
    """Frames of torch's or scalefree's own code (and Python's frozen modules)."""
    return filename.startswith(_skip_dirs) or filename.startswith("<frozen")


def _site():
    """The calling site: the innermost two frames outside torch and scalefree."""
    f = sys._getframe(2)
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
# What an operator returns for given argument shapes, dtypes and values (found on meta
# tensors): (shape, dtype), or False when it cannot go to the arena. The same operator at
# the same site sees the same arguments every step, so the meta run happens once.
_meta_results: dict = {}
_META_MAX = 4096


def _meta_key(func, args, kwargs):
    """A hashable key of an operator call by its tensors' shapes, dtypes and contiguity and
    its other arguments' values; None when an argument has no such key."""
    import torch

    def k(x):
        if isinstance(x, torch.Tensor):
            return ("T", tuple(x.shape), x.dtype, x.device.type, x.is_contiguous())
        if isinstance(x, (list, tuple)):
            return tuple(k(v) for v in x)
        hash(x)
        return x

    try:
        return (func, k(args), tuple(sorted((n, k(v)) for n, v in kwargs.items())))
    except TypeError:
        return None


def _out_form(func):
    """The operator's out= overload and the name of its one output argument (``out``, or
    ``grad_input`` for backward kernels such as ``tanh_backward``), or None."""
    if func in _out_forms:
        return _out_forms[func]
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
    _out_forms[func] = found
    return found


def _into_arena(func, args, kwargs):
    """Runs ``func`` in its out= form into an arena tensor; None if it cannot."""
    import torch
    from torch.utils._pytree import tree_map

    found = _out_form(func)
    if found is None:
        return None
    out_op, out_name = found
    allowed = {a.name for a in out_op._schema.arguments}
    if any(k not in allowed for k in kwargs if k not in _FACTORY_KW):
        return None

    def meta(x):
        if isinstance(x, torch.Tensor):
            return x.to("meta")
        if isinstance(x, torch.device):
            return torch.device("meta")
        return x

    key = _meta_key(func, args, kwargs)
    result = _meta_results.get(key) if key is not None else None
    if result is None:
        try:
            mkw = {k: meta(v) for k, v in kwargs.items()}
            if "device" in {a.name for a in func._schema.arguments}:  # factories: made on meta
                mkw["device"] = torch.device("meta")
            shape_of = func(*tree_map(meta, args), **mkw)
        except Exception:  # noqa: BLE001 - no meta kernel, or it needs real data
            shape_of = None
        if (not isinstance(shape_of, torch.Tensor) or not shape_of.is_contiguous() or shape_of.is_sparse
                or shape_of.numel() * shape_of.element_size() < SITE_MIN):
            result = False
        else:
            result = (tuple(shape_of.shape), shape_of.dtype)
        if key is not None:
            if len(_meta_results) >= _META_MAX:
                _meta_results.clear()
            _meta_results[key] = result
    if result is False:
        return None
    kw = {k: v for k, v in kwargs.items() if k in allowed and k != out_name}
    out = _arena_tensor(*result)
    try:
        res = out_op(*args, **kw, **{out_name: out})
    except Exception:  # noqa: BLE001 - the out form takes other arguments: run it as before
        return None
    if res is not out and not (isinstance(res, torch.Tensor) and res.data_ptr() == out.data_ptr()):
        return None
    return out


def _aliases(func) -> bool:
    """Whether the operator returns a view of (or writes into) an input: no new allocation."""
    rets = func._schema.returns
    return bool(rets) and rets[0].alias_info is not None


def _mode_class():
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    class SiteMode(TorchDispatchMode):
        """Records the site of large CPU results; runs operators of traced sites into the
        arena."""

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            site = _site()
            if site is not None and site in _traced:
                out = _into_arena(func, args, kwargs)
                if out is not None:
                    _stats["arena_allocations"] += 1
                    return out
            res = func(*args, **kwargs)
            if (site is not None and isinstance(res, torch.Tensor) and not _aliases(func)
                    and res.device.type == "cpu"
                    and not res.is_sparse and res.numel() * res.element_size() >= SITE_MIN):
                try:
                    ptr = res.untyped_storage().data_ptr()
                except Exception:  # noqa: BLE001 - tensors without storage
                    return res
                with _lock:
                    _live[ptr] = site
                    _live.move_to_end(ptr)
                    if len(_live) > _LIVE_MAX:
                        _live.popitem(last=False)
            return res

    return SiteMode


def activate() -> bool:
    """Turns the tracing on in the calling thread (idempotent); False when it stays off
    (torch not imported, the arena off, or ``SCALEFREE_TORCH_SITES=0``)."""
    if getattr(_active, "on", False):
        return True
    if "torch" not in sys.modules or os.environ.get("SCALEFREE_TORCH_SITES", "1").strip() in ("0", ""):
        return False
    if arena.threshold() is None:
        return False
    import torch
    from torch.utils._python_dispatch import _push_mode

    global _skip_dirs
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # scalefree/
    _skip_dirs = (os.path.dirname(torch.__file__) + os.sep, package + os.sep)
    _push_mode(_mode_class()())
    _active.on = True
    return True


def note_staged(tensor) -> bool:
    """A send had to stage ``tensor``: traces its allocation site (True if it had one)."""
    try:
        ptr = tensor.untyped_storage().data_ptr()
    except Exception:  # noqa: BLE001
        return False
    with _lock:
        site = _live.get(ptr)
        if site is None:
            return False
        _traced.add(site)
        return True


def traced_count() -> int:
    """How many torch allocation sites are traced in this process."""
    return len(_traced)


def arena_allocations() -> int:
    """How many torch operator results were allocated in the arena because of tracing."""
    return _stats["arena_allocations"]
