"""`edgespec client` as a person runs it: a subprocess against the real tiny server."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow  # edgespec in subprocesses, end to end


def _run(args, stdin=None):
    env = dict(os.environ, OMP_NUM_THREADS="1", EDGESPEC_TEST_THREADS="1")
    return subprocess.run([sys.executable, "-m", "edgespec", *args], input=stdin, capture_output=True,
                          text=True, env=env, timeout=120)


def test_client_prints_text_and_metrics(tiny_server, tiny_model_dir, tiny_tokenizer, tiny_target_f32, greedy):
    prompt = "def add(a, b):\n"
    proc = _run(["client", "--server", tiny_server.address, "--tokenizer", str(tiny_model_dir), "--drafter", "ngram",
                 "--temperature", "0",
                 "--raw", "--max-tokens", "12", "--color", "never", "--json", "--prompt", prompt])
    assert proc.returncode == 0, proc.stderr
    ids = tiny_tokenizer(prompt, add_special_tokens=False)["input_ids"]
    want = tiny_tokenizer.decode(greedy(tiny_target_f32, ids, 12, {258, 256}), skip_special_tokens=True)
    lines = proc.stdout.rstrip("\n").split("\n")
    metrics = json.loads(lines[-1])
    assert "\n".join(lines[:-1]) == want
    assert metrics["drafter"] == "ngram" and metrics["calls"] >= 1
    assert "tok/s" in proc.stderr and "tau" in proc.stderr


def test_client_reads_stdin_and_colours(tiny_server, tiny_model_dir):
    # the target's own weights as the independent drafter: most tokens are accepted drafts (green)
    proc = _run(["client", "--server", tiny_server.address, "--tokenizer", str(tiny_model_dir), "--max-tokens", "16",
                 "--drafter", "independent", "--drafter-model", str(tiny_model_dir), "--color", "always",
                 "--temperature", "0"],
                stdin="hello")
    assert proc.returncode == 0, proc.stderr
    assert "\033[32m" in proc.stdout and "\033[0m" in proc.stdout


def test_client_names_an_unreachable_server(tiny_model_dir):
    proc = _run(["client", "--server", "127.0.0.1:9", "--tokenizer", str(tiny_model_dir), "--prompt", "x"])
    assert proc.returncode == 1
    assert "cannot reach the edgespec server at 127.0.0.1:9" in proc.stderr
