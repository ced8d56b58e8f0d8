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
    allowed = {"pyproject.toml", "README.md", "LICENSE", "server", "client", "proto", "shared", "deploy", "tests", "netem"}
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
