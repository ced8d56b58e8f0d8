"""The package layout: every package folder is listed, the stubs match the .proto, the CLI starts."""
from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = {"shared": "edgespec.shared", "server": "edgespec.server", "client": "edgespec.client",
           "netem": "edgespec.netem", "proto": "edgespec.proto"}


def test_top_level_layout():
    allowed = {"pyproject.toml", "README.md", "server", "client", "proto", "shared", "deploy", "tests", "netem"}
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True).stdout.split()
    tops = {p.split("/")[0] for p in tracked if not p.startswith(".")}
    assert tops <= allowed, f"unexpected top-level entries: {sorted(tops - allowed)}"


def test_every_package_folder_is_listed_in_pyproject():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    assert config["package-dir"] == {package: folder for folder, package in FOLDERS.items()}
    found = set()
    for folder, package in FOLDERS.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder)
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
    out = subprocess.run([sys.executable, "-m", "edgespec.shared.cli", "--help"], capture_output=True, text=True)
    assert out.returncode == 0
    assert "models" in out.stdout
