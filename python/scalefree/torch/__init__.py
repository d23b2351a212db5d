"""scalefree as a ``torch.distributed`` backend.

    import scalefree.torch                     # registers the backend "scalefree" (CPU tensors)
    dist.init_process_group("scalefree")       # under torchrun, scalefree run, mpirun or srun
    model = DDP(model)                         # unchanged

:mod:`scalefree.torch.hooks` has DDP communication hooks (bf16 on the wire, bounded-staleness
SSP averaging, sparse embedding gradients).
"""

from __future__ import annotations

from ._env import fill_torch_env
from .backend import BACKEND_NAME, ProcessGroupScalefree, Work, create_backend, register

register()
# Under scalefree run, mpirun or srun (not torchrun), torch's env:// variables come from theirs.
fill_torch_env()

__all__ = ["BACKEND_NAME", "ProcessGroupScalefree", "Work", "create_backend", "register"]
