"""The import graph is a tree: the import-linter contracts in pyproject.toml hold (layers, and no
cycle between the modules of any package, function-local imports included), they break on a
planted cycle, no module imports another's underscore names, and the modules below the group
take only the native extension from the package root."""

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
ROOT = REPO / "python" / "scalefree"

pytest.importorskip("importlinter", reason="import-linter is not installed (pip install '.[test]')")

LINT = "import sys; from importlinter.cli import lint_imports; sys.exit(lint_imports(config_filename=sys.argv[1], no_cache=True))"


def _lint(python_dir: Path) -> subprocess.CompletedProcess:
    # grimp finds the package on the path: the source tree given, not an installed copy.
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(python_dir), "PYTHONNOUSERSITE": "1"}
    return subprocess.run([sys.executable, "-c", LINT, str(REPO / "pyproject.toml")], cwd=python_dir, env=env,
                          capture_output=True, text=True, timeout=300)


def test_the_import_contracts_hold():
    p = _lint(ROOT.parent)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "2 kept, 0 broken" in p.stdout


# (module, import planted in it, what it closes): a cycle across layers, one between two
# sibling packages, one between two modules of a package; the last two through function-local
# imports, which count as much as module-level ones.
PLANTED = [
    ("sparse/plan.py", "from ..graph import pagerank\n", "layers"),
    ("mf/data/stream.py", "def _planted():\n    from ..modes import rima\n", "no cycle"),
    ("graph/io.py", "def _planted():\n    from . import pagerank\n", "no cycle"),
]


@pytest.mark.parametrize("module, planted, contract", PLANTED, ids=[p[0] for p in PLANTED])
def test_a_planted_cycle_breaks_the_contracts(tmp_path, module, planted, contract):
    copy = tmp_path / "scalefree"
    shutil.copytree(ROOT, copy, ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    with open(copy / module, "a") as f:
        f.write("\n\n" + planted)
    p = _lint(tmp_path)
    assert p.returncode == 1, p.stdout + p.stderr
    broken = [line for line in p.stdout.splitlines() if line.endswith("BROKEN")]
    assert any(line.startswith(contract) for line in broken) or contract in p.stdout.split("Broken contracts")[-1], p.stdout


def _modules():
    for path in sorted(ROOT.rglob("*.py")):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        yield path, name, package


def _imported(node: ast.ImportFrom, package: str) -> str:
    if not node.level:
        return node.module or ""
    base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _is_module(dotted: str) -> bool:
    p = ROOT.parent.joinpath(*dotted.split("."))
    return p.with_suffix(".py").exists() or p.is_dir() or dotted == "scalefree._native"


def test_no_module_imports_another_modules_underscore_names():
    """``from .x import _name`` reaches into another module; private modules (``_units``) and
    the extension (``_native``) are modules of the package, not names."""
    found = []
    for path, name, package in _modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                target = _imported(node, package)
                if not target.startswith("scalefree"):
                    continue
                for a in node.names:
                    if a.name.startswith("_") and not a.name.startswith("__") and not _is_module(f"{target}.{a.name}"):
                        found.append(f"{name}:{node.lineno} {target}.{a.name}")
        # ... or through the module: `from . import core as flash; flash._csr_product`.
        tree = ast.parse(path.read_text())
        modules = {a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
                   and _imported(n, package).startswith("scalefree") for a in n.names
                   if _is_module(f"{_imported(n, package)}.{a.name}") and a.name != "_native"}
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules \
                    and node.attr.startswith("_") and not node.attr.startswith("__"):
                found.append(f"{name}:{node.lineno} {node.value.id}.{node.attr}")
    assert not found, f"underscore names taken from other modules: {found}"


# The layers below the applications: the package root starts a job (scalefree.init imports the
# group and the launcher), so these may take only modules (the native extension, the arena)
# from it.
BELOW_ROOT = ("scalefree.group", "scalefree.launch", "scalefree.sparse", "scalefree.ssp", "scalefree.tensors",
              "scalefree.arena", "scalefree._", "scalefree.errors")


def test_modules_below_the_group_take_only_the_extension_from_the_root():
    found = []
    for path, name, package in _modules():
        if not name.startswith(BELOW_ROOT):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and _imported(node, package) == "scalefree":
                # A submodule (`from .. import arena`) is the submodule's import, not the root's.
                found += [f"{name}:{node.lineno} {a.name}" for a in node.names if not _is_module(f"scalefree.{a.name}")]
            elif isinstance(node, ast.Import):
                found += [f"{name}:{node.lineno} import {a.name}" for a in node.names if a.name == "scalefree"]
    assert not found, f"modules below the group importing the package root: {found}"
