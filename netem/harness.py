"""What every experiment needs: a server process of its own, a relay in front of
it, the environment record, and JSON-lines output.

An experiment never reuses a server a person left running: it starts
`edgespec server` as a child process, waits for its "listening" line, and
stops it (SIGTERM, then SIGKILL) when done.
"""
from __future__ import annotations

import contextlib
import json
import os
import platform
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

_LISTENING = re.compile(r"edgespec server listening grpc=(\S+) http=(\S+)")


@dataclass
class ServerProcess:
    """`edgespec server` in a child process on loopback."""

    model: str  # registry name or local directory of the target
    extra_args: list[str] = field(default_factory=list)  # more `edgespec server` flags
    threads: int | None = None  # torch threads of the server (None: torch's default)
    startup_timeout_s: float = 600.0  # loading a 1.5B model on a busy CPU takes a while
    log_path: Path | None = None  # where the server's output goes (None: discarded after start)

    def __post_init__(self) -> None:
        self.proc: subprocess.Popen | None = None
        self.grpc_address = ""
        self.http_address = ""

    def start(self) -> "ServerProcess":
        env = dict(os.environ)
        if self.threads:
            env["OMP_NUM_THREADS"] = str(self.threads)
        cmd = [sys.executable, "-m", "edgespec.shared.cli", "server", "--model", self.model,
               "--host", "127.0.0.1", "--port", "0", "--http-port", "0", *self.extra_args]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        deadline = time.monotonic() + self.startup_timeout_s
        lines: list[str] = []
        assert self.proc.stdout is not None
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            match = _LISTENING.search(line)
            if match:
                self.grpc_address, self.http_address = match.group(1), match.group(2)
                self._drain(lines)
                return self
        self.stop()
        raise RuntimeError("the server did not start:\n" + "".join(lines[-20:]))

    def _drain(self, first: list[str]) -> None:
        # Keep reading its output so the pipe never fills and blocks the server.
        sink = open(self.log_path, "a") if self.log_path else None
        if sink:
            sink.writelines(first)

        def pump() -> None:
            assert self.proc and self.proc.stdout
            for line in self.proc.stdout:
                if sink:
                    sink.write(line)
                    sink.flush()
            if sink:
                sink.close()

        threading.Thread(target=pump, daemon=True).start()

    def stop(self, grace_s: float = 10.0) -> None:
        if not self.proc or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self) -> "ServerProcess":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def split_address(address: str) -> tuple[str, int]:
    host, port = address.rsplit(":", 1)
    return host, int(port)


@contextlib.contextmanager
def relayed(address: str, profile_name: str | None, seed: int = 0) -> Iterator[tuple[str, object | None]]:
    """Yield (address to connect to, relay or None). No profile = direct connection."""
    if profile_name is None:
        yield address, None
        return
    from .profile import load_profile
    from .relay_thread import RelayThread

    with RelayThread(load_profile(profile_name), upstream=split_address(address), seed=seed) as relay:
        yield relay.target, relay


def environment(settings: dict) -> dict:
    """Where and how a run happened: commit, machine, library versions, settings."""
    import torch
    import transformers

    root = Path(__file__).resolve().parents[1]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True,
                            text=True).stdout.strip() or "unknown"
    dirty = bool(subprocess.run(["git", "status", "--porcelain"], cwd=root, capture_output=True,
                                text=True).stdout.strip())
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return {"commit": commit + ("+dirty" if dirty else ""), "machine": {
        "cpu": cpu, "cores": os.cpu_count(), "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__},
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "settings": settings}


class JsonLines:
    """Append one JSON object a line; every record carries the run's environment."""

    def __init__(self, path: Path, env: dict):
        self.path = path
        self.env = env
        self.done: set[tuple] = set()  # keys of generations an earlier, stopped run already wrote
        path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, record: dict) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps({**record, "env": self.env}) + "\n")


def read_jsonl(path: Path) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]
