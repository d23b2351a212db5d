"""``_native.pyi`` covers the whole extension: every name and every class member the extension
has is declared, nothing is declared that it lacks, and every name the Python modules (and the
benchmark harness) use from it is declared."""

import ast
import inspect
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
STUB = REPO / "python" / "scalefree" / "_native.pyi"

native = pytest.importorskip("scalefree._native")


def _declared():
    """Top-level names, and each class's members, of the stub."""
    names, members = set(), {}
    for node in ast.parse(STUB.read_text()).body:
        if isinstance(node, ast.ClassDef):
            names.add(node.name)
            members[node.name] = {m.name if isinstance(m, ast.FunctionDef) else m.target.id
                                   for m in node.body if isinstance(m, (ast.FunctionDef, ast.AnnAssign))}
        elif isinstance(node, ast.FunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.AnnAssign):
            names.add(node.target.id)
    return names, members


def _public(cls) -> set:
    return {m for m in vars(cls) if not m.startswith("__") or m == "__len__"}


def test_every_name_and_member_of_the_extension_is_declared():
    names, members = _declared()
    have = {n for n in dir(native) if not n.startswith("__")}
    assert not have - names, f"names of the extension missing from _native.pyi (scripts/native_stubs.py adds them): {sorted(have - names)}"
    assert not names - have - {"__version__"}, f"_native.pyi declares names the extension lacks: {sorted(names - have)}"
    missing, stale = [], []
    for name in sorted(have):
        obj = getattr(native, name)
        if inspect.isclass(obj):
            want = _public(obj) | ({"__init__"} if obj.__text_signature__ else set())
            missing += [f"{name}.{m}" for m in sorted(want - members[name])]
            stale += [f"{name}.{m}" for m in sorted(members[name] - want)]
    assert not missing, f"members missing from _native.pyi (scripts/native_stubs.py adds them): {missing}"
    assert not stale, f"_native.pyi declares members the extension lacks: {stale}"


def test_every_name_python_uses_from_the_extension_is_declared():
    names, _ = _declared()
    used = set()
    for root in (REPO / "python" / "scalefree", REPO / "benchmarks" / "scalefree_bench"):
        for path in root.rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "_native":
                    used.add(node.attr)
                elif isinstance(node, ast.ImportFrom) and (node.module or "").endswith("_native"):
                    used.update(a.name for a in node.names)
    assert len(used) > 30
    assert not used - names, f"used from _native but not declared in _native.pyi: {sorted(used - names)}"
