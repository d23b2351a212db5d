"""The package's shape: subpackages import each other without cycles, and library modules
hold no command-line code (argparse lives in scalefree.cli; the benchmark harness is a package
of its own, benchmarks/)."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "python" / "scalefree"
# Modules that may parse command lines: the CLI.
CLI_PLACES = ("cli",)


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _area(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "scalefree"


def _imports(path: Path):
    """Every scalefree module ``path`` imports, at any depth (lazy imports count too)."""
    me = _module(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if node.module:
                yield target
            else:
                yield from (f"{target}.{a.name}" for a in node.names)


def _graph():
    edges: dict[str, set[str]] = {}
    for path in ROOT.rglob("*.py"):
        a = _area(_module(path))
        for target in _imports(path):
            if not target.startswith("scalefree"):
                continue
            b = _area(target)
            # Private helper modules (_units, _rss, _atomic, _native) sit below everything.
            if b != a and not b.startswith("_"):
                edges.setdefault(a, set()).add(b)
    return edges


def test_subpackages_have_no_import_cycles():
    edges = _graph()
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(v):
        state[v] = 1
        stack.append(v)
        for w in sorted(edges.get(v, ())):
            if state.get(w) == 1:
                raise AssertionError("import cycle: " + " -> ".join(stack[stack.index(w):] + [w]))
            if w not in state:
                visit(w)
        stack.pop()
        state[v] = 2

    for v in sorted(edges):
        if v not in state:
            visit(v)
    # The layering the architecture promises: the CLI and the harness on top, libraries below.
    assert "cli" not in set().union(*edges.values())
    assert not edges.get("launch", set()) - {"errors"}


def test_library_modules_hold_no_argparse():
    offenders = []
    for path in ROOT.rglob("*.py"):
        module = _module(path)
        if _area(module) in CLI_PLACES:
            continue
        tree = ast.parse(path.read_text())
        if any(isinstance(n, ast.Import) and any(a.name == "argparse" for a in n.names)
               or isinstance(n, ast.ImportFrom) and n.module == "argparse" for n in ast.walk(tree)):
            offenders.append(module)
    assert not offenders, f"argparse in library modules: {offenders}"


def test_no_merge_conflict_markers_left():
    repo = ROOT.parents[1]
    left = []
    for pattern in ("python/**/*.py", "tests/**/*.py", "benchmarks/**/*.py", "crates/**/*.rs", "docs/**/*.md", "*.md", "*.toml", ".ci/*", "scripts/*"):
        for path in repo.glob(pattern):
            if path.is_file():
                text = path.read_text(errors="replace")
                if any(line.startswith(("<<<<<<< ", ">>>>>>> ")) for line in text.splitlines()):
                    left.append(str(path.relative_to(repo)))
    assert not left, f"merge conflict markers in {left}"
