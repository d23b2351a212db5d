"""``scalefree run``: start N ranks of a command on this host (like torchrun, for one host).

    scalefree run -n 4 [--timeout S] [--grace S] [--no-prefix] [--] python train.py args

Each rank gets ``SCALEFREE_RANK``, ``SCALEFREE_WORLD_SIZE``, ``SCALEFREE_LOCAL_RANK``,
``SCALEFREE_LOCAL_SIZE``, ``SCALEFREE_JOB_ID`` and ``SCALEFREE_JOB_TOKEN`` (fresh for every
run) on top of the inherited environment, minus the rank variables of other launchers
(mpirun, srun, torchrun). Each output line is prefixed with ``[rank] ``.

The exit code is 0 when every rank exits 0, otherwise that of the first rank to fail
(128+k for a rank killed by signal k). When a rank fails the others get ``--grace`` seconds
to exit by themselves (the library makes them raise ``PeerLostError`` within about a
second), then SIGTERM, then SIGKILL 2 s later. ``--timeout`` ends the job with exit code
124. SIGINT (Ctrl-C) to the launcher is passed on to every rank (Python raises
KeyboardInterrupt; a wait of the library ends within 0.1 s), which get --grace seconds to
exit before SIGTERM, or less if a second signal comes; SIGTERM or SIGHUP stop every rank at
once (SIGTERM, SIGKILL 2 s later). Either way the exit code is 128 + the signal. A signal the
launcher was started with ignored (nohup, a background job of a script) stays ignored. Every
rank leads its own process group, which is killed as a whole at the end, and dies with the
launcher even if the launcher is SIGKILLed.

--max-restarts N: when a rank fails, stop the others and start every rank again (a new
rendezvous), up to N times; each rank sees SCALEFREE_RESTART_COUNT (0 on the first start)
and SCALEFREE_MAX_RESTARTS. A job run with --resume continues from its last checkpoint.
When no restart is left the exit code is that of the last start's failed rank.

--encrypt: seal every connection between hosts (the rendezvous and the TCP lanes) with
AES-256-GCM, keys per connection and direction derived from the job secret; traffic between
hosts then goes over the sealed lanes only. Give it on every host (the ranks get
SCALEFREE_ENCRYPT=1; under other launchers set that yourself). Nothing changes on one host.
"""

from __future__ import annotations

import argparse
import functools
import os
import secrets
import sys

from ..errors import InvalidArgumentError
from .common import count, port
from ..launch.launcher import (
    DEFAULT_GRACE_SECONDS,
    DEFAULT_MASTER_PORT,
    NO_SECRET,
    Nodes,
    insecure_token,
    job_secret,
    launch,
    say,
)

_USAGE = ("%(prog)s -n N [--timeout S] [--grace S] [--max-restarts N] [--no-prefix] [--allow-rank-failure] [--] CMD [ARGS...]\n"
          "       %(prog)s --nnodes H --node-rank I --nproc-per-node N --master-addr ADDR [--master-port P]\n"
          "                [--token-file PATH | --insecure-no-token] [--encrypt] [--] CMD ...")


