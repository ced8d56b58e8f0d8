"""Plain hosts: the nginx gRPC proxy config (nginx -t) and the systemd unit."""
from __future__ import annotations

import configparser
import re
import shutil
import subprocess

import pytest

SESSION_HASH = "hash $http_x_edgespec_session consistent;"


def test_nginx_template_hashes_on_the_session_header(deploy_dir):
    text = (deploy_dir / "nginx/edgespec-grpc.conf.template").read_text()
    body = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    upstream = re.search(r"upstream edgespec_verifiers \{(.*?)\n\}", body, re.S).group(1)
    assert SESSION_HASH in upstream
    assert "${EDGESPEC_UPSTREAMS}" in upstream
    assert re.search(r"listen \$\{EDGESPEC_PROXY_LISTEN\} http2;", body)
    assert "grpc_pass grpc://edgespec_verifiers;" in body
    # Long-lived bidirectional streams: no body size cap, hour-long timeouts.
    assert "client_max_body_size 0;" in body and "grpc_read_timeout 1h;" in body
    # The header comment tells operators the exact envsubst line, with every variable the template uses.
    used = set(re.findall(r"\$\{(\w+)\}", body))
    envsubst = re.search(r"envsubst '([^']*)'", text).group(1)
    assert set(re.findall(r"\$\{(\w+)\}", envsubst)) == used


def test_rendered_nginx_config_passes_nginx_t(nginx_bin, render_nginx, nginx_main_conf, tmp_path):
    site = tmp_path / "edgespec-grpc.conf"
    site.write_text(render_nginx("127.0.0.1:18443", ["127.0.0.1:50051", "127.0.0.1:50052", "10.0.0.7:50051"],
                                 tmp_path / "access.log"))
    main = tmp_path / "nginx.conf"
    main.write_text(nginx_main_conf(tmp_path, site))
    proc = subprocess.run([nginx_bin, "-t", "-p", str(tmp_path), "-c", str(main)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    # nginx >= 1.25.1 prefers `http2 on;` and warns about `listen ... http2`; nothing else may warn.
    warnings = [w for w in proc.stderr.splitlines() if "[warn]" in w and '"http2" directive is deprecated' not in w]
    assert not warnings, proc.stderr


def test_nginx_t_catches_a_broken_render(nginx_bin, render_nginx, nginx_main_conf, tmp_path):
    """The check above can fail: the template rendered with no replicas is rejected."""
    site = tmp_path / "edgespec-grpc.conf"
    site.write_text(render_nginx("127.0.0.1:18444", [], tmp_path / "access.log"))
    main = tmp_path / "nginx.conf"
    main.write_text(nginx_main_conf(tmp_path, site))
    proc = subprocess.run([nginx_bin, "-t", "-p", str(tmp_path), "-c", str(main)], capture_output=True, text=True)
    assert proc.returncode != 0 and "no servers are inside upstream" in proc.stderr, proc.stderr


@pytest.fixture(scope="module")
def unit(deploy_dir):
    parser = configparser.ConfigParser(interpolation=None, strict=True)
    parser.optionxform = str  # systemd keys are case-sensitive
    parser.read_string((deploy_dir / "systemd/edgespec-server.service").read_text())
    return parser


def test_unit_restarts_drains_and_reads_its_environment(unit, deploy_dir):
    service = unit["Service"]
    assert service["Restart"] == "on-failure"
    assert service["KillSignal"] == "SIGTERM"
    assert service["KillMode"] == "mixed"  # SIGTERM to edgespec alone; SIGKILL to all only past the timeout
    assert service["EnvironmentFile"] == "/etc/edgespec/server.env"
    assert service["ExecStart"] == "/opt/edgespec/bin/edgespec-entrypoint server"
    assert service["ExecStartPre"] == "/opt/edgespec/bin/edgespec-entrypoint prepare"
    assert service["User"] == "edgespec"
    assert unit["Install"]["WantedBy"] == "multi-user.target"
    env = dict(line.split("=", 1) for line in (deploy_dir / "systemd/edgespec-server.env").read_text().splitlines()
               if line and not line.startswith("#"))
    env_keys = set(env)
    # The stop timeout must leave room for the server's drain grace.
    assert int(service["TimeoutStopSec"]) > float(env["EDGESPEC_DRAIN_GRACE"])
    assert {"EDGESPEC_MODEL", "EDGESPEC_HOME", "EDGESPEC_GRPC_PORT", "EDGESPEC_HTTP_PORT",
            "EDGESPEC_LOG_FORMAT"} <= env_keys
    assert service["ReadWritePaths"].split() == ["/var/lib/edgespec", "/opt/edgespec"]


def test_unit_passes_systemd_analyze(deploy_dir, tmp_path):
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed (Debian package systemd); the unit's keys are checked above")
    # The binary lives at /opt/edgespec/bin on a real host; point at the repo's copy so
    # verify checks every directive rather than stopping at a missing path.
    entrypoint = deploy_dir / "bin/edgespec-entrypoint"
    text = (deploy_dir / "systemd/edgespec-server.service").read_text()
    copy = tmp_path / "edgespec-server.service"
    copy.write_text(text.replace("/opt/edgespec/bin/edgespec-entrypoint", str(entrypoint)))
    proc = subprocess.run([analyze, "verify", str(copy)], capture_output=True, text=True, timeout=60)
    problems = [line for line in proc.stderr.splitlines() if "edgespec-server.service" in line]
    assert proc.returncode == 0 and not problems, proc.stderr
