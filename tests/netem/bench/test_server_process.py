"""The benchmarks' server child: stopped with its experiment, also when the experiment is killed."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from edgespec.netem.bench.server_process import _restore_sigterm, _sigterm_exits


def test_sigterm_raises_system_exit_while_a_server_runs_and_the_default_comes_back():
    before = signal.getsignal(signal.SIGTERM)
    if before != signal.SIG_DFL:
        pytest.skip("the test runner has a SIGTERM handler of its own, which _sigterm_exits leaves alone")
    previous = _sigterm_exits()
    try:
        assert signal.getsignal(signal.SIGTERM) != signal.SIG_DFL
        with pytest.raises(SystemExit) as stopped:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler interrupts it
        assert stopped.value.code == 128 + signal.SIGTERM
    finally:
        _restore_sigterm(previous)
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


def test_a_caller_s_own_sigterm_handler_is_left_alone():
    def mine(signum, frame):
        pass

    old = signal.signal(signal.SIGTERM, mine)
    try:
        assert _sigterm_exits() is None
        assert signal.getsignal(signal.SIGTERM) is mine
    finally:
        signal.signal(signal.SIGTERM, old)


@pytest.mark.slow
def test_a_killed_experiment_stops_its_server(tiny_model_dir):
    """SIGTERM to the process holding a ServerProcess: the `with` block ends, the server child goes with it
    (before: Python's default ended the parent at once and the server lived on, orphaned)."""
    script = textwrap.dedent("""
        import sys, time
        from edgespec.netem.bench.server_process import ServerProcess
        with ServerProcess(sys.argv[1], startup_timeout_s=240) as server:
            print(server.proc.pid, flush=True)
            time.sleep(600)
    """)
    parent = subprocess.Popen([sys.executable, "-c", script, str(tiny_model_dir)], stdout=subprocess.PIPE, text=True)
    try:
        line = parent.stdout.readline()
        assert line.strip().isdigit(), f"the server did not start: {line!r}"
        server_pid = int(line)
        os.kill(server_pid, 0)  # running
        parent.send_signal(signal.SIGTERM)
        assert parent.wait(60) == 128 + signal.SIGTERM
        with pytest.raises(ProcessLookupError):  # stopped and reaped by its parent
            os.kill(server_pid, 0)
    finally:
        if parent.poll() is None:
            parent.kill()
