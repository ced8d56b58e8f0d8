"""Generate the Python stubs of the wire contract, or check that they match it.

    python -m edgespec.proto.build          # regenerate into proto/edgespec/v1
    python -m edgespec.proto.build --check  # exit 1 if the checked-in stubs drifted

The stubs are checked in so that installing edgespec needs no protoc. protoc
writes the gRPC stub's import as ``from edgespec.v1 import ...``; the package
lives at ``edgespec.proto.edgespec.v1`` once installed, so that import is made
relative.
"""
from __future__ import annotations

import argparse
import re
import sys
import tempfile
from pathlib import Path

PROTO_ROOT = Path(__file__).resolve().parent
PACKAGE_DIR = PROTO_ROOT / "edgespec" / "v1"
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")


def _fix_imports(text: str) -> str:
    return re.sub(r"^from edgespec\.v1 import (\w+)", r"from . import \1", text, flags=re.M)


def generate(out_dir: Path) -> list[Path]:
    """Run protoc (from grpcio-tools) on every .proto and write the stubs to out_dir."""
    try:
        from grpc_tools import protoc
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise SystemExit("grpcio-tools is needed to build the stubs: pip install 'edgespec[test]'") from exc
    import importlib.resources

    protos = sorted(PACKAGE_DIR.glob("*.proto"))
    with tempfile.TemporaryDirectory() as tmp:
        well_known = str(importlib.resources.files("grpc_tools") / "_proto")
        args = ["protoc", f"-I{PROTO_ROOT}", f"-I{well_known}", f"--python_out={tmp}",
                f"--pyi_out={tmp}", f"--grpc_python_out={tmp}"]
        args += [str(p.relative_to(PROTO_ROOT)) for p in protos]
        if protoc.main(args) != 0:
            raise SystemExit("protoc failed on " + ", ".join(map(str, protos)))
        written = []
        out_dir.mkdir(parents=True, exist_ok=True)
        for path in sorted((Path(tmp) / "edgespec" / "v1").iterdir()):
            if path.name.endswith(GENERATED_SUFFIXES):
                target = out_dir / path.name
                target.write_text(_fix_imports(path.read_text()))
                written.append(target)
        return written


def drifted() -> list[str]:
    """Names of checked-in stubs that differ from what the .proto files generate now."""
    with tempfile.TemporaryDirectory() as tmp:
        fresh = {p.name: p.read_text() for p in generate(Path(tmp))}
    current = {p.name: p.read_text() for p in PACKAGE_DIR.iterdir() if p.name.endswith(GENERATED_SUFFIXES)}
    return sorted(n for n in set(fresh) | set(current) if fresh.get(n) != current.get(n))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only check for drift")
    args = parser.parse_args(argv)
    if args.check:
        bad = drifted()
        if bad:
            print("stubs drifted from the .proto: " + ", ".join(bad) + " (run python -m edgespec.proto.build)")
            return 1
        print("stubs match the .proto")
        return 0
    for path in generate(PACKAGE_DIR):
        print("wrote", path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
