"""`edgespec client serve` as deployments run it: a subprocess, /health over HTTP, JSON log lines."""
from __future__ import annotations

import io
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from edgespec.shared.logging_setup import JsonFormatter, configure_logging

pytestmark = pytest.mark.slow  # edgespec in subprocesses, end to end
TIME = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}[+-]\d\d:\d\d"  # ISO 8601, milliseconds, the zone's offset


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_serve_health_metrics_and_json_logs(tiny_server, tiny_model_dir, tiny_drafter_dir, tmp_path):
    port = _free_port()
    config = tmp_path / "client.yaml"  # settings from a file and the environment, as deployments give them
    config.write_text(f"tokenizer: {tiny_model_dir}\nlog-format: json\nport: 1\n")
    env = dict(os.environ, OMP_NUM_THREADS="1", EDGESPEC_DRAFTER="independent", EDGESPEC_DRAFTR="ngram",
               EDGESPEC_DRAFTER_MODEL=str(tiny_drafter_dir), EDGESPEC_CONFIG=str(config),
               EDGESPEC_API_KEY="k3y")  # the local API's key, as vLLM's --api-key
    err_path = tmp_path / "stderr.log"
    with open(err_path, "w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "edgespec", "client", "serve", "--server", tiny_server.address,
             "--port", str(port), "--enable-log-requests", "--allowed-origins", "http://page.test"],
            # the command line wins over the file's port
            stdout=subprocess.PIPE, stderr=err, text=True, env=env)
    try:
        ready = proc.stdout.readline()  # printed once the port listens and the client has loaded
        assert "edgespec local API on" in ready, err_path.read_text()[-2000:]
        r = httpx.get(f"http://127.0.0.1:{port}/health", timeout=10)
        assert r.status_code == 200
        body = r.json()
        assert body["status"] == "ok" and body["drafter"] == "independent" and body["link"] == "up"
        assert body["server"] == tiny_server.address and body["model"]
        url, key = f"http://127.0.0.1:{port}", {"Authorization": "Bearer k3y"}
        assert httpx.post(f"{url}/v1/completions", json={"prompt": "x", "max_tokens": 1}).status_code == 401
        done = httpx.post(f"{url}/v1/completions", json={"prompt": "def f(x):", "max_tokens": 6}, headers=key,
                          timeout=60)
        assert done.status_code == 200
        spec = done.json()["edgespec"]["spec_decode"]  # vLLM's and SGLang's per-request figures
        assert spec["num_drafts"] >= 1 and spec["spec_accept_length"] == spec["mean_acceptance_length"] >= 1
        # A browser page of an allowed origin: its preflight is answered without the key, its call is readable.
        preflight = httpx.options(f"{url}/v1/completions", headers={
            "Origin": "http://page.test", "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization,content-type"})
        assert preflight.status_code == 200 and preflight.headers["access-control-allow-origin"] == "http://page.test"
        tokens = httpx.post(f"{url}/tokenize", json={"prompt": "def f(x):"},
                            headers={**key, "Origin": "http://page.test"})
        assert tokens.status_code == 200 and tokens.headers["access-control-allow-origin"] == "http://page.test"
        back = httpx.post(f"{url}/detokenize", json={"tokens": tokens.json()["tokens"]}, headers=key).json()
        assert back["prompt"] == "def f(x):"
        assert httpx.get(f"{url}/version", headers=key).json()["version"]
        scraped = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10)
        assert scraped.status_code == 200
        samples = {(s.name, s.labels.get("position")): s for f in text_string_to_metric_families(scraped.text)
                   for s in f.samples}
        assert not any(name.endswith("_created") for name, _ in samples)
        drafts = samples[("edgespec_client:spec_decode_num_drafts_total", None)]
        assert drafts.value >= 1 and drafts.labels["model_name"] == body["model"] and drafts.labels["engine"] == "0"
        assert samples[("edgespec_client:spec_decode_num_draft_tokens_total", None)].value >= drafts.value
        for name in ("time_to_first_token_seconds", "e2e_request_latency_seconds", "request_queue_time_seconds"):
            assert samples[(f"edgespec_client:{name}_count", None)].value == 1, name
        assert samples[("edgespec_client:num_requests_running", None)].value == 0
        assert samples[("edgespec_client:generation_tokens_total", None)].value == (
            done.json()["usage"]["completion_tokens"])
        assert not any(name.startswith("edgespec:") for name, _ in samples)  # the server's prefix is the server's
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
    raw = err_path.read_text()
    assert "\x1b" not in raw  # no ANSI colour codes anywhere (uvicorn's color_message is dropped)
    lines = [line for line in raw.splitlines() if line.strip()]
    entries = [json.loads(line) for line in lines]  # every line is one JSON object
    assert all({"time", "level", "logger", "message"} <= set(e) for e in entries)
    assert all(re.fullmatch(TIME, e["time"]) for e in entries), entries[0]["time"]  # milliseconds and zone
    assert not any("color_message" in e for e in entries)
    unknown = next(e for e in entries if "EDGESPEC_DRAFTR" in e["message"])
    assert unknown["level"] == "WARNING" and "did you mean EDGESPEC_DRAFTER" in unknown["message"]
    logged = next(e for e in entries if e.get("request_id"))  # --enable-log-requests: fields, not the prompt
    assert logged["endpoint"] == "completions" and logged["max_tokens"] == 6 and "def f" not in json.dumps(logged)
    ready_entry = next(e for e in entries if e["message"] == "client ready")
    assert ready_entry["drafter"] == "independent" and ready_entry["server"] == tiny_server.address
    gen = next(e for e in entries if e["message"] == "generation done")
    assert gen["new_tokens"] >= 1 and gen["calls"] >= 1  # extra= fields are kept
    assert any(e["logger"].startswith("uvicorn") for e in entries)  # uvicorn's own lines are JSON too


