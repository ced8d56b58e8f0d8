"""Fixtures of the deploy tests: where deploy/ is, nginx (installed if missing),
and rendering of the shipped nginx template exactly as its header says
(envsubst restricted to the template's own variables)."""
from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
NGINX_TEMPLATE = DEPLOY / "nginx" / "edgespec-grpc.conf.template"
NGINX_VARIABLES = ("EDGESPEC_PROXY_LISTEN", "EDGESPEC_UPSTREAMS", "EDGESPEC_PROXY_ACCESS_LOG")


@pytest.fixture(scope="session")
def deploy_dir() -> Path:
    return DEPLOY


def _render_nginx(listen: str, upstreams: list[str], access_log: Path) -> str:
    """The shipped template with its three variables filled, like
    ``envsubst '${EDGESPEC_PROXY_LISTEN} ${EDGESPEC_UPSTREAMS} ${EDGESPEC_PROXY_ACCESS_LOG}'``."""
    values = {
        "EDGESPEC_PROXY_LISTEN": listen,
        "EDGESPEC_UPSTREAMS": " ".join(f"server {u} max_fails=1 fail_timeout=10s;" for u in upstreams),
        "EDGESPEC_PROXY_ACCESS_LOG": str(access_log),
    }
    text = NGINX_TEMPLATE.read_text()
    for name, value in values.items():
        text = text.replace("${" + name + "}", value)
    leftover = re.findall(r"\$\{(\w+)\}", text)
    assert not leftover, f"template has variables the README does not tell operators to set: {leftover}"
    return text


def _nginx_main_conf(workdir: Path, include: Path) -> str:
    """A minimal nginx.conf that includes the rendered site file, all state under workdir."""
    user = "user root;\n" if os.geteuid() == 0 else ""
    return (f"{user}worker_processes 1;\ndaemon off;\npid {workdir}/nginx.pid;\n"
            f"error_log {workdir}/error.log info;\n"
            "events { worker_connections 256; }\n"
            f"http {{\n  client_body_temp_path {workdir}/body;\n  access_log off;\n"
            f"  include {include};\n}}\n")


def debian_tool(binary: str, package: str) -> str:
    """Path of a tool from a Debian package, installing the package when missing and we are root;
    skips the test, saying why, when it cannot be had."""
    found = shutil.which(binary) or (Path(f"/usr/sbin/{binary}").is_file() and f"/usr/sbin/{binary}")
    if found:
        return str(found)
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        pytest.skip(f"{binary} is not installed and cannot be installed here (needs root and apt-get): "
                    f"apt-get install -y {package}")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", package]):
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
        if proc.returncode != 0:
            pytest.skip(f"{package} could not be installed ({' '.join(cmd)} failed: {proc.stderr.strip()[-300:]})")
    found = shutil.which(binary) or f"/usr/sbin/{binary}"
    if not Path(found).is_file():
        pytest.skip(f"apt-get installed {package} but no {binary} binary is on PATH or in /usr/sbin")
    return found


@pytest.fixture(scope="session")
def nginx_bin() -> str:
    """Debian's nginx (it has the gRPC and HTTP/2 modules)."""
    return debian_tool("nginx", "nginx")


@pytest.fixture(scope="session")
def render_nginx():
    """render_nginx(listen, upstreams, access_log) -> the shipped template, rendered."""
    return _render_nginx


@pytest.fixture(scope="session")
def nginx_main_conf():
    """nginx_main_conf(workdir, include) -> a minimal nginx.conf around a rendered site file."""
    return _nginx_main_conf


@pytest.fixture(scope="session")
def docker_compose_bin() -> str:
    """Debian's docker-compose (1.x): `config` validates a compose file without a Docker engine."""
    return debian_tool("docker-compose", "docker-compose")


class Service:
    """A long-running process a test starts: stderr to a log file, stdout watched for a line."""

    def __init__(self, argv: list[str], log_path: Path, ready: str, env: dict[str, str] | None = None):
        full_env = {**os.environ, "OMP_NUM_THREADS": "1", "EDGESPEC_TEST_THREADS": "1", **(env or {})}
        self.log_path = log_path
        self._log = open(log_path, "w")
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=self._log, text=True, env=full_env)
        self.match: re.Match | None = None
        self._ready_re = re.compile(ready)
        self._ready = threading.Event()
        threading.Thread(target=self._watch, daemon=True).start()

    def _watch(self) -> None:
        for line in self.proc.stdout:
            if self.match is None and (m := self._ready_re.search(line)):
                self.match = m
                self._ready.set()

    def wait_ready(self, timeout_s: float) -> re.Match:
        if not self._ready.wait(timeout_s):
            raise AssertionError(f"{self.proc.args[:4]} printed no ready line within {timeout_s}s "
                                 f"(exit {self.proc.poll()}):\n{self.log()[-2000:]}")
        return self.match

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)
        self._log.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.05)
    raise AssertionError(f"nothing listens on 127.0.0.1:{port} after {timeout_s}s")


@pytest.fixture(scope="session")
def procs():
    """Process helpers for tests that start services: Service, free_port, wait_port."""
    return type("Procs", (), {"Service": Service, "free_port": staticmethod(free_port),
                              "wait_port": staticmethod(wait_port)})


def target_greedy(model_dir: Path, prompt_ids: list[int], eos_ids: set[int], max_new: int) -> list[int]:
    """The tiny target's own greedy continuation (transformers generate, float32 like the servers)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    out = model.generate(torch.tensor([prompt_ids]), attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long),
                         do_sample=False, max_new_tokens=max_new, eos_token_id=sorted(eos_ids),
                         pad_token_id=min(eos_ids))
    return out[0, len(prompt_ids):].tolist()


@pytest.fixture(scope="session")
def greedy():
    """greedy(model_dir, prompt_ids, eos_ids, max_new) -> the target's own greedy ids."""
    return target_greedy
