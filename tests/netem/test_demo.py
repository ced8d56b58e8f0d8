"""`edgespec demo`: server, relay and client on this machine, one prompt end to end."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow  # edgespec demo in a subprocess, end to end


def test_demo_runs_end_to_end_through_the_relay(tiny_model_dir):
    env = dict(os.environ, OMP_NUM_THREADS="1", EDGESPEC_TEST_THREADS="1")
    proc = subprocess.run([sys.executable, "-m", "edgespec", "demo", "--target", str(tiny_model_dir),
                           "--drafter-model", str(tiny_model_dir), "--max-tokens", "10", "--color", "never",
                           "--prompt", "hi", "--profile", "4g"], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "relay (4g)" in proc.stderr
    assert "tok/s" in proc.stderr and "calls" in proc.stderr


def test_a_moa_demo_loads_the_matching_server_part():
    from types import SimpleNamespace

    from edgespec.netem.demo import moa_server_parts

    def args(drafter, checkpoint=None, part=None):
        return SimpleNamespace(drafter=drafter, checkpoint=checkpoint, moa_server_part=part)

    assert moa_server_parts(args("moa")) == {"moa-tli0": "moa-tli0"}
    assert moa_server_parts(args("moa-tli1")) == {"moa-tli1": "moa-tli1"}
    assert moa_server_parts(args("moa-tli1+ngram")) == {"moa-tli1": "moa-tli1"}  # the lookup needs no part of its own
    assert moa_server_parts(args("moa", "/runs/x/moa-run")) == {"moa-run": "/runs/x/moa-run"}
    assert moa_server_parts(args("independent")) == {}


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 cores to pin apart")
def test_a_pinned_demo_runs_the_server_on_its_own_core(tiny_model_dir):
    server, client = sorted(os.sched_getaffinity(0))[-1], sorted(os.sched_getaffinity(0))[0]
    env = dict(os.environ, OMP_NUM_THREADS="1", EDGESPEC_TEST_THREADS="1")
    proc = subprocess.run([sys.executable, "-m", "edgespec", "demo", "--target", str(tiny_model_dir),
                           "--drafter-model", str(tiny_model_dir), "--max-tokens", "10", "--color", "never",
                           "--prompt", "hi", "--profile", "5g", "--server-cpus", str(server),
                           "--client-cpus", str(client)], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert f"server on CPU {server} (1 torch threads), client on CPU {client}" in proc.stderr
    assert "relay (5g)" in proc.stderr and "tok/s" in proc.stderr


def test_a_cpu_that_does_not_exist_is_refused_before_anything_loads():
    missing = max(os.sched_getaffinity(0)) + 1
    proc = subprocess.run([sys.executable, "-m", "edgespec", "demo", "--target", "/nonexistent",
                           "--server-cpus", str(missing)], capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert f"--server-cpus: CPU {missing} does not exist here" in proc.stderr
