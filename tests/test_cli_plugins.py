"""The library without its benchmark harness: `scalefree bench` and the harness's peer
transports of `scalefree ps train` say how to install it (one line, exit 2), and the package
holds no benchmark code and imports no benchmark peer."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "python" / "scalefree"

# Runs the CLI as if no package added commands or transports (the harness not installed).
WITHOUT_HARNESS = """
import importlib.metadata as m, sys
m.entry_points = lambda **kw: [] if kw else {}
from scalefree.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _cli_without_harness(*argv):
    return subprocess.run([sys.executable, "-c", WITHOUT_HARNESS, *argv], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("argv", [["bench"], ["bench", "allreduce", "--sizes", "1K"], ["bench", "--help"]])
def test_bench_without_the_harness_says_how_to_install_it(argv):
    p = _cli_without_harness(*argv)
    assert p.returncode == 2, p.stderr
    assert p.stderr.count("\n") == 1 and "pip install ./benchmarks" in p.stderr and "Traceback" not in p.stderr
    assert p.stdout == ""


@pytest.mark.parametrize("transport", ["gloo", "grpc", "grpc-stream"])
def test_ps_peer_transports_without_the_harness_say_how_to_install_it(transport):
    p = _cli_without_harness("ps", "train", "--transport", transport, "--steps", "1")
    assert p.returncode == 2, p.stderr
    assert p.stderr.count("\n") == 1 and f"--transport {transport}" in p.stderr and "pip install ./benchmarks" in p.stderr


def test_help_lists_bench_without_importing_the_harness():
    p = _cli_without_harness("--help")
    text = " ".join(p.stdout.split())  # argparse wraps the lines
    assert p.returncode == 0 and "bench benchmark scalefree against its peers" in text and "(not installed)" in text


# The benchmark peers and the only places the library may import them (the launcher asks MPI
# for the rendezvous under mpirun; the torch backend is torch.distributed's).
PEERS = {"mpi4py": {"scalefree.launch.mpi_master"}, "grpc": set(), "libmf": set(),
         "torch.distributed": {"scalefree.torch.backend", "scalefree.torch.hooks"}}


def test_the_package_holds_no_benchmark_code_and_imports_no_peer():
    assert not (ROOT / "bench").exists()
    found = []
    for path in ROOT.rglob("*.py"):
        module = ".".join(path.relative_to(ROOT.parent).with_suffix("").parts)
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            for name in names:
                if "bench" in name.split(".")[0]:
                    found.append((module, name))
                for peer, allowed in PEERS.items():
                    if (name == peer or name.startswith(peer + ".")) and module not in allowed:
                        found.append((module, name))
    assert not found, f"benchmark code or peers imported by the library: {found}"
