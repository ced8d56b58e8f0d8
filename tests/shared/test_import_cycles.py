"""No import circles in the package: the modules of edgespec (the top package, client, server, shared, netem)
form a graph from their import statements, read from the source (AST: imports inside functions and under
TYPE_CHECKING count, relative ones are resolved). Modules that import each other, directly or round a longer
loop, cannot be read, tested or loaded one without the other: each such circle is refused, except those in
KNOWN, which are there today and wait for their own fix. The list only shrinks: a circle that is gone must
leave it too (the check says so)."""
from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

PACKAGES = ("edgespec", "edgespec.client", "edgespec.server", "edgespec.shared", "edgespec.netem")

# Circles there today, as the sets of modules (without "edgespec.") that import each other.
KNOWN: list[set[str]] = []


def package_modules(packages=PACKAGES) -> dict[str, Path]:
    """{module name: its file} of every module in `packages`, found without importing them; a package's own
    modules only (the top package's folder is inside client/, but its modules are edgespec.client's)."""
    folders = {p: Path(importlib.util.find_spec(p).origin).parent for p in packages}
    out = {}
    for package, folder in folders.items():
        nested = [f for f in folders.values() if f != folder and folder in f.parents]
        for path in folder.rglob("*.py"):
            if any(f in path.parents for f in nested):
                continue
            parts = path.relative_to(folder).with_suffix("").parts
            out[".".join((package, *parts[:-1], *([] if parts[-1] == "__init__" else parts[-1:])))] = path
    return out


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """{module: the modules of `modules` it imports}. ``from package import name`` names the submodule when
    there is one, else the package; ``import a.b.c`` names the deepest of a.b.c, a.b, a that is a module."""
    graph = {}
    for name, path in modules.items():
        here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        found = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    parts = alias.name.split(".")
                    found |= {next((m for m in (".".join(parts[:k]) for k in range(len(parts), 0, -1))
                                    if m in modules), None)}
            elif isinstance(node, ast.ImportFrom):
                base = ".".join((here[: len(here) - node.level + 1] if node.level else [])
                                + ([node.module] if node.module else []))
                found |= {f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names}
        graph[name] = {m for m in found if m in modules and m != name}
    return graph


def circles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while not component or w != v:
                w = stack.pop()
                component.add(w)
            if len(component) > 1:
                out.append(component)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def short(modules: set[str]) -> set[str]:
    return {m.removeprefix("edgespec.") for m in modules}


def describe(circle: set[str], graph: dict[str, set[str]]) -> str:
    return "; ".join(f"{short({m}).pop()} -> {', '.join(sorted(short(graph[m] & circle)))}" for m in sorted(circle))


GRAPH = import_graph(package_modules())
FOUND = [short(c) for c in circles(GRAPH)]


def test_no_import_circles_beyond_the_known_ones():
    new = [describe({f"edgespec.{m}" for m in c}, GRAPH) for c in FOUND if c not in KNOWN]
    assert not new, "modules that import each other (break the circle: move what both need into one of them, " \
                    "or into a module below both): " + " | ".join(new)


def test_the_known_circles_are_still_there():
    gone = [sorted(k) for k in KNOWN if k not in FOUND]
    assert not gone, f"these circles are gone or changed: take them off KNOWN: {gone}"


def test_the_client_drafters_are_free_of_circles():
    assert not [c for c in FOUND if any(m.startswith("client.drafters") for m in c)]
    assert "edgespec.client.drafters.factory" in GRAPH and "edgespec.client.drafters.learned.loading" in GRAPH


def test_the_check_sees_a_circle_through_lazy_and_type_checking_imports(tmp_path, monkeypatch):
    pkg = tmp_path / "cyclepkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from .sub import b\n")
    (pkg / "sub" / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..c import C\n")
    (pkg / "c.py").write_text("import cyclepkg.a\n")
    (pkg / "d.py").write_text("from cyclepkg import c\n")  # imports into the circle, is not in it
    monkeypatch.syspath_prepend(str(tmp_path))
    graph = import_graph(package_modules(("cyclepkg",)))
    assert graph["cyclepkg.a"] == {"cyclepkg.sub.b"} and graph["cyclepkg.d"] == {"cyclepkg.c"}
    assert circles(graph) == [{"cyclepkg.a", "cyclepkg.sub.b", "cyclepkg.c"}]
