"""`edgespec demo`: server, relay and client on this machine, one prompt end to end."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow  # edgespec demo in a subprocess, end to end


def test_demo_runs_end_to_end_through_the_relay(tiny_model_dir):
    env = dict(os.environ, OMP_NUM_THREADS="1", EDGESPEC_TEST_THREADS="1")
    proc = subprocess.run([sys.executable, "-m", "edgespec.shared.cli", "demo", "--target", str(tiny_model_dir),
                           "--drafter-model", str(tiny_model_dir), "--max-tokens", "10", "--color", "never",
                           "--prompt", "hi", "--profile", "4g"], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "relay (4g)" in proc.stderr
    assert "tok/s" in proc.stderr and "calls" in proc.stderr
