"""`edgespec server` as a subprocess: the ready line, a real call, JSON logs, and a clean exit on SIGTERM."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys

import grpc
import httpx
import pytest

from edgespec.proto.edgespec.v1 import pb, pb_grpc

READY = re.compile(r"edgespec server listening grpc=(\S+) http=(\S+)")


@pytest.mark.slow
def test_cli_serves_until_sigterm(tiny_model_dir, tmp_path):
    """Settings from all three layers (positional model, EDGESPEC_* variables, a config file); JSON logs."""
    config = tmp_path / "server.yaml"
    config.write_text("served-model-name: tiny-served\ndrain-grace: 2\nlog-format: json\nhttp-port: 1\n"
                      "enable-log-requests: true\n")
    env = dict(os.environ, OMP_NUM_THREADS="1", EDGESPEC_DTYPE="float32", EDGESPEC_GRPC_PORT="0",
               EDGESPEC_HTTP_PORT="0", EDGESPEC_DEVICE="cpu",  # the variable wins over the file's http-port
               EDGESPEC_MAX_SESIONS="3")  # misspelt: a warning, logged as JSON
    proc = subprocess.Popen(
        [sys.executable, "-m", "edgespec", "server", str(tiny_model_dir), "--config", str(config)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = proc.stdout.readline()
        match = READY.search(line)
        assert match, f"no ready line; got {line!r}; stderr: {proc.stderr.read() if proc.poll() is not None else ''}"
        grpc_addr, http_addr = match.groups()
        with grpc.insecure_channel(grpc_addr) as channel:
            info = pb_grpc.VerifierStub(channel).Info(pb.InfoRequest(), timeout=10)
        assert info.vocab_size == 320 and info.dtype == "float32" and info.model_name == "tiny-served"
        health = httpx.get(f"http://{http_addr}/health").json()
        assert health["status"] == "ok" and health["model"] == "tiny-served"
        done = httpx.post(f"http://{http_addr}/v1/completions", json={"prompt": "x", "max_tokens": 2}, timeout=60)
        assert done.status_code == 200
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        raw = proc.stderr.read()
        lines = [x for x in raw.splitlines() if x.strip()]
        logs = [json.loads(x) for x in lines]  # every line is one JSON object: no progress bars, no stray text
        assert "\x1b" not in raw and not any("color_message" in e for e in logs)
        assert all(re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}[+-]\d\d:\d\d", e["time"]) for e in logs)
        assert any("EDGESPEC_MAX_SESIONS" in e["message"] and e["level"] == "WARNING" for e in logs)
        request = next(e for e in logs if e.get("request_id"))  # --enable-log-requests
        assert request["endpoint"] == "completions" and request["prompt_tokens"] >= 1
        messages = " | ".join(entry["message"] for entry in logs)
        assert "loaded target" in messages and "on cpu" in messages and "listening grpc=" in messages
        assert "draining" in messages and "stopped" in messages
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_cli_refuses_a_config_file_with_an_unknown_key(tmp_path):
    config = tmp_path / "server.yaml"
    config.write_text("max-sesions: 3\n")
    proc = subprocess.run([sys.executable, "-m", "edgespec", "server", "m", "--config", str(config)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "unknown key 'max-sesions'" in proc.stderr and "did you mean 'max-sessions'" in proc.stderr


def test_server_config_takes_the_vllm_spellings(tmp_path):
    from edgespec.server.cli import server_config
    from edgespec.cli import build_parser

    args = build_parser().parse_args(
        ["server", "org/model", "--max-model-len", "4096", "--ssl-certfile", "c.pem", "--ssl-keyfile", "k.pem",
         "--served-model-name", "coder", "--dtype", "auto", "--trust-remote-code", "--http-port", "-1"])
    config = server_config(args)
    assert (config.model, config.max_context_tokens, config.tls_cert, config.tls_key) == ("org/model", 4096, "c.pem",
                                                                                         "k.pem")
    assert (config.served_model_name, config.dtype, config.trust_remote_code) == ("coder", "auto", True)
    assert config.http_port is None
    with pytest.raises(SystemExit, match="no model"):
        server_config(build_parser().parse_args(["server"]))
    with pytest.raises(SystemExit, match="go together"):
        server_config(build_parser().parse_args(["server", "m", "--ssl-certfile", "c.pem"]))


def test_http_guards_and_admission_reach_the_server_config():
    from edgespec.server.cli import server_config
    from edgespec.cli import build_parser

    args = build_parser().parse_args(["server", "m", "--metrics-need-key", "--max-body-mb", "0.5",
                                      "--first-message-timeout", "2.5"])
    config = server_config(args)
    assert (config.metrics_need_key, config.max_body_bytes, config.first_message_timeout_s) == (True, 512 << 10, 2.5)
    defaults = server_config(build_parser().parse_args(["server", "m"]))
    assert (defaults.metrics_need_key, defaults.max_body_bytes, defaults.first_message_timeout_s) == (False, 8 << 20,
                                                                                                       5.0)
    with pytest.raises(SystemExit, match="first-message-timeout"):
        server_config(build_parser().parse_args(["server", "m", "--first-message-timeout", "0"]))


def test_port_is_the_http_port_as_in_vllm_and_grpc_has_its_own_flag():
    from edgespec.server.cli import server_config
    from edgespec.cli import build_parser

    def ports(*argv):
        config = server_config(build_parser().parse_args(["server", "m", *argv]))
        return config.port, config.http_port

    assert ports() == (50051, 8080)
    assert ports("--port", "8000") == (50051, 8000)  # a vLLM user's --port moves the HTTP API
    assert ports("--grpc-port", "6000", "--http-port", "9000") == (6000, 9000)  # --http-port: --port's old name
    with pytest.raises(SystemExit, match="--port is the HTTP port now.*--grpc-port 50051"):
        ports("--port", "50051")  # the old meaning, which would put both sides on one port
    # The old pair (--port was gRPC, --http-port HTTP) would drop the gRPC port without a word: refused, with the
    # new spelling, whatever the ports (the old defaults' line included).
    with pytest.raises(SystemExit, match="old spelling.*--grpc-port 50111 --port 50112"):
        ports("--port", "50111", "--http-port", "50112")
    with pytest.raises(SystemExit, match="--grpc-port 50051 --port 8080"):
        ports("--port", "50051", "--http-port", "8080")
    with pytest.raises(SystemExit, match="--grpc-port 7000 --port 7001"):
        ports("--http-port=7001", "--port=7000")
    # With --grpc-port given too, neither is the old gRPC port: the advice keeps --grpc-port's, never drops it.
    with pytest.raises(SystemExit, match=r"^--port 8080 --http-port 8081: .*give it once, as --port \(gRPC stays on "
                                         r"--grpc-port 50111\)$"):
        ports("--grpc-port", "50111", "--port", "8080", "--http-port", "8081")
    with pytest.raises(SystemExit, match="--port 8080 and --grpc-port 8080: .*cannot share one port"):
        ports("--grpc-port", "8080", "--port", "8080")  # refused before the model loads, not at bind time
    assert ports("--grpc-port", "0", "--port", "0") == (0, 0)  # both picked by the system: two ports
    text = build_parser()._subparsers._group_actions[0].choices["server"].format_help()
    assert "None" not in text[text.index("--device"):][:90]


def test_the_default_served_name_is_the_model_as_given(tiny_model_dir):
    from support.servers import running_server

    with running_server(tiny_model_dir, http_port=None) as handle:
        assert handle.core.target.name == str(tiny_model_dir)  # vLLM's default, not the folder's basename
