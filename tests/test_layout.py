"""The package layout (issue 28): a small root, moved modules' old paths kept for one release,
and nbqat's own code on the new paths only."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import nbqat
from nbqat._moved import MOVED

PKG = Path(nbqat.__file__).parent


def test_the_package_root_holds_at_most_20_modules():
    root = sorted(p.name for p in PKG.glob("*.py"))
    assert len(root) <= 20, root


def test_every_old_path_is_the_moved_module_with_a_deprecation_warning():
    """In a fresh interpreter (an alias warns once per process): ``import old`` and
    ``from nbqat import short`` give the new module object, each with one DeprecationWarning that
    names the new path and points at the importing line."""
    script = f"""
import importlib, json, warnings
import nbqat
out = {{}}
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    from nbqat import recipe  # an attribute of the package, not yet imported
out["from"] = [recipe is importlib.import_module("nbqat.train.recipe"), [str(x.message) for x in w]]
for old, new in {MOVED!r}.items():
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        mod = importlib.import_module(old) if old != "nbqat.recipe" else recipe
    out[old] = [mod is importlib.import_module(new), mod.__name__, mod.__spec__.name,
                [(str(x.message), x.category.__name__, x.filename) for x in w]]
print(json.dumps(out))
"""
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    out = json.loads(res.stdout)
    for old, new in MOVED.items():
        same, name, spec, warns = out[old]
        assert same and name == new and spec == new, (old, name, spec)
        if old == "nbqat.recipe":  # imported above, by ``from nbqat import recipe``
            continue
        assert len(warns) == 1, (old, warns)
        msg, cat, filename = warns[0]
        assert cat == "DeprecationWarning" and new in msg and old in msg, warns
        assert filename == "<string>", (old, filename)  # the importing line, not importlib
    assert out["from"][0] and len(out["from"][1]) == 1 and "nbqat.train.recipe" in out["from"][1][0]


def test_nbqat_itself_imports_no_old_path():
    """The aliases are for users only: every module of the package imports the new paths (module
    level and inside functions)."""
    shorts = {old.removeprefix("nbqat.") for old in MOVED}
    bad = []
    for path in sorted(PKG.rglob("*.py")):
        for n in ast.walk(ast.parse(path.read_text())):
            if isinstance(n, ast.Import):
                bad += [(path.name, a.name) for a in n.names if a.name in MOVED]
            elif isinstance(n, ast.ImportFrom) and n.module in MOVED:
                bad.append((path.name, n.module))
            elif isinstance(n, ast.ImportFrom) and n.module == "nbqat":
                bad += [(path.name, a.name) for a in n.names if a.name in shorts]
    assert bad == []


def _import_graph() -> dict[str, set[str]]:
    """nbqat's modules -> the nbqat modules each imports (module level and inside functions;
    ``from pkg import name`` counts as the submodule ``pkg.name`` when there is one)."""
    mods = {}
    for p in PKG.rglob("*.py"):
        parts = list(p.relative_to(PKG.parent).with_suffix("").parts)
        mods[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p

    def resolve(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {m: set() for m in mods}
    for m, p in mods.items():
        pkg = m if p.name == "__init__.py" else m.rpartition(".")[0]
        for n in ast.walk(ast.parse(p.read_text())):
            names: list[str | None] = []
            if isinstance(n, ast.Import):
                names = [resolve(a.name) for a in n.names]
            elif isinstance(n, ast.ImportFrom):
                base = n.module or ""
                if n.level:
                    up = pkg.split(".")[: len(pkg.split(".")) - n.level + 1]
                    base = ".".join(up + ([n.module] if n.module else []))
                names = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else resolve(base)
                         for a in n.names]  # fmt: skip
            graph[m] |= {t for t in names if t and t != m}
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_circle():
    """Data flows one way (docs/architecture.md): no two modules import each other, directly or
    through others, at module level or inside a function."""
    assert _circles(_import_graph()) == []


def test_the_circle_check_can_fail():
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_module_imports_the_package_root():
    """A module inside nbqat imports what it uses from its own module, never from ``nbqat``
    itself (whose ``__init__`` imports everything: a circle in waiting)."""
    graph = _import_graph()
    assert sorted(m for m, deps in graph.items() if "nbqat" in deps and m != "nbqat") == []


#: The size limits of docs/architecture.md: a module under this many lines, a function (its
#: ``def`` line to its last, docstring included) under this many.
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 80


def _too_long(source: str, name: str) -> list[str]:
    """The module ``name`` when ``source`` has MAX_MODULE_LINES lines or more, and each function
    or method in it (nested ones too) of MAX_FUNCTION_LINES lines or more."""
    bad = []
    n = len(source.splitlines())
    if n >= MAX_MODULE_LINES:
        bad.append(f"{name}: {n} lines")
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            span = (node.end_lineno or node.lineno) - node.lineno + 1
            if span >= MAX_FUNCTION_LINES:
                bad.append(f"{name}:{node.lineno} {node.name}: {span} lines")
    return bad


def test_modules_and_functions_are_under_the_size_limits():
    """Every module of the package is under 500 lines and every function under 80 (split by
    concern, never a file cut in two only to fit)."""
    bad = []
    for path in sorted(PKG.rglob("*.py")):
        bad += _too_long(path.read_text(), str(path.relative_to(PKG.parent)))
    assert bad == []


def test_the_size_check_can_fail():
    body = "".join(f"        x{i} = {i}\n" for i in range(77))
    fits = f"class C:\n    def f(self):\n{body}        return x0\n"  # f: 79 lines
    assert _too_long(fits, "m.py") == []
    over = f"class C:\n    async def f(self):\n{body}        y = 1\n        return y\n"  # 80
    assert _too_long(over, "m.py") == ["m.py:2 f: 80 lines"]
    assert _too_long("x = 1\n" * 499, "m.py") == []
    assert _too_long("x = 1\n" * 500, "m.py") == ["m.py: 500 lines"]
