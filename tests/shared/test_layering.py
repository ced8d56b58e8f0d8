"""Who may import whom, checked on the source (AST), imports inside functions included:
- the client and shared packages never import the server's: a laptop's client needs none of it, and what
  both sides use lives in shared/;
- the generation loop and the drafters never touch protobuf: the verifier (``client/verifier.py``) converts."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

import edgespec.client as client
import edgespec.shared as shared

ROOTS = {"client": Path(client.__file__).parent, "shared": Path(shared.__file__).parent}
MODULES = [(name, path) for name, root in ROOTS.items() for path in sorted(root.rglob("*.py"))]


def imported_modules(path: Path, root: Path, package: str) -> list[str]:
    """Every module an import statement in `path` names, relative ones resolved; `root` is the folder of
    the package `package` (e.g. client/ and "edgespec.client")."""
    parts = package.split(".") + list(path.relative_to(root).parent.parts)
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = parts[: len(parts) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            out += [module] + [f"{module}.{a.name}" for a in node.names]
    return out


@pytest.mark.parametrize("package,path", MODULES, ids=[f"{n}/{p.relative_to(ROOTS[n]).as_posix()}" for n, p in MODULES])
def test_no_server_import(package, path):
    bad = [m for m in imported_modules(path, ROOTS[package], f"edgespec.{package}") if m.startswith("edgespec.server")]
    assert not bad, f"{package}/{path.relative_to(ROOTS[package])} imports {bad}: move what both sides need to shared/"


def test_the_check_sees_server_imports(tmp_path):
    nested = tmp_path / "drafters"
    nested.mkdir()
    sample = nested / "sample.py"
    sample.write_text("from ...server.app import start_server\nimport edgespec.server.core\n"
                      "def f():\n    from edgespec.server import service\n")
    found = imported_modules(sample, tmp_path, "edgespec.client")
    assert {"edgespec.server.app", "edgespec.server.core", "edgespec.server"} <= set(found)


BOUNDARY = [ROOTS["client"] / "generation.py", *sorted((ROOTS["client"] / "drafters").glob("*.py"))]


@pytest.mark.parametrize("path", BOUNDARY, ids=lambda p: p.relative_to(ROOTS["client"]).as_posix())
def test_no_protobuf_import_in_the_loop_or_the_drafters(path):
    found = imported_modules(path, ROOTS["client"], "edgespec.client")
    bad = [m for m in found if m.startswith(("edgespec.proto", "google.protobuf", "grpc"))]
    assert not bad, f"{path.name} imports {bad}: go through client/verifier.py's domain types"


def test_the_check_sees_a_protobuf_import(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text("from edgespec.proto.edgespec.v1 import pb\nfrom edgespec import proto\nimport grpc\n")
    found = imported_modules(sample, tmp_path, "edgespec.client")
    assert {"edgespec.proto.edgespec.v1", "edgespec.proto", "grpc"} <= set(found)
