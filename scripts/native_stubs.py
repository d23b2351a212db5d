"""Rewrites python/scalefree/_native.pyi from the built extension: every name and class member it
has, in order; the declarations already in the stub are kept as written (their types), the
missing ones are added with Any. Run after adding a binding, then type what it added:

    python scripts/native_stubs.py python/scalefree/_native.pyi > /tmp/n.pyi && mv /tmp/n.pyi python/scalefree/_native.pyi
"""
import ast, inspect, re, sys
import scalefree._native as n
old_path = sys.argv[1]
src = open(old_path).read()
tree = ast.parse(src)
old_top = {}      # name -> source segment (with preceding comment lines kept via lineno)
old_members = {}  # class -> {member: segment}
lines = src.splitlines()
def seg(node):
    start = node.lineno - 1
    if getattr(node, "decorator_list", None):
        start = node.decorator_list[0].lineno - 1
    # keep comment lines directly above
    while start > 0 and lines[start - 1].lstrip().startswith("#"):
        start -= 1
    return "\n".join(lines[start:node.end_lineno])
header_end = 0
for node in tree.body:
    if isinstance(node, ast.ClassDef):
        old_top[node.name] = node
        old_members[node.name] = {}
        for m in node.body:
            name = m.name if isinstance(m, (ast.FunctionDef,)) else (m.target.id if isinstance(m, ast.AnnAssign) else None)
            if name:
                old_members[node.name][name] = m
    elif isinstance(node, ast.FunctionDef):
        old_top[node.name] = node
    elif isinstance(node, ast.AnnAssign):
        old_top[node.target.id] = node

def params(sig, drop_self):
    if not sig:
        return "*args: Any, **kwargs: Any"
    inner = sig.strip()[1:-1]
    parts = [p.strip() for p in re.split(r",(?![^()]*\))", inner) if p.strip()]
    out = []
    for p in parts:
        if p.startswith("$"):
            if not drop_self:
                out.append("self")
            continue
        if p == "/":
            continue
        if "=" in p:
            k, v = p.split("=", 1)
            out.append(f"{k}: Any = {v}")
        else:
            out.append(f"{p}: Any")
    return ", ".join(out)

def wrap(line, indent):
    if len(line) <= 110:
        return line
    # break after the opening parenthesis's arguments
    i = line.index("(")
    head, rest = line[: i + 1], line[i + 1:]
    args = rest.split(", ")
    out, cur = [], head
    pad = " " * (i + 1)
    for a in args:
        piece = a if cur.endswith("(") else ", " + a
        if len(cur) + len(piece) > 110 and not cur.endswith("("):
            out.append(cur + ",")
            cur = pad + a
        else:
            cur += piece
    out.append(cur)
    return "\n".join(out)

result = []
for name in sorted(x for x in dir(n) if not x.startswith("__")):
    o = getattr(n, name)
    if inspect.isclass(o):
        members = [m for m in sorted(vars(o)) if not m.startswith("__") or m in ("__len__",)]
        body = []
        old = old_members.get(name, {})
        if "__init__" in old:
            body.append(seg(old["__init__"]))
        elif o.__text_signature__:
            args = params(o.__text_signature__, True)  # a class's signature has no $self
            body.append(wrap(f"    def __init__({'self, ' + args if args else 'self'}) -> None: ...", 4))
        for m in members:
            if m in old:
                body.append(seg(old[m]))
                continue
            d = vars(o)[m]
            kind = type(d).__name__
            if kind == "getset_descriptor":
                body.append(f"    {m}: Any")
            elif kind == "staticmethod":
                f = getattr(o, m)
                body.append("    @staticmethod\n" + wrap(f"    def {m}({params(f.__text_signature__, True)}) -> Any: ...", 4))
            else:
                body.append(wrap(f"    def {m}({params(getattr(d, '__text_signature__', None), False)}) -> Any: ...", 4))
        # members only in the old stub (kept: hand-written)
        for m, node in old.items():
            if m not in members and m != "__init__" and not m.startswith("__"):
                print(f"note: {name}.{m} in the stub but not in the extension", file=sys.stderr)
        if name in old_top:
            cls = old_top[name]
            start = cls.lineno - 1
            while start > 0 and lines[start - 1].lstrip().startswith("#"):
                start -= 1
            head = "\n".join(lines[start:cls.lineno])
        else:
            head = f"class {name}:"
        result.append(head + "\n" + ("\n".join(body) if body else "    ..."))
    elif callable(o):
        if name in old_top:
            result.append(seg(old_top[name]))
        else:
            result.append(wrap(f"def {name}({params(o.__text_signature__, True)}) -> Any: ...", 0))
    else:
        result.append(seg(old_top[name]) if name in old_top else f"{name}: {type(o).__name__}")
for name in old_top:
    if not hasattr(n, name) and name != "__version__":
        print(f"note: {name} in the stub but not in the extension", file=sys.stderr)
first = next(n for n in tree.body if not isinstance(n, (ast.Import, ast.ImportFrom, ast.Expr)))
pre = "\n".join(lines[: first.lineno - 1])  # the docstring and the imports
print(pre.rstrip() + "\n\n__version__: str\n\n" + "\n\n".join(r for r in result))
