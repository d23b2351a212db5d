"""The rendezvous address under ``mpirun``/``mpiexec`` across hosts, asked of MPI itself.

Open MPI and MPICH tell every rank its rank and how many ranks share its host, but not where
rank 0 runs. When the job spans hosts and ``SCALEFREE_MASTER_ADDR`` is not set, and mpi4py
is importable, the ranks ask MPI: every rank lists its IPv4 interfaces (only
``SCALEFREE_IFNAME``'s when set), rank 0 picks its address that shares a subnet with the
most other ranks, a free port and a fresh job token, and broadcasts them. Each rank then
sets ``SCALEFREE_MASTER_ADDR``, ``SCALEFREE_MASTER_PORT`` and ``SCALEFREE_JOB_TOKEN`` for
the transport's own rendezvous. Nothing else of MPI is used afterwards.
"""

from __future__ import annotations

import ipaddress
import os
import secrets
import socket
import struct

# (world size, ranks on this host) variables of the launchers that do not say where rank 0 is.
_LAUNCHERS = (("OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE"), ("PMI_SIZE", "MPI_LOCALNRANKS"))


def spans_hosts_without_master(env=os.environ) -> bool:
    """Launched by Open MPI or MPICH on several hosts, with no rendezvous address given."""
    if env.get("SCALEFREE_MASTER_ADDR", "").strip():
        return False
    for size_var, local_var in _LAUNCHERS:
        if size_var in env and local_var in env:
            try:
                return int(env[local_var]) < int(env[size_var])
            except ValueError:
                return False  # the transport names the bad variable
    return False


def interfaces() -> list[tuple[str, str, int]]:
    """(name, IPv4 address, prefix length) of this host's interfaces, loopback left out;
    only ``SCALEFREE_IFNAME``'s when it is set."""
    import fcntl

    want = os.environ.get("SCALEFREE_IFNAME", "").strip()
    out = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            if want and name != want:
                continue
            req = struct.pack("256s", name.encode()[:15])
            try:
                addr = socket.inet_ntoa(fcntl.ioctl(s.fileno(), 0x8915, req)[20:24])  # SIOCGIFADDR
                mask = socket.inet_ntoa(fcntl.ioctl(s.fileno(), 0x891B, req)[20:24])  # SIOCGIFNETMASK
            except OSError:
                continue  # no IPv4 address
            if ipaddress.ip_address(addr).is_loopback:
                continue
            out.append((name, addr, ipaddress.ip_network(f"0.0.0.0/{mask}").prefixlen))
    return out


def pick(mine: list[tuple[str, str, int]], others: list[list[tuple[str, str, int]]]) -> str | None:
    """Rank 0's address that shares a subnet with the most other ranks (first on ties)."""
    best, best_n = None, -1
    for _, addr, plen in mine:
        net = ipaddress.ip_network(f"{addr}/{plen}", strict=False)
        n = sum(any(ipaddress.ip_address(a) in net for _, a, _ in theirs) for theirs in others)
        if n > best_n:
            best, best_n = addr, n
    return best


def _free_port(addr: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((addr, 0))
        return s.getsockname()[1]


def from_mpi() -> bool:
    """Sets the rendezvous variables from MPI when the job needs them and mpi4py is there;
    returns whether it did."""
    if not spans_hosts_without_master():
        return False
    try:
        from mpi4py import MPI
    except ImportError:
        return False  # the transport's error says what to set
    comm = MPI.COMM_WORLD
    mine = interfaces()
    every = comm.allgather(mine)
    msg = None
    if comm.Get_rank() == 0:
        addr = pick(mine, every[1:])
        msg = (addr, _free_port(addr), secrets.token_hex(16)) if addr else (None, 0, "")
    addr, port, token = comm.bcast(msg, root=0)
    if addr is None:
        from ..errors import BootstrapError

        raise BootstrapError(
            "rank 0 has no IPv4 interface to meet the other hosts on"
            + (f" (SCALEFREE_IFNAME={os.environ['SCALEFREE_IFNAME']})" if os.environ.get("SCALEFREE_IFNAME") else "")
            + ": set SCALEFREE_MASTER_ADDR to rank 0's address (mpirun -x SCALEFREE_MASTER_ADDR=...)")
    os.environ["SCALEFREE_MASTER_ADDR"] = addr
    os.environ["SCALEFREE_MASTER_PORT"] = str(port)
    os.environ["SCALEFREE_JOB_TOKEN"] = token
    return True
