"""Every command and code snippet of the README runs as written.

Each fenced block of README.md is one test case, run in a subprocess from a scratch
directory that sits beside a link to ``../shared`` (so ``../shared/data/...`` resolves as it
does from the repository root, and the files the snippets write land in the scratch
directory):

- ```` ```python ```` blocks are scripts. A first line ``# NAME.py — start with: CMD`` names
  the file and the command that starts it (the launcher the README shows); other blocks run
  as ``python FILE``.
- Other blocks are shell: every line is one command (a trailing ``# ...`` is a comment).
  Two exceptions: the ``pip install ... &&`` part of the main job is not run (CI installed
  the package already; the ``scalefree ...`` part is), and the test-suite command is not run
  (this test is part of it). The lines with ``--node-rank`` (one per host) are started
  together on this machine, with ``--master-addr 127.0.0.1``, a free ``--master-port`` and
  the shared ``SCALEFREE_JOB_TOKEN`` the prose asks for.

``python`` and ``scalefree`` resolve to this interpreter and its scripts. Inline ``code``
in the prose names flags and options and is not run.
"""

import os
import re
import secrets
import shlex
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
SHARED = ROOT.parent / "shared"
TIMEOUT = 180
HEADER = re.compile(r"#\s*(\S+\.py)\s*—\s*start with:\s*(.+)")


def _blocks():
    """(id, language, text) of every fenced block, in order."""
    out = []
    for m in re.finditer(r"^```(\w*)\n(.*?)^```", README.read_text(), re.S | re.M):
        line = README.read_text()[:m.start()].count("\n") + 1
        lang = m.group(1) or "sh"
        if lang == "json":
            continue
        out.append((f"{lang}-line{line}", lang, m.group(2)))
    return out


BLOCKS = _blocks()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def workdir(tmp_path):
    """tmp/work (the commands' cwd), tmp/shared -> ../shared, tmp/bin/python -> this
    interpreter; returns (cwd, env)."""
    if not (SHARED / "data").is_dir():
        pytest.skip(f"{SHARED / 'data'} is absent (the README's examples read the sample data there)")
    (tmp_path / "shared").symlink_to(SHARED)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    # A script, not a symlink: a symlink in another directory would lose a virtualenv
    # (Python finds pyvenv.cfg beside the path it was started by).
    (bin_dir / "python").write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} \"$@\"\n")
    (bin_dir / "python").chmod(0o755)
    cwd = tmp_path / "work"
    cwd.mkdir()
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(bin_dir), str(Path(sys.executable).parent), env.get("PATH", "")])
    env["SCALEFREE_CACHE_DIR"] = str(tmp_path / "cache")  # mf's rating cache stays in the scratch dir
    env["SCALEFREE_FLASH_DIR"] = str(tmp_path)
    env.pop("SCALEFREE_TRACEBACK", None)
    return cwd, env


def _run(argv, cwd, env):
    p = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=TIMEOUT)
    assert p.returncode == 0, f"{shlex.join(argv)} exited {p.returncode}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}"
    assert "Traceback" not in p.stderr, p.stderr
    return p


def _commands(text):
    """The commands of a shell block: (argv, is_host_line); the test-suite line dropped, the
    pip part of the main job dropped."""
    cmds = []
    for line in text.splitlines():
        argv_all = shlex.split(line, comments=True)
        if not argv_all:
            continue
        parts = [shlex.split(p) for p in line.split("#")[0].split("&&")]
        parts = [p for p in parts if p and p[:2] != ["pip", "install"]]
        if any(p[:2] == ["bash", "scripts/test"] for p in parts):
            continue
        for argv in parts:
            cmds.append((argv, "--node-rank" in argv))
    return cmds


def test_readme_has_the_set_up_commands():
    shell = "\n".join(t for _, lang, t in BLOCKS if lang != "python")
    assert "pip install . && scalefree graph pagerank ../shared/data/wiki-vote/wiki-Vote.txt -n 2" in shell
    assert "pip install '.[test]' && bash scripts/test" in shell
    assert sum(lang == "python" for _, lang, _ in BLOCKS) >= 5


RUN = [b for b in BLOCKS if b[1] == "python" or _commands(b[2])]  # not the test-suite block


@pytest.mark.parametrize("lang,text", [(lang, text) for _, lang, text in RUN], ids=[b[0] for b in RUN])
def test_readme_block_runs(lang, text, workdir):
    cwd, env = workdir
    if lang == "python":
        if "import scalefree.torch" in text and os.environ.get("CI", "").lower() not in ("1", "true", "yes"):
            # The PyTorch snippet needs torch in the interpreter the snippet runs with (CI installs it).
            probe = subprocess.run(["python", "-c", "import torch"], cwd=cwd, env=env, capture_output=True)
            if probe.returncode != 0:
                pytest.skip("torch is not installed (pip install '.[torch]')")
        first = text.splitlines()[0]
        m = HEADER.match(first)
        name = m.group(1) if m else "snippet.py"
        (cwd / name).write_text(text)
        argv = shlex.split(m.group(2)) if m else ["python", name]
        _run(argv, cwd, env)
        return
    # Snippets the shell lines use (train.py) are written first.
    for _, other_lang, other in BLOCKS:
        m = HEADER.match(other.splitlines()[0]) if other_lang == "python" else None
        if m:
            (cwd / m.group(1)).write_text(other)
    cmds = _commands(text)
    hosts = [argv for argv, host in cmds if host]
    for argv, host in cmds:
        if not host:
            _run(argv, cwd, env)
    if hosts:
        port = str(_free_port())
        env = {**env, "SCALEFREE_JOB_TOKEN": secrets.token_hex(16)}
        procs = []
        for argv in hosts:
            a = list(argv)
            a[a.index("--master-addr") + 1] = "127.0.0.1"
            a[a.index("--") : a.index("--")] = ["--master-port", port]
            procs.append(subprocess.Popen(a, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        try:
            outs = [p.communicate(timeout=TIMEOUT) for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
        for p, (out, err) in zip(procs, outs):
            assert p.returncode == 0, f"{shlex.join(p.args)} exited {p.returncode}\n{out}\n{err}"
