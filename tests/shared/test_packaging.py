"""The package layout: every package folder is listed, the stubs match the .proto, the CLI starts."""
from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = {"shared": "edgespec.shared", "server": "edgespec.server", "client": "edgespec.client",
           "netem": "edgespec.netem", "proto": "edgespec.proto"}
ROOT_PACKAGE = "client/root"  # the `edgespec` package's own folder


def test_top_level_layout():
    allowed = {"pyproject.toml", "README.md", "server", "client", "proto", "shared", "deploy", "tests", "netem"}
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True).stdout.split()
    tops = {p.split("/")[0] for p in tracked if not p.startswith(".")}
    assert tops <= allowed, f"unexpected top-level entries: {sorted(tops - allowed)}"


def test_every_package_folder_is_listed_in_pyproject():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    assert config["package-dir"] == {"edgespec": ROOT_PACKAGE, **{package: folder for folder, package in FOLDERS.items()}}
    found = {"edgespec"}
    for folder, package in FOLDERS.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder)
            if init.parent != ROOT / ROOT_PACKAGE:
                found.add(".".join([package, *rel.parts]))
    assert found == listed, (f"missing from pyproject packages: {sorted(found - listed)}; "
                             f"listed but absent: {sorted(listed - found)}")


def test_generated_stubs_match_the_proto():
    from edgespec.proto.build import drifted

    assert drifted() == [], "run: python -m edgespec.proto.build"


def test_stubs_import_under_the_edgespec_namespace():
    from edgespec.proto.edgespec.v1 import pb, pb_grpc

    assert pb.DESCRIPTOR.package == "edgespec.v1"
    assert hasattr(pb_grpc, "VerifierStub")


def test_cli_help_lists_models():
    out = subprocess.run([sys.executable, "-m", "edgespec", "--help"], capture_output=True, text=True)
    assert out.returncode == 0
    assert "models" in out.stdout


def test_the_top_level_package_gives_the_python_client():
    """`import edgespec` is light (the client loads on first use) and `edgespec.Client` is the text-level client."""
    code = ("import sys, edgespec; assert 'edgespec.client.python_client' not in sys.modules; "
            "from edgespec.client.python_client import AsyncClient, Client; "
            "assert edgespec.Client is Client and edgespec.AsyncClient is AsyncClient")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/")
    assert out.returncode == 0, out.stderr
    import edgespec

    with pytest.raises(AttributeError, match="has no attribute 'Nope'"):
        edgespec.Nope  # noqa: B018


def _requirements() -> dict[str, str]:
    """Declared distribution name (normalised) -> its requirement, runtime and extras alike."""
    import re

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    out = {}
    for req in project["dependencies"] + sum(project["optional-dependencies"].values(), []):
        name = re.split(r"[<>=!~\[ ;]", req, maxsplit=1)[0]
        out[name.lower().replace("_", "-")] = req
    return out


def test_the_version_is_one_string():
    import edgespec
    from edgespec.shared import __version__

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert edgespec.__version__ == __version__ == project["version"]


def test_protobufs_floor_is_at_least_the_stubs_version():
    """A runtime older than the protoc that made the checked-in stubs cannot import them (7.35.0 against 7.35.1
    stubs); a newer major version refuses them too."""
    import re

    stub = (ROOT / "proto/edgespec/v1/edgespec_pb2.py").read_text()
    made_by = tuple(int(x) for x in re.search(r"# Protobuf Python Version: ([\d.]+)", stub).group(1).split("."))
    requirement = _requirements()["protobuf"]
    floor = tuple(int(x) for x in re.search(r">=([\d.]+)", requirement).group(1).split("."))
    ceiling = re.search(r"<(\d+)", requirement)
    assert floor >= made_by, requirement
    assert ceiling and int(ceiling.group(1)) == made_by[0] + 1, requirement


def test_every_third_party_module_the_code_imports_is_declared():
    """Imported by name means declared by name: a dependency's dependency can drop it in any release."""
    import ast
    import importlib.metadata as metadata

    declared, owners = set(_requirements()), metadata.packages_distributions()
    missing = {}
    for folder in (*FOLDERS, ROOT_PACKAGE):
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                for name in (n.split(".")[0] for n in names):
                    if name in sys.stdlib_module_names or name in ("edgespec", "__future__"):
                        continue
                    dists = {d.lower().replace("_", "-") for d in owners.get(name, [])}
                    if not dists & declared:
                        missing.setdefault(name, str(path.relative_to(ROOT)))
    assert not missing, f"imported but not declared in pyproject.toml: {missing}"
    assert {"pydantic", "starlette", "protobuf"} <= declared


def test_the_license_is_the_one_pyproject_names():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == {"text": "Apache-2.0"}
    text = (ROOT / "shared" / "LICENSE").read_text()  # inside the fixed top-level layout
    assert "Apache License" in text and "Version 2.0, January 2004" in text
