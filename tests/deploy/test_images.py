"""deploy/docker and deploy/bin: the images install edgespec the pinned-torch way
(and pyproject.toml brings every module the code imports), run as a non-root
user, keep the model cache on a volume, check health, and start commands that
exist in the package (parsed against the real CLI)."""
from __future__ import annotations

import contextlib
import http.server
import io
import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
ENTRYPOINT = REPO / "deploy/bin/edgespec-entrypoint"
DOCKERFILES = sorted((REPO / "deploy/docker").glob("*.Dockerfile"))
ROLES = ("server", "client", "relay", "prepare", "healthcheck")


def parse_dockerfile(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    out, pending = [], ""
    for line in text.splitlines():
        stripped = line.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1].rstrip() + " "
            continue
        full = pending + stripped
        pending = ""
        word, _, rest = full.partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


def test_parse_dockerfile_joins_continuations():
    text = "FROM a\n# c\nRUN x \\\n  # inner\n  && y\nCMD [\"z\"]\n"
    assert parse_dockerfile(text) == [("FROM", "a"), ("RUN", "x && y"), ("CMD", '["z"]')]


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.stem)
def test_image_recipe(dockerfile):
    steps = parse_dockerfile(dockerfile.read_text())
    kinds = [k for k, _ in steps]
    args = {k: a for k, a in steps}  # the last of each kind
    runs = [a for k, a in steps if k == "RUN"]

    # torch pinned and installed before edgespec, from the index matching the base.
    torch_step = next(i for i, (k, a) in enumerate(steps) if k == "RUN" and '"torch==${TORCH_VERSION}"' in a)
    project_step = next(i for i, (k, a) in enumerate(steps) if k == "RUN" and a.startswith("pip install /home/edgespec/src"))
    assert torch_step < project_step
    assert any(k == "ARG" and a == "TORCH_VERSION=2.13.0" for k, a in steps)
    index = next(a for k, a in steps if k == "ARG" and a.startswith("TORCH_INDEX_URL="))
    base = next(a for k, a in steps if k == "ARG" and a.startswith(("PYTHON_IMAGE=", "CUDA_IMAGE=")))
    if dockerfile.stem == "server-cuda":
        assert base.startswith("CUDA_IMAGE=nvidia/cuda:") and "/whl/cu" in index
    else:
        assert base.startswith("PYTHON_IMAGE=python:3.11") and index.endswith("/whl/cpu")

    # Non-root from the install on: the entrypoint never runs as root.
    user_at = kinds.index("USER")
    assert args["USER"] == "edgespec" and user_at < project_step
    assert any("useradd" in r and "--uid 10001" in r for r in runs)

    # Model cache on a volume, where EDGESPEC_HOME points.
    assert json.loads(args["VOLUME"]) == ["/var/lib/edgespec"]
    assert "EDGESPEC_HOME=/var/lib/edgespec" in args["ENV"]

    # Health check, entrypoint and default role.
    assert args["HEALTHCHECK"].endswith('CMD ["edgespec-entrypoint", "healthcheck"]')
    assert json.loads(args["ENTRYPOINT"]) == ["edgespec-entrypoint"]
    (role,) = json.loads(args["CMD"])
    assert role == ("client" if dockerfile.stem == "client" else "server")
    copy = next(a for k, a in steps if k == "COPY" and "edgespec-entrypoint" in a)
    assert copy.split()[-2] == "deploy/bin/edgespec-entrypoint" and ENTRYPOINT.is_file()
    assert os.access(ENTRYPOINT, os.X_OK)
    exposed = set(args["EXPOSE"].split())
    assert exposed == ({"8000"} if dockerfile.stem == "client" else {"50051", "8080"})


def test_dockerignore_files_are_one_list():
    ignores = [p.read_text() for p in sorted((REPO / "deploy/docker").glob("*.Dockerfile.dockerignore"))]
    assert len(ignores) == len(DOCKERFILES) and len(set(ignores)) == 1
    assert ".git" in ignores[0].split()


# ---------------------------------------------------------------- entrypoint commands

def entrypoint_argv(role: str, env: dict[str, str]) -> list[str]:
    """The command the entrypoint would exec for a role, with these settings."""
    full = {k: v for k, v in os.environ.items() if not k.startswith("EDGESPEC_")}
    full.update(env, EDGESPEC_DRY_RUN="1")
    proc = subprocess.run(["bash", str(ENTRYPOINT), role], capture_output=True, text=True, env=full, timeout=30)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.splitlines()


def assert_parses(argv: list[str]) -> None:
    """argv must be an edgespec command the real CLI accepts (flags, values, subcommands)."""
    from edgespec.cli import build_parser

    assert argv[0] == "edgespec", argv
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            build_parser().parse_args(argv[1:])
    except SystemExit as exc:
        pytest.fail(f"deploy/ starts `{' '.join(argv)}`, which the edgespec CLI rejects "
                    f"(exit {exc.code}): {err.getvalue().strip()}")


