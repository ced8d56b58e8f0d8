"""The generation loop and the drafters never touch protobuf: the verifier (``client/verifier.py``) converts."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

import edgespec.client as client

CLIENT = Path(client.__file__).parent
MODULES = [CLIENT / "generation.py", *sorted((CLIENT / "drafters").glob("*.py"))]


def imported_modules(path: Path) -> list[str]:
    """Every module an import statement names, relative ones resolved against the client package."""
    package = ["edgespec", "client"] + (["drafters"] if path.parent.name == "drafters" else [])
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            out += [module] + [f"{module}.{a.name}" for a in node.names]
    return out


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.relative_to(CLIENT).as_posix())
def test_no_protobuf_import(path):
    bad = [m for m in imported_modules(path) if m.startswith(("edgespec.proto", "google.protobuf", "grpc"))]
    assert not bad, f"{path.name} imports {bad}: go through client/verifier.py's domain types"


def test_the_check_sees_a_protobuf_import(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text("from edgespec.proto.edgespec.v1 import pb\nfrom edgespec import proto\nimport grpc\n")
    assert {"edgespec.proto.edgespec.v1", "edgespec.proto", "grpc"} <= set(imported_modules(sample))
