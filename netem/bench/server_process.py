"""`edgespec server` in a child process: the server an experiment runs against.

An experiment never reuses a server a person left running: it starts
`edgespec server` as a child process, waits for its "listening" line, and
stops it (SIGTERM, then SIGKILL) when done, also when the experiment itself is
stopped by SIGTERM. Given cores, the child runs on
them from its start (it inherits them, ``cpus.spawning_on``).
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from edgespec.netem.cpus import spawning_on

_LISTENING = re.compile(r"edgespec server listening grpc=(\S+) http=(\S+)")


@dataclass
class ServerProcess:
    """`edgespec server` in a child process on loopback."""

    model: str  # registry name or local directory of the target
    extra_args: list[str] = field(default_factory=list)  # more `edgespec server` flags
    threads: int | None = None  # torch threads of the server (None: torch's default)
    startup_timeout_s: float = 600.0  # loading a 1.5B model on a busy CPU takes a while
    log_path: Path | None = None  # where the server's output goes (None: discarded after start)
    cpus: frozenset[int] | None = None  # the cores it runs on (None: wherever the OS puts it)

    def __post_init__(self) -> None:
        self.proc: subprocess.Popen | None = None
        self.grpc_address = ""
        self.http_address = ""

    def start(self) -> "ServerProcess":
        env = dict(os.environ)
        if self.threads:
            env["OMP_NUM_THREADS"] = str(self.threads)
        cmd = [sys.executable, "-m", "edgespec", "server", "--model", self.model,  # the `edgespec` command
               "--host", "127.0.0.1", "--grpc-port", "0", "--port", "0", *self.extra_args]
        with spawning_on(self.cpus):
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
        sink = open(self.log_path or os.devnull, "a")  # no log: read and dropped
        sink.writelines(first)

        def pump() -> None:
            assert self.proc and self.proc.stdout
            with sink:
                for line in self.proc.stdout:
                    sink.write(line)
                    sink.flush()

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
        self._sigterm = _sigterm_exits()
        try:
            return self.start()
        except BaseException:
            _restore_sigterm(self._sigterm)
            raise

    def __exit__(self, *exc) -> None:
        try:
            self.stop()
        finally:
            _restore_sigterm(self._sigterm)


def _sigterm_exits():
    """SIGTERM raises SystemExit in the main thread while a server runs, so the `with` block stops the
    child: Python's default for SIGTERM ends the process at once, and the server it started would live on,
    orphaned, holding its core and ports (a benchmark stopped by `kill` did). Returns the handler it
    replaced, or None where it left the handler alone (not the main thread, or a handler of the caller's)."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
        return None

    def exit_now(signum, frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, exit_now)
    return signal.SIG_DFL


def _restore_sigterm(previous) -> None:
    if previous is not None and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, previous)