def test_serve_exits_with_the_reason_when_the_client_cannot_load(tiny_server, tmp_path):
    """A drafter that does not exist is final: logged (JSON) and the service exits non-zero."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run(
        [sys.executable, "-m", "edgespec", "client", "serve", "--server", tiny_server.address,
         "--drafter", "medusa", "--tokenizer", str(tmp_path / "nowhere"), "--port", str(_free_port()),
         "--log-format", "json"], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 1
    entries = [json.loads(line) for line in proc.stderr.splitlines() if line.strip()]
    failed = [e for e in entries if e["level"] == "ERROR"]
    assert failed and "client failed to load" in failed[0]["message"]


def test_json_formatter_lines_carry_extra_fields_and_exceptions():
    stream = io.StringIO()
    handler = configure_logging("json", "info", stream)
    try:
        log = logging.getLogger("edgespec.test")
        log.info("hello %s", "there", extra={"drafter": "ngram", "tokens": 3, "odd": object()})
        try:
            raise ValueError("boom")
        except ValueError:
            log.error("failed", exc_info=True)
        log.debug("not shown at info")
    finally:
        logging.getLogger().removeHandler(handler)
    first, second = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert first["message"] == "hello there" and first["level"] == "INFO" and first["logger"] == "edgespec.test"
    assert first["drafter"] == "ngram" and first["tokens"] == 3 and isinstance(first["odd"], str)
    assert re.fullmatch(TIME, first["time"])
    assert second["level"] == "ERROR" and "ValueError: boom" in second["exception"]
    assert isinstance(JsonFormatter().format(logging.makeLogRecord({"msg": "x"})), str)


def test_text_lines_show_extra_fields_and_python_warnings_are_log_lines():
    import warnings

    stream = io.StringIO()
    with warnings.catch_warnings():  # pytest records warnings itself: let this test's reach logging
        warnings.simplefilter("always")
        handler = configure_logging("text", "info", stream)
        try:
            logging.getLogger("edgespec.test").info("generation done", extra={"new_tokens": 12, "detail": "a b"})
            uvicorn_log = logging.getLogger("uvicorn.error")
            uvicorn_log.setLevel(logging.INFO)  # an earlier in-process server may have set it to WARNING
            uvicorn_log.info("Started", extra={"color_message": "\x1b[32mStarted\x1b[0m"})
            warnings.warn("something old", UserWarning, stacklevel=1)
        finally:
            logging.getLogger().removeHandler(handler)
            logging.captureWarnings(False)
    done, started, warned = stream.getvalue().splitlines()[:3]  # the warning's source line follows it
    assert done.endswith('generation done new_tokens=12 detail="a b"') and re.match(TIME, done)
    assert started.endswith("uvicorn.error: Started")  # no colour codes, no color_message field
    assert "WARNING py.warnings" in warned and "something old" in warned
