"""Each learned-drafter family (EAGLE, MoA, Beagle) stays small to open: its model in
``shared/drafters/<family>/``, its drafting runtime in ``client/drafters/learned/``, and the modules all
families share beside them. Checked on the source (AST), following the edgespec imports:

- opening a family (its client runtime, or its shared model) loads at most ``LIMIT`` drafter modules
  (``shared/drafters/`` and ``client/drafters/``, itself included). What is counted is what importing it
  loads: module-level imports, transitively; an import inside a function (CORAL's router, attached only when
  a checkpoint has one) or under ``if TYPE_CHECKING`` (type names) is left out, since opening the family
  does not run it. Package ``__init__`` files are left out too: they must import nothing (checked here);
- no family imports another family's modules, at any level (inside functions and TYPE_CHECKING included),
  and the shared modules import no family at all."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

import edgespec.client as client
import edgespec.shared as shared

ROOTS = {"edgespec.shared": Path(shared.__file__).parent, "edgespec.client": Path(client.__file__).parent}
DRAFTERS = (ROOTS["edgespec.shared"] / "drafters", ROOTS["edgespec.client"] / "drafters")
LIMIT = 6  # the runtime, its model, the runtimes' base, and blocks, target_parts, checkpoint
FAMILIES = {  # a family: (its client runtime, its shared model: for MoA both halves, what training builds)
    "eagle": ("edgespec.client.drafters.learned.eagle_runtime", "edgespec.shared.drafters.eagle.model"),
    "moa": ("edgespec.client.drafters.learned.moa_runtime", "edgespec.shared.drafters.moa.model"),
    "beagle": ("edgespec.client.drafters.learned.beagle_runtime", "edgespec.shared.drafters.beagle.model"),
}
SHARED_BASE = ["edgespec.shared.drafters.blocks", "edgespec.shared.drafters.target_parts",
               "edgespec.shared.drafters.checkpoint", "edgespec.shared.drafters.router",
               "edgespec.shared.drafters.vocab", "edgespec.client.drafters.learned.runtime",
               "edgespec.client.drafters.learned.drafter"]


def path_of(module: str) -> Path | None:
    """The file of an edgespec module of the shared or client package (a package: its ``__init__``)."""
    for package, root in ROOTS.items():
        if module == package or module.startswith(package + "."):
            folder = root.joinpath(*module[len(package):].strip(".").split(".")) if module != package else root
            for candidate in (folder.with_suffix(".py"), folder / "__init__.py"):
                if candidate.is_file():
                    return candidate
    return None


def module_of(path: Path) -> str:
    for package, root in ROOTS.items():
        if root in path.parents:
            parts = list(path.relative_to(root).with_suffix("").parts)
            return ".".join([package, *(parts[:-1] if parts[-1] == "__init__" else parts)])
    raise ValueError(path)


def _is_type_checking(node: ast.stmt) -> bool:
    test = node.test if isinstance(node, ast.If) else None
    return isinstance(test, (ast.Name, ast.Attribute)) and "TYPE_CHECKING" in ast.unparse(test)


def _statements(tree: ast.Module, loaded_only: bool) -> list[ast.stmt]:
    """Every import statement; with ``loaded_only`` those that importing the module runs: top level, and
    inside a top-level ``if`` / ``try`` (not ``if TYPE_CHECKING``), never inside a function or class."""
    if not loaded_only:
        return [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
    out, todo = [], list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            out.append(node)
        elif isinstance(node, ast.If) and not _is_type_checking(node):
            todo += node.body + node.orelse
        elif isinstance(node, ast.Try):
            todo += node.body + node.orelse + node.finalbody + [s for h in node.handlers for s in h.body]
    return out


def imports(path: Path, loaded_only: bool) -> set[str]:
    """The edgespec modules (shared and client) that ``path`` imports, each import resolved to the module
    that holds the name (``from x import Name`` names ``x``; ``from pkg import module`` names the module)."""
    module = module_of(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in _statements(ast.parse(path.read_text(), str(path)), loaded_only):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            head = ".".join(base + ([node.module] if node.module else []))
            names = [f"{head}.{a.name}" if path_of(f"{head}.{a.name}") else head for a in node.names]
        found |= {n for n in names if path_of(n)}
    return found


def reached(start: str, loaded_only: bool = True) -> list[str]:
    """The drafter modules (``__init__`` files aside) that importing ``start`` loads, itself included."""
    seen, todo = set(), [start]
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo += imports(path_of(module), loaded_only)
    return sorted(m for m in seen if _is_drafter_module(path_of(m)))


def _is_drafter_module(path: Path) -> bool:
    return path.name != "__init__.py" and any(folder in path.parents for folder in DRAFTERS)


def family_of(module: str) -> str | None:
    """The family a module belongs to (its model folder, or its client runtime); None for shared ones."""
    for family, (runtime, _) in FAMILIES.items():
        if module == runtime or module.startswith(f"edgespec.shared.drafters.{family}.") \
                or module == f"edgespec.shared.drafters.{family}":
            return family
    return None


def family_modules(family: str) -> list[str]:
    folder = DRAFTERS[0] / family
    return [FAMILIES[family][0], *(module_of(p) for p in sorted(folder.glob("*.py")))]


def others_named(module: str) -> list[str]:
    """The modules of other families that ``module`` imports, at any level."""
    own = family_of(module)
    return sorted(m for m in imports(path_of(module), loaded_only=False) if family_of(m) not in (None, own))


@pytest.mark.parametrize("start", [s for pair in FAMILIES.values() for s in pair])
def test_opening_a_family_touches_few_modules(start):
    touched = reached(start)
    assert len(touched) <= LIMIT, f"importing {start} loads {len(touched)} drafter modules: {touched}"
    assert start in touched and all(family_of(m) in (None, family_of(start)) for m in touched), touched


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_no_family_imports_another(family):
    bad = {m: others_named(m) for m in family_modules(family) if others_named(m)}
    assert not bad, f"{family}'s modules import another family's: {bad}"


@pytest.mark.parametrize("module", SHARED_BASE)
def test_the_shared_modules_import_no_family(module):
    named = sorted(m for m in imports(path_of(module), loaded_only=False) if family_of(m))
    assert not named, f"{module} is shared by every family but imports {named}"


def test_the_drafter_packages_import_nothing():
    """What the count leaves out must load nothing: a package's ``__init__`` that imported its modules would
    make opening one module of a family open them all."""
    inits = [p for folder in DRAFTERS for p in sorted(folder.rglob("__init__.py"))]
    assert len(inits) >= 6
    loud = [str(p) for p in inits if imports(p, loaded_only=False)]
    assert not loud, f"package __init__ files that import modules: {loud}"


def test_the_count_follows_imports_and_sees_a_family_cross():
    """The walker itself: the MoA runtime reaches the shared base through its model; a lazy import is not
    loaded but is still an import; a module of another family is told apart from a shared one."""
    moa = reached(FAMILIES["moa"][0])
    assert {"edgespec.shared.drafters.blocks", "edgespec.shared.drafters.checkpoint",
            "edgespec.client.drafters.learned.runtime"} <= set(moa)
    runtime = path_of("edgespec.client.drafters.learned.runtime")
    assert "edgespec.shared.drafters.router" in imports(runtime, loaded_only=False) - imports(runtime, True)
    assert family_of("edgespec.shared.drafters.moa.lsa") == "moa" and family_of("edgespec.shared.drafters.blocks") is None
    assert family_of("edgespec.client.drafters.learned.eagle_runtime") == "eagle"
    assert family_of("edgespec.client.drafters.learned.loading") is None  # the loader picks among them
