"""deploy/compose: one box, server + relay + client, a profile per env file."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

_VAR = re.compile(r"\$\{(\w+)(?::-([^}]*))?\}")


def interpolate(value, env: dict[str, str]):
    """Compose's ${VAR} / ${VAR:-default} interpolation over a loaded YAML tree."""
    if isinstance(value, str):
        return _VAR.sub(lambda m: env.get(m.group(1)) or (m.group(2) or ""), value)
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    return value


def read_env_file(path: Path) -> dict[str, str]:
    pairs = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            pairs[key.strip()] = value.strip()
    return pairs


def test_interpolate_is_compose_like():
    env = {"A": "x", "EMPTY": ""}
    assert interpolate({"k": ["${A}", "${B:-d}", "${EMPTY:-d}", "p-${A}-${B}"]}, env) == {"k": ["x", "d", "d", "p-x-"]}


PROFILE_FILES = sorted((Path(__file__).resolve().parents[2] / "deploy/compose/profiles").glob("*.env"))


@pytest.fixture(scope="module")
def compose_raw(deploy_dir):
    return yaml.safe_load((deploy_dir / "compose/compose.yaml").read_text())


def test_env_files_cover_the_papers_profiles_and_the_default_exists(compose_raw):
    from edgespec.netem.profile import profile_names

    assert {"4g", "5g"} <= {p.stem for p in PROFILE_FILES}
    default = re.search(r"\$\{EDGESPEC_PROFILE:-([^}]+)\}", compose_raw["services"]["relay"]["environment"]["EDGESPEC_PROFILE"])
    assert default.group(1) in profile_names()


@pytest.mark.parametrize("env_file", PROFILE_FILES, ids=lambda p: p.stem)
def test_compose_with_each_profile(compose_raw, env_file, deploy_dir):
    from edgespec.netem.profile import load_profile

    env = read_env_file(env_file)
    compose = interpolate(compose_raw, env)
    services = compose["services"]
    assert set(services) == {"server", "relay", "client"}

    # The profile named by the env file is one the relay can load.
    assert services["relay"]["environment"]["EDGESPEC_PROFILE"] == env_file.stem
    assert load_profile(env_file.stem).name == env_file.stem

    # The images are built from the repo with files that exist.
    for svc in services.values():
        if "build" in svc:
            context = (deploy_dir / "compose" / svc["build"]["context"]).resolve()
            assert (context / svc["build"]["dockerfile"]).is_file(), svc["build"]
            assert (context / "pyproject.toml").is_file()


def test_only_the_relay_joins_client_and_server(compose_raw):
    services = compose_raw["services"]
    nets = {name: set(svc["networks"]) for name, svc in services.items()}
    assert not nets["client"] & nets["server"], "the client would bypass the emulated link"
    assert nets["relay"] >= nets["client"] | nets["server"]
    # The client talks to the relay, the relay to the server's gRPC port.
    assert services["client"]["environment"]["EDGESPEC_SERVER"] == "relay:50051"
    assert services["relay"]["environment"]["EDGESPEC_RELAY_UPSTREAM"] == (
        f"server:{services['server']['environment']['EDGESPEC_GRPC_PORT']}")
    assert "NET_ADMIN" in services["relay"]["cap_add"]


def test_ports_health_volumes_and_shutdown(compose_raw):
    env = read_env_file(PROFILE_FILES[0])
    services = interpolate(compose_raw, env)["services"]
    server, client = services["server"], services["client"]
    assert server["ports"] == ["127.0.0.1:8080:8080"]
    assert client["ports"] == ["127.0.0.1:8000:8000"]
    for svc in (server, client):
        assert svc["healthcheck"]["test"] == ["CMD", "edgespec-entrypoint", "healthcheck"]
        assert any(v.endswith(":/var/lib/edgespec") for v in svc["volumes"])
        assert svc["environment"]["EDGESPEC_HOME"] == "/var/lib/edgespec"
    assert server["environment"]["EDGESPEC_LOG_FORMAT"] == "json"
    assert server["stop_signal"] == "SIGTERM" and server["stop_grace_period"] == "60s"
    assert float(server["environment"]["EDGESPEC_DRAIN_GRACE"]) < 60
    assert services["relay"]["depends_on"]["server"]["condition"] == "service_healthy"
    assert services["client"]["depends_on"]["relay"]["condition"] == "service_healthy"
    # The relay runs from the client image, whose own check probes the client API: it needs its own.
    assert "50051" in " ".join(services["relay"]["healthcheck"]["test"])
    assert "models" in compose_raw["volumes"]


def test_gpu_override_uses_the_cuda_image(deploy_dir):
    gpu = yaml.safe_load((deploy_dir / "compose/compose.gpu.yaml").read_text())
    server = gpu["services"]["server"]
    assert server["build"]["dockerfile"] == "deploy/docker/server-cuda.Dockerfile"
    devices = server["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["driver"] == "nvidia" and "gpu" in devices[0]["capabilities"]


@pytest.mark.parametrize("env_file,gpu", [(p, False) for p in PROFILE_FILES] + [(PROFILE_FILES[0], True)],
                         ids=lambda v: v.stem if isinstance(v, Path) else ("gpu" if v else "cpu"))
@pytest.mark.slow
def test_docker_compose_config_accepts_it(docker_compose_bin, deploy_dir, env_file, gpu):
    """The compose tool itself validates the files against its schema (no engine needed)."""
    files = ["-f", str(deploy_dir / "compose/compose.yaml")]
    if gpu:
        files += ["-f", str(deploy_dir / "compose/compose.gpu.yaml")]
    proc = subprocess.run([docker_compose_bin, *files, "--env-file", str(env_file), "config"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    resolved = yaml.safe_load(proc.stdout)
    assert resolved["services"]["relay"]["environment"]["EDGESPEC_PROFILE"] == env_file.stem
    dockerfile = resolved["services"]["server"]["build"]["dockerfile"]
    assert dockerfile.endswith("server-cuda.Dockerfile" if gpu else "server-cpu.Dockerfile")
