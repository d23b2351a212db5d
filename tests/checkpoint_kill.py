"""Runs ``scalefree ARGS`` as one rank of a ``scalefree run`` job, with rank RANK SIGKILLing
itself right after its checkpoint of step STEP (or, STEP negative, after step -STEP without
one): the resume tests' fault. ``python checkpoint_kill.py RANK STEP ARGS...``, or
``... RANK STEP -m MODULE ARGS...`` to run a module (a rank worker) instead of ``scalefree``."""

import os
import runpy
import signal
import sys

from scalefree import checkpoint
from scalefree.cli import main

rank, step = int(sys.argv[1]), int(sys.argv[2])
after = checkpoint.Checkpoints.after


def dying(self, it, state):
    stop = after(self, it, state)
    if self.group.rank == rank and it == abs(step):
        os.kill(os.getpid(), signal.SIGKILL)
    return stop


checkpoint.Checkpoints.after = dying
if sys.argv[3] == "-m":
    sys.argv = [sys.argv[4], *sys.argv[5:]]
    runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
else:
    sys.exit(main(sys.argv[3:]))