def _settings_sources() -> dict[str, dict[str, str]]:
    """The environments deploy/ gives the entrypoint: systemd env file, k8s ConfigMap, compose."""
    systemd = {}
    for line in (REPO / "deploy/systemd/edgespec-server.env").read_text().splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            systemd[key] = value
    k8s = next(d for d in yaml.safe_load_all((REPO / "deploy/k8s/server.yaml").read_text())
               if d["kind"] == "ConfigMap")["data"]
    compose = yaml.safe_load((REPO / "deploy/compose/compose.yaml").read_text())["services"]
    compose_env = {}
    for svc in compose.values():
        compose_env.update({k: str(v) for k, v in svc["environment"].items() if "${" not in str(v)})
    return {"defaults": {}, "systemd": systemd, "k8s": k8s, "compose": compose_env}


@pytest.mark.parametrize("source", ["defaults", "systemd", "k8s", "compose"])
@pytest.mark.parametrize("role", ["server", "client", "relay"])
def test_entrypoint_commands_parse_against_the_cli(role, source):
    env = _settings_sources()[source]
    assert_parses(entrypoint_argv(role, env))


def test_entrypoint_passes_optional_settings_and_extra_flags():
    argv = entrypoint_argv("server", {"EDGESPEC_TLS_CERT": "/c.pem", "EDGESPEC_TLS_KEY": "/k.pem",
                                      "EDGESPEC_API_KEY": "s3cret"})
    assert_parses(argv)
    assert argv[argv.index("--ssl-certfile") + 1] == "/c.pem"  # the flag's current name, as the docs write it
    assert argv[argv.index("--ssl-keyfile") + 1] == "/k.pem"
    # The key stays in the environment, where edgespec reads it, not in the process list.
    assert "--api-key" not in argv and "s3cret" not in argv
    extra = subprocess.run(["bash", str(ENTRYPOINT), "server", "--port", "6000"], capture_output=True, text=True,
                           env={**os.environ, "EDGESPEC_DRY_RUN": "1"}, timeout=30).stdout.splitlines()
    assert extra[-2:] == ["--port", "6000"]


def test_entrypoint_ports_and_keys_mean_what_the_deploy_files_say():
    """EDGESPEC_GRPC_PORT is the gRPC port and EDGESPEC_HTTP_PORT the HTTP one (--port, as vLLM's); the client's
    keys stay in the environment: the server's as EDGESPEC_SERVER_API_KEY, the local API's as
    EDGESPEC_LOCAL_API_KEY (--local-api-key, --api-key's old name)."""
    from edgespec.server.cli import server_config
    from edgespec.cli import build_parser

    argv = entrypoint_argv("server", {"EDGESPEC_GRPC_PORT": "6001", "EDGESPEC_HTTP_PORT": "6002"})
    config = server_config(build_parser().parse_args(argv[1:]))
    assert (config.port, config.http_port) == (6001, 6002)
    argv = entrypoint_argv("client", {"EDGESPEC_LOCAL_API_KEY": "l0cal", "EDGESPEC_SERVER_API_KEY": "rem0te"})
    assert_parses(argv)
    assert not {"--api-key", "--local-api-key", "--server-api-key", "l0cal", "rem0te"} & set(argv)
    compose = yaml.safe_load((REPO / "deploy/compose/compose.yaml").read_text())["services"]["client"]["environment"]
    k8s = next(d for d in yaml.safe_load_all((REPO / "deploy/k8s/client.yaml").read_text())
               if d["kind"] == "Deployment")
    k8s_env = {e["name"] for c in k8s["spec"]["template"]["spec"]["containers"] for e in c.get("env", [])}
    for names in (set(compose), k8s_env):  # the verifier's key reaches the client as the server's key
        assert "EDGESPEC_SERVER_API_KEY" in names and "EDGESPEC_API_KEY" not in names, names