def _integer_at_least(minimum: int, text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if n < minimum:
        raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {n}")
    return n


_at_least_one = functools.partial(_integer_at_least, 1)


def _ranks_per_host(text: str) -> int | tuple[int, ...]:
    """``N`` (ranks on this host), or ``N0,N1,...`` (ranks of every host, in host order)."""
    if "," not in text:
        return _at_least_one(text)
    return tuple(_at_least_one(t) for t in text.split(","))


def _seconds(text: str, *, allow_zero: bool) -> float:
    try:
        s = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not (0 <= s < float("inf")) or (s == 0 and not allow_zero):
        raise argparse.ArgumentTypeError(f"must be a {'non-negative' if allow_zero else 'positive'} number of seconds, got {text}")
    return s


def _configure(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("-n", "--nprocs", "--nproc-per-node", type=_ranks_per_host, default=None, metavar="N",
                   help="number of ranks to start on this host (at least 1); across hosts of different sizes, "
                        "every host's count in host order (N0,N1,...; the same list on every host)")
    hosts = p.add_argument_group("several hosts (run the same command on every host)")
    hosts.add_argument("--nnodes", type=_at_least_one, default=1, metavar="H", help="number of hosts (default: 1)")
    hosts.add_argument("--node-rank", type=count(0), default=0, metavar="I", help="this host's index, 0..H-1 (default: 0)")
    hosts.add_argument("--master-addr", default=os.environ.get("SCALEFREE_MASTER_ADDR"), metavar="ADDR",
                       help="address of the host of rank 0 (node rank 0), where ranks meet "
                            "(default: SCALEFREE_MASTER_ADDR)")
    hosts.add_argument("--master-port", type=port, default=None, metavar="P",
                       help=f"TCP port of the meeting point (default: SCALEFREE_MASTER_PORT or {DEFAULT_MASTER_PORT})")
    hosts.add_argument("--token-file", default=None, metavar="PATH",
                       help="file holding the job's secret, readable by you only (default: SCALEFREE_JOB_TOKEN, "
                            "or SCALEFREE_JOB_TOKEN_FILE; without either, host 0 makes a secret and prints the "
                            "command for the other hosts)")
    hosts.add_argument("--insecure-no-token", action="store_true",
                       help="run a job across hosts without a secret: anyone who reaches the master address can "
                            "join it (closed networks only)")
    hosts.add_argument("--encrypt", action="store_true",
                       help="seal every connection between hosts (rendezvous, TCP lanes) with AES-256-GCM; "
                            "give it on every host (the ranks get SCALEFREE_ENCRYPT=1; see docs/security.md)")
    p.add_argument("--timeout", type=functools.partial(_seconds, allow_zero=False), default=None, metavar="S",
                   help="wall-clock limit for the whole job in seconds; exit code 124 when reached (default: none)")
    p.add_argument("--grace", type=functools.partial(_seconds, allow_zero=True), default=DEFAULT_GRACE_SECONDS,
                   metavar="S", help="seconds the other ranks get to exit by themselves after one fails, "
                                     f"before SIGTERM (default: {DEFAULT_GRACE_SECONDS:g})")
    p.add_argument("--max-restarts", type=functools.partial(_integer_at_least, 0), default=0, metavar="N",
                   help="when a rank fails, stop the others and start every rank again, up to N times "
                        "(SCALEFREE_RESTART_COUNT tells the ranks which start it is; default: 0)")
    p.add_argument("--no-prefix", action="store_true", help="pass output through without the [rank] prefix")
    p.add_argument("--allow-rank-failure", action="store_true",
                   help="keep the job running when a rank dies (replicated collectives, e.g. "
                        "sparse_allreduce(replication=2)); exit 0 if some rank succeeded and every "
                        "failed rank died by a signal")
    p.add_argument("cmd", nargs=argparse.REMAINDER, metavar="CMD", help="the command and its arguments (after --)")
    p.set_defaults(func=functools.partial(_run, p))
    return p


def _run(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    cmd = list(args.cmd)
    if cmd[:1] == ["--"]:
        cmd = cmd[1:]
    if not cmd:
        parser.error("no command given: scalefree run -n N [--] CMD [ARGS...]")
    if args.nprocs is None:
        parser.error("the number of ranks is required: -n N (or --nproc-per-node N)")
    if args.nnodes > 1 and not args.master_addr:
        parser.error("--nnodes > 1 needs --master-addr (the address of node rank 0)")
    if not 0 <= args.node_rank < args.nnodes:
        parser.error(f"--node-rank must be in 0..{args.nnodes - 1}, got {args.node_rank}")
    layout = args.nprocs if isinstance(args.nprocs, tuple) else None
    if layout is not None:
        if len(layout) != args.nnodes:
            parser.error(f"--nproc-per-node lists {len(layout)} hosts' ranks, but --nnodes is {args.nnodes}")
        if not args.master_addr:
            parser.error("--nproc-per-node N0,N1,... needs --master-addr (a job across hosts)")
        args.nprocs = layout[args.node_rank]
    port = args.master_port or int(os.environ.get("SCALEFREE_MASTER_PORT") or DEFAULT_MASTER_PORT)
    nodes = Nodes(args.nnodes, args.node_rank, args.master_addr, port, layout) if args.master_addr else None
    token = None
    if nodes is not None and nodes.nnodes > 1:
        token = _secret_for(args, nodes, cmd)
    return launch(cmd, args.nprocs, timeout=args.timeout, grace=args.grace, prefix=not args.no_prefix, nodes=nodes,
                  allow_rank_failure=args.allow_rank_failure, token=token, max_restarts=args.max_restarts,
                  encrypt=args.encrypt)


def _secret_for(args: argparse.Namespace, nodes: Nodes, cmd: list[str]) -> str:
    """The secret of a job across hosts: given (--token-file, SCALEFREE_JOB_TOKEN,
    SCALEFREE_JOB_TOKEN_FILE), else made here on host 0 with the command for the other hosts
    printed; a missing secret on another host is a one-line error."""
    import shlex

    secret = job_secret(args.token_file)  # a bad file: PermissionError, InvalidArgumentError (exit 2)
    if secret:
        return secret
    if args.insecure_no_token:
        say(f"warning: --insecure-no-token: anyone who can reach {nodes.master_addr}:{nodes.master_port} can join this job")
        return insecure_token(nodes)
    if nodes.node_rank != 0:
        raise InvalidArgumentError(NO_SECRET)
    secret = secrets.token_hex(16)
    per_node = ",".join(map(str, nodes.layout)) if nodes.layout else str(args.nprocs)
    argv = ["scalefree", "run", "--nnodes", str(nodes.nnodes), "--node-rank", "I", "--nproc-per-node", per_node,
            "--master-addr", nodes.master_addr, "--master-port", str(nodes.master_port)]
    if args.timeout is not None:
        argv += ["--timeout", f"{args.timeout:g}"]
    if args.grace != DEFAULT_GRACE_SECONDS:
        argv += ["--grace", f"{args.grace:g}"]
    if args.max_restarts:
        argv += ["--max-restarts", str(args.max_restarts)]
    argv += [o for o, on in (("--no-prefix", args.no_prefix), ("--allow-rank-failure", args.allow_rank_failure),
                             ("--encrypt", args.encrypt)) if on]
    line = shlex.join([*argv, "--", *cmd]).replace(" --node-rank I ", " --node-rank $I ")
    say(f"no job secret given (SCALEFREE_JOB_TOKEN or --token-file): made one. On host I = 1..{nodes.nnodes - 1} run:\n"
         f"  SCALEFREE_JOB_TOKEN={secret} {line}")
    return secret


def add_parser(sub) -> None:
    """Registers ``run`` on the ``scalefree`` command's subparsers."""
    _configure(sub.add_parser("run", help="start N ranks of a command on this host", usage=_USAGE,
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter))


def main(argv: list[str] | None = None) -> int:
    """``scalefree run -n N [--] CMD ...`` alone (what ``python -m scalefree.cli run`` runs)."""
    from .common import run_guarded

    parser = _configure(argparse.ArgumentParser(prog="scalefree run", usage=_USAGE, description=__doc__,
                                                formatter_class=argparse.RawDescriptionHelpFormatter))
    args = parser.parse_args(argv)
    return run_guarded("scalefree run", args.func, args)


if __name__ == "__main__":
    sys.exit(main())
