"""Finding and describing UCX, the backend between hosts.

UCX is a run-time dependency: ``pip install 'scalefree[ucx]'`` brings the PyPI UCX wheel
(``libucx-cu12``), or a system UCX is used. :func:`prepare` points the native backend at the
wheel's library (``SCALEFREE_UCX_LIB``) unless the variable is already set; a UCX already
loaded in the process (by mpi4py or ucx-py, say) is shared instead of loading a second copy.
``scalefree ucx info`` prints what was found.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess


def wheel_dir() -> str | None:
    """The ``libucx`` wheel's install folder, if the wheel is installed."""
    spec = importlib.util.find_spec("libucx")
    if spec is None or not spec.submodule_search_locations:
        return None
    return list(spec.submodule_search_locations)[0]


def prepare() -> None:
    """Sets ``SCALEFREE_UCX_LIB`` to the wheel's ``lib`` folder when it is unset."""
    if os.environ.get("SCALEFREE_UCX_LIB"):
        return
    d = wheel_dir()
    if d and os.path.exists(os.path.join(d, "lib", "libucp.so.0")):
        os.environ["SCALEFREE_UCX_LIB"] = os.path.join(d, "lib")


def info() -> dict:
    """Version and library path of the UCX the backend loads; raises
    :class:`~scalefree.errors.UnsupportedError` naming every place looked at."""
    prepare()
    from .. import _native

    version, path = _native.ucx_library()
    return {"version": ".".join(map(str, version)), "library": path}


def tool(name: str) -> list[str] | None:
    """Command prefix for a UCX tool (``ucx_info``, ``ucx_perftest``): the wheel's, with its
    library folder on ``LD_LIBRARY_PATH`` via ``env``, else one on ``PATH``."""
    d = wheel_dir()
    if d and os.path.exists(os.path.join(d, "bin", name)):
        return ["env", f"LD_LIBRARY_PATH={os.path.join(d, 'lib')}", os.path.join(d, "bin", name)]
    found = shutil.which(name)
    return [found] if found else None


def transports() -> list[str]:
    """The ``transport/device`` pairs UCX offers on this host (from ``ucx_info -d``)."""
    cmd = tool("ucx_info")
    if cmd is None:
        return []
    out = subprocess.run(cmd + ["-d"], capture_output=True, text=True, timeout=60).stdout
    found, tl = [], None
    for line in out.splitlines():
        line = line.lstrip("#").strip()
        if line.startswith("Transport:"):
            tl = line.split(":", 1)[1].strip()
        elif line.startswith("Device:") and tl:
            pair = f"{tl}/{line.split(':', 1)[1].strip()}"
            if pair not in found:
                found.append(pair)
    return found


def _cmd_info(args) -> int:
    from ..errors import UnsupportedError

    try:
        i = info()
    except UnsupportedError as e:
        print(f"UCX: not available: {e}")
        return 1
    print(f"UCX {i['version']} from {i['library']}")
    t = transports()
    if t:
        print("transports: " + ", ".join(t))
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser("ucx", help="the UCX backend between hosts", description=__doc__)
    s = p.add_subparsers(dest="ucx_command", metavar="COMMAND")
    s.required = True
    i = s.add_parser("info", help="which UCX is used and the transports it offers")
    i.set_defaults(func=_cmd_info)