def test_entrypoint_refuses_unknown_roles_and_half_tls():
    proc = subprocess.run(["bash", str(ENTRYPOINT), "serve"], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2 and "unknown role 'serve'" in proc.stderr
    proc = subprocess.run(["bash", str(ENTRYPOINT), "server"], capture_output=True, text=True, timeout=30,
                          env={**os.environ, "EDGESPEC_DRY_RUN": "1", "EDGESPEC_TLS_CERT": "/c.pem"})
    assert proc.returncode != 0 and "EDGESPEC_TLS_KEY" in proc.stderr


@pytest.mark.parametrize("command", [["server"], ["client", "serve"], ["netem", "relay"], ["models", "prepare"]],
                         ids=" ".join)
def test_commands_the_images_run_exist(command):
    """Every subcommand deploy/ starts answers --help (a missing one fails, naming it)."""
    proc = subprocess.run([sys.executable, "-m", "edgespec", *command, "--help"],
                          capture_output=True, text=True, timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, (f"`edgespec {' '.join(command)} --help` failed: the images start this "
                                  f"command, so it must exist.\n{proc.stderr[-800:]}")
    assert "usage: edgespec" in proc.stdout


def test_prepare_role_leaves_directories_and_hub_ids_alone(tmp_path):
    for model in (str(tmp_path), "org/some-model"):
        proc = subprocess.run(["bash", str(ENTRYPOINT), "prepare"], capture_output=True, text=True, timeout=30,
                              env={**os.environ, "EDGESPEC_MODEL": model, "PATH": "/usr/bin:/bin"})
        # With edgespec off PATH, any attempt to prepare would fail: success means nothing was run.
        assert proc.returncode == 0, proc.stderr


class _Health(http.server.BaseHTTPRequestHandler):
    """Answers `status` on `path`, 404 elsewhere."""

    status = 200
    path_ok = "/health"

    def do_GET(self):  # noqa: N802 - http.server's name
        self.send_response(self.status if self.path == self.path_ok else 404)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.mark.parametrize("role,var,path", [("server", "EDGESPEC_HTTP_PORT", "/health"),
                                           ("client", "EDGESPEC_CLIENT_PORT", "/health")])
@pytest.mark.parametrize("status,healthy", [(200, True), (503, False)])
def test_healthcheck_role_follows_the_http_side(role, var, path, status, healthy):
    handler = type("H", (_Health,), {"status": status, "path_ok": path})
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        env = {**os.environ, "EDGESPEC_HEALTH_ROLE": role, var: str(httpd.server_address[1]),
               "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin"}
        proc = subprocess.run(["bash", str(ENTRYPOINT), "healthcheck"], env=env, capture_output=True, timeout=30)
        assert (proc.returncode == 0) is healthy, proc.stderr
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_healthcheck_role_speaks_https_when_the_server_has_tls(tmp_path):
    import shutil
    import ssl

    if shutil.which("openssl") is None:
        pytest.skip("openssl (Debian package openssl) is needed to make a test certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=edgespec",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True, timeout=60)
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Health)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    httpd.socket = context.wrap_socket(httpd.socket, server_side=True)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        env = {**os.environ, "EDGESPEC_HEALTH_ROLE": "server", "EDGESPEC_HTTP_PORT": str(httpd.server_address[1]),
               "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin"}
        plain = subprocess.run(["bash", str(ENTRYPOINT), "healthcheck"], env=env, capture_output=True, timeout=30)
        assert plain.returncode != 0  # plain HTTP to a TLS port fails ...
        env.update(EDGESPEC_TLS_CERT=str(cert), EDGESPEC_TLS_KEY=str(key))
        tls = subprocess.run(["bash", str(ENTRYPOINT), "healthcheck"], env=env, capture_output=True, timeout=30)
        assert tls.returncode == 0, tls.stderr  # ... and the TLS settings switch the probe to HTTPS
    finally:
        httpd.shutdown()
        httpd.server_close()


# ---------------------------------------------------------------- what `pip install` brings

def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _declared_closure() -> set[str]:
    """Distributions `pip install .[every extra]` brings: pyproject's requirements and theirs, transitively."""
    import tomllib
    from importlib import metadata

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    todo = list(project["dependencies"]) + [r for reqs in project.get("optional-dependencies", {}).values() for r in reqs]
    seen: set[str] = set()
    while todo:
        req = todo.pop()
        if "extra ==" in req:
            continue
        name = _normalize(re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", req).group(1))
        if name in seen:
            continue
        seen.add(name)
        try:
            todo.extend(metadata.requires(name) or [])
        except metadata.PackageNotFoundError:
            pass
    return seen


def _imported_top_level_modules(folders: list[str]) -> dict[str, str]:
    """Absolute third-party imports in the package folders -> a file that imports it."""
    import ast

    found: dict[str, str] = {}
    for folder in folders:
        for path in sorted((REPO / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                names = []
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                for name in names:
                    top = name.split(".")[0]
                    if top not in sys.stdlib_module_names and top not in ("edgespec", "__future__"):
                        found.setdefault(top, str(path.relative_to(REPO)))
    return found


def test_pip_install_brings_every_module_the_package_imports():
    """The images get their Python packages only from pyproject.toml: a module the code imports
    that no declared requirement brings would be missing in every image."""
    from importlib import metadata

    provided = metadata.packages_distributions()
    declared = _declared_closure()
    missing = []
    for module, where in _imported_top_level_modules(["shared", "server", "client", "netem", "proto"]).items():
        dists = {_normalize(d) for d in provided.get(module, [])}
        if not dists & declared:
            missing.append(f"{module} (imported by {where}; distribution {', '.join(sorted(dists)) or 'not installed'})")
    assert not missing, ("imported but brought by no requirement in pyproject.toml, so absent from the images: "
                         + "; ".join(missing))
