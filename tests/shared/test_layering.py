"""Who may import whom, checked on the source (AST), imports inside functions included, and so are
modules named in strings (``importlib.import_module("...")``, a registry of module names):
- the floors of the house: shared/ and proto/ on the ground; the server and the client on the first, neither
  naming the other (a laptop's client needs none of the server, and what both sides use lives in shared/);
  netem/ (network emulation, demos, benchmarks) above both; the top package (``edgespec``: the Python client's
  front and the `edgespec` command) above all. Nothing names a floor above its own;
- the server's assembly has no import circle (the engines, the core and its metrics, the app and its gRPC side);
- inside the server, training (``server/training/``) on a floor of its own above the runtime (everything else in
  server/): training may use the runtime, the runtime never imports training;
- inside the client, the drafters (``client/drafters/``) and the link (``client/link/``) on the ground, neither
  naming the other; the loop (``client/loop/``) above them; the front (the modules beside them: the commands, the
  APIs, the assembly, the face) above all;
- the generation loop and the drafters never touch protobuf: the verifier (``client/link/verifier.py``) converts;
  on the server only ``rpc/`` does (training and its data aside);
- netem builds the server's and the client's parts only through their public faces (the names in
  ``edgespec.server.__all__`` and ``edgespec.client.__all__``), so their modules can move under it."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import edgespec
import edgespec.client as client
import edgespec.server as server

TOP = Path(edgespec.__file__).parent  # client/root: the `edgespec` package has no folder of its own
PACKAGES = {"edgespec": TOP, **{f"edgespec.{name}": Path(client.__file__).parents[1] / name
                                for name in ("shared", "proto", "server", "client", "netem")}}
FLOORS = {"edgespec.shared": 0, "edgespec.proto": 0, "edgespec.server": 1, "edgespec.client": 1,
          "edgespec.netem": 2, "edgespec": 3}
MODULES = [(package, path) for package, root in PACKAGES.items() for path in sorted(root.rglob("*.py"))
           if package == "edgespec" or TOP not in path.parents]
LOADERS = {"import_module", "find_spec", "__import__"}  # calls whose first argument names a module
MODULE_NAME = re.compile(r"edgespec(\.\w+)+")


def imported_modules(path: Path, root: Path, package: str) -> list[str]:
    """Every module an import statement in `path` names, relative ones resolved, and every module named in a
    string: the first argument of ``importlib.import_module`` / ``find_spec`` / ``__import__`` (its constant
    head when an f-string), and a dotted ``edgespec...`` name in a dict, list, tuple or set. `root` is the
    folder of the package `package` (e.g. client/ and "edgespec.client")."""
    parts = package.split(".") + list(path.relative_to(root).parent.parts)
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = parts[: len(parts) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            out += [module] + [f"{module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Call) and node.args and _called(node.func) in LOADERS:
            name = _string_head(node.args[0], ".".join(parts))
            if name.startswith("."):
                dots = len(name) - len(name.lstrip("."))
                name = ".".join(parts[: len(parts) - dots + 1] + [name[dots:]])
            out += [name.strip(".")] if name.strip(".") else []
        elif isinstance(node, (ast.Dict, ast.List, ast.Tuple, ast.Set)):
            items = node.values if isinstance(node, ast.Dict) else node.elts
            out += [i.value for i in items if isinstance(i, ast.Constant) and isinstance(i.value, str)
                    and MODULE_NAME.fullmatch(i.value)]
    return out


def _called(func: ast.expr) -> str:
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def _string_head(arg: ast.expr, package: str) -> str:
    """A string argument's constant head: all of a constant; an f-string up to its first unknown part
    (``__package__`` and ``__name__`` are this file's package)."""
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return arg.value
    head = ""
    for value in getattr(arg, "values", []) if isinstance(arg, ast.JoinedStr) else []:
        if isinstance(value, ast.Constant):
            head += value.value
        elif isinstance(value, ast.FormattedValue) and isinstance(value.value, ast.Name) \
                and value.value.id in ("__package__", "__name__"):
            head += package
        else:
            break
    return head


def floor_of(module: str) -> str | None:
    """The package (a key of FLOORS) a module name belongs to; None outside edgespec, and for a bare
    ``edgespec`` (``from edgespec import client`` names ``edgespec.client`` too, which is what counts)."""
    if module == "edgespec" or not module.startswith("edgespec."):
        return None
    top = ".".join(module.split(".")[:2])
    return top if top in FLOORS else "edgespec"


@pytest.mark.parametrize("package,path", MODULES, ids=[f"{p}:{m.relative_to(PACKAGES[p]).as_posix()}"
                                                       for p, m in MODULES])
def test_no_import_from_a_higher_floor(package, path):
    named = {m: floor_of(m) for m in imported_modules(path, PACKAGES[package], package)}
    bad = sorted(m for m, other in named.items() if other and other != package and FLOORS[other] >= FLOORS[package])
    hint = " (what both sides need goes in shared/)" if any(floor_of(m) == "edgespec.server" for m in bad) else ""
    assert not bad, f"{package}: {path.relative_to(PACKAGES[package])} names {bad}, on a floor not below its own{hint}"


def test_the_check_sees_server_imports(tmp_path):
    nested = tmp_path / "drafters"
    nested.mkdir()
    sample = nested / "sample.py"
    sample.write_text("from ...server.app import start_server\nimport edgespec.server.core\n"
                      "def f():\n    from edgespec.server import service\n")
    found = imported_modules(sample, tmp_path, "edgespec.client")
    assert {"edgespec.server.app", "edgespec.server.core", "edgespec.server"} <= set(found)


def test_the_check_sees_modules_named_in_strings(tmp_path):
    """What shared/cli.py did: a registry of module names, loaded with import_module; and the other forms."""
    sample = tmp_path / "sample.py"
    sample.write_text('import importlib\nfrom importlib import import_module\n'
                      'COMMANDS = {"server": "edgespec.server.cli", "bench": "edgespec.netem.bench.cli"}\n'
                      'importlib.import_module("edgespec.client.cli")\nimport_module(".drafters", __name__)\n'
                      'importlib.util.find_spec("edgespec.cli")\n__import__("edgespec.netem.demo")\n'
                      'def f(name):\n    return importlib.import_module(f"{__package__}.{name}")\n'
                      'def g(name):\n    return importlib.import_module(f"edgespec.server.{name}")\n'
                      'log = __import__("logging").getLogger("edgespec.server")\n')
    found = set(imported_modules(sample, tmp_path, "edgespec.shared"))
    assert {"edgespec.server.cli", "edgespec.netem.bench.cli", "edgespec.client.cli", "edgespec.shared.drafters",
            "edgespec.cli", "edgespec.netem.demo", "edgespec.shared", "edgespec.server", "logging"} <= found
    floors = {floor_of(m) for m in found} - {None}
    assert floors == {"edgespec.server", "edgespec.netem", "edgespec.client", "edgespec.shared", "edgespec"}


def test_the_front_door_is_the_top_floor():
    """The command's list of subcommands lives in the top package, which may name every floor."""
    named = {floor_of(m) for m in imported_modules(TOP / "cli.py", TOP, "edgespec")}
    assert {"edgespec.server", "edgespec.client", "edgespec.netem", "edgespec.shared"} <= named


# ------------------------------------------------------------------ the server's assembly
SERVER = PACKAGES["edgespec.server"]
NO_CIRCLE = [("engine.base", "engine.batched"), ("engine.base", "engine.generic"), ("core", "metrics"),
             ("app", "rpc.grpc_server")]


def server_import_graph() -> dict[str, set[str]]:
    """Server module (``core``, ``engine.batched``, ``training.cli``; a package's ``__init__`` as the package,
    ``engine``) -> the server modules it imports."""
    modules = {".".join(p.relative_to(SERVER).with_suffix("").parts).removesuffix(".__init__")
               for p in SERVER.rglob("*.py")}
    graph = {}
    for path in SERVER.rglob("*.py"):
        name = ".".join(path.relative_to(SERVER).with_suffix("").parts).removesuffix(".__init__")
        graph[name] = set()
        for m in imported_modules(path, SERVER, "edgespec.server"):
            parts = m.removeprefix("edgespec.server.").split(".") if m.startswith("edgespec.server.") else []
            # the longest prefix that is a module: `from .core import VerifierCore` names edgespec.server.core
            found = next((".".join(parts[:n]) for n in range(len(parts), 0, -1) if ".".join(parts[:n]) in modules), None)
            if found and found != name:
                graph[name].add(found)
    return graph


def reaches(graph: dict[str, set[str]], start: str, goal: str) -> bool:
    seen, todo = set(), [start]
    while todo:
        node = todo.pop()
        if node == goal:
            return True
        if node not in seen:
            seen.add(node)
            todo += graph.get(node, ())
    return False


@pytest.mark.parametrize("a,b", NO_CIRCLE, ids=lambda m: m)
def test_no_import_circle_in_the_servers_assembly(a, b):
    graph = server_import_graph()
    assert not (reaches(graph, a, b) and reaches(graph, b, a)), \
        f"server/{a.replace('.', '/')}.py and server/{b.replace('.', '/')}.py import each other (directly or " \
        f"through others)"


def test_the_circle_check_sees_a_circle():
    graph = {"engine.base": {"target"}, "engine.batched": {"engine.base"}, "target": set()}
    assert not (reaches(graph, "engine.base", "engine.batched")
                and reaches(graph, "engine.batched", "engine.base"))
    graph["target"].add("engine.batched")  # a circle through a third module counts
    assert reaches(graph, "engine.base", "engine.batched") and reaches(graph, "engine.batched", "engine.base")


def test_the_graph_names_the_servers_sub_packages():
    graph = server_import_graph()
    assert {"engine.base", "engine.masks"} <= graph["engine.generic"] and "core" in graph["rpc.service"]


# ------------------------------------------------------------------ training's floor in the server
TRAINING = "edgespec.server.training"
RUNTIME = [path for package, path in MODULES
           if package == "edgespec.server" and SERVER / "training" not in path.parents]


def names_training(found: list[str]) -> list[str]:
    return sorted({m for m in found if m == TRAINING or m.startswith(TRAINING + ".")})


@pytest.mark.parametrize("path", RUNTIME, ids=lambda p: p.relative_to(SERVER).as_posix())
def test_the_servers_runtime_never_imports_training(path):
    """Training (its recipes, trainers, feature stores) is built on the runtime, not under it: a server that
    verifies needs none of it. (The face, server/__init__.py, lists training's entry points for the benchmarks,
    loaded by name on first use; that loads training on a benchmark's call, never the runtime's.)"""
    bad = names_training(imported_modules(path, SERVER, "edgespec.server"))
    assert not bad, f"server/{path.relative_to(SERVER)} names {bad}: the runtime never imports server/training/"


def test_the_training_check_sees_an_import(tmp_path):
    nested = tmp_path / "engine"
    nested.mkdir()
    sample = nested / "sample.py"
    sample.write_text("from edgespec.server.training.features import FeatureStore\n"
                      "from edgespec.server import training\n"
                      "import importlib\nimportlib.import_module('edgespec.server.training.fit')\n"
                      "from edgespec.server.target import TargetModel\n")
    assert names_training(imported_modules(sample, tmp_path, "edgespec.server")) == [
        TRAINING, f"{TRAINING}.features", f"{TRAINING}.features.FeatureStore", f"{TRAINING}.fit"]


# ------------------------------------------------------------------ the client's floors
CLIENT = PACKAGES["edgespec.client"]
CLIENT_FLOORS = {"drafters": 0, "link": 0, "loop": 1}  # a sub-package's floor; the front (anything else) is 2


def client_part(module: str) -> str | None:
    """The part of the client (a key of CLIENT_FLOORS, or "front") a module name belongs to; None outside it."""
    if module != "edgespec.client" and not module.startswith("edgespec.client."):
        return None
    part = module.split(".")[2] if module.count(".") >= 2 else ""
    return part if part in CLIENT_FLOORS else "front"


def client_floor(part: str) -> int:
    return CLIENT_FLOORS.get(part, 2)


CLIENT_MODULES = [path for package, path in MODULES if package == "edgespec.client"]


@pytest.mark.parametrize("path", CLIENT_MODULES, ids=lambda p: p.relative_to(CLIENT).as_posix())
def test_no_import_from_a_higher_floor_of_the_client(path):
    own = client_part(".".join(("edgespec.client", *path.relative_to(CLIENT).with_suffix("").parts)))
    named = {m: client_part(m) for m in imported_modules(path, CLIENT, "edgespec.client")}
    bad = sorted(m for m, part in named.items()
                 if part and part != own and client_floor(part) >= client_floor(own))
    assert not bad, f"client/{path.relative_to(CLIENT)} ({own}) names {bad}, on a floor of the client not below its own"


def test_the_client_floor_check_sees_an_upward_import(tmp_path):
    loop = tmp_path / "loop"
    loop.mkdir()
    sample = loop / "sample.py"
    sample.write_text("from .generation import Generation\nfrom edgespec.client.link.verifier import Verifier\n"
                      "from edgespec.client.edge_client import EdgespecClient\nfrom edgespec.client import Client\n")
    named = {m: client_part(m) for m in imported_modules(sample, tmp_path, "edgespec.client")}
    upward = sorted(m for m, part in named.items() if part and part != "loop" and client_floor(part) >= 1)
    assert upward == ["edgespec.client", "edgespec.client.Client", "edgespec.client.edge_client",
                      "edgespec.client.edge_client.EdgespecClient"]
    assert client_part("edgespec.client.link.verifier") == "link" and client_part("edgespec.server") is None


PROTOBUF = ("edgespec.proto", "google.protobuf", "grpc")  # what only the adapters to the wire import
BOUNDARY = [*sorted((PACKAGES["edgespec.client"] / "loop").rglob("*.py")),
            *sorted((PACKAGES["edgespec.client"] / "drafters").rglob("*.py"))]  # rglob: drafters/learned/ too


@pytest.mark.parametrize("path", BOUNDARY, ids=lambda p: p.relative_to(PACKAGES["edgespec.client"]).as_posix())
def test_no_protobuf_import_in_the_loop_or_the_drafters(path):
    found = imported_modules(path, PACKAGES["edgespec.client"], "edgespec.client")
    bad = [m for m in found if m.startswith(PROTOBUF)]
    assert not bad, f"{path.name} imports {bad}: go through client/link/verifier.py's domain types"


SERVER_RUNTIME = [p for p in sorted(PACKAGES["edgespec.server"].rglob("*.py"))
                  if not {"rpc", "training"} & set(p.relative_to(PACKAGES["edgespec.server"]).parts)]


@pytest.mark.parametrize("path", SERVER_RUNTIME, ids=lambda p: p.relative_to(PACKAGES["edgespec.server"]).as_posix())
def test_only_the_servers_rpc_package_touches_protobuf(path):
    """The server's one protobuf adapter is rpc/ (the gRPC service): the core, the sessions, the engines and the
    HTTP API work on shared/'s types, as the client's loop does."""
    found = imported_modules(path, PACKAGES["edgespec.server"], "edgespec.server")
    bad = [m for m in found if m.startswith(PROTOBUF)]
    assert not bad, f"{path.name} imports {bad}: protobuf stays in server/rpc/"


def test_the_check_sees_a_protobuf_import(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text("from edgespec.proto.edgespec.v1 import pb\nfrom edgespec import proto\nimport grpc\n")
    found = imported_modules(sample, tmp_path, "edgespec.client")
    assert {"edgespec.proto.edgespec.v1", "edgespec.proto", "grpc"} <= set(found)


def test_one_import_style_across_packages():
    """Another package (or a parent package) is imported by its absolute name, `from edgespec.shared...`;
    a relative import stays within its own package (one dot)."""
    climbing = [f"{path.relative_to(PACKAGES[package])}:{node.lineno}"
                for package, path in MODULES for node in ast.walk(ast.parse(path.read_text()))
                if isinstance(node, ast.ImportFrom) and node.level > 1]
    assert not climbing, f"relative imports that climb out of their package: {climbing}"


# ------------------------------------------------------------------ netem through the public faces
FACES = {"edgespec.client": client, "edgespec.server": server}
NETEM = [path for package, path in MODULES if package == "edgespec.netem"]


def past_the_faces(found: list[str]) -> list[str]:
    """The names in `found` (from ``imported_modules``) of the client's or the server's that are not their
    face's: one of their modules, or a name their ``__all__`` does not list."""
    def listed(name: str) -> bool:
        face, _, attr = name.rpartition(".")
        return name in FACES or (face in FACES and attr in FACES[face].__all__)

    return sorted({m for m in found if floor_of(m) in FACES and not listed(m)})


@pytest.mark.parametrize("path", NETEM, ids=lambda p: p.relative_to(PACKAGES["edgespec.netem"]).as_posix())
def test_netem_uses_only_the_public_faces(path):
    bad = past_the_faces(imported_modules(path, PACKAGES["edgespec.netem"], "edgespec.netem"))
    assert not bad, (f"netem/{path.relative_to(PACKAGES['edgespec.netem'])} names {bad}: import from "
                     f"edgespec.client or edgespec.server what their __all__ lists (add a name there when a benchmark "
                     f"needs one)")


def test_the_face_check_sees_a_reach_past_it(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text("from edgespec.client import Generation\nfrom edgespec.server.decoder import decode_step\n"
                      "import edgespec.client.cli\nfrom edgespec.server import _FACE\n"
                      "import importlib\nimportlib.import_module('edgespec.client.render')\n")
    assert past_the_faces(imported_modules(sample, tmp_path, "edgespec.netem")) == [
        "edgespec.client.cli", "edgespec.client.render", "edgespec.server._FACE", "edgespec.server.decoder",
        "edgespec.server.decoder.decode_step"]


@pytest.mark.parametrize("face", sorted(FACES))
def test_every_name_of_a_face_loads(face):
    """The faces load their names on first use: each must still be where the face says, as modules move."""
    missing = [name for name in FACES[face].__all__ if getattr(FACES[face], name, None) is None]
    assert not missing, f"{face} lists {missing}, which its modules no longer define"
