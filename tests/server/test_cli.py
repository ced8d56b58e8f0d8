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

from edgespec.proto.edgespec.v1 import pb, pb_grpc

READY = re.compile(r"edgespec server listening grpc=(\S+) http=(\S+)")


def test_cli_serves_until_sigterm(tiny_model_dir):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "edgespec.shared.cli", "server", "--model", str(tiny_model_dir), "--port", "0",
         "--http-port", "0", "--log-format", "json", "--dtype", "float32", "--drain-grace", "2"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = proc.stdout.readline()
        match = READY.search(line)
        assert match, f"no ready line; got {line!r}; stderr: {proc.stderr.read() if proc.poll() is not None else ''}"
        grpc_addr, http_addr = match.groups()
        with grpc.insecure_channel(grpc_addr) as channel:
            info = pb_grpc.VerifierStub(channel).Info(pb.InfoRequest(), timeout=10)
        assert info.vocab_size == 320 and info.dtype == "float32"
        assert httpx.get(f"http://{http_addr}/health").json()["status"] == "ok"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        logs = [json.loads(x) for x in proc.stderr.read().splitlines() if x.startswith("{")]
        messages = " | ".join(entry["message"] for entry in logs)
        assert "loaded target" in messages and "on cpu" in messages and "listening grpc=" in messages
        assert "draining" in messages and "stopped" in messages
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
